package admin

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/trace"
)

// callJSON is a call on the wire. Timestamps are Weave-style RFC 3339
// strings with microseconds; project_id is always "entity/project".
type callJSON struct {
	ID          string          `json:"id"`
	ProjectID   string          `json:"project_id"`
	OpName      string          `json:"op_name"`
	DisplayName *string         `json:"display_name"`
	TraceID     string          `json:"trace_id"`
	ParentID    *string         `json:"parent_id"`
	ThreadID    *string         `json:"thread_id"`
	TurnID      *string         `json:"turn_id"`
	StartedAt   string          `json:"started_at"`
	EndedAt     *string         `json:"ended_at"`
	Exception   *string         `json:"exception"`
	Attributes  json.RawMessage `json:"attributes"`
	Inputs      json.RawMessage `json:"inputs"`
	Output      json.RawMessage `json:"output"`
	Summary     json.RawMessage `json:"summary"`
	SvcUserID   *string         `json:"svc_user_id"`
	SvcRunID    *string         `json:"svc_run_id"`
	// WbUserID and WbRunID repeat svc_user_id and svc_run_id under the
	// names the Weave SDKs read.
	WbUserID *string `json:"wb_user_id"`
	WbRunID  *string `json:"wb_run_id"`
}

func renderCall(p trace.Project, c *trace.Call) callJSON {
	out := callJSON{
		ID: c.ID, ProjectID: p.Entity + "/" + p.Name, OpName: c.OpName, DisplayName: c.DisplayName,
		TraceID: c.TraceID, ParentID: c.ParentID, ThreadID: c.ThreadID, TurnID: c.TurnID,
		StartedAt: formatTime(c.StartedAt), Exception: c.Exception,
		Attributes: orEmptyObject(c.Attributes), Inputs: orEmptyObject(c.Inputs), Output: c.Output,
		Summary: orEmptyObject(c.Summary), SvcUserID: c.SvcUserID, SvcRunID: c.SvcRunID,
		WbUserID: c.SvcUserID, WbRunID: c.SvcRunID,
	}
	if c.EndedAt != nil {
		s := formatTime(*c.EndedAt)
		out.EndedAt = &s
	}
	return out
}

func orEmptyObject(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("{}")
	}
	return m
}

// startReq is a validated call start whose project is not resolved yet.
type startReq struct {
	projectID string
	start     trace.CallStart
}

// parseCallStart validates a Weave StartedCallSchemaForInsert. Unknown keys
// are ignored, as pydantic does by default. The svc_user_id defaults to the
// key's name; wb_user_id and wb_run_id, the names the Weave SDK uses, are
// accepted for svc_user_id and svc_run_id.
func parseCallStart(v *validation, key *auth.Key, raw any, loc []any) (startReq, error) {
	boundCallIDs(v, raw, loc)
	obj, ok := v.object(raw, loc, "StartedCallSchemaForInsert")
	if !ok {
		return startReq{}, nil
	}
	var r startReq
	r.projectID, _ = v.reqString(obj, "project_id", loc)
	r.start.OpName, _ = v.reqString(obj, "op_name", loc)
	if ts, ok := obj["started_at"]; ok {
		r.start.StartedAt, _ = parseTime(v, ts, at(loc, "started_at"))
	} else {
		v.add(at(loc, "started_at"), "missing", "Field required", obj)
	}
	id := v.optString(obj, "id", loc)
	traceID := v.optString(obj, "trace_id", loc)
	r.start.ParentID = nonEmpty(v.optString(obj, "parent_id", loc))
	r.start.DisplayName = v.optString(obj, "display_name", loc)
	r.start.ThreadID = v.optString(obj, "thread_id", loc)
	r.start.TurnID = v.optString(obj, "turn_id", loc)
	r.start.Attributes = v.optDict(obj, "attributes", loc)
	r.start.Inputs = v.optDict(obj, "inputs", loc)
	r.start.SvcUserID = firstString(v.optString(obj, "svc_user_id", loc), v.optString(obj, "wb_user_id", loc))
	r.start.SvcRunID = firstString(v.optString(obj, "svc_run_id", loc), v.optString(obj, "wb_run_id", loc))
	if r.start.SvcUserID == nil {
		name := key.Name
		r.start.SvcUserID = &name
	}
	if id != nil && *id != "" {
		r.start.ID = *id
	} else {
		u, err := uuid.NewV7()
		if err != nil {
			return startReq{}, err
		}
		r.start.ID = u.String()
	}
	switch {
	case traceID != nil && *traceID != "":
		r.start.TraceID = *traceID
	case r.start.ParentID == nil:
		u, err := uuid.NewV7()
		if err != nil {
			return startReq{}, err
		}
		r.start.TraceID = u.String()
	}
	// Otherwise TraceID stays empty and the store takes the parent's.
	return r, nil
}

// endReq is a validated call end whose project is not resolved yet.
type endReq struct {
	projectID string
	end       trace.CallEnd
}

// parseCallEnd validates a Weave EndedCallSchemaForInsert.
func parseCallEnd(v *validation, raw any, loc []any) endReq {
	boundCallIDs(v, raw, loc)
	obj, ok := v.object(raw, loc, "EndedCallSchemaForInsert")
	if !ok {
		return endReq{}
	}
	var r endReq
	r.projectID, _ = v.reqString(obj, "project_id", loc)
	r.end.ID, _ = v.reqString(obj, "id", loc)
	if ts, ok := obj["ended_at"]; ok {
		r.end.EndedAt, _ = parseTime(v, ts, at(loc, "ended_at"))
	} else {
		v.add(at(loc, "ended_at"), "missing", "Field required", obj)
	}
	r.end.Exception = v.optString(obj, "exception", loc)
	if out, ok := obj["output"]; ok && out != nil {
		r.end.Output = mustJSON(out)
	}
	r.end.Summary = v.optDict(obj, "summary", loc)
	// Not in Weave's model, but the TypeScript SDK sends the name the
	// call ended with.
	r.end.DisplayName = v.optString(obj, "display_name", loc)
	return r
}

func nonEmpty(s *string) *string {
	if s == nil || *s == "" {
		return nil
	}
	return s
}

func firstString(a, b *string) *string {
	if a != nil {
		return a
	}
	return b
}

// parseTime reads a datetime the way pydantic does: an RFC 3339 string
// (a missing zone means UTC, a space may replace the "T"), or a Unix time
// in seconds (or milliseconds, when too large for seconds).
func parseTime(v *validation, raw any, loc []any) (time.Time, bool) {
	switch x := raw.(type) {
	case string:
		s := strings.TrimSpace(x)
		for _, layout := range []string{
			time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00",
			"2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999Z0700",
		} {
			if t, err := time.Parse(layout, s); err == nil {
				return t.UTC(), true
			}
		}
		if s != "" {
			if t, ok := unixTime(json.Number(s)); ok {
				return t, true
			}
		}
		v.add(loc, "datetime_from_date_parsing", "Input should be a valid datetime or date, invalid datetime", raw)
	case json.Number:
		if t, ok := unixTime(x); ok {
			return t, true
		}
		v.add(loc, "datetime_parsing", "Input should be a valid datetime, unable to parse number", raw)
	default:
		v.add(loc, "datetime_type", "Input should be a valid datetime", raw)
	}
	return time.Time{}, false
}

func unixTime(n json.Number) (time.Time, bool) {
	f, err := n.Float64()
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return time.Time{}, false
	}
	// pydantic reads values above 2e10 as milliseconds.
	if math.Abs(f) > 2e10 {
		f /= 1000
	}
	if math.Abs(f) > 1e11 {
		return time.Time{}, false
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(math.Round(frac*1e6))*1e3).UTC(), true
}

// projectCache resolves each distinct project_id of a request once.
type projectCache struct {
	s   *Service
	ctx context.Context
	key *auth.Key
	m   map[string]trace.Project
}

func (c *projectCache) forWrite(raw string, loc []any) (trace.Project, *apiError) {
	if p, ok := c.m[raw]; ok {
		return p, nil
	}
	p, _, e := c.s.resolveProject(c.ctx, c.key, raw, loc, forWrite)
	if e != nil {
		return trace.Project{}, e
	}
	if c.m == nil {
		c.m = make(map[string]trace.Project)
	}
	c.m[raw] = p
	return p, nil
}

// writeCalls stores the writes and maps store failures to the item they
// concern; locs[i] is the location of write i in the request.
func (s *Service) writeCalls(ctx context.Context, writes []trace.CallWrite, locs [][]any) ([]string, *apiError) {
	traces, err := s.store.WriteCalls(ctx, writes)
	if err == nil {
		return traces, nil
	}
	var we *trace.CallWriteError
	if !errors.As(err, &we) || we.Index < 0 || we.Index >= len(writes) {
		return nil, internalError(err)
	}
	switch {
	case errors.Is(err, trace.ErrParentNotFound):
		return nil, invalid([]fieldError{{
			Loc: at(locs[we.Index], "trace_id"), Type: "missing", Input: nil,
			Msg: "Field required: parent_id names no known call, so trace_id must be sent",
		}})
	}
	return nil, internalError(err)
}

type startRes struct {
	ID      string `json:"id"`
	TraceID string `json:"trace_id"`
}

// envelopeField returns the one field of an ingest envelope such as
// {"start": {...}}, and its location for validation errors. A body without
// it is a 422 naming the field, as FastAPI words it.
func envelopeField(rc *fasthttp.RequestCtx, name string) (raw any, loc []any, e *apiError) {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return nil, nil, e
	}
	loc = at(bodyLoc, name)
	raw, ok := body[name]
	if !ok {
		var v validation
		v.add(loc, "missing", "Field required", body)
		return nil, nil, v.err()
	}
	return raw, loc, nil
}

// callStart serves POST /call/start {"start": {...}}.
func (s *Service) callStart(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	raw, loc, e := envelopeField(rc, "start")
	if e != nil {
		return e
	}
	var v validation
	r, err := parseCallStart(&v, key, raw, loc)
	if err != nil {
		return internalError(err)
	}
	if v.failed() {
		return v.err()
	}
	pc := projectCache{s: s, ctx: ctx, key: key}
	p, e := pc.forWrite(r.projectID, at(loc, "project_id"))
	if e != nil {
		return e
	}
	r.start.ProjectID = p.ID
	traces, e := s.writeCalls(ctx, []trace.CallWrite{{Start: &r.start}}, [][]any{loc})
	if e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, startRes{ID: r.start.ID, TraceID: traces[0]})
	return nil
}

// callEnd serves POST /call/end {"end": {...}}.
func (s *Service) callEnd(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	raw, loc, e := envelopeField(rc, "end")
	if e != nil {
		return e
	}
	var v validation
	r := parseCallEnd(&v, raw, loc)
	if v.failed() {
		return v.err()
	}
	pc := projectCache{s: s, ctx: ctx, key: key}
	p, e := pc.forWrite(r.projectID, at(loc, "project_id"))
	if e != nil {
		return e
	}
	r.end.ProjectID = p.ID
	if _, e := s.writeCalls(ctx, []trace.CallWrite{{End: &r.end}}, [][]any{loc}); e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, struct{}{})
	return nil
}

// callUpsertBatch serves POST /call/upsert_batch: starts and ends applied in
// order, all or nothing. An end may come before its start, in this batch or
// an earlier one: it is kept until the start arrives.
func (s *Service) callUpsertBatch(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	raw, ok := body["batch"]
	if !ok {
		v.add(at(bodyLoc, "batch"), "missing", "Field required", body)
		return v.err()
	}
	list, ok := raw.([]any)
	if !ok {
		v.add(at(bodyLoc, "batch"), "list_type", "Input should be a valid list", raw)
		return v.err()
	}
	type item struct {
		projectID string
		write     trace.CallWrite
		loc       []any
	}
	items := make([]item, 0, len(list))
	for i, it := range list {
		iloc := at(bodyLoc, "batch", i)
		obj, ok := v.object(it, iloc, "CallBatchStartMode | CallBatchEndMode")
		if !ok {
			continue
		}
		mode, ok := v.reqString(obj, "mode", iloc)
		if ok && mode != "start" && mode != "end" {
			v.addCtx(at(iloc, "mode"), "literal_error", "Input should be 'start' or 'end'", mode,
				map[string]any{"expected": "'start' or 'end'"})
			ok = false
		}
		reqRaw, hasReq := obj["req"]
		if !hasReq {
			v.add(at(iloc, "req"), "missing", "Field required", obj)
		}
		if !ok || !hasReq {
			continue
		}
		rloc := at(iloc, "req")
		req, ok := v.object(reqRaw, rloc, "CallStartReq | CallEndReq")
		if !ok {
			continue
		}
		inner, ok := req[mode]
		if !ok {
			v.add(at(rloc, mode), "missing", "Field required", req)
			continue
		}
		loc := at(rloc, mode)
		if mode == "start" {
			r, err := parseCallStart(&v, key, inner, loc)
			if err != nil {
				return internalError(err)
			}
			items = append(items, item{projectID: r.projectID, write: trace.CallWrite{Start: &r.start}, loc: loc})
		} else {
			r := parseCallEnd(&v, inner, loc)
			items = append(items, item{projectID: r.projectID, write: trace.CallWrite{End: &r.end}, loc: loc})
		}
	}
	if v.failed() {
		return v.err()
	}
	pc := projectCache{s: s, ctx: ctx, key: key}
	writes := make([]trace.CallWrite, len(items))
	locs := make([][]any, len(items))
	for i, it := range items {
		p, e := pc.forWrite(it.projectID, at(it.loc, "project_id"))
		if e != nil {
			return e
		}
		if it.write.Start != nil {
			it.write.Start.ProjectID = p.ID
		} else {
			it.write.End.ProjectID = p.ID
		}
		writes[i], locs[i] = it.write, it.loc
	}
	traces, e := s.writeCalls(ctx, writes, locs)
	if e != nil {
		return e
	}
	res := make([]any, len(writes))
	for i, w := range writes {
		if w.Start != nil {
			res[i] = startRes{ID: w.Start.ID, TraceID: traces[i]}
		} else {
			res[i] = struct{}{}
		}
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]any{"res": res})
	return nil
}

// callRead serves POST /call/read {"project_id","id"} → {"call": {...}},
// or {"call": null} for a call that does not exist (yet), as Weave answers.
func (s *Service) callRead(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	projectID, _ := v.reqString(body, "project_id", bodyLoc)
	id, _ := v.reqString(body, "id", bodyLoc)
	if v.failed() {
		return v.err()
	}
	p, found, e := s.resolveProject(ctx, key, projectID, at(bodyLoc, "project_id"), forRead)
	if e != nil {
		return e
	}
	if !found {
		writeJSON(rc, fasthttp.StatusOK, map[string]*callJSON{"call": nil})
		return nil
	}
	c, err := s.store.ReadCall(ctx, p.ID, id)
	if errors.Is(err, trace.ErrNotFound) {
		writeJSON(rc, fasthttp.StatusOK, map[string]*callJSON{"call": nil})
		return nil
	}
	if err != nil {
		return internalError(err)
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]callJSON{"call": renderCall(p, &c)})
	return nil
}

// callsStreamQuery serves POST /calls/stream_query, answering JSON Lines.
// With include_costs each call's summary gets weave.costs, priced as
// /trace/usage prices. Keys of the Weave request this server does not
// implement (columns, expand_columns, ...) are ignored; filter and query
// are strict.
func (s *Service) callsStreamQuery(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	projectID, _ := v.reqString(body, "project_id", bodyLoc)
	q := trace.CallsQuery{
		Filter: parseFilter(&v, body["filter"], at(bodyLoc, "filter")),
		Query:  parseQuery(&v, body["query"], at(bodyLoc, "query")),
		SortBy: parseSortBy(&v, body["sort_by"], at(bodyLoc, "sort_by")),
		Limit:  v.optNonNegInt(body, "limit", bodyLoc, -1),
		Offset: v.optNonNegInt(body, "offset", bodyLoc, 0),
	}
	includeCosts := v.optBool(body, "include_costs", bodyLoc, false)
	if v.failed() {
		return v.err()
	}
	p, found, e := s.resolveProject(ctx, key, projectID, at(bodyLoc, "project_id"), forRead)
	if e != nil {
		return e
	}
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetContentType("application/jsonl")
	if !found {
		return nil
	}
	var pricing map[string]config.Pricing
	if includeCosts {
		var err error
		if pricing, err = s.projectPricing(ctx, p.ID); err != nil {
			return internalError(err)
		}
	}
	// The answer is streamed from a cursor of its own context: the
	// handler's ends when it returns, before the first row is written.
	sctx, cancel := context.WithCancel(context.Background())
	cur, err := s.store.OpenCalls(sctx, p.ID, q)
	if err != nil {
		cancel()
		return internalError(err)
	}
	var c trace.Call
	streamLines(rc, s.log, "calls", func(enc *json.Encoder) (bool, error) {
		ok, err := cur.Next(&c)
		if err != nil || !ok {
			return false, err
		}
		out := renderCall(p, &c)
		if includeCosts {
			out.Summary = summaryWithCosts(out.Summary, pricing)
		}
		return true, enc.Encode(out)
	}, func() error {
		err := cur.Close()
		cancel()
		return err
	})
	return nil
}

// maxDeleteCalls bounds one /calls/delete, as Weave does.
const maxDeleteCalls = 1000

// callUpdate serves POST /call/update {"project_id","call_id","display_name"}
// → {}. Weave's CallUpdateReq: display_name is the one field a client may
// change (wb_user_id is the server's to set, and ignored).
func (s *Service) callUpdate(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	projectID, _ := v.reqString(body, "project_id", bodyLoc)
	id, _ := v.reqString(body, "call_id", bodyLoc)
	name := v.optString(body, "display_name", bodyLoc)
	if !v.failed() && name == nil {
		v.add(at(bodyLoc, "display_name"), "missing", "Field required: display_name is the field a call update changes", body)
	}
	if v.failed() {
		return v.err()
	}
	p, found, e := s.resolveProject(ctx, key, projectID, at(bodyLoc, "project_id"), forRead)
	if e != nil {
		return e
	}
	if !found {
		return notFound("Call " + strconv.Quote(id))
	}
	if e := lookupError(s.store.UpdateCall(ctx, p.ID, id, *name), "Call "+strconv.Quote(id)); e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, struct{}{})
	return nil
}

// callsDelete serves POST /calls/delete {"project_id","call_ids"} →
// {"num_deleted"}: the calls and all their descendants go, as in Weave, and
// num_deleted counts them all (Weave's newer CallsDeleteRes; older clients
// ignore it). Unknown ids are not an error (deleting twice is harmless).
func (s *Service) callsDelete(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	projectID, _ := v.reqString(body, "project_id", bodyLoc)
	ids := v.reqStringList(body, "call_ids", bodyLoc, maxDeleteCalls)
	if v.failed() {
		return v.err()
	}
	p, found, e := s.resolveProject(ctx, key, projectID, at(bodyLoc, "project_id"), forRead)
	if e != nil {
		return e
	}
	n := 0
	if found && len(ids) > 0 {
		var err error
		if n, err = s.store.DeleteCalls(ctx, p.ID, ids); err != nil {
			return internalError(err)
		}
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]int{"num_deleted": n})
	return nil
}

// callsQueryStats serves POST /calls/query_stats {"project_id","filter",
// "query","limit"} → {"count"}. Other keys of Weave's request
// (include_total_storage_size, expand_columns) are ignored.
func (s *Service) callsQueryStats(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	projectID, _ := v.reqString(body, "project_id", bodyLoc)
	filter := parseFilter(&v, body["filter"], at(bodyLoc, "filter"))
	query := parseQuery(&v, body["query"], at(bodyLoc, "query"))
	limit := v.optNonNegInt(body, "limit", bodyLoc, -1)
	if v.failed() {
		return v.err()
	}
	p, found, e := s.resolveProject(ctx, key, projectID, at(bodyLoc, "project_id"), forRead)
	if e != nil {
		return e
	}
	n := 0
	if found {
		var err error
		if n, err = s.store.CountCalls(ctx, p.ID, filter, query, limit); err != nil {
			return internalError(err)
		}
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]int{"count": n})
	return nil
}
