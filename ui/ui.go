// Package ui serves tollgate's usage and health dashboard: one HTML page,
// a stylesheet and a few JavaScript modules embedded in the binary, which
// read only the gateway's own public endpoints (the usage API, the trace
// service, /readyz and /metrics) with the API key the user signs in with.
package ui

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"path"
	"strings"
	"sync"

	"github.com/valyala/fasthttp"
)

// Prefix is the path the dashboard is served under.
const Prefix = "/ui/"

// static holds the page. embed needs a package-level variable; it is
// never written to. static/vendor/chart.umd.min.js is Chart.js 4.6.1 as
// the npm package chart.js ships it (dist/chart.umd.min.js, unmodified),
// with its licence beside it.
//
//go:embed static
var static embed.FS

// contentSecurityPolicy allows the page to load its own files and to call
// its own origin, and nothing else: no inline script or style, no other
// hosts, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// cacheControl makes browsers revalidate every file with its ETag: the
// file names carry no version, so a long max-age would keep an old page
// after an upgrade, while a revalidation costs a 304.
const cacheControl = "no-cache"

// contentType returns the type of a file the page is made of, by its
// extension. Anything else is served as bytes.
func contentType(ext string) string {
	switch ext {
	case ".html":
		return "text/html; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".js", ".mjs":
		return "text/javascript; charset=utf-8"
	case ".json":
		return "application/json"
	case ".svg":
		return "image/svg+xml"
	case ".png":
		return "image/png"
	case ".md", ".txt":
		// Markdown as plain text, so that browsers show the licence
		// rather than download it.
		return "text/plain; charset=utf-8"
	}
	return "application/octet-stream"
}

// file is one embedded file, ready to serve.
type file struct {
	body        []byte
	contentType string
	etag        string
}

// loadStatic reads the embedded files once per process, however often
// Handler is called.
var loadStatic = sync.OnceValues(func() (map[string]*file, error) { return load(static) })

// Handler returns the handler of GET and HEAD /ui/ (the page) and
// /ui/<file> (its assets); /ui redirects to /ui/, other paths and
// unknown files are 404s. It is cheap to call: the files are read and
// indexed once.
func Handler() fasthttp.RequestHandler {
	files, err := loadStatic()
	if err != nil {
		// The files are compiled in, so this cannot fail at run time
		// unless the embed directive itself is broken.
		panic("ui: read embedded files: " + err.Error())
	}
	return newHandler(files)
}

// load reads every file under static/ into memory, keyed by its path
// below /ui/, with index.html also under "".
func load(fsys fs.FS) (map[string]*file, error) {
	root, err := fs.Sub(fsys, "static")
	if err != nil {
		return nil, err
	}
	files := make(map[string]*file)
	err = fs.WalkDir(root, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(root, name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		files[name] = &file{body: body, contentType: contentType(path.Ext(name)), etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if index, ok := files["index.html"]; ok {
		files[""] = index
	}
	return files, nil
}

func newHandler(files map[string]*file) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		p := string(ctx.Path())
		if p == strings.TrimSuffix(Prefix, "/") {
			ctx.Redirect(Prefix, fasthttp.StatusMovedPermanently)
			return
		}
		name, ok := strings.CutPrefix(p, Prefix)
		if !ok {
			plainError(ctx, fasthttp.StatusNotFound)
			return
		}
		f, ok := files[name]
		if !ok {
			plainError(ctx, fasthttp.StatusNotFound)
			return
		}
		if !ctx.IsGet() && !ctx.IsHead() {
			plainError(ctx, fasthttp.StatusMethodNotAllowed)
			ctx.Response.Header.Set(fasthttp.HeaderAllow, "GET, HEAD")
			return
		}
		h := &ctx.Response.Header
		setSecurityHeaders(h)
		h.Set(fasthttp.HeaderCacheControl, cacheControl)
		h.Set(fasthttp.HeaderETag, f.etag)
		if match := ctx.Request.Header.Peek(fasthttp.HeaderIfNoneMatch); len(match) > 0 && etagMatches(string(match), f.etag) {
			ctx.SetStatusCode(fasthttp.StatusNotModified)
			return
		}
		ctx.SetContentType(f.contentType)
		// The body is shared between requests and never written to, so
		// it is handed to fasthttp without a copy.
		ctx.Response.SetBodyRaw(f.body)
	}
}

// setSecurityHeaders sets the headers every answer of the dashboard
// carries, the 404s included.
func setSecurityHeaders(h *fasthttp.ResponseHeader) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set(fasthttp.HeaderXContentTypeOptions, "nosniff")
	h.Set(fasthttp.HeaderXFrameOptions, "DENY")
	h.Set(fasthttp.HeaderReferrerPolicy, "no-referrer")
}

// plainError answers status with its name as plain text.
func plainError(ctx *fasthttp.RequestCtx, status int) {
	// ctx.Error resets the headers, so the security headers come after.
	ctx.Error(fasthttp.StatusMessage(status)+"\n", status)
	setSecurityHeaders(&ctx.Response.Header)
}

// etagMatches reports whether an If-None-Match header names etag (or is
// "*"), weak validators included, as RFC 9110 compares them for GET.
func etagMatches(header, etag string) bool {
	for item := range strings.SplitSeq(header, ",") {
		item = strings.TrimPrefix(strings.TrimSpace(item), "W/")
		if item == "*" || item == etag {
			return true
		}
	}
	return false
}
