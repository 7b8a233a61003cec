package admin

import (
	"bytes"
	"encoding/json"
	"maps"
	"mime/multipart"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/jsonscan"
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
	// maxRefBytes bounds a ref the store indexes (a feedback's weave_ref,
	// indexed on (project_id, weave_ref)): room for a ref's entity,
	// project, name, digest and path, and under the same index entry size.
	maxRefBytes = 2048
)

// nulPattern is the pattern a string with a NUL character fails, in
// pydantic's words: PostgreSQL can store NUL neither in text nor in JSON
// documents, so no string of the trace service may hold one.
const nulPattern = `^[^\x00]*$`

// bodyBounds checks what every trace-service request carries before its
// handler decodes it: the path parameters; a multipart form's fields; and
// a JSON body's nesting, NUL characters and Unicode.
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

// check refuses, with a 422 naming the place, a request whose path
// parameters are not short, NUL-free UTF-8, whose multipart form has a
// field that is not NUL-free UTF-8, or whose JSON body checkJSON refuses.
// A route that decodes its body itself (ownBody: /otel/v1/traces,
// protobuf or gzip) checks what it decoded.
func (b bodyBounds) check(rc *fasthttp.RequestCtx, p pathParams, ownBody bool) *apiError {
	var v validation
	for _, f := range [...]struct{ name, value string }{
		{"entity", p.entity}, {"project", p.project}, {"id", p.id},
	} {
		loc := []any{"path", f.name}
		v.plainString(loc, f.value)
		v.boundString(loc, f.value, maxIDBytes)
	}
	if v.failed() {
		return v.err()
	}
	if ownBody {
		return nil
	}
	// A multipart form (/file/create) carries a file's bytes, which
	// traces.max_file_bytes bounds, and fields, checked here. Any other
	// body is checked as JSON whatever its Content-Type says, as the
	// handlers read it.
	if form := multipartForm(rc); form != nil {
		checkForm(&v, form)
		if v.failed() {
			return v.err()
		}
		return nil
	}
	return b.checkJSON(rc.PostBody())
}

// checkJSON refuses, with a 422 naming the place, a JSON body that nests
// deeper than the bound or holds a string with a NUL character, a byte
// that is not UTF-8 or a lone UTF-16 surrogate escape. The decoder would
// read the last two as U+FFFD, so that distinct values would be stored,
// and digested, as one. It scans the body's bytes once; only a body that
// fails is decoded, to name the field.
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
	if badText(body) && len(v.errs) < maxReported {
		walkRawStrings(&v, body)
	}
	if !v.failed() {
		// The scan's finding is not where the decoded document has it
		// (a "\u0000" the decoder read otherwise): name the body.
		v.addCtx(at(bodyLoc), "value_error", "Value error, the body holds a NUL character or text that is not Unicode, or nests too deep", nil,
			map[string]any{"max_depth": b.maxDepth})
	}
	return v.err()
}

// multipartForm returns the request's multipart form, or nil when the body
// is not one.
func multipartForm(rc *fasthttp.RequestCtx) *multipart.Form {
	if !bytes.HasPrefix(rc.Request.Header.ContentType(), []byte("multipart/")) {
		return nil
	}
	form, err := rc.MultipartForm()
	if err != nil {
		return nil
	}
	return form
}

// checkForm reports every name, value and file name of form that is not
// NUL-free UTF-8, at ["body", name], in name order.
func checkForm(v *validation, form *multipart.Form) {
	for _, name := range slices.Sorted(maps.Keys(form.Value)) {
		loc := at(bodyLoc, name)
		v.plainString(loc, name)
		for _, value := range form.Value[name] {
			v.plainString(loc, value)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(form.File)) {
		loc := at(bodyLoc, name)
		v.plainString(loc, name)
		for _, fh := range form.File[name] {
			v.plainString(at(loc, "filename"), fh.Filename)
		}
	}
}

// plainString reports s, at loc, when it holds a NUL character or is not
// UTF-8: what the store cannot keep, or would keep as another string.
func (v *validation) plainString(loc []any, s string) {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		v.nul(loc, truncateInput(s))
	case !utf8.ValidString(s):
		v.notUnicode(loc, truncateInput(strings.ToValidUTF8(s, "\uFFFD")))
	}
}

// refuses reports whether checkJSON refuses doc: it scans the bytes,
// decoding nothing.
func (b bodyBounds) refuses(doc []byte) bool {
	return badText(doc) || jsonscan.TooDeepBytes(doc, b.maxDepth) || hasEscapedNUL(doc)
}

// badText reports whether doc holds bytes that are not UTF-8 or a lone
// UTF-16 surrogate escape.
func badText(doc []byte) bool {
	return !utf8.Valid(doc) || hasLoneSurrogate(doc)
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

// notUnicode reports a string that is not valid Unicode, in pydantic's
// words for a str it cannot read.
func (v *validation) notUnicode(loc []any, input any) {
	v.add(loc, "string_unicode", "Input should be a valid string, unable to parse raw data as a unicode string", input)
}

func (v *validation) depth(loc []any, limit int) {
	v.addCtx(loc, "value_error", "Value error, JSON nested deeper than "+strconv.Itoa(limit)+" levels", nil,
		map[string]any{"max_depth": limit})
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
		if s, ok := obj[f.key].(string); ok {
			v.boundString(at(loc, f.key), s, f.limit)
		}
	}
}

// boundString reports s, at loc, when it is longer than limit bytes: a
// text the store indexes (an id, a name, a ref) is bounded where it
// enters, as PostgreSQL refuses an index entry above 2,704 bytes.
func (v *validation) boundString(loc []any, s string, limit int) {
	if len(s) > limit {
		v.tooLongString(loc, s, limit)
	}
}

// boundProjectID refuses a project_id (raw, at loc) longer than a
// project's entity and name may be together in the store's index.
func boundProjectID(raw string, loc []any) *apiError {
	var v validation
	v.boundString(loc, raw, maxIDBytes)
	if v.failed() {
		return v.err()
	}
	return nil
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

// hasLoneSurrogate reports whether a JSON string in body holds a \u escape
// of a UTF-16 surrogate that is not half of a pair: a high surrogate not
// followed by a low one's escape, or a low one not preceded by a high one.
// Only bodies with an escape of a surrogate are scanned.
func hasLoneSurrogate(body []byte) bool {
	if !bytes.Contains(body, []byte(`\ud`)) && !bytes.Contains(body, []byte(`\uD`)) {
		return false
	}
	for i := 0; i < len(body); i++ {
		if body[i] != '"' {
			continue
		}
		end := jsonscan.ClosingQuoteBytes(body, i)
		if loneSurrogate(body[i+1 : min(end, len(body))]) {
			return true
		}
		i = end
	}
	return false
}

// loneSurrogate reports whether raw, the text of a JSON string between its
// quotes, holds an escape of a lone UTF-16 surrogate.
func loneSurrogate(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		r, ok := escapedUnit(raw[i:])
		switch {
		case !ok:
			i++ // another escape: skip the escaped byte
		case 0xDC00 <= r && r <= 0xDFFF:
			return true // a low surrogate, no high one before it
		case 0xD800 <= r && r <= 0xDBFF:
			low, ok := escapedUnit(raw[i+6:])
			if !ok || low < 0xDC00 || low > 0xDFFF {
				return true
			}
			i += 11 // the pair
		default:
			i += 5
		}
	}
	return false
}

// escapedUnit reads the UTF-16 code unit of a \uXXXX escape at the start
// of b; ok is false when b starts with no such escape.
func escapedUnit(b []byte) (r rune, ok bool) {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[2:6]), 16, 16)
	if err != nil {
		return 0, false
	}
	return rune(n), true
}

// walkRawStrings reports every string and key of body, a valid JSON
// document, whose text is not UTF-8 or holds a lone surrogate escape,
// named by its place in the document. It reads the document token by
// token, so that each string's text is read as it was sent.
func walkRawStrings(v *validation, body []byte) {
	type level struct {
		object  bool
		key     any // the key of the value being read in an object
		index   int // the index of the value being read in an array
		wantKey bool
	}
	var stack []level
	here := func() []any {
		out := at(bodyLoc)
		for _, l := range stack {
			if l.object {
				out = append(out, l.key)
			} else {
				out = append(out, l.index)
			}
		}
		return out
	}
	valueRead := func() {
		if len(stack) == 0 {
			return
		}
		if top := &stack[len(stack)-1]; top.object {
			top.wantKey = true
		} else {
			top.index++
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for len(v.errs) < maxReported {
		start := int(dec.InputOffset())
		tok, err := dec.Token()
		if err != nil {
			return
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, level{object: true, wantKey: true})
			case '[':
				stack = append(stack, level{})
			default:
				stack = stack[:len(stack)-1]
				valueRead()
			}
		case string:
			bad := badRawString(body, start)
			if len(stack) > 0 && stack[len(stack)-1].wantKey {
				top := &stack[len(stack)-1]
				top.key, top.wantKey = t, false
				if bad {
					v.notUnicode(here(), truncateInput(t))
				}
				continue
			}
			if bad {
				v.notUnicode(here(), truncateInput(t))
			}
			valueRead()
		default:
			valueRead()
		}
	}
}

// badRawString reports whether the JSON string whose token starts at or
// after from in body (past separators and white space) is not UTF-8 or
// holds a lone surrogate escape.
func badRawString(body []byte, from int) bool {
	i := from
	for i < len(body) && body[i] != '"' {
		i++
	}
	if i == len(body) {
		return false
	}
	raw := body[i+1 : min(jsonscan.ClosingQuoteBytes(body, i), len(body))]
	return !utf8.Valid(raw) || loneSurrogate(raw)
}
