package admin

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/tollgate-dev/tollgate/trace"
)

func decodeAny(t *testing.T, s string) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return v
}

func TestParseQueryOperators(t *testing.T) {
	op := trace.GetField{Column: "op_name"}
	tests := []struct {
		name  string
		query string
		want  trace.Operand
	}{
		{"spec example: $and of string literals", `{"$expr":{"$and":[{"$literal":"a"},{"$literal":"b"}]}}`,
			trace.AndOp{Operands: []trace.Operand{trace.Literal{Value: "a"}, trace.Literal{Value: "b"}}}},
		{"$or", `{"$expr":{"$or":[{"$literal":true}]}}`, trace.OrOp{Operands: []trace.Operand{trace.Literal{Value: true}}}},
		{"$not", `{"$expr":{"$not":[{"$eq":[{"$getField":"op_name"},{"$literal":"x"}]}]}}`,
			trace.NotOp{Operand: trace.CompareOp{Op: trace.OpEq, Left: op, Right: trace.Literal{Value: "x"}}}},
		{"$gt with an integer", `{"$expr":{"$gt":[{"$getField":"summary.usage.m.total_tokens"},{"$literal":10}]}}`,
			trace.CompareOp{Op: trace.OpGt, Left: trace.GetField{Column: "summary", Path: []string{"usage", "m", "total_tokens"}}, Right: trace.Literal{Value: int64(10)}}},
		{"$gte with a float", `{"$expr":{"$gte":[{"$literal":1.5},{"$literal":null}]}}`,
			trace.CompareOp{Op: trace.OpGte, Left: trace.Literal{Value: 1.5}, Right: trace.Literal{Value: nil}}},
		{"$lt", `{"$expr":{"$lt":[{"$getField":"started_at"},{"$literal":"2026-01-01T00:00:00Z"}]}}`,
			trace.CompareOp{Op: trace.OpLt, Left: trace.GetField{Column: "started_at"}, Right: trace.Literal{Value: "2026-01-01T00:00:00Z"}}},
		{"$lte", `{"$expr":{"$lte":[{"$getField":"ended_at"},{"$literal":5}]}}`,
			trace.CompareOp{Op: trace.OpLte, Left: trace.GetField{Column: "ended_at"}, Right: trace.Literal{Value: int64(5)}}},
		{"$in", `{"$expr":{"$in":[{"$getField":"op_name"},[{"$literal":"a"},{"$literal":"b"}]]}}`,
			trace.InOp{Left: op, Values: []trace.Operand{trace.Literal{Value: "a"}, trace.Literal{Value: "b"}}}},
		{"$contains", `{"$expr":{"$contains":{"input":{"$getField":"op_name"},"substr":{"$literal":"chat"},"case_insensitive":true}}}`,
			trace.ContainsOp{Input: op, Substr: trace.Literal{Value: "chat"}, CaseInsensitive: true}},
		{"$convert nested in $eq", `{"$expr":{"$eq":[{"$convert":{"input":{"$getField":"attributes.n"},"to":"int"}},{"$literal":3}]}}`,
			trace.CompareOp{Op: trace.OpEq, Left: trace.Convert{Input: trace.GetField{Column: "attributes", Path: []string{"n"}}, To: trace.ToInt}, Right: trace.Literal{Value: int64(3)}}},
		{"composite literal", `{"$expr":{"$eq":[{"$getField":"output"},{"$literal":{"b":[1,"x"]}}]}}`,
			trace.CompareOp{Op: trace.OpEq, Left: trace.GetField{Column: "output"}, Right: trace.Literal{Value: json.RawMessage(`{"b":[1,"x"]}`)}}},
		{"model name with dots", `{"$expr":{"$gt":[{"$getField":"summary.usage.gpt-4.1.total_tokens"},{"$literal":0}]}}`,
			trace.CompareOp{Op: trace.OpGt, Left: trace.GetField{Column: "summary", Path: []string{"usage", "gpt-4.1", "total_tokens"}}, Right: trace.Literal{Value: int64(0)}}},
		{"escaped dot", `{"$expr":{"$eq":[{"$getField":"inputs.a\\.b.c"},{"$literal":1}]}}`,
			trace.CompareOp{Op: trace.OpEq, Left: trace.GetField{Column: "inputs", Path: []string{"a.b", "c"}}, Right: trace.Literal{Value: int64(1)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v validation
			q := parseQuery(&v, decodeAny(t, tt.query), []any{"body", "query"})
			if v.failed() {
				t.Fatalf("errors: %+v", v.errs)
			}
			if !reflect.DeepEqual(q.Expr, tt.want) {
				t.Fatalf("got %#v\nwant %#v", q.Expr, tt.want)
			}
		})
	}
}

func TestParseQueryErrors(t *testing.T) {
	tests := []struct {
		name     string
		query    string
		wantLoc  []any
		wantType string
	}{
		{"not an object", `[1]`, []any{"body", "query"}, "model_type"},
		{"unknown key beside $expr", `{"$expr":{"$and":[]},"bogus":1}`, []any{"body", "query", "bogus"}, "extra_forbidden"},
		{"$expr missing", `{}`, []any{"body", "query", "$expr"}, "missing"},
		{"$expr a bare value", `{"$expr":{"$literal":1}}`, []any{"body", "query", "$expr"}, "value_error"},
		{"unknown operator", `{"$expr":{"$and":[{"$bogus":[]}]}}`, []any{"body", "query", "$expr", "$and", 0}, "value_error"},
		{"extra key beside an operator", `{"$expr":{"$eq":[{"$literal":1},{"$literal":1}],"x":1}}`, []any{"body", "query", "$expr", "x"}, "extra_forbidden"},
		{"$and not a list", `{"$expr":{"$and":{}}}`, []any{"body", "query", "$expr", "$and"}, "list_type"},
		{"$not with two operands", `{"$expr":{"$not":[{"$literal":1},{"$literal":2}]}}`, []any{"body", "query", "$expr", "$not"}, "too_long"},
		{"$eq with one operand", `{"$expr":{"$eq":[{"$literal":1}]}}`, []any{"body", "query", "$expr", "$eq", 1}, "missing"},
		{"$in without a list", `{"$expr":{"$in":[{"$literal":1},{"$literal":1}]}}`, []any{"body", "query", "$expr", "$in", 1}, "list_type"},
		{"$contains without substr", `{"$expr":{"$contains":{"input":{"$literal":"a"}}}}`, []any{"body", "query", "$expr", "$contains", "substr"}, "missing"},
		{"$contains extra key", `{"$expr":{"$contains":{"input":{"$literal":"a"},"substr":{"$literal":"a"},"x":1}}}`, []any{"body", "query", "$expr", "$contains", "x"}, "extra_forbidden"},
		{"$contains bad case_insensitive", `{"$expr":{"$contains":{"input":{"$literal":"a"},"substr":{"$literal":"a"},"case_insensitive":"maybe"}}}`, []any{"body", "query", "$expr", "$contains", "case_insensitive"}, "bool_parsing"},
		{"$convert bad target", `{"$expr":{"$eq":[{"$convert":{"input":{"$literal":1},"to":"date"}},{"$literal":1}]}}`, []any{"body", "query", "$expr", "$eq", 0, "$convert", "to"}, "literal_error"},
		{"$getField not a string", `{"$expr":{"$eq":[{"$getField":1},{"$literal":1}]}}`, []any{"body", "query", "$expr", "$eq", 0, "$getField"}, "string_type"},
		{"$getField unknown field", `{"$expr":{"$eq":[{"$getField":"bogus"},{"$literal":1}]}}`, []any{"body", "query", "$expr", "$eq", 0, "$getField"}, "value_error"},
		{"$getField path into a scalar column", `{"$expr":{"$eq":[{"$getField":"op_name.x"},{"$literal":1}]}}`, []any{"body", "query", "$expr", "$eq", 0, "$getField"}, "value_error"},
		{"$getField empty segment", `{"$expr":{"$eq":[{"$getField":"inputs..x"},{"$literal":1}]}}`, []any{"body", "query", "$expr", "$eq", 0, "$getField"}, "value_error"},
		{"operand not an object", `{"$expr":{"$and":[1]}}`, []any{"body", "query", "$expr", "$and", 0}, "dict_type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v validation
			if q := parseQuery(&v, decodeAny(t, tt.query), []any{"body", "query"}); q != nil && !v.failed() {
				t.Fatalf("accepted: %#v", q)
			}
			for _, e := range v.errs {
				if reflect.DeepEqual(e.Loc, tt.wantLoc) && e.Type == tt.wantType {
					return
				}
			}
			t.Fatalf("errors %+v lack %s at %v", v.errs, tt.wantType, tt.wantLoc)
		})
	}
}

func TestParseFilter(t *testing.T) {
	raw := `{"op_names":["a"],"input_refs":["r1"],"output_refs":["r2"],"parent_ids":["p"],"trace_ids":["t"],
		"call_ids":["c"],"thread_ids":["th"],"turn_ids":["tu"],"trace_roots_only":true,"svc_user_ids":["u"],"svc_run_ids":["r"]}`
	var v validation
	f := parseFilter(&v, decodeAny(t, raw), []any{"body", "filter"})
	if v.failed() {
		t.Fatalf("errors: %+v", v.errs)
	}
	want := &trace.CallsFilter{
		OpNames: []string{"a"}, InputRefs: []string{"r1"}, OutputRefs: []string{"r2"}, ParentIDs: []string{"p"},
		TraceIDs: []string{"t"}, CallIDs: []string{"c"}, ThreadIDs: []string{"th"}, TurnIDs: []string{"tu"},
		TraceRootsOnly: true, SvcUserIDs: []string{"u"}, SvcRunIDs: []string{"r"},
	}
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("got %+v\nwant %+v", f, want)
	}

	v = validation{}
	parseFilter(&v, decodeAny(t, `{"bogus":1,"trace_ids":"x","call_ids":[1],"trace_roots_only":[]}`), []any{"body", "filter"})
	want2 := []struct {
		loc []any
		typ string
	}{
		{[]any{"body", "filter", "bogus"}, "extra_forbidden"},
		{[]any{"body", "filter", "trace_ids"}, "list_type"},
		{[]any{"body", "filter", "call_ids", 0}, "string_type"},
		{[]any{"body", "filter", "trace_roots_only"}, "bool_type"},
	}
	if len(v.errs) != len(want2) {
		t.Fatalf("errors = %+v", v.errs)
	}
	for i, w := range want2 {
		if !reflect.DeepEqual(v.errs[i].Loc, w.loc) || v.errs[i].Type != w.typ {
			t.Errorf("error %d = %v %s, want %v %s", i, v.errs[i].Loc, v.errs[i].Type, w.loc, w.typ)
		}
	}
}

func TestInternalProjectID(t *testing.T) {
	if got := InternalProjectID(123); got != "UHJvamVjdEludGVybmFsSWQ6MTIz" {
		t.Fatalf("InternalProjectID(123) = %s", got)
	}
	for _, tt := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"UHJvamVjdEludGVybmFsSWQ6MTIz", 123, true},
		{"UHJvamVjdEludGVybmFsSWQ6YWJj", 0, false}, // "ProjectInternalId:abc"
		{"UHJvamVjdEludGVybmFsSWQ6LTQ=", 0, false}, // "ProjectInternalId:-4"
		{"not base64!", 0, false},
		{"T3RoZXI6MQ==", 0, false}, // "Other:1"
	} {
		got, ok := parseInternalProjectID(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseInternalProjectID(%q) = %d, %v", tt.in, got, ok)
		}
	}
}
