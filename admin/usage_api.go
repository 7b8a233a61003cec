package admin

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
)

// UsageStore is what the usage API reads usage from.
type UsageStore interface {
	// UsageBuckets sums the usage q selects, one row per bucket and group,
	// ordered by bucket. Buckets with no usage have no row.
	UsageBuckets(ctx context.Context, q accounting.UsageQuery) ([]accounting.UsageRow, error)
}

// usageKind is one path of the usage API: what it counts unless
// endpoints= says otherwise, and the shape of its results.
type usageKind struct {
	// object names its results, as OpenAI does.
	object string
	// endpoints are counted by default: what OpenAI counts on that path.
	endpoints []string
	// outputs: results carry output_tokens and input_cached_tokens
	// (completions do; embeddings have no output).
	outputs bool
}

// completionsUsage is GET /v1/organization/usage/completions: OpenAI
// counts every text generation there, chat completions, legacy
// completions and Responses API responses alike; the gateway counts
// Anthropic's Messages API there too.
func completionsUsage() usageKind {
	return usageKind{
		object:    "organization.usage.completions.result",
		endpoints: []string{"chat.completions", "completions", "responses", "messages"},
		outputs:   true,
	}
}

// embeddingsUsage is GET /v1/organization/usage/embeddings.
func embeddingsUsage() usageKind {
	return usageKind{object: "organization.usage.embeddings.result", endpoints: []string{"embeddings"}}
}

// UsageAPI serves GET /v1/organization/usage/completions and
// /v1/organization/usage/embeddings in the shape of OpenAI's organization
// usage API, so that dashboards built for it work unchanged. An admin key
// reads every team; any other key its own teams.
//
// Three parameters extend OpenAI's: group_by=endpoint splits the results
// by endpoint (each then names it in "endpoint"), group_by=status by
// outcome (each then names one of UsageStatuses in "status" and counts
// every request of that outcome in "num_requests", the refusals that
// reached no model included), and
// endpoints= (a list, like models=) chooses which endpoints' usage is
// counted instead of the path's own. Without them an answer has exactly
// OpenAI's shape.
type UsageAPI struct {
	store UsageStore
	keys  *auth.Keyring
}

// NewUsageAPI returns the usage API reading st and authenticating with keys.
func NewUsageAPI(st UsageStore, keys *auth.Keyring) *UsageAPI {
	return &UsageAPI{store: st, keys: keys}
}

// usageWidths are the bucket widths OpenAI supports, with the default and
// maximum number of buckets per page it allows for each.
var usageWidths = map[string]usageWidth{
	"1m": {time.Minute, 60, 1440},
	"1h": {time.Hour, 24, 168},
	"1d": {24 * time.Hour, 7, 31},
}

// usagePagePrefix starts every page cursor; the rest is opaque to clients.
const usagePagePrefix = "page_"

// usageError is a refused request, answered in the OpenAI error shape.
type usageError struct {
	status  int
	typ     string
	code    string // "" is null
	param   string // "" is null
	message string
}

func usageInvalid(param, message string) *usageError {
	return &usageError{status: fasthttp.StatusBadRequest, typ: "invalid_request_error", param: param, message: message}
}

// usageGetKey admits a GET request with a known API key, the prologue of
// the read-only usage and budget APIs. Otherwise it answers 405 or 401 and
// returns nil.
func usageGetKey(ctx *fasthttp.RequestCtx, keys *auth.Keyring) *auth.Key {
	if !ctx.IsGet() {
		ctx.Response.Header.Set("Allow", "GET")
		usageWriteError(ctx, &usageError{status: fasthttp.StatusMethodNotAllowed, typ: "invalid_request_error",
			message: "Method " + string(ctx.Method()) + " is not allowed; use GET."})
		return nil
	}
	key := keys.Lookup(auth.Secret(nil, ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)))
	if key == nil {
		usageWriteError(ctx, &usageError{status: fasthttp.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
			message: "Missing or invalid API key: send Authorization: Bearer KEY."})
	}
	return key
}

// ServeUsage answers GET /v1/organization/usage/completions.
func (a *UsageAPI) ServeUsage(ctx *fasthttp.RequestCtx) { a.serve(ctx, completionsUsage()) }

// ServeEmbeddingsUsage answers GET /v1/organization/usage/embeddings.
func (a *UsageAPI) ServeEmbeddingsUsage(ctx *fasthttp.RequestCtx) { a.serve(ctx, embeddingsUsage()) }

func (a *UsageAPI) serve(ctx *fasthttp.RequestCtx, kind usageKind) {
	key := usageGetKey(ctx, a.keys)
	if key == nil {
		return
	}
	req, uerr := parseUsageRequest(ctx.QueryArgs(), time.Now(), kind)
	if uerr != nil {
		usageWriteError(ctx, uerr)
		return
	}
	if !key.AllowsAnyTeam() {
		req.query.Teams = key.Teams()
		for _, p := range req.query.Projects {
			if !key.AllowsTeam(p.Team) {
				usageWriteError(ctx, &usageError{status: fasthttp.StatusForbidden, typ: "permission_denied", param: "project_ids",
					message: "The API key may not read the usage of team " + strconv.Quote(p.Team) + "."})
				return
			}
		}
	}
	var rows []accounting.UsageRow
	if req.query.Start.Before(req.query.End) {
		// The store gets a context of its own, not the RequestCtx: the SQL
		// driver may watch it from goroutines that outlive the handler, and
		// fasthttp reuses a RequestCtx once the handler returns.
		sctx, cancel := context.WithCancel(context.Background())
		var err error
		rows, err = a.store.UsageBuckets(sctx, req.query)
		cancel()
		if err != nil {
			// ctx.Logger goes to the server's logger; the client learns
			// nothing of the store's internals.
			ctx.Logger().Printf("usage api: read usage: %v", err)
			usageWriteError(ctx, &usageError{status: fasthttp.StatusInternalServerError, typ: "api_error",
				message: "The server had an error while reading usage."})
			return
		}
	}
	usageWriteJSON(ctx, fasthttp.StatusOK, req.page(rows))
}

// usageRequest is a validated request: the store query for its page, and
// what the page answer needs besides the rows.
type usageRequest struct {
	query   accounting.UsageQuery
	kind    usageKind
	hasMore bool
}

// parseUsageRequest validates the query parameters and works out the page:
// buckets are aligned to UTC multiples of their width (Anthropic's usage
// API documents the same snapping; OpenAI's examples show midnight-aligned
// days), every bucket that overlaps [start_time, end_time) is listed, and
// each sums exactly its own [start, end) range, so that buckets compare.
func parseUsageRequest(args *fasthttp.Args, now time.Time, kind usageKind) (*usageRequest, *usageError) {
	w, uerr := parseUsageWindow(args, now, usageWidths)
	if uerr != nil {
		return nil, uerr
	}
	q := accounting.UsageQuery{BucketWidth: w.width}
	for _, g := range usageList(args, "group_by") {
		switch g {
		case "project_id":
			q.GroupByProject = true
		case "model":
			q.GroupByModel = true
		case "api_key_id":
			q.GroupByKey = true
		case "endpoint":
			q.GroupByEndpoint = true
		case "status":
			q.GroupByStatus = true
		default:
			return nil, usageInvalid("group_by", "Invalid 'group_by' value "+strconv.Quote(g)+": want project_id, model, api_key_id, endpoint or status.")
		}
	}
	for _, id := range usageList(args, "project_ids") {
		team, project, found := strings.Cut(id, "/")
		if !found || team == "" || project == "" || strings.Contains(project, "/") {
			return nil, usageInvalid("project_ids", "Invalid 'project_ids' value "+strconv.Quote(id)+": want team/project.")
		}
		q.Projects = append(q.Projects, accounting.UsageProject{Team: team, Project: project})
	}
	q.Models = usageList(args, "models")
	q.Endpoints = kind.endpoints
	if endpoints := usageList(args, "endpoints"); len(endpoints) > 0 {
		known := accounting.UsageEndpoints()
		for _, e := range endpoints {
			if !slices.Contains(known, e) {
				return nil, usageInvalid("endpoints", "Invalid 'endpoints' value "+strconv.Quote(e)+": want "+strings.Join(known, ", ")+".")
			}
		}
		q.Endpoints = endpoints
	}

	q.Start, q.End = w.start, w.end
	return &usageRequest{query: q, kind: kind, hasMore: w.hasMore}, nil
}

// usageWidth is a bucket width a usage or costs path supports, with the
// default and maximum number of buckets per page it allows.
type usageWidth struct {
	width                  time.Duration
	defaultLimit, maxLimit int
}

// usageWindow is the page of buckets a request selects.
type usageWindow struct {
	width      time.Duration
	start, end time.Time
	hasMore    bool
}

// parseUsageWindow validates start_time, end_time, bucket_width (among
// widths, 1d by default), limit and page, and works out the page's
// buckets: aligned to UTC multiples of their width, every bucket that
// overlaps [start_time, end_time), limit of them from the page cursor.
func parseUsageWindow(args *fasthttp.Args, now time.Time, widths map[string]usageWidth) (usageWindow, *usageError) {
	startRaw := args.Peek("start_time")
	if len(startRaw) == 0 {
		return usageWindow{}, usageInvalid("start_time", "Missing required parameter: 'start_time' (unix seconds).")
	}
	start, err := strconv.ParseInt(string(startRaw), 10, 64)
	if err != nil || start < 0 {
		return usageWindow{}, usageInvalid("start_time", "Invalid 'start_time': want a non-negative integer (unix seconds).")
	}
	end := now.Unix()
	if raw := args.Peek("end_time"); len(raw) > 0 {
		if end, err = strconv.ParseInt(string(raw), 10, 64); err != nil || end < 0 {
			return usageWindow{}, usageInvalid("end_time", "Invalid 'end_time': want a non-negative integer (unix seconds).")
		}
		if end <= start {
			return usageWindow{}, usageInvalid("end_time", "Invalid 'end_time': it must be after 'start_time'.")
		}
	}
	// Unix seconds beyond this overflow time.Duration arithmetic in
	// nanoseconds; no usage exists there anyway.
	const maxUnix = 1 << 33
	if start > maxUnix {
		return usageWindow{}, usageInvalid("start_time", "Invalid 'start_time': it must be before the year 2242.")
	}
	if end > maxUnix {
		return usageWindow{}, usageInvalid("end_time", "Invalid 'end_time': it must be before the year 2242.")
	}

	widthName := "1d"
	if raw := args.Peek("bucket_width"); len(raw) > 0 {
		widthName = string(raw)
	}
	bw, ok := widths[widthName]
	if !ok {
		names := slices.SortedFunc(maps.Keys(widths), func(a, b string) int { return cmp.Compare(widths[a].width, widths[b].width) })
		return usageWindow{}, usageInvalid("bucket_width", "Invalid 'bucket_width': want one of "+strings.Join(names, ", ")+".")
	}
	width := int64(bw.width / time.Second)

	limit := bw.defaultLimit
	if raw := args.Peek("limit"); len(raw) > 0 {
		n, err := strconv.Atoi(string(raw))
		if err != nil || n < 1 || n > bw.maxLimit {
			return usageWindow{}, usageInvalid("limit", "Invalid 'limit': want an integer from 1 to "+strconv.Itoa(bw.maxLimit)+" for bucket_width "+widthName+".")
		}
		limit = n
	}

	first := floorDiv(start, width) * width
	last := -floorDiv(-end, width) * width // end rounded up to a bucket boundary
	pageStart := first
	if raw := args.Peek("page"); len(raw) > 0 {
		p, ok := decodeUsagePage(string(raw))
		if !ok || p < first || p >= last || (p-first)%width != 0 {
			return usageWindow{}, usageInvalid("page", "Invalid 'page': pass the next_page value of the previous answer, with the same parameters.")
		}
		pageStart = p
	}
	pageEnd := min(pageStart+int64(limit)*width, last)
	return usageWindow{width: bw.width, start: time.Unix(pageStart, 0).UTC(), end: time.Unix(max(pageEnd, pageStart), 0).UTC(),
		hasMore: pageEnd < last}, nil
}

// usageList collects a list parameter given repeated ("models=a&models=b"),
// comma separated ("models=a,b"), or in brackets as openai-python sends
// arrays ("models[]=a"), skipping empty items.
func usageList(args *fasthttp.Args, name string) []string {
	var out []string
	for _, n := range [...]string{name, name + "[]"} {
		for _, v := range args.PeekMulti(n) {
			for item := range strings.SplitSeq(string(v), ",") {
				if item = strings.TrimSpace(item); item != "" {
					out = append(out, item)
				}
			}
		}
	}
	return out
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func encodeUsagePage(start int64) string {
	return usagePagePrefix + base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(start, 10)))
}

func decodeUsagePage(s string) (int64, bool) {
	rest, ok := strings.CutPrefix(s, usagePagePrefix)
	if !ok {
		return 0, false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}

// The answer, in OpenAI's shape. Group fields not grouped by are null.
type usagePage struct {
	Object   string        `json:"object"`
	Data     []usageBucket `json:"data"`
	HasMore  bool          `json:"has_more"`
	NextPage *string       `json:"next_page"`
}

type usageBucket struct {
	Object    string        `json:"object"`
	StartTime int64         `json:"start_time"`
	EndTime   int64         `json:"end_time"`
	Results   []usageResult `json:"results"`
}

// usageResult is a result of either path. OutputTokens and
// InputCachedTokens are pointers so that embeddings results, which have
// neither, leave them out; Endpoint is there only with group_by=endpoint
// and Status only with group_by=status, so that other answers keep
// exactly OpenAI's shape.
type usageResult struct {
	Object            string `json:"object"`
	InputTokens       int64  `json:"input_tokens"`
	OutputTokens      *int64 `json:"output_tokens,omitempty"`
	InputCachedTokens *int64 `json:"input_cached_tokens,omitempty"`
	// InputCacheWriteTokens are the input tokens written to the backend's
	// prompt cache (Anthropic's cache_creation_input_tokens), part of
	// InputTokens; there only when some were, which OpenAI's usage never
	// has.
	InputCacheWriteTokens *int64  `json:"input_cache_write_tokens,omitempty"`
	NumModelRequests      int64   `json:"num_model_requests"`
	ProjectID             *string `json:"project_id"`
	APIKeyID              *string `json:"api_key_id"`
	Model                 *string `json:"model"`
	Endpoint              *string `json:"endpoint,omitempty"`
	Status                *string `json:"status,omitempty"`
	// NumRequests is there only with group_by=status: refusals reach no
	// model, so num_model_requests alone cannot count them.
	NumRequests *int64 `json:"num_requests,omitempty"`
}

// page lays rows out in the page's buckets, empty buckets included.
func (r *usageRequest) page(rows []accounting.UsageRow) usagePage {
	q := &r.query
	width := int64(q.BucketWidth / time.Second)
	start, end := q.Start.Unix(), q.End.Unix()
	p := usagePage{Object: "page", Data: make([]usageBucket, 0, (end-start)/width)}
	for s := start; s < end; s += width {
		p.Data = append(p.Data, usageBucket{Object: "bucket", StartTime: s, EndTime: s + width, Results: []usageResult{}})
	}
	for _, row := range rows {
		i := (row.BucketStart.Unix() - start) / width
		if i < 0 || i >= int64(len(p.Data)) {
			continue // the store returned a row outside the page: ignore it
		}
		res := usageResult{
			Object:           r.kind.object,
			InputTokens:      row.InputTokens,
			NumModelRequests: row.Requests,
		}
		if r.kind.outputs {
			res.OutputTokens, res.InputCachedTokens = &row.OutputTokens, &row.CachedTokens
			if row.CacheWriteTokens > 0 {
				res.InputCacheWriteTokens = &row.CacheWriteTokens
			}
		}
		if q.GroupByProject {
			id := row.Team + "/" + row.Project
			res.ProjectID = &id
		}
		if q.GroupByKey {
			res.APIKeyID = &row.KeyName
		}
		if q.GroupByModel {
			res.Model = &row.Model
		}
		if q.GroupByEndpoint {
			res.Endpoint = &row.Endpoint
		}
		if q.GroupByStatus {
			res.Status, res.NumRequests = &row.Status, &row.Records
		}
		p.Data[i].Results = append(p.Data[i].Results, res)
	}
	if r.hasMore {
		next := encodeUsagePage(end)
		p.HasMore, p.NextPage = true, &next
	}
	return p
}

// usageWriteError answers with e in the OpenAI error shape.
func usageWriteError(ctx *fasthttp.RequestCtx, e *usageError) {
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	b := body{Message: e.message, Type: e.typ}
	if e.param != "" {
		b.Param = &e.param
	}
	if e.code != "" {
		b.Code = &e.code
	}
	if e.status == fasthttp.StatusUnauthorized {
		ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="tollgate"`)
	}
	usageWriteJSON(ctx, e.status, struct {
		Error body `json:"error"`
	}{b})
}

func usageWriteJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain strings and integers are encoded here, so this is a
		// programming error; the client still gets the OpenAI shape.
		ctx.Logger().Printf("usage api: encode answer: %v", err)
		status = fasthttp.StatusInternalServerError
		b = []byte(`{"error":{"message":"The server had an error while writing the answer.","type":"api_error","param":null,"code":null}}`)
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
