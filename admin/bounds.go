package admin

import (
	"bytes"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// The bounds of what the trace service accepts. Each keeps a body that
// would make the store fail (a 500 on every later query of the project,
// for a stored document) out of it, with a 422 naming the field, and is
// generous enough that no real client meets it.
const (
	// defaultMaxJSONDepth is the body nesting allowed when Options sets
	// none, as server.max_json_depth defaults to.
	defaultMaxJSONDepth = 64
	// maxStoredJSONDepth caps the body nesting whatever the configuration
	// says: SQLite's JSON functions refuse documents nested more than 1,000
	// deep, and a call stored that deep would fail every query of its
	// project.
	maxStoredJSONDepth = 900

	// maxListItems bounds each id list of a filter (trace_ids, call_ids,
	// ...) and of projects_info.
	maxListItems = 10_000
	// maxFilterValues bounds the values of a filter's lists together, and
	// maxQueryOperands the operands of one query: each becomes an SQL
	// parameter, and SQLite takes at most 32,766 in a statement
	// (PostgreSQL 65,535).
	maxFilterValues  = 10_000
	maxQueryOperands = 5_000
	// maxQueryDepth bounds how deep query operations nest ($not in $and in
	// $or ...): the store's SQL nests as deep, and the databases refuse
	// expressions nested about a thousand deep.
	maxQueryDepth = 64
	// maxSortFields bounds sort_by.
	maxSortFields = 100

	// maxIDBytes and maxOpNameBytes bound the identifiers a call is stored
	// and indexed under. PostgreSQL refuses an index entry above 2,704
	// bytes, and calls are indexed on (project_id, op_name, started_at, id).
	maxIDBytes     = 512
	maxOpNameBytes = 1024
)

// nulPattern is the pattern a string with a NUL character fails, in
// pydantic's words: PostgreSQL can store NUL neither in text nor in JSON
// documents, so no string of the trace service may hold one.
const nulPattern = `^[^\x00]*$`

// bodyBounds checks what every trace-service request carries before its
// handler decodes it: the nesting of the body, and NUL characters in the
// body and the path.
type bodyBounds struct {
	maxDepth int
}

// newBodyBounds bounds bodies to maxDepth levels of nesting: zero means
// defaultMaxJSONDepth, and more than maxStoredJSONDepth is capped.
func newBodyBounds(maxDepth int) bodyBounds {
	if maxDepth <= 0 {
		maxDepth = defaultMaxJSONDepth
	}
	return bodyBounds{maxDepth: min(maxDepth, maxStoredJSONDepth)}
}

// check refuses a request whose path parameters or body hold a NUL
// character, or whose body nests deeper than the bound, with a 422 naming
// the place. It scans the body's bytes once; only a body that fails is
// decoded, to name the field.
func (b bodyBounds) check(rc *fasthttp.RequestCtx, p pathParams, ownBody bool) *apiError {
	var v validation
	for _, f := range [...]struct{ name, value string }{
		{"entity", p.entity}, {"project", p.project}, {"id", p.id},
	} {
		if strings.IndexByte(f.value, 0) >= 0 {
			v.nul([]any{"path", f.name}, f.value)
		}
	}
	if v.failed() {
		return v.err()
	}
	// A multipart body (/file/create) carries a file's bytes, not JSON:
	// traces.max_file_bytes bounds it. A route that decodes its body
	// itself (/otel/v1/traces: protobuf, gzip) checks what it decoded.
	if ownBody || bytes.HasPrefix(rc.Request.Header.ContentType(), []byte("multipart/")) {
		return nil
	}
	return b.checkJSON(rc.PostBody())
}

// checkJSON refuses a JSON body holding a NUL character, or nesting deeper
// than the bound, with a 422 naming the place.
func (b bodyBounds) checkJSON(body []byte) *apiError {
	if !b.refuses(body) {
		return nil
	}
	var v validation
	doc, e := decodeBody(body, false)
	if e != nil {
		return e
	}
	b.walk(&v, doc, at(bodyLoc), 1)
	if !v.failed() {
		// The scan's finding is not where the decoded document has it
		// (a "\u0000" the decoder read otherwise): name the body.
		v.addCtx(at(bodyLoc), "value_error", "Value error, the body holds a NUL character or nests too deep", nil,
			map[string]any{"max_depth": b.maxDepth})
	}
	return v.err()
}

// refuses reports whether the JSON text doc holds a NUL character or
// nests deeper than the bound: it scans the bytes, decoding nothing.
func (b bodyBounds) refuses(doc []byte) bool {
	return jsonTooDeep(doc, b.maxDepth) || hasEscapedNUL(doc)
}

// walk reports the first place doc nests deeper than the bound, and every
// string or key holding a NUL. depth is the nesting of doc itself. Keys
// are visited in order, so that the errors are deterministic.
func (b bodyBounds) walk(v *validation, doc any, loc []any, depth int) {
	switch x := doc.(type) {
	case map[string]any:
		if depth > b.maxDepth {
			v.depth(loc, b.maxDepth)
			return
		}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if strings.IndexByte(k, 0) >= 0 {
				v.nul(at(loc, k), k)
			}
			b.walk(v, x[k], at(loc, k), depth+1)
			if len(v.errs) >= maxReported {
				return
			}
		}
	case []any:
		if depth > b.maxDepth {
			v.depth(loc, b.maxDepth)
			return
		}
		for i, item := range x {
			b.walk(v, item, at(loc, i), depth+1)
			if len(v.errs) >= maxReported {
				return
			}
		}
	case string:
		if strings.IndexByte(x, 0) >= 0 {
			v.nul(loc, x)
		}
	}
}

// maxReported bounds the errors one body's bounds report: a body of ten
// thousand NUL strings gets a readable answer, not ten thousand entries.
const maxReported = 20

func (v *validation) nul(loc []any, input any) {
	v.addCtx(loc, "string_pattern_mismatch", "String should match pattern '"+nulPattern+"' (no NUL character)", input,
		map[string]any{"pattern": nulPattern})
}

func (v *validation) depth(loc []any, limit int) {
	v.addCtx(loc, "value_error", "Value error, JSON nested deeper than "+strconv.Itoa(limit)+" levels", nil,
		map[string]any{"max_depth": limit})
}

// jsonTooDeep reports whether body nests arrays and objects deeper than
// limit, skipping strings. It reads body as JSON only as far as nesting
// goes: syntax is the decoder's job.
func jsonTooDeep(body []byte, limit int) bool {
	if bytes.Count(body, []byte("["))+bytes.Count(body, []byte("{")) <= limit {
		return false
	}
	depth := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '"':
			i = stringEnd(body, i)
		case '[', '{':
			depth++
			if depth > limit {
				return true
			}
		case ']', '}':
			depth--
		}
	}
	return false
}

// stringEnd returns the index of the quote closing the string whose
// opening quote is at start, or len(body) if it is not closed.
func stringEnd(body []byte, start int) int {
	for i := start + 1; i < len(body); i++ {
		switch body[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(body)
}

// hasEscapedNUL reports whether a JSON string in body holds the escape
// \u0000. A raw NUL byte is not valid JSON and is refused by the decoder.
func hasEscapedNUL(body []byte) bool {
	for i := bytes.Index(body, []byte(`\u0000`)); i >= 0; {
		// The escape counts only if its backslash is not itself escaped:
		// an odd run of backslashes ends in one that starts an escape.
		n := 0
		for j := i; j >= 0 && body[j] == '\\'; j-- {
			n++
		}
		if n%2 == 1 {
			return true
		}
		next := bytes.Index(body[i+1:], []byte(`\u0000`))
		if next < 0 {
			return false
		}
		i += 1 + next
	}
	return false
}

// boundCallIDs refuses identifiers of a call start or end (raw, its object
// as decoded) too long to be indexed. Fields that are absent or not
// strings are left to the call's own validation.
func boundCallIDs(v *validation, raw any, loc []any) {
	obj, ok := raw.(map[string]any)
	if !ok {
		return
	}
	for _, f := range [...]struct {
		key   string
		limit int
	}{
		{"project_id", maxIDBytes}, {"id", maxIDBytes}, {"trace_id", maxIDBytes}, {"parent_id", maxIDBytes},
		{"thread_id", maxIDBytes}, {"turn_id", maxIDBytes}, {"svc_user_id", maxIDBytes}, {"wb_user_id", maxIDBytes},
		{"svc_run_id", maxIDBytes}, {"wb_run_id", maxIDBytes}, {"op_name", maxOpNameBytes},
	} {
		if s, ok := obj[f.key].(string); ok && len(s) > f.limit {
			v.tooLongString(at(loc, f.key), s, f.limit)
		}
	}
}

func (v *validation) tooLongString(loc []any, s string, limit int) {
	v.addCtx(loc, "string_too_long", "String should have at most "+strconv.Itoa(limit)+" bytes of UTF-8, not "+
		strconv.Itoa(len(s)), truncateInput(s), map[string]any{"max_length": limit})
}

// truncateInput shortens a refused string echoed as a 422's input.
func truncateInput(s string) string {
	const keep = 64
	if len(s) <= keep {
		return s
	}
	cut := keep
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// tooLongList reports a list longer than limit, in pydantic's words. The
// input echoed is the length, not the list.
func (v *validation) tooLongList(loc []any, n, limit int) {
	v.addCtx(loc, "too_long", "List should have at most "+strconv.Itoa(limit)+" items after validation, not "+strconv.Itoa(n),
		nil, map[string]any{"field_type": "List", "max_length": limit, "actual_length": n})
}

// boundQuery checks a query's $expr (raw, as decoded) against
// maxQueryDepth and maxQueryOperands before it is parsed, reporting the
// first operand too deep, or the expression when it has too many. An
// operand is an object; a $literal's value is one operand however large.
func boundQuery(v *validation, raw any, loc []any) bool {
	count := 0
	var deep []any
	var walk func(x any, loc []any, depth int)
	walk = func(x any, loc []any, depth int) {
		if deep != nil || count > maxQueryOperands {
			return
		}
		switch x := x.(type) {
		case map[string]any:
			count++
			if depth > maxQueryDepth {
				deep = loc
				return
			}
			if _, ok := x["$literal"]; ok {
				return
			}
			for _, k := range slices.Sorted(maps.Keys(x)) {
				walk(x[k], at(loc, k), depth+1)
			}
		case []any:
			for i, item := range x {
				walk(item, at(loc, i), depth)
			}
		}
	}
	walk(raw, loc, 1)
	switch {
	case deep != nil:
		v.addCtx(deep, "value_error", "Value error, query operations nested deeper than "+strconv.Itoa(maxQueryDepth)+" levels",
			nil, map[string]any{"max_depth": maxQueryDepth})
		return false
	case count > maxQueryOperands:
		v.addCtx(loc, "value_error", "Value error, a query may have at most "+strconv.Itoa(maxQueryOperands)+" operands",
			nil, map[string]any{"max_operands": maxQueryOperands})
		return false
	}
	return true
}
