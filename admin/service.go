// Package admin serves tollgate's service API (projects, ops, evaluation
// runs, calls and trace usage in the W&B Weave wire) and the usage API: it
// parses requests and renders answers. The domain it serves, with the
// contracts of the store behind it, is in packages trace and weave.
package admin

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/route"
	"github.com/tollgate-dev/tollgate/trace"
	"github.com/tollgate-dev/tollgate/weave"
)

// Options configures a Service.
type Options struct {
	// Keys authenticates requests.
	Keys *auth.Keyring
	// Store persists projects, ops and calls.
	Store trace.Store
	// Pricing holds the per-model prices /trace/usage uses with
	// include_costs, by public model id.
	Pricing map[string]config.Pricing
	// CurrentPricing, when set, is asked for those prices at each request
	// instead of Pricing, so that a configuration reload changes them.
	CurrentPricing func() map[string]config.Pricing
	// Log receives server errors; nil means no logging.
	Log *zap.Logger
	// MaxJSONDepth bounds the nesting of request bodies, as
	// server.max_json_depth does; zero means 64 (see bounds.go).
	MaxJSONDepth int
	// Weave persists objects, tables, files, feedback and prices; nil
	// means Store, which must then implement weave.Store.
	Weave weave.Store
	// MaxFileBytes bounds a file of /file/create, as
	// traces.max_file_bytes does; zero means 32 MiB.
	MaxFileBytes int64
	// MaxBodyBytes bounds a request body once decompressed (a gzip body
	// of /otel/v1/traces), as server.max_body_bytes bounds it on the
	// wire; zero means 4 MiB.
	MaxBodyBytes int
}

// Service serves the service API.
type Service struct {
	keys    *auth.Keyring
	store   trace.Store
	pricing func() map[string]config.Pricing
	log     *zap.Logger
	bounds  bodyBounds

	// weave and maxFileBytes serve the objects, tables, files, feedback
	// and prices routes.
	weave        weave.Store
	maxFileBytes int64
	// maxBodyBytes bounds a body once decompressed (otel.go).
	maxBodyBytes int
}

// New returns a Service.
func New(opts Options) *Service {
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	ws := opts.Weave
	if ws == nil {
		ws, _ = opts.Store.(weave.Store)
	}
	maxFile := opts.MaxFileBytes
	if maxFile <= 0 {
		maxFile = defaultMaxFileBytes
	}
	maxBody := opts.MaxBodyBytes
	if maxBody <= 0 {
		maxBody = defaultMaxBodyBytes
	}
	pricing := opts.CurrentPricing
	if pricing == nil {
		pricing = func() map[string]config.Pricing { return opts.Pricing }
	}
	s := &Service{keys: opts.Keys, store: opts.Store, pricing: pricing, log: log,
		bounds: newBodyBounds(opts.MaxJSONDepth), weave: ws, maxFileBytes: maxFile, maxBodyBytes: maxBody}
	return s
}

// handler serves one route once the caller is authenticated. For the /v2/
// routes the entity of the path is already authorized.
type handler func(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, p pathParams) *apiError

// pathParams are the parameters of a /v2/{entity}/{project}/... path.
type pathParams struct {
	entity, project string
	// id is the op's object id or the evaluation run's id.
	id string
}

// handlers are the handlers of one path by method.
type handlers struct {
	get, post, del handler
	// ownBody is set for a route whose handler decodes its body itself
	// (protobuf, gzip) and checks the bounds of what it decoded.
	ownBody bool
}

// serve is the route.Handler of h: it authenticates the caller, checks
// that its key may act for the path's entity and that the body is within
// bounds, and calls h.
func (s *Service) serve(h handler, ownBody bool) route.Handler {
	return func(rc *fasthttp.RequestCtx, rp route.Params) {
		p := pathParams{entity: string(rp.Get("entity")), project: string(rp.Get("project")), id: string(rp.Get("id"))}
		key := s.authenticate(rc)
		if key == nil {
			s.writeError(rc, unauthorized())
			return
		}
		if p.entity != "" && !key.AllowsTeam(p.entity) {
			s.writeError(rc, forbidden(p.entity))
			return
		}
		if e := s.bounds.check(rc, p, ownBody); e != nil {
			s.writeError(rc, e)
			return
		}
		// The store gets a context of its own rather than the RequestCtx:
		// database/sql and the SQLite driver watch a context from goroutines
		// that may outlive the handler, and fasthttp reuses a RequestCtx as
		// soon as the handler returns. Cancelling on return also releases them.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if e := s.call(h, ctx, rc, key, p); e != nil {
			s.writeError(rc, e)
		}
	}
}

// NotFound answers a path no route serves in the trace service's shape,
// FastAPI's.
func NotFound(rc *fasthttp.RequestCtx) {
	rc.Error(`{"detail":"Not Found"}`, fasthttp.StatusNotFound)
	rc.SetContentType("application/json")
}

// MethodNotAllowed answers a path served with other methods, named by
// allow, in the trace service's shape.
func MethodNotAllowed(rc *fasthttp.RequestCtx, allow string) {
	rc.Response.Header.Set(fasthttp.HeaderAllow, allow)
	writeJSON(rc, fasthttp.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
}

// routes is the service's routing table, one entry per path with its
// handlers by method. A "{entity}" and "{project}" segment name the team
// and project of a /v2/ path, "{id}" the op or evaluation run.
func (s *Service) routes() []routeEntry {
	return []routeEntry{
		{"/service/projects_info", handlers{post: s.projectsInfo}},
		{"/health", handlers{get: s.health}},
		{"/server_info", handlers{get: s.serverInfo}},
		{"/obj/create", handlers{post: s.objCreate}},
		{"/obj/read", handlers{post: s.objRead}},
		{"/objs/query", handlers{post: s.objsQuery}},
		{"/obj/delete", handlers{post: s.objDelete}},
		{"/table/create", handlers{post: s.tableCreate}},
		{"/table/update", handlers{post: s.tableUpdate}},
		{"/table/query", handlers{post: s.tableQuery}},
		{"/table/query_stats", handlers{post: s.tableQueryStats}},
		{"/table/query_stream", handlers{post: s.tableQueryStream}},
		{"/table/query_stats_batch", handlers{post: s.tableQueryStatsBatch}},
		{"/refs/read_batch", handlers{post: s.refsReadBatch}},
		{"/file/create", handlers{post: s.fileCreate}},
		{"/file/content", handlers{post: s.fileContent}},
		{"/feedback/create", handlers{post: s.feedbackCreate}},
		{"/feedback/query", handlers{post: s.feedbackQuery}},
		{"/feedback/purge", handlers{post: s.feedbackPurge}},
		{"/feedback/replace", handlers{post: s.feedbackReplace}},
		{"/cost/create", handlers{post: s.costCreate}},
		{"/cost/query", handlers{post: s.costQuery}},
		{"/cost/purge", handlers{post: s.costPurge}},
		{"/call/start", handlers{post: s.callStart}},
		{"/call/end", handlers{post: s.callEnd}},
		{"/call/upsert_batch", handlers{post: s.callUpsertBatch}},
		{"/call/read", handlers{post: s.callRead}},
		{"/calls/stream_query", handlers{post: s.callsStreamQuery}},
		{"/call/update", handlers{post: s.callUpdate}},
		{"/calls/delete", handlers{post: s.callsDelete}},
		{"/calls/query_stats", handlers{post: s.callsQueryStats}},
		{"/calls/usage", handlers{post: s.serveCallsUsage}},
		{"/trace/usage", handlers{post: s.serveTraceUsage}},
		{"/otel/v1/traces", handlers{post: s.otelTraces, ownBody: true}},
		{"/v2/{entity}/{project}/ops", handlers{get: s.listOps, post: s.createOp}},
		{"/v2/{entity}/{project}/ops/{id}", handlers{del: s.deleteOp}},
		{"/v2/{entity}/{project}/evaluation_runs", handlers{get: s.listEvaluationRuns, post: s.createEvaluationRun, del: s.deleteEvaluationRuns}},
		{"/v2/{entity}/{project}/evaluation_runs/{id}", handlers{get: s.readEvaluationRun}},
		{"/v2/{entity}/{project}/evaluation_runs/{id}/finish", handlers{post: s.finishEvaluationRun}},
	}
}

// routeEntry is a path pattern of the routing table (see route.Route)
// and its handlers.
type routeEntry struct {
	pattern string
	handlers
}

// Routes are the service's rows of the binary's table, one per path and
// method, with their handlers. A single trailing slash is ignored, as
// clients built on FastAPI's redirects expect.
func (s *Service) Routes() []route.Route {
	var out []route.Route
	for _, e := range s.routes() {
		for _, m := range []struct {
			method string
			h      handler
		}{{fasthttp.MethodGet, e.get}, {fasthttp.MethodPost, e.post}, {fasthttp.MethodDelete, e.del}} {
			if m.h != nil {
				out = append(out, route.Route{Method: m.method, Pattern: e.pattern, Module: "trace service",
					Handler: s.serve(m.h, e.ownBody), OrSlash: true})
			}
		}
	}
	return out
}

// authenticate returns the key of the request's Authorization header
// (Basic with the key as password, or Bearer), or nil.
func (s *Service) authenticate(ctx *fasthttp.RequestCtx) *auth.Key {
	if s.keys == nil {
		return nil
	}
	header := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	var buf [128]byte
	return s.keys.Lookup(auth.Secret(buf[:0], header))
}

// wantsJSONArray reports whether the client asked for application/json
// (and not JSON Lines) in its Accept header.
func wantsJSONArray(ctx *fasthttp.RequestCtx) bool {
	for _, part := range strings.Split(string(ctx.Request.Header.Peek(fasthttp.HeaderAccept)), ",") {
		mediaType, _, _ := strings.Cut(part, ";")
		if strings.EqualFold(strings.TrimSpace(mediaType), "application/json") {
			return true
		}
	}
	return false
}

// writeList answers with items as JSON Lines (application/jsonl), as
// Weave's v2 listings stream them, or as one JSON array when the client's
// Accept header asks for application/json.
func writeList[T any](rc *fasthttp.RequestCtx, items []T) {
	if wantsJSONArray(rc) {
		if items == nil {
			items = []T{}
		}
		writeJSON(rc, fasthttp.StatusOK, items)
		return
	}
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetContentType("application/jsonl")
	enc := json.NewEncoder(rc)
	enc.SetEscapeHTML(false)
	for _, it := range items {
		if err := enc.Encode(it); err != nil {
			return
		}
	}
}

// formatTime renders a timestamp the Weave way: RFC 3339 in UTC with
// microseconds.
func formatTime(t time.Time) string { return t.UTC().Format(trace.TimeLayout) }
