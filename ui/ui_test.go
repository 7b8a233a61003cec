package ui

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/valyala/fasthttp"
)

// serve runs h on one request and returns the response.
func serve(t *testing.T, h fasthttp.RequestHandler, method, uri string, headers ...string) *fasthttp.Response {
	t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(uri)
	for i := 0; i+1 < len(headers); i += 2 {
		ctx.Request.Header.Set(headers[i], headers[i+1])
	}
	h(&ctx)
	var resp fasthttp.Response
	ctx.Response.CopyTo(&resp)
	return &resp
}

func TestHandler(t *testing.T) {
	h := Handler()
	index, err := fs.ReadFile(static, "static/index.html")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		method      string
		path        string
		status      int
		contentType string
		body        []byte // checked when not nil
		location    string
	}{
		{name: "page", method: "GET", path: "/ui/", status: 200, contentType: "text/html; charset=utf-8", body: index},
		{name: "page by name", method: "GET", path: "/ui/index.html", status: 200, contentType: "text/html; charset=utf-8", body: index},
		{name: "module", method: "GET", path: "/ui/app.js", status: 200, contentType: "text/javascript; charset=utf-8"},
		{name: "stylesheet", method: "GET", path: "/ui/app.css", status: 200, contentType: "text/css; charset=utf-8"},
		{name: "icon", method: "GET", path: "/ui/icon.svg", status: 200, contentType: "image/svg+xml"},
		{name: "vendored chart library", method: "GET", path: "/ui/vendor/chart.umd.min.js", status: 200, contentType: "text/javascript; charset=utf-8"},
		{name: "vendored licence", method: "GET", path: "/ui/vendor/LICENSE-chart.js.md", status: 200, contentType: "text/plain; charset=utf-8"},
		{name: "head", method: "HEAD", path: "/ui/app.js", status: 200, contentType: "text/javascript; charset=utf-8"},
		{name: "unknown file", method: "GET", path: "/ui/nope.js", status: 404},
		{name: "directory", method: "GET", path: "/ui/vendor/", status: 404},
		{name: "traversal", method: "GET", path: "/ui/../ui.go", status: 404},
		{name: "encoded traversal", method: "GET", path: "/ui/%2e%2e/ui.go", status: 404},
		{name: "outside the prefix", method: "GET", path: "/other", status: 404},
		{name: "no trailing slash", method: "GET", path: "/ui", status: 301, location: "/ui/"},
		{name: "post", method: "POST", path: "/ui/", status: 405},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := serve(t, h, tt.method, tt.path)
			if resp.StatusCode() != tt.status {
				t.Fatalf("status %d, want %d (body %q)", resp.StatusCode(), tt.status, resp.Body())
			}
			if tt.location != "" {
				if loc := string(resp.Header.Peek("Location")); !strings.HasSuffix(loc, tt.location) {
					t.Errorf("Location %q, want %q", loc, tt.location)
				}
				return
			}
			if got := string(resp.Header.Peek("Content-Security-Policy")); got != contentSecurityPolicy {
				t.Errorf("Content-Security-Policy %q", got)
			}
			if got := string(resp.Header.Peek("X-Content-Type-Options")); got != "nosniff" {
				t.Errorf("X-Content-Type-Options %q", got)
			}
			if tt.status != 200 {
				return
			}
			if got := string(resp.Header.ContentType()); got != tt.contentType {
				t.Errorf("Content-Type %q, want %q", got, tt.contentType)
			}
			if got := string(resp.Header.Peek("Cache-Control")); got != cacheControl {
				t.Errorf("Cache-Control %q, want %q", got, cacheControl)
			}
			if len(resp.Header.Peek("ETag")) == 0 {
				t.Error("no ETag")
			}
			if tt.body != nil && !bytes.Equal(resp.Body(), tt.body) {
				t.Errorf("body is not the embedded file")
			}
			if tt.method == "GET" && len(resp.Body()) == 0 {
				t.Errorf("empty body")
			}
		})
	}
}

func TestHandlerConditionalGet(t *testing.T) {
	h := Handler()
	etag := string(serve(t, h, "GET", "/ui/app.js").Header.Peek("ETag"))
	tests := []struct {
		name        string
		ifNoneMatch string
		status      int
	}{
		{name: "same", ifNoneMatch: etag, status: 304},
		{name: "weak", ifNoneMatch: "W/" + etag, status: 304},
		{name: "in a list", ifNoneMatch: `"other", ` + etag, status: 304},
		{name: "any", ifNoneMatch: "*", status: 304},
		{name: "changed", ifNoneMatch: `"other"`, status: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := serve(t, h, "GET", "/ui/app.js", "If-None-Match", tt.ifNoneMatch)
			if resp.StatusCode() != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode(), tt.status)
			}
			if tt.status == 304 && len(resp.Body()) != 0 {
				t.Errorf("304 with a body")
			}
		})
	}
}

func TestLoadIndexesEveryFile(t *testing.T) {
	fsys := fstest.MapFS{
		"static/index.html":   {Data: []byte("<!doctype html>")},
		"static/a/b.js":       {Data: []byte("export {}")},
		"static/data.unknown": {Data: []byte{0}},
	}
	files, err := load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, contentType string
	}{
		{name: "", contentType: "text/html; charset=utf-8"},
		{name: "index.html", contentType: "text/html; charset=utf-8"},
		{name: "a/b.js", contentType: "text/javascript; charset=utf-8"},
		{name: "data.unknown", contentType: "application/octet-stream"},
	}
	for _, tt := range tests {
		f, ok := files[tt.name]
		if !ok {
			t.Errorf("%q not indexed", tt.name)
			continue
		}
		if f.contentType != tt.contentType {
			t.Errorf("%q: content type %q, want %q", tt.name, f.contentType, tt.contentType)
		}
	}
	if len(files) != len(tests) {
		t.Errorf("%d files indexed, want %d", len(files), len(tests))
	}
}

// TestPageLoadsNothingFromElsewhere checks that the page and its modules
// refer to no other host (no CDN, no web fonts) and put no server text
// into HTML.
func TestPageLoadsNothingFromElsewhere(t *testing.T) {
	external := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//|@import|url\(\s*["']?(https?:)?//|fetch\(\s*["'` + "`" + `]https?:`)
	err := fs.WalkDir(static, "static", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(name, "static/vendor/") {
			return err
		}
		b, err := fs.ReadFile(static, name)
		if err != nil {
			return err
		}
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers to another host: %q", name, m)
		}
		if bytes.Contains(b, []byte("innerHTML")) || bytes.Contains(b, []byte("insertAdjacentHTML")) {
			t.Errorf("%s writes HTML from strings", name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestJavaScriptModules runs the unit tests of the page's pure modules
// (Prometheus parsing, histogram quantiles, usage aggregation, the trace
// tree) with node's test runner, when node 20.19 or later is installed.
func TestJavaScriptModules(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: JavaScript unit tests skipped (the browser test still checks the page's numbers)")
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		t.Fatalf("node --version: %v", err)
	}
	if !nodeDetectsModules(strings.TrimSpace(string(out))) {
		t.Skipf("node %s cannot load ES modules from .js files without a package.json; need 20.19 or later", bytes.TrimSpace(out))
	}
	cmd := exec.Command(node, "--test", "testdata/modules_test.mjs")
	cmd.Env = append(os.Environ(), "NODE_NO_WARNINGS=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
}

// nodeDetectsModules reports whether a node version ("v20.20.2") loads a
// .js file with import statements as an ES module on its own.
func nodeDetectsModules(version string) bool {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 22 || (major == 22 && minor >= 7) || (major == 20 && minor >= 19)
}

// TestScriptsFindTheirElements checks that every element app.js looks up
// by data-testid ($('…') and setText('…')) is in index.html, so that a
// renamed element fails here rather than leave a tile blank.
func TestScriptsFindTheirElements(t *testing.T) {
	index, err := fs.ReadFile(static, "static/index.html")
	if err != nil {
		t.Fatal(err)
	}
	app, err := fs.ReadFile(static, "static/app.js")
	if err != nil {
		t.Fatal(err)
	}
	lookups := regexp.MustCompile(`(?:\$|setText)\('([a-z0-9-]+)'`).FindAllSubmatch(app, -1)
	if len(lookups) < 20 {
		t.Fatalf("found %d lookups in app.js; has the helper been renamed?", len(lookups))
	}
	for _, m := range lookups {
		if !bytes.Contains(index, []byte(`data-testid="`+string(m[1])+`"`)) {
			t.Errorf("app.js looks up %q, which index.html does not have", m[1])
		}
	}
}
