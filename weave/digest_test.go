package weave

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func decode(t *testing.T, s string) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestValueDigestMatchesWeave checks digests against Weave's own
// algorithm, computed with CPython 3:
//
//	def bytes_digest(b):
//	    h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).decode()
//	    return h.replace("-", "X").replace("_", "Y").rstrip("=")
//	bytes_digest(json.dumps(val, sort_keys=True).encode())
//
// The canonical text each case must produce is Python's json.dumps output.
func TestValueDigestMatchesWeave(t *testing.T) {
	tests := []struct {
		name, val, canonical, digest string
	}{
		{"keys sorted, non-ASCII escaped", `{"b":1,"a":"é"}`, `{"a": "\u00e9", "b": 1}`,
			"1zkT77MJtZhs3JWS7IaXxaAkwiQM4yF893fTlsTjg60"},
		{"a dataset object", `{"_type":"Dataset","_class_name":"Dataset","_bases":["Object","BaseModel"],"name":"qa","rows":"weave:///e/p/table/abc"}`,
			`{"_bases": ["Object", "BaseModel"], "_class_name": "Dataset", "_type": "Dataset", "name": "qa", "rows": "weave:///e/p/table/abc"}`,
			"XTTmZcYFXww405XJmUjXBe12BpmsFMq75fEJJNYzYjk"},
		{"a list of every kind", `["x",null,true,false,1.5,-3,{"z":{"y":[]}}]`, `["x", null, true, false, 1.5, -3, {"z": {"y": []}}]`,
			"DEHtCvl8Z841vvMvbJnEzLWbxOqX0yhuUL5BXM8Tqi0"},
		{"escapes: astral, controls, DEL", `"emoji 😀 tab\t nl\n quote\" back\\ ctrl\u0001 del` + "\x7f" + `"`,
			`"emoji \ud83d\ude00 tab\t nl\n quote\" back\\ ctrl\u0001 del\u007f"`,
			"Ehawz5zqegFwbxQejXyXtFN9RbxWxZMdu45IFkRI0xY"},
		{"key order by code point", `{"é":3,"a":2,"B":1,"":0}`, `{"": 0, "B": 1, "a": 2, "\u00e9": 3}`,
			"tzH3XcsRuB8RsFpiEGxdOLzYsrTkXXHdX2MaTFSGYmA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := decode(t, tt.val)
			got, err := AppendCanonical(nil, v)
			if err != nil || string(got) != tt.canonical {
				t.Fatalf("canonical = %s, %v; want %s", got, err, tt.canonical)
			}
			d, err := ValueDigest(v)
			if err != nil || d != tt.digest {
				t.Fatalf("digest = %s, %v; want %s", d, err, tt.digest)
			}
		})
	}
}

func TestBytesAndTableDigests(t *testing.T) {
	// bytes_digest(b"hello"), bytes_digest(b"") in CPython.
	if d := BytesDigest([]byte("hello")); d != "LPJNulXwow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ" {
		t.Errorf("BytesDigest(hello) = %s", d)
	}
	if d := BytesDigest(nil); d != "47DEQpj8HBSaXYTImWX5JCeuQeRkm5NMpJWZG3hSuFU" {
		t.Errorf("BytesDigest(empty) = %s", d)
	}
	// Rows {"q":"1+1","a":"2"} and {"q":"2+2","a":"4"}: their digests, and
	// the hex SHA-256 of the two concatenated (Weave's table digest).
	digest, rows, stored, err := NewTable([]map[string]any{
		{"q": "1+1", "a": "2"}, {"q": "2+2", "a": "4"}, {"q": "1+1", "a": "2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"4AyQSRRsY71h5G0LnrJKkmtgs2vtUgoY3lef86WLN5A", "0S9DGT9WaTh3NmpAYXd7YBefvlTW2psFGfzNGj9yHu8", "4AyQSRRsY71h5G0LnrJKkmtgs2vtUgoY3lef86WLN5A"}
	for i := range want {
		if rows[i] != want[i] {
			t.Fatalf("row digests = %v, want %v", rows, want)
		}
	}
	if len(stored) != 2 {
		t.Errorf("a repeated row is stored once: %d stored", len(stored))
	}
	if two := TableDigest(want[:2]); two != "df60df8796b210077f29f741e4cd5c03816fd705d2da6bc52a03e7d326e88c76" {
		t.Errorf("TableDigest = %s", two)
	}
	if digest == TableDigest(want[:2]) {
		t.Error("a third row did not change the table digest")
	}
	if d := TableDigest(nil); d != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("empty table digest = %s", d)
	}
}

func TestApplyTableUpdates(t *testing.T) {
	_, base, _, err := NewTable([]map[string]any{{"n": json.Number("0")}, {"n": json.Number("1")}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := ApplyTableUpdates(base, []TableUpdate{
		{Append: true, Row: map[string]any{"n": json.Number("2")}},
		{Pop: true, Index: 0},
		{Insert: true, Index: 1, Row: map[string]any{"n": json.Number("9")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	d2, _ := ValueDigest(map[string]any{"n": json.Number("2")})
	d9, _ := ValueDigest(map[string]any{"n": json.Number("9")})
	want := []string{base[1], d9, d2}
	if len(res.RowDigests) != 3 || res.RowDigests[0] != want[0] || res.RowDigests[1] != want[1] || res.RowDigests[2] != want[2] {
		t.Fatalf("rows = %v, want %v", res.RowDigests, want)
	}
	if res.Digest != TableDigest(want) {
		t.Error("digest is not the table digest of the rows")
	}
	if len(res.Updated) != 3 || res.Updated[0] != d2 || res.Updated[1] != base[0] || res.Updated[2] != d9 {
		t.Errorf("updated = %v", res.Updated)
	}
	if len(res.NewRows) != 2 {
		t.Errorf("new rows = %d, want 2", len(res.NewRows))
	}
	for _, bad := range []TableUpdate{{Pop: true, Index: 2}, {Insert: true, Index: 3, Row: map[string]any{}}, {Pop: true, Index: -1}} {
		var ie *IndexError
		if _, err := ApplyTableUpdates(base, []TableUpdate{bad}); !errors.As(err, &ie) {
			t.Errorf("%+v: err = %v, want an IndexError", bad, err)
		}
	}
}

func TestParseRef(t *testing.T) {
	tests := []struct {
		in   string
		want Ref
		ok   bool
	}{
		{"weave:///e/p/object/ds:abc", Ref{Entity: "e", Project: "p", Kind: RefObject, Name: "ds", Version: "abc", Extra: []string{}}, true},
		{"weave:///e/p/object/ds:abc/attr/rows/index/0", Ref{Entity: "e", Project: "p", Kind: RefObject, Name: "ds", Version: "abc", Extra: []string{"attr", "rows", "index", "0"}}, true},
		{"weave:///e/p/op/my%3Aop:v2", Ref{Entity: "e", Project: "p", Kind: RefOp, Name: "my:op", Version: "v2", Extra: []string{}}, true},
		{"weave:///e/p/table/0123/id/r1", Ref{Entity: "e", Project: "p", Kind: RefTable, Name: "0123", Extra: []string{"id", "r1"}}, true},
		{"weave:///e/p/call/c-1", Ref{Entity: "e", Project: "p", Kind: RefCall, Name: "c-1", Extra: []string{}}, true},
		{"weave:///e/p/object/ds", Ref{}, false},
		{"weave:///e/p/object/ds:abc/attr", Ref{}, false},
		{"weave:///e/p/object/ds:abc/bogus/x", Ref{}, false},
		{"weave:///e/p/thing/x", Ref{}, false},
		{"weave:///e//object/ds:abc", Ref{}, false},
		{"http://e/p/object/ds:abc", Ref{}, false},
		// Escapes may make any Unicode but a NUL character: the store
		// can hold nothing else.
		{"weave:///e/p/object/caf%C3%A9:abc", Ref{Entity: "e", Project: "p", Kind: RefObject, Name: "café", Version: "abc", Extra: []string{}}, true},
		{"weave:///e/p/object/a%00b:abc", Ref{}, false},
		{"weave:///e/p/object/a%ffb:abc", Ref{}, false},
		{"weave:///e/p%00/call/c", Ref{}, false},
		{"weave:///e%ff/p/call/c", Ref{}, false},
		{"weave:///e/p/call/c%00", Ref{}, false},
		{"weave:///e/p/table/0123/id/r%ff", Ref{}, false},
		{"weave:///e/p/object/ds:abc/key/%ED%A0%80", Ref{}, false}, // an encoded surrogate is not UTF-8
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseRef(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if tt.ok && (got.Entity != tt.want.Entity || got.Project != tt.want.Project || got.Kind != tt.want.Kind ||
				got.Name != tt.want.Name || got.Version != tt.want.Version || len(got.Extra) != len(tt.want.Extra)) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for i := range tt.want.Extra {
				if got.Extra[i] != tt.want.Extra[i] {
					t.Fatalf("extra = %v, want %v", got.Extra, tt.want.Extra)
				}
			}
		})
	}
}

func TestKindAndClasses(t *testing.T) {
	op := decode(t, `{"_type":"CustomWeaveType","weave_type":{"type":"Op"},"files":{"obj.py":"D1"},"load_op":"NO_LOAD_OP"}`)
	if KindOf(op) != KindOp || OpCodeDigest(op) != "D1" {
		t.Errorf("op: kind %s, code %q", KindOf(op), OpCodeDigest(op))
	}
	if KindOf(decode(t, `{"_type":"Dataset"}`)) != KindObject || KindOf(decode(t, `[1]`)) != KindObject {
		t.Error("non-ops must be objects")
	}
	leaf, base := ObjectClasses(decode(t, `{"_class_name":"MyEval","_bases":["Evaluation","Object","BaseModel"]}`))
	if leaf == nil || base == nil || *leaf != "MyEval" || *base != "Evaluation" {
		t.Errorf("classes = %v, %v", leaf, base)
	}
	leaf, base = ObjectClasses(decode(t, `{"_class_name":"Dataset","_bases":["Object","BaseModel"]}`))
	if leaf == nil || *leaf != "Dataset" || *base != "Dataset" {
		t.Errorf("classes = %v, %v", leaf, base)
	}
	if leaf, base = ObjectClasses(decode(t, `{"_class_name":"X","_bases":["Thing"]}`)); leaf != nil || base != nil {
		t.Error("a value outside weave.Object has no classes")
	}
}

func TestExpr(t *testing.T) {
	doc := decode(t, `{"id":"f1","feedback_type":"score","payload":{"score":0.8,"label":"Good"},"creator":null}`).(map[string]any)
	tests := []struct {
		expr string
		want bool
	}{
		{`{"$eq":[{"$getField":"id"},{"$literal":"f1"}]}`, true},
		{`{"$gt":[{"$getField":"payload.score"},{"$literal":0.5}]}`, true},
		{`{"$lte":[{"$getField":"payload.score"},{"$literal":0.5}]}`, false},
		{`{"$in":[{"$getField":"feedback_type"},[{"$literal":"a"},{"$literal":"score"}]]}`, true},
		{`{"$contains":{"input":{"$getField":"payload.label"},"substr":{"$literal":"goo"},"case_insensitive":true}}`, true},
		{`{"$contains":{"input":{"$getField":"payload.label"},"substr":{"$literal":"goo"}}}`, false},
		{`{"$not":[{"$eq":[{"$getField":"creator"},{"$literal":null}]}]}`, false},
		{`{"$and":[{"$eq":[{"$getField":"id"},{"$literal":"f1"}]},{"$gte":[{"$convert":{"input":{"$literal":"0.8"},"to":"double"}},{"$getField":"payload.score"}]}]}`, true},
		{`{"$or":[]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			x, err := ParseExpr(decode(t, tt.expr))
			if err != nil {
				t.Fatal(err)
			}
			if got := x.Match(doc); got != tt.want {
				t.Fatalf("Match = %v, want %v", got, tt.want)
			}
		})
	}
	for _, bad := range []string{`{"$nope":[]}`, `{"$eq":[1]}`, `{"$eq":[{"$literal":1}]}`, `[]`, `{"$literal":1,"$getField":"x"}`} {
		if _, err := ParseExpr(decode(t, bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
	ids, ok := IDsOf(mustExpr(t, `{"$or":[{"$eq":[{"$getField":"id"},{"$literal":"a"}]},{"$eq":[{"$literal":"b"},{"$getField":"id"}]},{"$in":[{"$getField":"id"},[{"$literal":"c"}]]}]}`))
	if !ok || len(ids) != 3 || ids[0] != "a" || ids[1] != "b" || ids[2] != "c" {
		t.Errorf("IDsOf = %v, %v", ids, ok)
	}
	if _, ok := IDsOf(mustExpr(t, `{"$eq":[{"$getField":"weave_ref"},{"$literal":"a"}]}`)); ok {
		t.Error("a selection by weave_ref is not one by ids")
	}
}

func mustExpr(t *testing.T, s string) Expr {
	t.Helper()
	x, err := ParseExpr(decode(t, s))
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestExprValues(t *testing.T) {
	tests := []struct {
		expr string
		want []string
		ok   bool
	}{
		{`{"$eq":[{"$getField":"weave_ref"},{"$literal":"r1"}]}`, []string{"r1"}, true},
		{`{"$in":[{"$getField":"weave_ref"},[{"$literal":"r1"},{"$literal":"r2"}]]}`, []string{"r1", "r2"}, true},
		{`{"$and":[{"$eq":[{"$getField":"feedback_type"},{"$literal":"x"}]},{"$eq":[{"$literal":"r3"},{"$getField":"weave_ref"}]}]}`, []string{"r3"}, true},
		{`{"$or":[{"$eq":[{"$getField":"weave_ref"},{"$literal":"a"}]},{"$eq":[{"$getField":"weave_ref"},{"$literal":"b"}]}]}`, []string{"a", "b"}, true},
		{`{"$or":[{"$eq":[{"$getField":"weave_ref"},{"$literal":"a"}]},{"$eq":[{"$getField":"id"},{"$literal":"b"}]}]}`, nil, false},
		{`{"$not":[{"$eq":[{"$getField":"weave_ref"},{"$literal":"a"}]}]}`, nil, false},
		{`{"$gt":[{"$getField":"weave_ref"},{"$literal":"a"}]}`, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, ok := mustExpr(t, tt.expr).Values("weave_ref")
			if ok != tt.ok || strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("Values = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestValueDigestRefusesNonUnicode: a string that is not UTF-8 (a stray
// byte, a surrogate's UTF-8 bytes) has no digest of its own, rather than
// the digest of U+FFFD, which another value has.
func TestValueDigestRefusesNonUnicode(t *testing.T) {
	for _, v := range []any{
		"\xff",
		"a\xed\xa0\x80b", // U+D800 in UTF-8 bytes
		map[string]any{"k\xff": "v"},
		[]any{"ok", map[string]any{"k": "\xc3"}},
	} {
		if d, err := ValueDigest(v); !errors.Is(err, ErrNotUnicode) {
			t.Errorf("ValueDigest(%q) = %q, %v; want ErrNotUnicode", v, d, err)
		}
	}
	for _, v := range []any{"\ufffd", "café 🙂", map[string]any{"\ufffd": "日本"}} {
		if _, err := ValueDigest(v); err != nil {
			t.Errorf("ValueDigest(%q): %v", v, err)
		}
	}
}
