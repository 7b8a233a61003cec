package route

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// served records what a test table's handlers were called with.
type served struct {
	pattern string
	params  map[string]string
}

// testRouter builds a Router over rows of patterns, each recording into
// got; its refusals write "404" and "405 <allow>".
func testRouter(t *testing.T, got *served, rows ...Route) *Router {
	t.Helper()
	for i := range rows {
		pattern := rows[i].Pattern
		rows[i].Handler = func(_ *fasthttp.RequestCtx, p Params) {
			got.pattern = pattern
			got.params = map[string]string{}
			for i, n := range p.names {
				got.params[n] = string(p.values[i])
			}
		}
	}
	r, err := New(rows, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(404) },
		func(ctx *fasthttp.RequestCtx, allow string) {
			ctx.SetStatusCode(405)
			ctx.SetBodyString(allow)
		})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func serve(r *Router, method, path string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(path)
	r.Serve(&ctx)
	return &ctx
}

func TestRouterMatches(t *testing.T) {
	var got served
	r := testRouter(t, &got,
		Route{Method: "GET", Pattern: "/health", OrSlash: true},
		Route{Method: "POST", Pattern: "/v1/chat/completions"},
		Route{Method: "GET", Pattern: "/v2/{entity}/{project}/ops"},
		Route{Method: "POST", Pattern: "/v2/{entity}/{project}/ops"},
		Route{Method: "POST", Pattern: "/v2/{entity}/{project}/evaluation_runs/{id}/finish"},
		Route{Method: "GET", Pattern: "/v1/models/{id...}"},
		Route{Pattern: "/ui/{path...}"},
	)
	tests := []struct {
		method, path string
		pattern      string // "" for a refusal
		params       string // "k=v,..." sorted as the pattern names them
		refusal      string // "404" or "405 <allow>"
	}{
		{"GET", "/health", "/health", "", ""},
		{"GET", "/health/", "/health", "", ""},
		{"POST", "/v1/chat/completions", "/v1/chat/completions", "", ""},
		{"POST", "/v1/chat/completions/", "", "", "404"},
		{"GET", "/v1/chat/completions", "", "", "405 POST"},
		{"GET", "/v2/acme/p/ops", "/v2/{entity}/{project}/ops", "entity=acme,project=p", ""},
		{"DELETE", "/v2/acme/p/ops", "", "", "405 GET, POST"},
		{"GET", "/v2/acme//ops", "", "", "404"},
		{"GET", "/v2/acme/p/ops/x", "", "", "404"},
		{"POST", "/v2/a/b/evaluation_runs/r1/finish", "/v2/{entity}/{project}/evaluation_runs/{id}/finish", "entity=a,project=b,id=r1", ""},
		{"POST", "/v2/a/b/evaluation_runs/r1/other", "", "", "404"},
		{"POST", "/v2/a/b/evaluation_runs//finish", "", "", "404"},
		{"GET", "/v1/models/org/model", "/v1/models/{id...}", "id=org/model", ""},
		{"GET", "/v1/models/", "", "", "404"},
		{"PUT", "/ui/static/app.js", "/ui/{path...}", "path=static/app.js", ""},
		{"GET", "/nope", "", "", "404"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			got = served{}
			ctx := serve(r, tt.method, tt.path)
			if tt.refusal != "" {
				refusal := refusalOf(ctx)
				if got.pattern != "" || refusal != tt.refusal {
					t.Fatalf("served %q, refused %q; want the refusal %q", got.pattern, refusal, tt.refusal)
				}
				return
			}
			var params []string
			for _, kv := range strings.Split(tt.params, ",") {
				if k, v, ok := strings.Cut(kv, "="); ok && got.params[k] != v {
					t.Errorf("param %s = %q, want %q", k, got.params[k], v)
				}
				params = append(params, kv)
			}
			if got.pattern != tt.pattern {
				t.Fatalf("served %q (%d), want %q", got.pattern, ctx.Response.StatusCode(), tt.pattern)
			}
			if tt.params != "" && len(got.params) != len(params) {
				t.Errorf("params %v, want %s", got.params, tt.params)
			}
		})
	}
}

// refusalOf renders a refusal: its status, and for a 405 the Allow list the
// router handed it.
func refusalOf(ctx *fasthttp.RequestCtx) string {
	s := ctx.Response.StatusCode()
	if s == 405 {
		return "405 " + string(ctx.Response.Body())
	}
	if s == 404 {
		return "404"
	}
	return ""
}

func TestNewRefusesADuplicate(t *testing.T) {
	h := func(*fasthttp.RequestCtx, Params) {}
	for _, tt := range []struct {
		name string
		rows []Route
		want string
	}{
		{"same method and pattern", []Route{{Method: "GET", Pattern: "/a", Module: "x", Handler: h}, {Method: "GET", Pattern: "/a", Module: "y", Handler: h}}, "listed twice"},
		{"both any method", []Route{{Pattern: "/a", Handler: h}, {Pattern: "/a", Handler: h}}, "listed twice"},
		{"no handler", []Route{{Pattern: "/a"}}, "no handler"},
		{"rest not last", []Route{{Pattern: "/a/{p...}/b", Handler: h}}, "last segment"},
		{"relative", []Route{{Pattern: "a", Handler: h}}, "start with /"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.rows, nil, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want an error about %q", err, tt.want)
			}
		})
	}
	if _, err := New([]Route{{Method: "GET", Pattern: "/a", Handler: h}, {Method: "POST", Pattern: "/a", Handler: h}}, nil, nil); err != nil {
		t.Fatalf("two methods of one path: %v", err)
	}
}

// TestServeDoesNotAllocate guards the hot path: routing the first row and
// a row with parameters allocates nothing.
func TestServeDoesNotAllocate(t *testing.T) {
	calls := 0
	h := func(_ *fasthttp.RequestCtx, p Params) { calls += len(p.Get("id")) }
	r, err := New([]Route{
		{Method: "POST", Pattern: "/v1/chat/completions", Handler: h},
		{Method: "GET", Pattern: "/v1/responses/{id}", Handler: h},
		{Method: "GET", Pattern: "/v1/models/{id...}", Handler: h},
	}, func(*fasthttp.RequestCtx) {}, func(*fasthttp.RequestCtx, string) {})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path string }{
		{"POST", "/v1/chat/completions"}, {"GET", "/v1/responses/resp_1"}, {"GET", "/v1/models/org/m"},
	} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(tc.method)
		ctx.Request.SetRequestURI(tc.path)
		ctx.Path()
		if n := testing.AllocsPerRun(100, func() { r.Serve(&ctx) }); n != 0 {
			t.Errorf("%s %s: %v allocations per dispatch", tc.method, tc.path, n)
		}
	}
	if calls == 0 {
		t.Fatal("no handler saw its id")
	}
}

func TestMatch(t *testing.T) {
	for _, tt := range []struct {
		pattern, path string
		ok            bool
	}{
		{"/health", "/health", true},
		{"/health", "/health/", false},
		{"/v1/models/{id...}", "/v1/models/org/model", true},
		{"/ui/{path...}", "/ui/", false},
	} {
		if got := Match(tt.pattern, tt.path); got != tt.ok {
			t.Errorf("Match(%q, %q) = %v, want %v", tt.pattern, tt.path, got, tt.ok)
		}
	}
}
