package admin

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestHasEscapedNUL(t *testing.T) {
	tests := []struct {
		body string
		want bool
	}{
		{`{"a":"\u0000"}`, true},
		{`{"a":"x\\\u0000"}`, true},            // an escaped backslash, then the escape
		{`{"a":"\\u0000"}`, false},             // a backslash, then the text u0000
		{`{"a":"\\\\u0000"}`, false},           // two backslashes, then text
		{`{"a":"\\u0000","b":"\u0000"}`, true}, // the second one counts
		{`{"a":"\u00001"}`, true},
		{`{"a":"\u0001"}`, false},
		{`{}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			if got := hasEscapedNUL([]byte(tt.body)); got != tt.want {
				t.Errorf("= %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNewBodyBoundsStaysUnderSQLiteDepth(t *testing.T) {
	for _, tt := range []struct{ configured, want int }{
		{0, defaultMaxJSONDepth}, {10, 10}, {5000, maxStoredJSONDepth},
	} {
		if got := newBodyBounds(tt.configured).maxDepth; got != tt.want {
			t.Errorf("newBodyBounds(%d) = %d, want %d", tt.configured, got, tt.want)
		}
	}
}

// TestBoundQuery checks the query bounds on their own: with a large
// server.max_json_depth, the body bound no longer stops a deep query.
func TestBoundQuery(t *testing.T) {
	deep := func(n int) any {
		var x any = map[string]any{"$literal": 1}
		for range n - 1 {
			x = map[string]any{"$not": []any{x}}
		}
		return x
	}
	many := func(n int) any {
		ops := make([]any, n)
		for i := range ops {
			ops[i] = map[string]any{"$literal": i}
		}
		return map[string]any{"$and": ops}
	}
	loc := []any{"body", "query", "$expr"}
	tests := []struct {
		name    string
		expr    any
		ok      bool
		wantLoc []any
	}{
		{"64 deep", deep(64), true, nil},
		{"65 deep", deep(65), false, notPath(loc, 64)},
		{"5,000 operands", many(4999), true, nil},
		{"5,002 operands", many(5001), false, loc},
		{"a large $literal is one operand", map[string]any{"$eq": []any{
			map[string]any{"$literal": deepValue(500)}, map[string]any{"$literal": 1}}}, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v validation
			if got := boundQuery(&v, tt.expr, loc); got != tt.ok {
				t.Fatalf("= %v, want %v (%v)", got, tt.ok, v.errs)
			}
			if tt.ok {
				return
			}
			if got := v.errs[0].Loc; !reflect.DeepEqual(got, tt.wantLoc) {
				t.Errorf("loc = %v, want %v", got, tt.wantLoc)
			}
		})
	}
}

// notPath is the loc of the operand n $not below loc.
func notPath(loc []any, n int) []any {
	out := append([]any{}, loc...)
	for range n {
		out = append(out, "$not", 0)
	}
	return out
}

func deepValue(n int) any {
	var x any = 1
	for range n {
		x = map[string]any{"a": x}
	}
	return x
}

func TestHasLoneSurrogate(t *testing.T) {
	tests := []struct {
		body string
		want bool
	}{
		{`{"a":"\ud800"}`, true},
		{`{"a":"\uDC00"}`, true},
		{`{"a":"\ud83d\ude42"}`, false},      // a pair
		{`{"a":"\uD83D\uDE42"}`, false},      // a pair, upper case
		{`{"a":"\ude42\ud83d"}`, true},       // a pair reversed
		{`{"a":"\ud83d\u0041"}`, true},       // a high one before another escape
		{`{"a":"\ud83d\n"}`, true},           // before another kind of escape
		{`{"a":"\ud83d"}`, true},             // ending the string
		{`{"a":"\\ud800"}`, false},           // an escaped backslash, then text
		{`{"a":"\\\ud800"}`, true},           // an escaped backslash, then the escape
		{`{"a":"x","\udfff":1}`, true},       // a key
		{`{"a":"\ud83d\ude42\udc00"}`, true}, // a pair, then a low one
		{`{"a":"\u00e9\uffff"}`, false},
		{`{"a":"\ud8"}`, false}, // no escape: the decoder refuses it
		{`{}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			if got := hasLoneSurrogate([]byte(tt.body)); got != tt.want {
				t.Errorf("= %v, want %v", got, tt.want)
			}
		})
	}
}

// FuzzBodyBounds feeds arbitrary bodies to the bounds every trace-service
// request passes. A refusal must be a FastAPI-shaped 422 under "body". A
// body accepted and decoded must hold no NUL character, nest no deeper
// than the bound, and have lost nothing to the decoder: every U+FFFD of
// its strings and keys is one the body spells (as UTF-8 or as an escape),
// none a lone surrogate or a byte that is not UTF-8 read as U+FFFD, so
// that no two distinct bodies are stored, or digested, as one.
func FuzzBodyBounds(f *testing.F) {
	for _, s := range []string{
		`{"a":"\ud800"}`, `{"a":"\udc00"}`, `{"a":"\ud83d\ude42"}`, `{"a":"\ude42\ud83d"}`, `{"\ud800":1}`,
		`{"a":"\\ud800"}`, `{"a":"\ufffd"}`, "{\"a\":\"\xef\xbf\xbd\"}", "{\"a\":\"\xff\"}", "{\"a\":\"\xed\xa0\x80\"}",
		`{"a":"\u0000"}`, `{"a\u0000":1}`, `{"a":"\\u0000"}`, `[[[[[[[[1]]]]]]]]`, `{"a":"[[[["}`,
		`{"start":{"project_id":"team-a/p","op_name":"caf\u00e9:*","inputs":{"q":["\ud800",1]}}}`,
		`{"obj":{"project_id":"team-a/p","object_id":"o","val":{"s":"\uD800\u0041"}}}`,
		`{"a":"\ud83d\ude42\udc00"}`, `{"a":"\ufffd","\ufffd":"\ufffd"}`, `"\ud800"`, `{"a":1,"a":"\ud800"}`,
		``, `{`, `nul`, "\x00",
	} {
		f.Add([]byte(s))
	}
	bounds := newBodyBounds(0)
	f.Fuzz(func(t *testing.T, body []byte) {
		var rc fasthttp.RequestCtx
		rc.Request.Header.SetContentType("application/json")
		rc.Request.SetBody(body)
		if e := bounds.check(&rc, pathParams{}, false); e != nil {
			checkValidationError(t, e, bodyLoc)
			return
		}
		doc, e := decodeBody(body, false)
		if e != nil {
			return // the handler refuses what does not decode
		}
		var nul bool
		replaced := 0
		var walk func(x any, depth int) int
		walk = func(x any, depth int) int {
			deepest := depth
			switch x := x.(type) {
			case map[string]any:
				for k, item := range x {
					nul = nul || strings.IndexByte(k, 0) >= 0
					replaced += strings.Count(k, "\ufffd")
					deepest = max(deepest, walk(item, depth+1))
				}
			case []any:
				for _, item := range x {
					deepest = max(deepest, walk(item, depth+1))
				}
			case string:
				nul = nul || strings.IndexByte(x, 0) >= 0
				replaced += strings.Count(x, "\ufffd")
			default:
				return depth - 1 // a scalar adds no level
			}
			return deepest
		}
		depth := walk(doc, 1)
		switch {
		case nul:
			t.Fatalf("accepted a NUL character: %q", body)
		case depth > bounds.maxDepth:
			t.Fatalf("accepted %d levels of nesting: %q", depth, body)
		case replaced > spelledReplacements(body):
			// Duplicate keys may merge spelled ones: only more than
			// spelled is a loss.
			t.Fatalf("decoded %d U+FFFD, the body spells %d: %q", replaced, spelledReplacements(body), body)
		}
	})
}

// spelledReplacements counts the U+FFFD a JSON body spells: as UTF-8, or
// as a \ufffd escape whose backslash is not itself escaped.
func spelledReplacements(body []byte) int {
	n := bytes.Count(body, []byte("\ufffd"))
	// Lower-case ASCII only, so that offsets stay those of body.
	lower := make([]byte, len(body))
	for i, c := range body {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	for i := bytes.Index(lower, []byte(`\ufffd`)); i >= 0; {
		run := 0
		for j := i; j >= 0 && body[j] == '\\'; j-- {
			run++
		}
		if run%2 == 1 {
			n++
		}
		next := bytes.Index(lower[i+1:], []byte(`\ufffd`))
		if next < 0 {
			break
		}
		i += 1 + next
	}
	return n
}
