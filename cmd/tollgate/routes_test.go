package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/route"
	"github.com/tollgate-dev/tollgate/ui"
)

// gatewayRoutes builds a gateway on cfg, as main does, and returns its
// table of every route.
func gatewayRoutes(t *testing.T, cfg *config.Config) []route.Route {
	t.Helper()
	g, err := build(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	routes := g.routes
	if err := g.close(cfg.Server.ShutdownTimeout); err != nil {
		t.Fatal(err)
	}
	return routes
}

// samplePath fills a route pattern's segments with values that exist in
// gatewayConfig (the team acme, the model demo).
var samplePath = strings.NewReplacer("{entity}", "acme", "{project}", "routes", "{id}", "x",
	"{id...}", "demo", "{path...}", "index.html").Replace

// routerNotFound reports whether an answer is a router's "no such path"
// (the proxy's for /v1/ and other paths, the trace service's), as opposed
// to a handler's answer about what it was asked for.
func routerNotFound(status int, body string) bool {
	return status == http.StatusNotFound &&
		(strings.Contains(body, `"unknown_url"`) || strings.Contains(body, "Unknown path") || body == `{"detail":"Not Found"}`)
}

// TestEveryRouteAnswers takes every route of the binary's table, once per
// path and method, and checks that the running gateway routes it: no
// router 404, no 405. It also checks that no two rows claim the same
// method and path, and that each part of the gateway contributed rows.
func TestEveryRouteAnswers(t *testing.T) {
	cfg := gatewayConfig(t, t.TempDir(), "")
	routes := gatewayRoutes(t, cfg)
	seen := map[string]bool{}
	modules := map[string]int{}
	for _, r := range routes {
		key := r.Method + " " + r.Pattern
		if seen[key] {
			t.Errorf("%s is in the table twice", key)
		}
		seen[key] = true
		modules[r.Module]++
	}
	if r := routes[0]; r.Method != http.MethodPost || r.Pattern != "/v1/chat/completions" {
		t.Errorf("the first row is %s %s; chat completions, the hot path, must be matched first", r.Method, r.Pattern)
	}
	for _, m := range []string{"proxy", "usage API", "budgets", "admin API", "metrics", "dashboard", "trace service"} {
		if modules[m] == 0 {
			t.Errorf("no route of %s in the table %v", m, modules)
		}
	}

	gw := start(t, cfg)
	for _, r := range routes {
		method := r.Method
		if method == "" {
			method = http.MethodGet
		}
		path := samplePath(r.Pattern)
		t.Run(method+" "+r.Pattern, func(t *testing.T) {
			status, body := gw.do(t, method, path, adminKey, "{}")
			if routerNotFound(status, body) || status == http.StatusMethodNotAllowed {
				t.Fatalf("%s %s (%s) = %d %s, want it routed", method, path, r.Module, status, body)
			}
		})
	}
	t.Run("an unknown path is a router 404", func(t *testing.T) {
		for _, path := range []string{"/v1/nope", "/nope", "/v2/acme/routes/nope"} {
			if status, body := gw.do(t, http.MethodGet, path, adminKey, ""); !routerNotFound(status, body) {
				t.Errorf("GET %s = %d %s, want a router 404", path, status, body)
			}
		}
	})
}

// TestEveryReplyHasRequestID checks that every route of the binary's table,
// the router's 404s and 405s, and a refused key answer with X-Request-Id:
// the client's when it sent a valid one, a generated one otherwise. With
// admin_listen set, it checks both listeners, each with its own routes.
func TestEveryReplyHasRequestID(t *testing.T) {
	type request struct{ method, path, key, what string }
	refusals := []request{
		{http.MethodGet, "/v1/nope", adminKey, "a /v1/ 404"},
		{http.MethodGet, "/nope", adminKey, "a 404"},
		{http.MethodGet, "/v2/acme/routes/nope", adminKey, "a trace service 404"},
		{http.MethodGet, "/v1/chat/completions", adminKey, "a 405"},
		{http.MethodDelete, "/v1/models", adminKey, "a 405"},
		{http.MethodGet, "/call/start", adminKey, "a trace service 405"},
		{http.MethodGet, "/v1/models", "sk-wrong", "a 401"},
		{http.MethodGet, "/v1/organization/usage/completions", "sk-wrong", "a 401"},
	}
	check := func(t *testing.T, gw *running, requests []request) {
		for i, r := range requests {
			t.Run(r.method+" "+r.path+" ("+r.what+")", func(t *testing.T) {
				status, h, body := gw.doHeader(t, r.method, r.path, r.key, "{}")
				if got := h.Get("X-Request-Id"); got == "" {
					t.Errorf("%d %.200s: no X-Request-Id", status, body)
				}
				sent := fmt.Sprintf("rid-%d-%s", i, r.what)
				sent = strings.ReplaceAll(sent, " ", "-")
				status, h, body = gw.doHeader(t, r.method, r.path, r.key, "{}", "X-Request-Id: "+sent)
				if got := h.Get("X-Request-Id"); got != sent {
					t.Errorf("%d %.200s: X-Request-Id %q, want the client's %q", status, body, got, sent)
				}
			})
		}
	}
	// routed lists a request per route of routes, for which pick is true.
	routed := func(routes []route.Route, pick func(route.Route) bool) []request {
		var out []request
		for _, r := range routes {
			method := r.Method
			if method == "" {
				method = http.MethodGet
			}
			if pick(r) {
				out = append(out, request{method, samplePath(r.Pattern), adminKey, r.Module})
			}
		}
		return out
	}
	all := func(route.Route) bool { return true }

	t.Run("one listener", func(t *testing.T) {
		cfg := gatewayConfig(t, t.TempDir(), "")
		routes := gatewayRoutes(t, cfg)
		check(t, start(t, cfg), append(routed(routes, all), refusals...))
	})
	t.Run("admin_listen", func(t *testing.T) {
		adminAddr := freePort(t)
		cfg := gatewayConfig(t, t.TempDir(), "admin_listen: "+adminAddr)
		routes := gatewayRoutes(t, cfg)
		gw := start(t, cfg)
		adm := &running{base: "http://" + adminAddr}
		waitAnswers(t, adm.base+"/metrics")
		isProxy := func(r route.Route) bool { return r.Module == "proxy" }
		t.Run("client listener", func(t *testing.T) {
			check(t, gw, append(routed(routes, isProxy), refusals...))
		})
		t.Run("admin listener", func(t *testing.T) {
			check(t, adm, append(routed(routes, func(r route.Route) bool { return !isProxy(r) }), refusals...))
		})
	})
}

// waitAnswers waits until url answers at all, as a listener opened after
// the first does once it is up.
func waitAnswers(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readmeEndpointPath is a path in the first column of the README's
// endpoint table, with its method when the row names one.
var readmeEndpointPath = regexp.MustCompile("`(?:(GET|POST|DELETE) )?(/[^` ]+)`")

// TestReadmeEndpointsAreRoutes checks the README's endpoint table against
// the binary's table: every path it names (a "{id}" filled in, a "…"
// ending read as a prefix) is a route, with the method it names.
func TestReadmeEndpointsAreRoutes(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Endpoints\n")
	if !ok {
		t.Fatal("README has no Endpoints section")
	}
	section, _, _ = strings.Cut(section, "\n#")
	routes := gatewayRoutes(t, gatewayConfig(t, t.TempDir(), ""))
	checked := 0
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		for _, m := range readmeEndpointPath.FindAllStringSubmatch(cells[1], -1) {
			method, path := m[1], m[2]
			if path == "/" {
				continue // "(and with a trailing `/`)"
			}
			checked++
			prefix, isPrefix := strings.CutSuffix(path, "…")
			if !readmeRouteExists(routes, method, samplePath(prefix), isPrefix) {
				t.Errorf("the README's endpoint table names %s %s, which no route serves", method, path)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d README paths; the endpoint table was not read", checked)
	}
}

func readmeRouteExists(routes []route.Route, method, path string, isPrefix bool) bool {
	for _, r := range routes {
		if method != "" && r.Method != "" && r.Method != method {
			continue
		}
		if isPrefix && strings.HasPrefix(samplePath(r.Pattern), path) {
			return true
		}
		if route.Match(r.Pattern, path) {
			return true
		}
	}
	return false
}

// TestOnFirstRequestBuildsOnce checks that the handler is built on the
// first request, not before, and once however many follow.
func TestOnFirstRequestBuildsOnce(t *testing.T) {
	built, served := 0, 0
	h := onFirstRequest(func() fasthttp.RequestHandler {
		built++
		return func(*fasthttp.RequestCtx) { served++ }
	})
	if built != 0 {
		t.Fatalf("built %d times before any request", built)
	}
	for range 3 {
		h(&fasthttp.RequestCtx{})
	}
	if built != 1 || served != 3 {
		t.Fatalf("after 3 requests: built %d times, served %d; want 1 and 3", built, served)
	}
}

// TestDashboardOnFirstRequestServesAsUI compares the dashboard ownRoutes
// serves, built on its first request, with ui.Handler built at once.
func TestDashboardOnFirstRequestServesAsUI(t *testing.T) {
	lazy := onFirstRequest(ui.Handler)
	eager := ui.Handler()
	for _, tc := range []struct{ method, path string }{
		{"GET", "/ui"}, {"GET", "/ui/"}, {"GET", "/ui/app.css"}, {"HEAD", "/ui/app.js"},
		{"GET", "/ui/vendor/chart.umd.min.js"}, {"GET", "/ui/missing.js"}, {"POST", "/ui/"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			serve := func(h fasthttp.RequestHandler) *fasthttp.Response {
				var ctx fasthttp.RequestCtx
				ctx.Request.Header.SetMethod(tc.method)
				ctx.Request.SetRequestURI(tc.path)
				h(&ctx)
				var resp fasthttp.Response
				ctx.Response.CopyTo(&resp)
				return &resp
			}
			got, want := serve(lazy), serve(eager)
			if got.StatusCode() != want.StatusCode() || !bytes.Equal(got.Body(), want.Body()) ||
				got.Header.String() != want.Header.String() {
				t.Errorf("got %d %q (%d bytes), want %d %q (%d bytes)", got.StatusCode(), got.Header.String(), len(got.Body()),
					want.StatusCode(), want.Header.String(), len(want.Body()))
			}
			if tc.method == "GET" && tc.path == "/ui/" && (got.StatusCode() != fasthttp.StatusOK || len(got.Body()) == 0) {
				t.Errorf("/ui/: %d with %d bytes, want the page", got.StatusCode(), len(got.Body()))
			}
		})
	}
}
