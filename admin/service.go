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
	pricing := opts.CurrentPricing
	if pricing == nil {
		pricing = func() map[string]config.Pricing { return opts.Pricing }
	}
	return &Service{keys: opts.Keys, store: opts.Store, pricing: pricing, log: log,
		bounds: newBodyBounds(opts.MaxJSONDepth), weave: ws, maxFileBytes: maxFile}
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

// route is the handlers of one path by method.
type route struct {
	get, post, del handler
}

func (r route) handler(method []byte) (handler, bool) {
	var h handler
	switch string(method) {
	case fasthttp.MethodGet:
		h = r.get
	case fasthttp.MethodPost:
		h = r.post
	case fasthttp.MethodDelete:
		h = r.del
	}
	return h, h != nil
}

func (r route) allow() string {
	var m []string
	if r.get != nil {
		m = append(m, fasthttp.MethodGet)
	}
	if r.post != nil {
		m = append(m, fasthttp.MethodPost)
	}
	if r.del != nil {
		m = append(m, fasthttp.MethodDelete)
	}
	return strings.Join(m, ", ")
}

// Handle serves the service API. It returns false when the path is not one
// of its routes, so the caller can try others (the usage API, /metrics) or
// answer 404.
func (s *Service) Handle(rc *fasthttp.RequestCtx) bool {
	r, p, ok := s.match(string(rc.Path()))
	if !ok {
		return false
	}
	h, ok := r.handler(rc.Method())
	if !ok {
		rc.Response.Header.Set("Allow", r.allow())
		writeJSON(rc, fasthttp.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
		return true
	}
	key := s.authenticate(rc)
	if key == nil {
		s.writeError(rc, unauthorized())
		return true
	}
	if p.entity != "" && !key.AllowsTeam(p.entity) {
		s.writeError(rc, forbidden(p.entity))
		return true
	}
	if e := s.bounds.check(rc, p); e != nil {
		s.writeError(rc, e)
		return true
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
	return true
}

// match finds the route of path. A single trailing slash is ignored, as
// clients built on FastAPI's redirects expect.
func (s *Service) match(path string) (route, pathParams, bool) {
	if len(path) > 1 {
		path = strings.TrimSuffix(path, "/")
	}
	switch path {
	case "/service/projects_info":
		return route{post: s.projectsInfo}, pathParams{}, true
	case "/health":
		return route{get: s.health}, pathParams{}, true
	case "/server_info":
		return route{get: s.serverInfo}, pathParams{}, true
	case "/obj/create":
		return route{post: s.objCreate}, pathParams{}, true
	case "/obj/read":
		return route{post: s.objRead}, pathParams{}, true
	case "/objs/query":
		return route{post: s.objsQuery}, pathParams{}, true
	case "/obj/delete":
		return route{post: s.objDelete}, pathParams{}, true
	case "/table/create":
		return route{post: s.tableCreate}, pathParams{}, true
	case "/table/update":
		return route{post: s.tableUpdate}, pathParams{}, true
	case "/table/query":
		return route{post: s.tableQuery}, pathParams{}, true
	case "/table/query_stats":
		return route{post: s.tableQueryStats}, pathParams{}, true
	case "/table/query_stream":
		return route{post: s.tableQueryStream}, pathParams{}, true
	case "/table/query_stats_batch":
		return route{post: s.tableQueryStatsBatch}, pathParams{}, true
	case "/refs/read_batch":
		return route{post: s.refsReadBatch}, pathParams{}, true
	case "/file/create":
		return route{post: s.fileCreate}, pathParams{}, true
	case "/file/content":
		return route{post: s.fileContent}, pathParams{}, true
	case "/feedback/create":
		return route{post: s.feedbackCreate}, pathParams{}, true
	case "/feedback/query":
		return route{post: s.feedbackQuery}, pathParams{}, true
	case "/feedback/purge":
		return route{post: s.feedbackPurge}, pathParams{}, true
	case "/feedback/replace":
		return route{post: s.feedbackReplace}, pathParams{}, true
	case "/cost/create":
		return route{post: s.costCreate}, pathParams{}, true
	case "/cost/query":
		return route{post: s.costQuery}, pathParams{}, true
	case "/cost/purge":
		return route{post: s.costPurge}, pathParams{}, true
	case "/call/start":
		return route{post: s.callStart}, pathParams{}, true
	case "/call/end":
		return route{post: s.callEnd}, pathParams{}, true
	case "/call/upsert_batch":
		return route{post: s.callUpsertBatch}, pathParams{}, true
	case "/call/read":
		return route{post: s.callRead}, pathParams{}, true
	case "/calls/stream_query":
		return route{post: s.callsStreamQuery}, pathParams{}, true
	case "/call/update":
		return route{post: s.callUpdate}, pathParams{}, true
	case "/calls/delete":
		return route{post: s.callsDelete}, pathParams{}, true
	case "/calls/query_stats":
		return route{post: s.callsQueryStats}, pathParams{}, true
	case "/calls/usage":
		return route{post: s.serveCallsUsage}, pathParams{}, true
	case "/trace/usage":
		return route{post: s.serveTraceUsage}, pathParams{}, true
	}
	rest, ok := strings.CutPrefix(path, "/v2/")
	if !ok {
		return route{}, pathParams{}, false
	}
	segs := strings.Split(rest, "/")
	if len(segs) < 3 || segs[0] == "" || segs[1] == "" {
		return route{}, pathParams{}, false
	}
	p := pathParams{entity: segs[0], project: segs[1]}
	switch {
	case len(segs) == 3 && segs[2] == "ops":
		return route{get: s.listOps, post: s.createOp}, p, true
	case len(segs) == 4 && segs[2] == "ops" && segs[3] != "":
		p.id = segs[3]
		return route{del: s.deleteOp}, p, true
	case len(segs) == 3 && segs[2] == "evaluation_runs":
		return route{get: s.listEvaluationRuns, post: s.createEvaluationRun, del: s.deleteEvaluationRuns}, p, true
	case len(segs) == 4 && segs[2] == "evaluation_runs" && segs[3] != "":
		p.id = segs[3]
		return route{get: s.readEvaluationRun}, p, true
	case len(segs) == 5 && segs[2] == "evaluation_runs" && segs[3] != "" && segs[4] == "finish":
		p.id = segs[3]
		return route{post: s.finishEvaluationRun}, p, true
	}
	return route{}, pathParams{}, false
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
