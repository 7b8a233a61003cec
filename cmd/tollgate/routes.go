package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"slices"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/admin"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/route"
	"github.com/tollgate-dev/tollgate/proxy"
	"github.com/tollgate-dev/tollgate/ui"
)

// The binary's routes come from three places: the proxy's (completions,
// responses, models, health), the ones this package serves itself (the
// usage API, budgets, the Admin API, /metrics, the dashboard), and the
// trace service's. routeTable lists them all, once, with their handlers;
// newRouter dispatches over them (or, with admin_listen, over each
// listener's part of them).

// ownRoutes are the routes served beside the proxy's and the trace
// service's. metrics is guarded as server.metrics_auth says (see
// guardMetrics).
func ownRoutes(cfg *config.Config, keys *auth.Keyring, usageAPI *admin.UsageAPI, budgetAPI *admin.BudgetAPI,
	orgAPI *admin.OrgAPI, costsAPI *admin.CostsAPI, metrics fasthttp.RequestHandler) []route.Route {
	metrics = guardMetrics(cfg.Server, keys, metrics)
	// The dashboard's files are read into the heap on its first request
	// rather than here: a gateway whose dashboard nobody opens would
	// otherwise hold them for its life, and at GOGC=100 the heap may grow
	// by as much again before each collection.
	dashboard := plain(onFirstRequest(ui.Handler))
	org := plain(orgAPI.Serve)
	return []route.Route{
		{Pattern: "/v1/organization/usage/completions", Module: "usage API", Handler: plain(usageAPI.ServeUsage)},
		{Pattern: "/v1/organization/usage/embeddings", Module: "usage API", Handler: plain(usageAPI.ServeEmbeddingsUsage)},
		{Pattern: admin.OrgCostsPath, Module: "usage API", Handler: plain(costsAPI.Serve)},
		{Pattern: "/v1/tollgate/budgets", Module: "budgets", Handler: plain(budgetAPI.ServeBudgets)},
		{Pattern: admin.OrgProjectsPath, Module: "admin API", Handler: org},
		{Pattern: admin.OrgProjectsPath + "/{path...}", Module: "admin API", Handler: org},
		{Pattern: admin.OrgAuditLogsPath, Module: "admin API", Handler: org},
		{Pattern: "/metrics", Module: "metrics", Handler: plain(metrics)},
		{Pattern: "/ui", Module: "dashboard", Handler: dashboard},
		{Pattern: ui.Prefix, Module: "dashboard", Handler: dashboard},
		{Pattern: ui.Prefix + "{path...}", Module: "dashboard", Handler: dashboard},
	}
}

// plain adapts a handler that reads no path parameters.
func plain(h fasthttp.RequestHandler) route.Handler {
	return func(ctx *fasthttp.RequestCtx, _ route.Params) { h(ctx) }
}

// guardMetrics returns the /metrics handler server.metrics_auth asks for.
// Its series name every team and project, so by default it answers only an
// admin key or the metrics token, sent as "Bearer <secret>" (or Basic, as
// every key may be); metrics_auth: public answers anyone.
func guardMetrics(s config.Server, keys *auth.Keyring, metrics fasthttp.RequestHandler) fasthttp.RequestHandler {
	if s.MetricsAuth == config.MetricsAuthPublic {
		return metrics
	}
	// The token is compared by digest in constant time, as keys are.
	token := sha256.Sum256([]byte(s.MetricsToken))
	return func(ctx *fasthttp.RequestCtx) {
		secret := auth.Secret(nil, ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
		if len(secret) > 0 && s.MetricsToken != "" {
			if d := sha256.Sum256(secret); subtle.ConstantTimeCompare(d[:], token[:]) == 1 {
				metrics(ctx)
				return
			}
		}
		switch key := keys.Lookup(secret); {
		case key == nil:
			ctx.Error(`{"detail":"Not authenticated: /metrics needs an admin key or server.metrics_token"}`, fasthttp.StatusUnauthorized)
			ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="tollgate metrics"`)
		case !key.Admin:
			ctx.Error(`{"detail":"/metrics needs an admin key or server.metrics_token"}`, fasthttp.StatusForbidden)
		default:
			metrics(ctx)
			return
		}
		ctx.SetContentType("application/json")
	}
}

// onFirstRequest returns a handler that builds its handler with
// newHandler on its first request, and serves every request with it.
func onFirstRequest(newHandler func() fasthttp.RequestHandler) fasthttp.RequestHandler {
	handler := sync.OnceValue(newHandler)
	return func(ctx *fasthttp.RequestCtx) { handler()(ctx) }
}

// routeTable is every route the binary serves, in one table: the proxy's
// (chat completions first), then own, then the trace service's.
func routeTable(proxyRoutes, own, traceRoutes []route.Route) []route.Route {
	return slices.Concat(proxyRoutes, own, traceRoutes)
}

// newRouter dispatches over routes, refusing a path in its client's wire
// shape: OpenAI's error JSON under /v1/, which OpenAI clients parse, and
// the trace service's (FastAPI's) everywhere else.
func newRouter(routes []route.Route) (*route.Router, error) {
	return route.New(routes, func(ctx *fasthttp.RequestCtx) {
		if isOpenAIPath(ctx.Path()) {
			proxy.NotFound(ctx)
			return
		}
		admin.NotFound(ctx)
	}, func(ctx *fasthttp.RequestCtx, allow string) {
		if isOpenAIPath(ctx.Path()) {
			proxy.MethodNotAllowed(ctx, allow)
			return
		}
		admin.MethodNotAllowed(ctx, allow)
	})
}

func isOpenAIPath(path []byte) bool { return bytes.HasPrefix(path, []byte("/v1/")) }
