package main

import (
	"crypto/sha256"
	"crypto/subtle"
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
// usage API, budgets, /metrics, the dashboard), and the trace service's.
// routeTable lists them all, once; each part dispatches over its own rows.

// servedRoute is a route this package serves, with its handler.
type servedRoute struct {
	route.Route
	serve fasthttp.RequestHandler
}

// ownRoutes are the routes served beside the proxy's and the trace
// service's. metrics is guarded as server.metrics_auth says (see
// guardMetrics).
func ownRoutes(cfg *config.Config, keys *auth.Keyring, usageAPI *admin.UsageAPI, budgetAPI *admin.BudgetAPI,
	orgAPI *admin.OrgAPI, metrics fasthttp.RequestHandler) []servedRoute {
	metrics = guardMetrics(cfg.Server, keys, metrics)
	// The dashboard's files (about 290 KB) are read into the heap on its
	// first request rather than here: a gateway whose dashboard nobody
	// opens would otherwise hold them for its life, and at GOGC=100 the
	// heap may grow by as much again before each collection.
	dashboard := onFirstRequest(ui.Handler)
	return []servedRoute{
		{route.Route{Pattern: "/v1/organization/usage/completions", Module: "usage API"}, usageAPI.ServeUsage},
		{route.Route{Pattern: "/v1/organization/usage/embeddings", Module: "usage API"}, usageAPI.ServeEmbeddingsUsage},
		{route.Route{Pattern: "/v1/tollgate/budgets", Module: "budgets"}, budgetAPI.ServeBudgets},
		{route.Route{Pattern: admin.OrgProjectsPath, Module: "admin API"}, orgAPI.Serve},
		{route.Route{Pattern: admin.OrgProjectsPath + "/{path...}", Module: "admin API"}, orgAPI.Serve},
		{route.Route{Pattern: admin.OrgAuditLogsPath, Module: "admin API"}, orgAPI.Serve},
		{route.Route{Pattern: "/metrics", Module: "metrics"}, metrics},
		{route.Route{Pattern: "/ui", Module: "dashboard"}, dashboard},
		{route.Route{Pattern: ui.Prefix, Module: "dashboard"}, dashboard},
		{route.Route{Pattern: ui.Prefix + "{path...}", Module: "dashboard"}, dashboard},
	}
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

// serveOwnAndTraces serves own's routes, then the trace service's, and
// answers 404 for any other path: what the proxy hands on (Options.Next),
// and the whole admin listener when admin_listen is set.
func serveOwnAndTraces(own []servedRoute, svc *admin.Service) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		path := string(ctx.Path())
		for i := range own {
			if _, ok := route.Match(own[i].Pattern, path); ok {
				own[i].serve(ctx)
				return
			}
		}
		if !svc.Handle(ctx) {
			ctx.Error(`{"detail":"Not Found"}`, fasthttp.StatusNotFound)
			ctx.SetContentType("application/json")
		}
	}
}

// routeTable is every route the binary serves, in one table: the proxy's,
// then own, then the trace service's.
func routeTable(p *proxy.Server, own []servedRoute, svc *admin.Service) []route.Route {
	table := p.Routes()
	for _, r := range own {
		table = append(table, r.Route)
	}
	return append(table, svc.Routes()...)
}
