package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"mime/multipart"
	"net/textproto"
	"reflect"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/trace"
)

// incompressible is n bytes of random letters, digits, '-' and '_': text
// PostgreSQL cannot compress below its index entry size, as a hostile
// client would send, where "aaa..." would be stored compressed and pass.
func incompressible(seed uint64, n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// refused checks that r is a FastAPI 422 whose first error is at a loc
// starting with wantLoc, of type typ, with ctx's entries.
func refused(t *testing.T, r response, wantLoc []any, typ string, ctx map[string]any) {
	t.Helper()
	if r.status != fasthttp.StatusUnprocessableEntity {
		t.Fatalf("status %d, want 422: %.300s", r.status, r.body)
	}
	var got struct {
		Detail []struct {
			Loc  []any          `json:"loc"`
			Type string         `json:"type"`
			Msg  string         `json:"msg"`
			Ctx  map[string]any `json:"ctx"`
		} `json:"detail"`
	}
	if err := json.Unmarshal(r.body, &got); err != nil || len(got.Detail) == 0 {
		t.Fatalf("not a FastAPI 422 (%v): %.300s", err, r.body)
	}
	d := got.Detail[0]
	if len(d.Loc) < len(wantLoc) || !reflect.DeepEqual(d.Loc[:len(wantLoc)], wantLoc) {
		t.Errorf("loc = %v, want it to start with %v", d.Loc, wantLoc)
	}
	if d.Type != typ || d.Msg == "" {
		t.Errorf("type %q msg %q, want type %q", d.Type, d.Msg, typ)
	}
	for k, want := range ctx {
		if d.Ctx[k] != want {
			t.Errorf("ctx[%s] = %v, want %v", k, d.Ctx[k], want)
		}
	}
	if len(r.body) > 16<<10 {
		t.Errorf("the 422 is %d bytes: refused input is echoed whole", len(r.body))
	}
}

// formField is one field of a multipart form; a file when fileName is set.
type formField struct {
	name, fileName, value string
}

// postForm sends fields to /file/create as multipart/form-data.
func (e *env) postForm(t *testing.T, authz string, fields ...formField) response {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	for _, f := range fields {
		h := textproto.MIMEHeader{}
		disposition := `form-data; name="` + f.name + `"`
		if f.fileName != "" {
			// Written by hand: mime/multipart's CreateFormFile escapes
			// quotes only, and this is what a hostile client sends.
			disposition += `; filename="` + f.fileName + `"`
			h.Set("Content-Type", "application/octet-stream")
		}
		h.Set("Content-Disposition", disposition)
		pw, err := w.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pw.Write([]byte(f.value)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return e.doRaw(t, "POST", "/file/create", authz, w.FormDataContentType(), buf.Bytes())
}

// TestMultipartFieldsBounded checks that the fields of /file/create's form
// meet the bounds of every JSON string (no NUL, UTF-8, a project_id short
// enough to be indexed): a 422 naming the field, and nothing stored. They
// answered a 500 on PostgreSQL, and were stored on SQLite.
func TestMultipartFieldsBounded(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	longName := incompressible(1, 3000)
	tests := []struct {
		name    string
		fields  []formField
		wantLoc []any
		typ     string
		ctx     map[string]any
	}{
		{"NUL in project_id", []formField{{name: "project_id", value: "team-a/p\x00"}, {name: "file", fileName: "f", value: "content 1"}},
			[]any{"body", "project_id"}, "string_pattern_mismatch", map[string]any{"pattern": `^[^\x00]*$`}},
		{"project_id not UTF-8", []formField{{name: "project_id", value: "team-a/p\xff"}, {name: "file", fileName: "f", value: "content 2"}},
			[]any{"body", "project_id"}, "string_unicode", nil},
		{"project_id past the index entry size", []formField{{name: "project_id", value: "team-a/" + longName}, {name: "file", fileName: "f", value: "content 3"}},
			[]any{"body", "project_id"}, "string_too_long", map[string]any{"max_length": 512.0}},
		{"NUL in another field", []formField{{name: "project_id", value: "team-a/p"}, {name: "note", value: "a\x00b"}, {name: "file", fileName: "f", value: "content 4"}},
			[]any{"body", "note"}, "string_pattern_mismatch", nil},
		{"a field name not UTF-8", []formField{{name: "project_id", value: "team-a/p"}, {name: "n\xff", value: "v"}, {name: "file", fileName: "f", value: "content 5"}},
			[]any{"body"}, "string_unicode", nil},
		{"a file name not UTF-8", []formField{{name: "project_id", value: "team-a/p"}, {name: "file", fileName: "f\xff.txt", value: "content 6"}},
			[]any{"body", "file", "filename"}, "string_unicode", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refused(t, e.postForm(t, a, tt.fields...), tt.wantLoc, tt.typ, tt.ctx)
		})
	}
	// Nothing refused was stored: not the files, not the project.
	for _, tt := range tests {
		content := tt.fields[len(tt.fields)-1].value
		digest := e.postForm(t, a, formField{name: "project_id", value: "team-a/check"},
			formField{name: "file", fileName: "f", value: content}).object(t)["digest"].(string)
		if r := e.do("POST", "/file/content", a, `{"project_id":"team-a/p","digest":"`+digest+`"}`); r.status != fasthttp.StatusNotFound {
			t.Errorf("%s: the refused file is stored in team-a/p: status %d", tt.name, r.status)
		}
	}
	if _, err := e.db.FindProject(context.Background(), "team-a", longName); !errors.Is(err, trace.ErrNotFound) {
		t.Errorf("the refused project was created: %v", err)
	}
	// A valid form at the bound is stored.
	atBound := "team-a/" + incompressible(2, 512-len("team-a/"))
	if r := e.postForm(t, a, formField{name: "project_id", value: atBound}, formField{name: "file", fileName: "café.txt", value: "x"}); r.status != fasthttp.StatusOK {
		t.Fatalf("a 512-byte project_id: status %d: %s", r.status, r.body)
	}
}

// TestJSONBodyLabelledMultipartIsBounded checks that a JSON body sent with
// a multipart Content-Type that is no form gets the bounds of JSON: the
// handlers read it as JSON, and the bounds used to skip any multipart body.
func TestJSONBodyLabelledMultipartIsBounded(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	body := []byte(`{"start":{"project_id":"team-a/mp","op_name":"a\u0000b","started_at":"2026-11-21T10:00:00Z"}}`)
	for _, ct := range []string{"multipart/mixed", "multipart/form-data", "multipart/related; boundary=x", "Multipart/Form-Data"} {
		t.Run(ct, func(t *testing.T) {
			refused(t, e.doRaw(t, "POST", "/call/start", a, ct, body), []any{"body", "start", "op_name"}, "string_pattern_mismatch", nil)
		})
	}
	r := e.ok("POST", "/calls/stream_query", a, `{"project_id":"team-a/mp"}`)
	if lines := r.lines(t); len(lines) != 0 {
		t.Errorf("refused calls were stored: %v", lines)
	}
}

// TestIndexedTextBounded checks every text the store indexes that a client
// chooses (a project's entity and name, in a body or a path; a feedback's
// weave_ref; a cost's llm_id; the names a ref escapes) against its bound:
// past it, or not storable text, is a 422 naming the field, where
// PostgreSQL answered a 500 (an index entry over 2,704 bytes, a NUL, bytes
// not UTF-8). At the bound, each is stored, on either engine.
func TestIndexedTextBounded(t *testing.T) {
	e := newEnv(t)
	a, star := bearer(aliceKey), bearer(starKey)
	long := incompressible(3, 2800)
	tests := []struct {
		name, authz, path, body string
		wantLoc                 []any
		typ                     string
		ctx                     map[string]any
	}{
		{"obj/create project name", a, "/obj/create", `{"obj":{"project_id":"team-a/` + long + `","object_id":"o","val":1}}`,
			[]any{"body", "obj", "project_id"}, "string_too_long", map[string]any{"max_length": 512.0}},
		{"obj/create entity of a star key", star, "/obj/create", `{"obj":{"project_id":"` + long + `/p","object_id":"o","val":1}}`,
			[]any{"body", "obj", "project_id"}, "string_too_long", nil},
		{"table/create project name", a, "/table/create", `{"table":{"project_id":"team-a/` + long + `","rows":[]}}`,
			[]any{"body", "table", "project_id"}, "string_too_long", nil},
		{"feedback/create weave_ref", a, "/feedback/create",
			`{"project_id":"team-a/p","weave_ref":"weave:///team-a/p/call/` + long + `","feedback_type":"note","payload":{"note":"x"}}`,
			[]any{"body", "weave_ref"}, "string_too_long", map[string]any{"max_length": 2048.0}},
		{"feedback/replace weave_ref", a, "/feedback/replace",
			`{"project_id":"team-a/p","feedback_id":"f","weave_ref":"weave:///team-a/p/call/` + long + `","feedback_type":"note","payload":{"note":"x"}}`,
			[]any{"body", "weave_ref"}, "string_too_long", nil},
		{"cost/create llm_id", a, "/cost/create",
			`{"project_id":"team-a/p","costs":{"` + long + `":{"prompt_token_cost":1,"completion_token_cost":2}}}`,
			[]any{"body", "costs"}, "string_too_long", map[string]any{"max_length": 512.0}},
		{"path project", a, "/v2/team-a/" + long + "/ops", `{"name":"x","source_code":"y"}`,
			[]any{"path", "project"}, "string_too_long", map[string]any{"max_length": 512.0}},
		{"path entity of a star key", star, "/v2/" + long + "/p/evaluation_runs", `{"evaluation":"e","model":"m"}`,
			[]any{"path", "entity"}, "string_too_long", nil},
		{"path project not UTF-8", a, "/v2/team-a/p%ff/ops", `{"name":"x","source_code":"y"}`,
			[]any{"path", "project"}, "string_unicode", nil},
		{"ref name escaping a NUL", a, "/refs/read_batch", `{"refs":["weave:///team-a/p/object/a%00:abc"]}`,
			[]any{"body", "refs", 0.0}, "value_error", nil},
		{"ref project escaping bytes not UTF-8", a, "/refs/read_batch", `{"refs":["weave:///team-a/p%ff/call/c"]}`,
			[]any{"body", "refs", 0.0}, "value_error", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refused(t, e.do("POST", tt.path, tt.authz, tt.body), tt.wantLoc, tt.typ, tt.ctx)
		})
	}
	if _, err := e.db.FindProject(context.Background(), "team-a", long); !errors.Is(err, trace.ErrNotFound) {
		t.Errorf("a refused project was created: %v", err)
	}

	// At the bounds, everything is stored.
	name := incompressible(4, 512-len("team-a/"))
	ref := "weave:///team-a/p/call/" + incompressible(5, 2048-len("weave:///team-a/p/call/"))
	llm := incompressible(6, 512)
	e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/`+name+`","object_id":"o","val":1}}`)
	e.ok("POST", "/v2/team-a/"+incompressible(7, 512)+"/ops", a, `{"name":"x","source_code":"y"}`)
	e.ok("POST", "/v2/"+incompressible(8, 512)+"/"+incompressible(9, 512)+"/ops", star, `{"name":"x","source_code":"y"}`)
	e.ok("POST", "/feedback/create", a, `{"project_id":"team-a/p","weave_ref":"`+ref+`","feedback_type":"note","payload":{"note":"x"}}`)
	e.ok("POST", "/cost/create", a, `{"project_id":"team-a/p","costs":{"`+llm+`":{"prompt_token_cost":1,"completion_token_cost":2}}}`)
	if r := e.ok("POST", "/feedback/query", a, `{"project_id":"team-a/p"}`); !strings.Contains(string(r.body), ref) {
		t.Errorf("the 2,048-byte weave_ref is not read back: %.300s", r.body)
	}
}

// TestLoneSurrogatesRefused checks that a JSON string holding a lone UTF-16
// surrogate escape, or bytes that are not UTF-8, is a 422 naming it, as
// pydantic refuses a str it cannot read as Unicode: Go's decoder reads
// either as U+FFFD, so that distinct values would be stored, and digested,
// as one. What is accepted has a digest of its own.
func TestLoneSurrogatesRefused(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	obj := func(val string) string {
		return `{"obj":{"project_id":"team-a/s","object_id":"o","val":` + val + `}}`
	}
	tests := []struct {
		name, path, body string
		wantLoc          []any
	}{
		{"a high surrogate", "/obj/create", obj(`{"s":"\ud800"}`), []any{"body", "obj", "val", "s"}},
		{"a low surrogate", "/obj/create", obj(`{"s":"\uDC00"}`), []any{"body", "obj", "val", "s"}},
		{"a high surrogate in text", "/obj/create", obj(`{"s":"a\ud83db"}`), []any{"body", "obj", "val", "s"}},
		{"a high surrogate before another escape", "/obj/create", obj(`{"s":"\ud800\u0041"}`), []any{"body", "obj", "val", "s"}},
		{"a pair reversed", "/obj/create", obj(`{"s":"\ude42\ud83d"}`), []any{"body", "obj", "val", "s"}},
		{"a high surrogate ending the string", "/obj/create", obj(`{"s":"ok","t":"x\ud800"}`), []any{"body", "obj", "val", "t"}},
		{"in a key", "/obj/create", obj(`{"k\udfff":1}`), []any{"body", "obj", "val", "k\ufffd"}},
		{"in a list", "/obj/create", obj(`["ok","\\\ud800"]`), []any{"body", "obj", "val", 1.0}},
		{"a byte that is not UTF-8", "/obj/create", obj("{\"s\":\"a\xffb\"}"), []any{"body", "obj", "val", "s"}},
		{"a surrogate's UTF-8 bytes", "/obj/create", obj("{\"s\":\"\xed\xa0\x80\"}"), []any{"body", "obj", "val", "s"}},
		{"in call inputs", "/call/start",
			`{"start":{"project_id":"team-a/s","op_name":"op","started_at":"2026-11-21T10:00:00Z","inputs":{"q":[{"r":"\ud800"}]}}}`,
			[]any{"body", "start", "inputs", "q", 0.0, "r"}},
		{"in a table row", "/table/create", `{"table":{"project_id":"team-a/s","rows":[{"a":1},{"a":"\udbff"}]}}`,
			[]any{"body", "table", "rows", 1.0, "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refused(t, e.do("POST", tt.path, a, tt.body), tt.wantLoc, "string_unicode", nil)
		})
	}
	// Nothing refused was stored.
	if r := e.ok("POST", "/calls/stream_query", a, `{"project_id":"team-a/s"}`); len(r.lines(t)) != 0 {
		t.Errorf("a refused call was stored: %s", r.body)
	}
	if r := e.do("POST", "/obj/read", a, `{"project_id":"team-a/s","object_id":"o","digest":"latest"}`); r.status != fasthttp.StatusNotFound {
		t.Errorf("a refused object was stored: status %d: %.300s", r.status, r.body)
	}

	// What is accepted is Unicode, each value with a digest of its own;
	// an escaped pair and its character are one value.
	digests := map[string]string{}
	for name, val := range map[string]string{
		"U+FFFD":                `{"s":"\ufffd"}`,
		"U+FFFD raw":            "{\"s\":\"\xef\xbf\xbd\"}",
		"a pair":                `{"s":"\ud83d\ude42"}`,
		"its character":         `{"s":"🙂"}`,
		"an escaped backslash":  `{"s":"\\ud800"}`,
		"two escaped surrogate": `{"s":"\\udc00\\ud800"}`,
	} {
		digests[name] = e.ok("POST", "/obj/create", a, obj(val)).object(t)["digest"].(string)
	}
	if digests["U+FFFD"] != digests["U+FFFD raw"] || digests["a pair"] != digests["its character"] {
		t.Errorf("one value, two digests: %v", digests)
	}
	seen := map[string]bool{}
	for _, name := range []string{"U+FFFD", "a pair", "an escaped backslash", "two escaped surrogate"} {
		if seen[digests[name]] {
			t.Errorf("distinct values share a digest: %v", digests)
		}
		seen[digests[name]] = true
	}
}
