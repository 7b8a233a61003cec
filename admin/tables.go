package admin

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/weave"
)

// tableRowJSON is Weave's TableRowSchema.
type tableRowJSON struct {
	Digest        string          `json:"digest"`
	Val           json.RawMessage `json:"val"`
	OriginalIndex int             `json:"original_index"`
}

// rowObject reads a table row, which must be a JSON object.
func rowObject(v *validation, raw any, loc []any) (map[string]any, bool) {
	m, ok := raw.(map[string]any)
	if !ok {
		v.add(loc, "dict_type", "Input should be a valid dictionary", raw)
	}
	return m, ok
}

// tableCreate serves POST /table/create {"table": {project_id, rows}}.
func (s *Service) tableCreate(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	raw, ok := body["table"]
	if !ok {
		v.add(at(bodyLoc, "table"), "missing", "Field required", body)
		return v.err()
	}
	loc := at(bodyLoc, "table")
	tbl, ok := v.object(raw, loc, "TableSchemaForInsert")
	if !ok {
		return v.err()
	}
	list := v.reqList(tbl, "rows", loc)
	rows := make([]map[string]any, 0, len(list))
	for i, r := range list {
		if m, ok := rowObject(&v, r, at(loc, "rows", i)); ok {
			rows = append(rows, m)
		}
	}
	_, proj, _, e := s.projectOf(ctx, &v, key, tbl, loc, forWrite)
	if e != nil {
		return e
	}
	digest, rowDigests, stored, err := weave.NewTable(rows)
	if err != nil {
		return internalError(err)
	}
	if err := s.weave.PutTable(ctx, proj.ID, digest, rowDigests, stored); err != nil {
		return internalError(err)
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]any{"digest": digest, "row_digests": rowDigests})
	return nil
}

// tableUpdate serves POST /table/update {project_id, base_digest, updates}:
// each update is {"append": {"row"}}, {"pop": {"index"}} or
// {"insert": {"index", "row"}}.
func (s *Service) tableUpdate(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	base, _ := v.reqString(body, "base_digest", bodyLoc)
	var updates []weave.TableUpdate
	for i, item := range v.reqList(body, "updates", bodyLoc) {
		if u, ok := parseTableUpdate(&v, item, at(bodyLoc, "updates", i)); ok {
			updates = append(updates, u)
		}
	}
	_, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forWrite)
	if e != nil {
		return e
	}
	if !found {
		return notFound("Table " + base)
	}
	baseRows, err := s.weave.TableRowDigests(ctx, proj.ID, base)
	if e := lookupError(err, "Table "+base); e != nil {
		return e
	}
	res, err := weave.ApplyTableUpdates(baseRows, updates)
	var ie *weave.IndexError
	if errors.As(err, &ie) {
		v.add(at(bodyLoc, "updates", ie.Update), "value_error", "Value error, "+ie.Error(), ie.Index)
		return v.err()
	}
	if err != nil {
		return internalError(err)
	}
	if err := s.weave.PutTable(ctx, proj.ID, res.Digest, res.RowDigests, res.NewRows); err != nil {
		return internalError(err)
	}
	updated := res.Updated
	if updated == nil {
		updated = []string{}
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]any{"digest": res.Digest, "updated_row_digests": updated})
	return nil
}

func parseTableUpdate(v *validation, raw any, loc []any) (weave.TableUpdate, bool) {
	obj, ok := v.object(raw, loc, "TableUpdateSpec")
	if !ok {
		return weave.TableUpdate{}, false
	}
	if len(obj) != 1 {
		v.add(loc, "value_error", `Value error, an update is one of {"append"}, {"pop"}, {"insert"}`, raw)
		return weave.TableUpdate{}, false
	}
	var u weave.TableUpdate
	for kind, spec := range obj {
		sloc := at(loc, kind)
		m, ok := v.object(spec, sloc, "TableUpdatePayload")
		if !ok {
			return weave.TableUpdate{}, false
		}
		switch kind {
		case "append":
			u.Append = true
		case "pop":
			u.Pop = true
		case "insert":
			u.Insert = true
		default:
			v.add(loc, "value_error", `Value error, an update is one of {"append"}, {"pop"}, {"insert"}`, raw)
			return weave.TableUpdate{}, false
		}
		if u.Pop || u.Insert {
			if _, ok := m["index"]; !ok {
				v.add(at(sloc, "index"), "missing", "Field required", m)
				return weave.TableUpdate{}, false
			}
			u.Index = v.optNonNegInt(m, "index", sloc, 0)
		}
		if u.Append || u.Insert {
			if u.Row, ok = rowObject(v, m["row"], at(sloc, "row")); !ok {
				return weave.TableUpdate{}, false
			}
		}
	}
	return u, !v.failed()
}

// tableQuery serves POST /table/query {project_id, digest, filter:
// {row_digests}, limit, offset, sort_by} → {"rows": [...]}: rows in table
// order unless sorted by fields of their values.
func (s *Service) tableQuery(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	rows, e := s.queryTable(ctx, rc, key)
	if e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, map[string][]tableRowJSON{"rows": rows})
	return nil
}

// tableQueryStream serves POST /table/query_stream: the rows of
// /table/query as JSON Lines, as the Python SDK reads them.
func (s *Service) tableQueryStream(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	rows, e := s.queryTable(ctx, rc, key)
	if e != nil {
		return e
	}
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetContentType("application/jsonl")
	enc := json.NewEncoder(rc)
	enc.SetEscapeHTML(false)
	for i := range rows {
		if err := enc.Encode(&rows[i]); err != nil {
			return nil
		}
	}
	return nil
}

// queryTable validates a TableQueryReq and selects its rows.
func (s *Service) queryTable(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key) ([]tableRowJSON, *apiError) {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return nil, e
	}
	var v validation
	digest, _ := v.reqString(body, "digest", bodyLoc)
	var only map[string]bool
	if raw, ok := body["filter"]; ok && raw != nil {
		floc := at(bodyLoc, "filter")
		if f, ok := v.object(raw, floc, "TableRowFilter"); ok {
			v.strict(f, floc, "row_digests")
			if ds := v.optStringList(f, "row_digests", floc); ds != nil {
				only = make(map[string]bool, len(ds))
				for _, d := range ds {
					only[d] = true
				}
			}
		}
	}
	limit := -1
	if body["limit"] != nil {
		limit = v.optNonNegInt(body, "limit", bodyLoc, -1)
	}
	offset := v.optNonNegInt(body, "offset", bodyLoc, 0)
	sortBy := parseDocSort(&v, body["sort_by"], at(bodyLoc, "sort_by"))
	_, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forRead)
	if e != nil {
		return nil, e
	}
	if !found {
		return nil, notFound("Table " + digest)
	}
	digests, err := s.weave.TableRowDigests(ctx, proj.ID, digest)
	if e := lookupError(err, "Table "+digest); e != nil {
		return nil, e
	}
	type indexed struct {
		digest string
		index  int
	}
	sel := make([]indexed, 0, len(digests))
	for i, d := range digests {
		if only == nil || only[d] {
			sel = append(sel, indexed{d, i})
		}
	}
	page := func(n int) (lo, hi int) {
		lo = min(offset, n)
		hi = n
		if limit >= 0 {
			hi = min(lo+limit, n)
		}
		return lo, hi
	}
	if len(sortBy) == 0 {
		lo, hi := page(len(sel))
		sel = sel[lo:hi]
	}
	want := make([]string, len(sel))
	for i, r := range sel {
		want[i] = r.digest
	}
	vals, err := s.weave.TableRows(ctx, proj.ID, want)
	if err != nil {
		return nil, internalError(err)
	}
	out := make([]tableRowJSON, 0, len(sel))
	for _, r := range sel {
		out = append(out, tableRowJSON{Digest: r.digest, Val: vals[r.digest], OriginalIndex: r.index})
	}
	if len(sortBy) > 0 {
		docs := make([]map[string]any, len(out))
		for i := range out {
			var m map[string]any
			dec := json.NewDecoder(bytesReader(out[i].Val))
			dec.UseNumber()
			_ = dec.Decode(&m) // a stored row is always an object
			docs[i] = map[string]any{"val": m, "i": json.Number(itoa(i))}
		}
		keys := make([]weave.DocSort, len(sortBy))
		for i, k := range sortBy {
			keys[i] = weave.DocSort{Field: append([]string{"val"}, k.Field...), Desc: k.Desc}
		}
		weave.SortDocs(docs, keys)
		sorted := make([]tableRowJSON, len(out))
		for i, d := range docs {
			j, _ := d["i"].(json.Number).Int64()
			sorted[i] = out[j]
		}
		lo, hi := page(len(sorted))
		out = sorted[lo:hi]
	}
	for i := range out {
		if out[i].Val == nil {
			out[i].Val = json.RawMessage("null")
		}
	}
	return out, nil
}

// tableQueryStats serves POST /table/query_stats {project_id, digest}.
func (s *Service) tableQueryStats(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	digest, projectID, e := s.digestRequest(ctx, rc, key, "Table")
	if e != nil {
		return e
	}
	digests, err := s.weave.TableRowDigests(ctx, projectID, digest)
	if e := lookupError(err, "Table "+digest); e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]int{"count": len(digests)})
	return nil
}

// tableQueryStatsBatch serves POST /table/query_stats_batch {project_id,
// digests} → {"tables": [{"digest", "count"}]}, for the tables that exist.
func (s *Service) tableQueryStatsBatch(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	digests := v.optStringList(body, "digests", bodyLoc)
	if len(digests) > maxRefsPerBatch {
		v.tooLongList(at(bodyLoc, "digests"), len(digests), maxRefsPerBatch)
	}
	_, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forRead)
	if e != nil {
		return e
	}
	type stat struct {
		Digest string `json:"digest"`
		Count  int    `json:"count"`
	}
	out := []stat{}
	for _, d := range digests {
		if !found {
			break
		}
		rows, err := s.weave.TableRowDigests(ctx, proj.ID, d)
		switch {
		case errors.Is(err, weave.ErrNotFound):
			continue
		case err != nil:
			return internalError(err)
		}
		out = append(out, stat{Digest: d, Count: len(rows)})
	}
	writeJSON(rc, fasthttp.StatusOK, map[string][]stat{"tables": out})
	return nil
}

// digestRequest validates a body naming one stored thing by digest,
// {project_id, digest}, as reading a file or a table's stats does, and
// returns the digest and the id of the project. A project that does not
// exist holds nothing: the answer is then a 404 naming what (File, Table)
// and the digest.
func (s *Service) digestRequest(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, what string) (string, int64, *apiError) {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return "", 0, e
	}
	var v validation
	digest, _ := v.reqString(body, "digest", bodyLoc)
	_, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forRead)
	if e != nil {
		return "", 0, e
	}
	if !found {
		return "", 0, notFound(what + " " + digest)
	}
	return digest, proj.ID, nil
}
