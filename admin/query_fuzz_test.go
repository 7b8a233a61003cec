package admin

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/tollgate-dev/tollgate/trace"
)

// FuzzParseQuery feeds arbitrary bytes, decoded as a request body is, to
// the calls query parser: as the "query" field, and as the $expr of one.
// It checks that nothing panics; that every refusal is a FastAPI-shaped
// validation error (a 422 whose detail entries each have a non-empty loc
// under the field, a msg and a type) that encodes to JSON; that the errors
// are the same on a second parse (so answers are deterministic); and that
// an accepted query is an operation, never a bare value.
func FuzzParseQuery(f *testing.F) {
	seeds := []string{
		`{"$expr":{"$and":[{"$literal":"a"},{"$literal":"b"}]}}`,
		`{"$expr":{"$not":[{"$eq":[{"$getField":"op_name"},{"$literal":"x"}]}]}}`,
		`{"$expr":{"$gt":[{"$getField":"summary.usage.gpt-4.1.total_tokens"},{"$literal":10}]}}`,
		`{"$expr":{"$in":[{"$getField":"op_name"},[{"$literal":"a"},{"$literal":1.5}]]}}`,
		`{"$expr":{"$contains":{"input":{"$getField":"inputs.a\\.b"},"substr":{"$literal":"chat"},"case_insensitive":"yes"}}}`,
		`{"$expr":{"$eq":[{"$convert":{"input":{"$getField":"attributes.n"},"to":"int"}},{"$literal":99999999999999999999999}]}}`,
		`{"$expr":{"$lte":[{"$getField":"started_at"},{"$literal":1e400}]}}`,
		`{"$expr":{"$or":[]},"x":1}`,
		`{"$expr":{"$literal":{"a":[1,null]}}}`,
		`{"$expr":{"$eq":[{"$literal":1}],"$and":[]}}`,
		`{"$expr":{"$not":{}}}`,
		`{"$expr":{"$getField":"inputs..x"}}`,
		`{"$and":[{"$literal":true}]}`,
		`{}`, `[]`, `null`, `1`, `"x"`, ``, `{`, `{"$expr":`, `{} {}`,
		"{\"$expr\":{\"$eq\":[{\"$getField\":\"op_name\"},{\"$literal\":\"\xff\"}]}}",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	queryLoc := []any{"body", "query"}
	f.Fuzz(func(t *testing.T, data []byte) {
		raw, e := decodeBody(data, false)
		if e != nil {
			checkValidationError(t, e, bodyLoc)
			return
		}
		for _, in := range []any{raw, map[string]any{"$expr": raw}} {
			var v validation
			q := parseQuery(&v, in, queryLoc)
			var again validation
			q2 := parseQuery(&again, in, queryLoc)
			if (q == nil) != (q2 == nil) || !bytes.Equal(encodeErrors(t, v.errs), encodeErrors(t, again.errs)) {
				t.Fatalf("two parses of %s disagree:\n%+v\n%+v", data, v.errs, again.errs)
			}
			if v.failed() {
				checkValidationError(t, v.err(), queryLoc)
				continue
			}
			switch {
			case in == nil:
				if q != nil {
					t.Fatalf("null parsed as %#v", q)
				}
			case q == nil:
				t.Fatalf("%s refused without an error", data)
			default:
				switch q.Expr.(type) {
				case trace.AndOp, trace.OrOp, trace.NotOp, trace.CompareOp, trace.InOp, trace.ContainsOp:
				default:
					t.Fatalf("accepted %s with a bare value %#v as $expr", data, q.Expr)
				}
			}
		}
	})
}

// encodeErrors encodes validation errors as the 422 body carries them.
func encodeErrors(t *testing.T, errs []fieldError) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(struct {
		Detail []fieldError `json:"detail"`
	}{errs}); err != nil {
		t.Fatalf("validation errors do not encode: %v", err)
	}
	return buf.Bytes()
}

// checkValidationError checks that e is a 422 whose body is FastAPI's
// validation error: {"detail": [{"loc": [...], "msg": "...", "type": "..."}]}
// with every loc starting at under.
func checkValidationError(t *testing.T, e *apiError, under []any) {
	t.Helper()
	if e.status != 422 || len(e.fields) == 0 {
		t.Fatalf("refusal is %d with %d entries, want a 422 with entries: %v", e.status, len(e.fields), e)
	}
	var body struct {
		Detail []map[string]any `json:"detail"`
	}
	dec := json.NewDecoder(bytes.NewReader(encodeErrors(t, e.fields)))
	dec.UseNumber() // inputs may hold numbers beyond float64, such as 1e400
	if err := dec.Decode(&body); err != nil || len(body.Detail) != len(e.fields) {
		t.Fatalf("422 body does not decode: %v", err)
	}
	for _, d := range body.Detail {
		loc, ok := d["loc"].([]any)
		if !ok || len(loc) < len(under) {
			t.Fatalf("entry %v: loc is not a list under %v", d, under)
		}
		for i, l := range loc {
			switch x := l.(type) {
			case string:
				if i < len(under) && x != under[i] {
					t.Fatalf("entry %v: loc not under %v", d, under)
				}
			case json.Number:
				if n, err := x.Int64(); i < len(under) || err != nil || n < 0 {
					t.Fatalf("entry %v: loc element %v is not a field name or an index", d, l)
				}
			default:
				t.Fatalf("entry %v: loc element %v (%T) is not a string or an integer", d, l, l)
			}
		}
		if msg, ok := d["msg"].(string); !ok || msg == "" {
			t.Fatalf("entry %v: no msg", d)
		}
		if typ, ok := d["type"].(string); !ok || typ == "" {
			t.Fatalf("entry %v: no type", d)
		}
		if _, ok := d["input"]; !ok {
			t.Fatalf("entry %v: no input", d)
		}
	}
}
