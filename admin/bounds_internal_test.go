package admin

import (
	"reflect"
	"testing"
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

func TestJSONTooDeep(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		limit int
		want  bool
	}{
		{"at the limit", `{"a":[{"b":1}]}`, 3, false},
		{"past the limit", `{"a":[{"b":[1]}]}`, 3, true},
		{"brackets in strings do not count", `{"a":"[[[[{{{{"}`, 2, false},
		{"an escaped quote does not end a string", `{"a":"\"[[[["}`, 2, false},
		{"siblings do not add up", `[[1],[2],[3],[4]]`, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := jsonTooDeep([]byte(tt.body), tt.limit); got != tt.want {
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
