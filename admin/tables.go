package admin

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"

	"github.com/tidwall/gjson"
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

// Bounds of the table reads, besides maxReadBytes.
const (
	// tableReadRows is how many rows a table read asks the store for at
	// once.
	tableReadRows = 100
	// tableBatchBytes is about what one such batch of rows may hold: the
	// batch ends after the row that reaches it.
	tableBatchBytes = 1 << 20
	// tableFirstRead is how many rows the first read of a table query
	// asks for, before the size of its rows is known.
	tableFirstRead = 8
	// sortedRowOverhead is what one row held for a sort takes besides its
	// sort keys, for the read budget.
	sortedRowOverhead = 64
	// tableRowOverhead is what one answered row takes besides its digest
	// and value, for the read budget.
	tableRowOverhead = 48
)

// errBatchFull ends a batch of table rows that holds tableBatchBytes.
var errBatchFull = errors.New("batch full")

// selectedRow is a row a table query selects: its digest and its index in
// the table.
type selectedRow struct {
	digest string
	index  int
}

// tableQuery serves POST /table/query {project_id, digest, filter:
// {row_digests}, limit, offset, sort_by} → {"rows": [...]}: rows in table
// order unless sorted by fields of their values. The answer is held
// whole, so it is refused past maxReadBytes (a 413 naming the pages and
// the stream to read instead).
func (s *Service) tableQuery(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	rows, e := s.queryTable(ctx, rc, key)
	if e != nil {
		return e
	}
	budget := readBudget{what: "read the table in pages with limit and offset, or stream it with /table/query_stream"}
	out := make([]tableRowJSON, 0, min(len(rows.sel), tableReadRows))
	for {
		batch, err := rows.next(ctx)
		if err != nil {
			return internalError(err)
		}
		if len(batch) == 0 {
			break
		}
		for i := range batch {
			if e := budget.take(len(batch[i].Val) + len(batch[i].Digest) + tableRowOverhead); e != nil {
				return e
			}
		}
		out = append(out, batch...)
	}
	writeJSON(rc, fasthttp.StatusOK, map[string][]tableRowJSON{"rows": out})
	return nil
}

// tableQueryStream serves POST /table/query_stream: the rows of
// /table/query as JSON Lines, as the Python SDK reads them, streamed a
// batch of rows at a time as the client takes them.
func (s *Service) tableQueryStream(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	rows, e := s.queryTable(ctx, rc, key)
	if e != nil {
		return e
	}
	// The rows are read after the handler returns, in a context of
	// their own.
	sctx, cancel := context.WithCancel(context.Background())
	streamLines(rc, s.log, "table rows", func(enc *json.Encoder) (bool, error) {
		batch, err := rows.next(sctx)
		for i := 0; err == nil && i < len(batch); i++ {
			err = enc.Encode(&batch[i])
		}
		return len(batch) > 0, err
	}, func() error {
		cancel()
		return nil
	})
	return nil
}

// tableRows reads the values of the rows a table query selected, in its
// order, a batch at a time: at most tableReadRows rows, and no more than
// tableBatchBytes held besides the row that reaches it. The store hands
// rows over in its own order, so values read ahead of their turn are kept
// for the batches after, within that bound. A row the store does not hold
// is null.
type tableRows struct {
	ws        weave.Store
	projectID int64
	sel       []selectedRow              // the rows not answered yet
	ahead     map[string]json.RawMessage // values read, not answered yet
	held      int                        // the bytes of ahead
	// readRows and readBytes are what was read so far, to size the
	// next read.
	readRows, readBytes int
}

// next returns the next batch of rows; none at the end.
func (r *tableRows) next(ctx context.Context) ([]tableRowJSON, error) {
	n := min(len(r.sel), tableReadRows)
	if n == 0 {
		return nil, nil
	}
	if r.ahead == nil {
		r.ahead = make(map[string]json.RawMessage, n)
	}
	for {
		if out := r.answer(n); len(out) > 0 {
			return out, nil
		}
		// The batch's first row is not read yet: read the rows of the
		// batch not held, as many as the rows read so far say fit in
		// the bound (a statement cut short still sends the rest), and
		// at least that row.
		fit := tableFirstRead
		if r.readRows > 0 {
			fit = (tableBatchBytes - r.held) / max(1, r.readBytes/r.readRows)
		}
		var want []string
		for _, row := range r.sel[:n] {
			if _, ok := r.ahead[row.digest]; !ok && (len(want) == 0 || len(want) < fit) {
				want = append(want, row.digest)
			}
		}
		err := r.ws.EachTableRow(ctx, r.projectID, want, func(digest string, val json.RawMessage) error {
			r.readRows++
			r.readBytes += len(val)
			if _, ok := r.ahead[digest]; !ok {
				r.ahead[digest] = val
				r.held += len(val)
			}
			if r.held >= tableBatchBytes {
				return errBatchFull
			}
			return nil
		})
		switch {
		case errors.Is(err, errBatchFull):
		case err != nil:
			return nil, err
		default:
			// Read whole: what did not come is not held.
			for _, d := range want {
				if _, ok := r.ahead[d]; !ok {
					r.ahead[d] = json.RawMessage("null")
				}
			}
		}
	}
}

// answer takes, from the first n rows, those whose values are read, up to
// the first that is not.
func (r *tableRows) answer(n int) []tableRowJSON {
	var out []tableRowJSON
	for _, row := range r.sel[:n] {
		v, ok := r.ahead[row.digest]
		if !ok {
			break
		}
		out = append(out, tableRowJSON{Digest: row.digest, Val: v, OriginalIndex: row.index})
	}
	for _, row := range out {
		if v, ok := r.ahead[row.Digest]; ok {
			r.held -= len(v)
			delete(r.ahead, row.Digest)
		}
	}
	r.sel = r.sel[len(out):]
	return out
}

// queryTable validates a TableQueryReq and selects its rows, sorted and
// paged, for reading. A sort reads every row the filter selects, a batch
// at a time, and holds only their sort keys, within maxReadBytes.
func (s *Service) queryTable(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key) (*tableRows, *apiError) {
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
	sel := make([]selectedRow, 0, len(digests))
	for i, d := range digests {
		if only == nil || only[d] {
			sel = append(sel, selectedRow{d, i})
		}
	}
	if len(sortBy) > 0 {
		if sel, err = s.sortTableRows(ctx, proj.ID, sel, sortBy); err != nil {
			var ae *apiError
			if errors.As(err, &ae) {
				return nil, ae
			}
			return nil, internalError(err)
		}
	}
	lo := min(offset, len(sel))
	hi := len(sel)
	if limit >= 0 {
		hi = min(lo+limit, hi)
	}
	return &tableRows{ws: s.weave, projectID: proj.ID, sel: sel[lo:hi]}, nil
}

// sortTableRows orders sel stably by the values of sortBy's fields in its
// rows (absent ones first ascending, as weave.SortDocs orders them). The
// rows are read tableReadRows at a time and only their keys are kept, all
// within maxReadBytes.
func (s *Service) sortTableRows(ctx context.Context, projectID int64, sel []selectedRow, sortBy []weave.DocSort) ([]selectedRow, error) {
	type keyed struct {
		selectedRow
		keys []any
	}
	budget := readBudget{what: "a sort holds the sorted fields of every row it selects: sort fewer rows (filter.row_digests) or by smaller fields"}
	rows := make([]keyed, len(sel))
	for start := 0; start < len(sel); start += tableReadRows {
		batch := sel[start:min(start+tableReadRows, len(sel))]
		places := make(map[string][]int, len(batch)) // digest → its places in rows
		want := make([]string, 0, len(batch))
		for i, row := range batch {
			rows[start+i].selectedRow = row
			if places[row.digest] == nil {
				want = append(want, row.digest)
			}
			places[row.digest] = append(places[row.digest], start+i)
		}
		err := s.weave.EachTableRow(ctx, projectID, want, func(digest string, val json.RawMessage) error {
			keys, size := sortKeys(val, sortBy)
			if e := budget.take(size + sortedRowOverhead*len(places[digest])); e != nil {
				return e
			}
			for _, i := range places[digest] {
				rows[i].keys = keys
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	sort.SliceStable(rows, func(i, j int) bool {
		for k, by := range sortBy {
			var a, b any
			if rows[i].keys != nil {
				a = rows[i].keys[k]
			}
			if rows[j].keys != nil {
				b = rows[j].keys[k]
			}
			if r := weave.CompareValues(a, b); r != 0 {
				return (r < 0) != by.Desc
			}
		}
		return false
	})
	out := sel[:0]
	for _, r := range rows {
		out = append(out, r.selectedRow)
	}
	return out, nil
}

// sortKeys reads the values of sortBy's fields in a row, found through
// objects only, as weave.Lookup finds them; absent ones are nil. size is
// the bytes of their JSON.
func sortKeys(row json.RawMessage, sortBy []weave.DocSort) (keys []any, size int) {
	keys = make([]any, len(sortBy))
	doc := gjson.ParseBytes(row)
	for i, by := range sortBy {
		cur := doc
		for _, f := range by.Field {
			if !cur.IsObject() {
				cur = gjson.Result{}
				break
			}
			cur = cur.Get(gjson.Escape(f))
		}
		if !cur.Exists() {
			continue
		}
		size += len(cur.Raw)
		dec := json.NewDecoder(strings.NewReader(cur.Raw))
		dec.UseNumber()
		_ = dec.Decode(&keys[i]) // gjson found a whole JSON value
	}
	return keys, size
}

// tableQueryStats serves POST /table/query_stats {project_id, digest},
// counting from the row count stored with the table.
func (s *Service) tableQueryStats(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	digest, projectID, e := s.digestRequest(ctx, rc, key, "Table")
	if e != nil {
		return e
	}
	n, err := s.weave.TableRowCount(ctx, projectID, digest)
	if e := lookupError(err, "Table "+digest); e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]int{"count": n})
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
		n, err := s.weave.TableRowCount(ctx, proj.ID, d)
		switch {
		case errors.Is(err, weave.ErrNotFound):
			continue
		case err != nil:
			return internalError(err)
		}
		out = append(out, stat{Digest: d, Count: n})
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
