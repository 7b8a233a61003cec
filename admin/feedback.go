package admin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/trace"
	"github.com/tollgate-dev/tollgate/weave"
)

// maxFeedbackPayloadBytes bounds a feedback payload, as Weave's.
const maxFeedbackPayloadBytes = 1 << 20

// feedbackRes is Weave's FeedbackCreateRes (and FeedbackReplaceRes).
type feedbackRes struct {
	ID        string          `json:"id"`
	CreatedAt string          `json:"created_at"`
	WBUserID  string          `json:"wb_user_id"`
	Payload   json.RawMessage `json:"payload"`
}

// parseFeedback validates a FeedbackCreateReq into f, whose project is
// resolved by the caller. The key's name is the wb_user_id, whatever the
// body says, as Weave's server populates it.
func parseFeedback(v *validation, key *auth.Key, body map[string]any) weave.Feedback {
	f := weave.Feedback{WBUserID: key.Name}
	f.WeaveRef, _ = v.reqString(body, "weave_ref", bodyLoc)
	v.boundString(at(bodyLoc, "weave_ref"), f.WeaveRef, maxRefBytes)
	if f.WeaveRef != "" {
		if _, err := weave.ParseRef(f.WeaveRef); err != nil {
			v.add(at(bodyLoc, "weave_ref"), "value_error", "Value error, weave_ref must be a weave:/// ref", f.WeaveRef)
		}
	}
	f.FeedbackType, _ = v.reqString(body, "feedback_type", bodyLoc)
	f.Creator = v.optString(body, "creator", bodyLoc)
	f.AnnotationRef = v.optString(body, "annotation_ref", bodyLoc)
	f.RunnableRef = v.optString(body, "runnable_ref", bodyLoc)
	f.CallRef = v.optString(body, "call_ref", bodyLoc)
	f.TriggerRef = v.optString(body, "trigger_ref", bodyLoc)
	raw, ok := body["payload"]
	payload, isObj := raw.(map[string]any)
	switch {
	case !ok:
		v.add(at(bodyLoc, "payload"), "missing", "Field required", body)
	case !isObj:
		v.add(at(bodyLoc, "payload"), "dict_type", "Input should be a valid dictionary", raw)
	default:
		f.Payload = weave.Compact(payload)
		if len(f.Payload) > maxFeedbackPayloadBytes {
			v.add(at(bodyLoc, "payload"), "value_error", "Value error, the payload exceeds 1 MiB", nil)
		}
	}
	checkFeedbackType(v, &f, payload)
	return f
}

// checkFeedbackType applies Weave's rules for the reserved "wandb." types:
// a reaction has an emoji, a note a note, a runnable or annotation result
// its ref; other wandb. types are not for clients.
func checkFeedbackType(v *validation, f *weave.Feedback, payload map[string]any) {
	t := f.FeedbackType
	if !strings.HasPrefix(t, "wandb.") {
		return
	}
	str := func(k string) {
		if _, ok := payload[k].(string); !ok && payload != nil {
			v.add(at(bodyLoc, "payload", k), "string_type", "Input should be a valid string", payload[k])
		}
	}
	switch {
	case t == "wandb.reaction.1":
		str("emoji")
	case t == "wandb.note.1":
		str("note")
	case strings.HasPrefix(t, "wandb.runnable."):
		if f.RunnableRef == nil {
			v.add(at(bodyLoc, "runnable_ref"), "missing", "Field required for feedback_type "+t, nil)
		}
	case strings.HasPrefix(t, "wandb.annotation."):
		if f.AnnotationRef == nil {
			v.add(at(bodyLoc, "annotation_ref"), "missing", "Field required for feedback_type "+t, nil)
		}
	default:
		v.add(at(bodyLoc, "feedback_type"), "value_error", "Value error, feedback types starting with 'wandb.' are reserved", t)
	}
}

// refInProject refuses feedback on a ref of another project.
func refInProject(v *validation, f *weave.Feedback, p trace.Project) {
	r, err := weave.ParseRef(f.WeaveRef)
	if err == nil && (r.Entity != p.Entity || r.Project != p.Name) {
		v.add(at(bodyLoc, "weave_ref"), "value_error", "Value error, weave_ref must be a ref in the request's project", f.WeaveRef)
	}
}

// feedbackCreate serves POST /feedback/create.
func (s *Service) feedbackCreate(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	return s.putFeedback(ctx, rc, key, false)
}

// feedbackReplace serves POST /feedback/replace: a create that also
// deletes the feedback feedback_id, atomically.
func (s *Service) feedbackReplace(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	return s.putFeedback(ctx, rc, key, true)
}

func (s *Service) putFeedback(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, replace bool) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	f := parseFeedback(&v, key, body)
	var oldID string
	if replace {
		oldID, _ = v.reqString(body, "feedback_id", bodyLoc)
	}
	_, proj, _, e := s.projectOf(ctx, &v, key, body, bodyLoc, forWrite)
	if e != nil {
		return e
	}
	if refInProject(&v, &f, proj); v.failed() {
		return v.err()
	}
	id, err := uuid.NewV7()
	if err != nil {
		return internalError(err)
	}
	f.ProjectID, f.ID, f.CreatedAt = proj.ID, id.String(), time.Now().UTC()
	if replace {
		err = s.weave.ReplaceFeedback(ctx, oldID, f)
	} else {
		err = s.weave.PutFeedback(ctx, f)
	}
	if e := lookupError(err, "Feedback "+oldID); e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, feedbackRes{ID: f.ID, CreatedAt: formatTime(f.CreatedAt), WBUserID: f.WBUserID, Payload: f.Payload})
	return nil
}

// feedbackDoc is a feedback item as queries see and return it.
func feedbackDoc(projectID string, f *weave.Feedback) map[string]any {
	return map[string]any{
		"id": f.ID, "project_id": projectID, "weave_ref": f.WeaveRef, "wb_user_id": f.WBUserID,
		"creator": strOrNil(f.Creator), "created_at": formatTime(f.CreatedAt), "feedback_type": f.FeedbackType,
		"payload": decodeValue(f.Payload), "annotation_ref": strOrNil(f.AnnotationRef),
		"runnable_ref": strOrNil(f.RunnableRef), "call_ref": strOrNil(f.CallRef), "trigger_ref": strOrNil(f.TriggerRef),
	}
}

func strOrNil(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// docQuery is a validated FeedbackQueryReq or CostQueryReq.
type docQuery struct {
	fields        []string
	expr          *weave.Expr
	sortBy        []weave.DocSort
	limit, offset int
}

func parseDocQuery(v *validation, body map[string]any) docQuery {
	q := docQuery{limit: -1}
	q.fields = v.optStringList(body, "fields", bodyLoc)
	q.expr = parseExpr(v, body["query"], at(bodyLoc, "query"), false)
	q.sortBy = parseDocSort(v, body["sort_by"], at(bodyLoc, "sort_by"))
	if body["limit"] != nil {
		q.limit = v.optNonNegInt(body, "limit", bodyLoc, -1)
	}
	q.offset = v.optNonNegInt(body, "offset", bodyLoc, 0)
	return q
}

// parseExpr validates a {"$expr": ...} query of documents.
func parseExpr(v *validation, raw any, loc []any, required bool) *weave.Expr {
	if raw == nil {
		if required {
			v.add(loc, "missing", "Field required", nil)
		}
		return nil
	}
	obj, ok := v.object(raw, loc, "Query")
	if !ok {
		return nil
	}
	v.strict(obj, loc, "$expr")
	if !boundQuery(v, obj["$expr"], at(loc, "$expr")) {
		return nil
	}
	x, err := weave.ParseExpr(obj["$expr"])
	if err != nil {
		var ee *weave.ExprError
		if errors.As(err, &ee) {
			v.add(at(loc, ee.Path...), "value_error", "Value error, "+ee.Msg, nil)
		}
		return nil
	}
	return &x
}

// apply filters, sorts, pages and projects docs.
func (q *docQuery) apply(docs []map[string]any) []map[string]any {
	kept := docs[:0]
	for _, d := range docs {
		if q.expr == nil || q.expr.Match(d) {
			kept = append(kept, d)
		}
	}
	weave.SortDocs(kept, q.sortBy)
	lo := min(q.offset, len(kept))
	hi := len(kept)
	if q.limit >= 0 {
		hi = min(lo+q.limit, hi)
	}
	kept = kept[lo:hi]
	if len(q.fields) > 0 {
		for i, d := range kept {
			sel := make(map[string]any, len(q.fields))
			for _, f := range q.fields {
				if x, ok := d[f]; ok {
					sel[f] = x
				}
			}
			kept[i] = sel
		}
	}
	return kept
}

// maxFeedbackRefs bounds the refs a /feedback/query may name for the store
// to select by before it is matched here; its page is bounded by
// maxQueryPage.
const maxFeedbackRefs = 500

// errPageFull ends a feedback query once its page is full.
var errPageFull = errors.New("page full")

// feedbackQuery serves POST /feedback/query {project_id, fields, query,
// sort_by, limit, offset} → {"result": [...]}. The page is cut by the
// store when nothing is left to match here; otherwise the items are read
// one at a time, matched, and the read ends when the page is full. Sorted
// answers hold their matches, within maxReadBytes.
func (s *Service) feedbackQuery(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	q := parseDocQuery(&v, body)
	q.limit = v.pageLimit(body, q.limit)
	raw, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forRead)
	if e != nil {
		return e
	}
	docs := []map[string]any{}
	if !found {
		writeJSON(rc, fasthttp.StatusOK, map[string][]map[string]any{"result": docs})
		return nil
	}
	sq := weave.FeedbackQuery{Limit: q.limit, Offset: q.offset}
	if q.expr != nil {
		// Feedback is stored by ref, so a query naming refs reads only those.
		if vals, ok := q.expr.Values("weave_ref"); ok && len(vals) <= maxFeedbackRefs {
			sq.Refs = append(make([]string, 0, len(vals)), vals...)
		}
	}
	inStore := q.expr == nil && len(q.sortBy) == 0
	if !inStore {
		sq.Limit, sq.Offset = -1, 0
	}
	budget := readBudget{what: "narrow the query or lower its limit"}
	skip := q.offset
	err := s.weave.QueryFeedback(ctx, proj.ID, sq, func(f *weave.Feedback) error {
		if len(q.sortBy) == 0 && len(docs) >= q.limit {
			return errPageFull
		}
		d := feedbackDoc(raw, f)
		if q.expr != nil && !q.expr.Match(d) {
			return nil
		}
		if len(q.sortBy) == 0 && !inStore && skip > 0 {
			skip--
			return nil
		}
		if e := budget.take(len(f.Payload) + 256); e != nil {
			return e
		}
		docs = append(docs, d)
		return nil
	})
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case err != nil && !errors.Is(err, errPageFull):
		return internalError(err)
	}
	if len(q.sortBy) == 0 {
		// Already filtered and paged: apply only projects the fields.
		q.expr, q.offset, q.limit = nil, 0, -1
	}
	writeJSON(rc, fasthttp.StatusOK, map[string][]map[string]any{"result": q.apply(docs)})
	return nil
}

// serveDocQuery serves a Weave query of documents, POST {project_id, fields,
// query, sort_by, limit, offset} → {resultKey: [...]}, as the feedback and
// cost queries are: list returns the documents of the project (raw is its
// id as the client wrote it), which the query then filters, sorts, pages
// and projects. A project that does not exist has no documents.
func (s *Service) serveDocQuery(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, resultKey string,
	list func(raw string, projectID int64, q *docQuery) ([]map[string]any, error)) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	q := parseDocQuery(&v, body)
	raw, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forRead)
	if e != nil {
		return e
	}
	docs := []map[string]any{}
	if found {
		listed, err := list(raw, proj.ID, &q)
		if err != nil {
			return internalError(err)
		}
		docs = append(docs, listed...)
	}
	writeJSON(rc, fasthttp.StatusOK, map[string][]map[string]any{resultKey: q.apply(docs)})
	return nil
}

// purgeIDs reads the query of a purge, which may only name ids, as
// Weave's purges do.
func purgeIDs(v *validation, body map[string]any) []string {
	x := parseExpr(v, body["query"], at(bodyLoc, "query"), true)
	if x == nil {
		return nil
	}
	ids, ok := weave.IDsOf(*x)
	if !ok {
		v.add(at(bodyLoc, "query"), "value_error", "Value error, can only purge by specifying one or more ids", nil)
	}
	return ids
}

// feedbackPurge serves POST /feedback/purge {project_id, query} → {}.
func (s *Service) feedbackPurge(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	return s.purgeByIDs(ctx, rc, key, s.weave.DeleteFeedback)
}

// purgeByIDs serves a Weave purge, POST {project_id, query} → {}, whose
// query names the ids that del deletes, as the feedback and cost purges
// are. A project that does not exist has nothing to purge.
func (s *Service) purgeByIDs(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key,
	del func(ctx context.Context, projectID int64, ids []string) (int, error)) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	ids := purgeIDs(&v, body)
	_, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forRead)
	if e != nil {
		return e
	}
	if found {
		if _, err := del(ctx, proj.ID, ids); err != nil {
			return internalError(err)
		}
	}
	writeJSON(rc, fasthttp.StatusOK, struct{}{})
	return nil
}
