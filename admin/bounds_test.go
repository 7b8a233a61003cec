package admin_test

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// nest wraps leaf in n objects {"a": ...}.
func nest(n int, leaf string) string {
	return strings.Repeat(`{"a":`, n) + leaf + strings.Repeat("}", n)
}

// idList is a JSON list of n distinct ids.
func idList(n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Quote("id-" + strconv.Itoa(i))
	}
	return "[" + strings.Join(ids, ",") + "]"
}

// literals is a JSON list of n $literal operands.
func literals(n int) string {
	ops := make([]string, n)
	for i := range ops {
		ops[i] = `{"$literal":"v` + strconv.Itoa(i) + `"}`
	}
	return "[" + strings.Join(ops, ",") + "]"
}

// notNest wraps an operation in n $not.
func notNest(n int) string {
	return strings.Repeat(`{"$not":[`, n) + `{"$eq":[{"$getField":"op_name"},{"$literal":"x"}]}` + strings.Repeat("]}", n)
}

const boundsStart = `{"project_id":"team-a/bounds","id":"ok-1","op_name":"op","started_at":"2026-11-21T10:00:00Z"}`

// TestTraceServiceRefusesHostileBodies checks that what would break the
// store (documents nested past SQLite's JSON depth, NUL characters, id
// lists past the SQL parameter limits, deep or huge queries, identifiers
// past PostgreSQL's index entry size) is a 422 naming the field, that
// nothing of a refused write is stored, and that the project answers
// queries afterwards. The admin suite runs on PostgreSQL when
// TOLLGATE_TEST_PG_DSN is set, else on SQLite.
func TestTraceServiceRefusesHostileBodies(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name    string
		path    string
		body    string
		wantLoc []any // a prefix of the first error's loc
		typ     string
		ctx     map[string]any // entries the first error's ctx must hold
	}{
		{"start inputs nested 1001 deep", "/call/start",
			`{"start":{"project_id":"team-a/bounds","op_name":"op","started_at":"2026-11-21T10:00:00Z","inputs":` + nest(1001, "1") + `}}`,
			[]any{"body", "start", "inputs", "a"}, "value_error", map[string]any{"max_depth": 64.0}},
		{"end summary nested 65 deep", "/call/end",
			`{"end":{"project_id":"team-a/bounds","id":"x","ended_at":"2026-11-21T10:00:00Z","summary":` + nest(65, "1") + `}}`,
			[]any{"body", "end", "summary", "a"}, "value_error", map[string]any{"max_depth": 64.0}},
		{"batch output nested deep after a valid start", "/call/upsert_batch",
			`{"batch":[{"mode":"start","req":{"start":` + boundsStart + `}},{"mode":"end","req":{"end":{"project_id":"team-a/bounds","id":"ok-1","ended_at":"2026-11-21T10:00:01Z","output":` + nest(100, "[]") + `}}}]}`,
			[]any{"body", "batch", 1.0, "req", "end", "output", "a"}, "value_error", nil},
		{"NUL in op_name", "/call/start",
			`{"start":{"project_id":"team-a/bounds","op_name":"a\u0000b","started_at":"2026-11-21T10:00:00Z"}}`,
			[]any{"body", "start", "op_name"}, "string_pattern_mismatch", map[string]any{"pattern": `^[^\x00]*$`}},
		{"NUL in project_id", "/call/start",
			`{"start":{"project_id":"team-a/bou\u0000nds","op_name":"op","started_at":"2026-11-21T10:00:00Z"}}`,
			[]any{"body", "start", "project_id"}, "string_pattern_mismatch", nil},
		{"NUL in an inputs key", "/call/start",
			`{"start":{"project_id":"team-a/bounds","op_name":"op","started_at":"2026-11-21T10:00:00Z","inputs":{"k\u0000":1}}}`,
			[]any{"body", "start", "inputs", "k\x00"}, "string_pattern_mismatch", nil},
		{"NUL in an inputs value", "/call/upsert_batch",
			`{"batch":[{"mode":"start","req":{"start":{"project_id":"team-a/bounds","op_name":"op","started_at":"2026-11-21T10:00:00Z","inputs":{"q":["ok","\u0000"]}}}}]}`,
			[]any{"body", "batch", 0.0, "req", "start", "inputs", "q", 1.0}, "string_pattern_mismatch", nil},
		{"NUL in a query id", "/call/read",
			`{"project_id":"team-a/bounds","id":"x\u0000"}`,
			[]any{"body", "id"}, "string_pattern_mismatch", nil},
		{"NUL in the path", "/v2/team-a/bou%00nds/ops", `{"op_obj":{"name":"x"}}`,
			[]any{"path", "project"}, "string_pattern_mismatch", nil},
		{"id past the index entry size", "/call/start",
			`{"start":{"project_id":"team-a/bounds","id":"` + strings.Repeat("i", 3000) + `","op_name":"op","started_at":"2026-11-21T10:00:00Z"}}`,
			[]any{"body", "start", "id"}, "string_too_long", map[string]any{"max_length": 512.0}},
		{"op_name past the index entry size", "/call/upsert_batch",
			`{"batch":[{"mode":"start","req":{"start":{"project_id":"team-a/bounds","op_name":"` + strings.Repeat("o", 3000) + `","started_at":"2026-11-21T10:00:00Z"}}}]}`,
			[]any{"body", "batch", 0.0, "req", "start", "op_name"}, "string_too_long", map[string]any{"max_length": 1024.0}},
		{"40,000 trace_ids", "/calls/stream_query",
			`{"project_id":"team-a/bounds","filter":{"trace_ids":` + idList(40000) + `}}`,
			[]any{"body", "filter", "trace_ids"}, "too_long",
			map[string]any{"field_type": "List", "max_length": 10000.0, "actual_length": 40000.0}},
		{"lists past 10,000 values together", "/calls/stream_query",
			`{"project_id":"team-a/bounds","filter":{"trace_ids":` + idList(6000) + `,"call_ids":` + idList(6000) + `}}`,
			[]any{"body", "filter"}, "value_error", map[string]any{"max_values": 10000.0}},
		{"40,000 call_ids in trace usage", "/trace/usage",
			`{"project_id":"team-a/bounds","filter":{"call_ids":` + idList(40000) + `}}`,
			[]any{"body", "filter", "call_ids"}, "too_long", nil},
		{"20,000 project_ids", "/service/projects_info",
			`{"project_ids":` + idList(20000) + `}`,
			[]any{"body", "project_ids"}, "too_long", map[string]any{"max_length": 10000.0}},
		{"20,000-field sort_by", "/calls/stream_query",
			`{"project_id":"team-a/bounds","sort_by":[` + strings.TrimSuffix(strings.Repeat(`{"field":"started_at","direction":"asc"},`, 20000), ",") + `]}`,
			[]any{"body", "sort_by"}, "too_long", map[string]any{"max_length": 100.0, "actual_length": 20000.0}},
		{"$not nested 500 deep", "/calls/stream_query",
			`{"project_id":"team-a/bounds","query":{"$expr":` + notNest(500) + `}}`,
			[]any{"body", "query", "$expr", "$not", 0.0}, "value_error", nil},
		{"$in with 6,000 values", "/calls/stream_query",
			`{"project_id":"team-a/bounds","query":{"$expr":{"$in":[{"$getField":"id"},` + literals(6000) + `]}}}`,
			[]any{"body", "query", "$expr"}, "value_error", map[string]any{"max_operands": 5000.0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := "POST"
			r := e.do(method, tt.path, bearer(aliceKey), tt.body)
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
			if len(d.Loc) < len(tt.wantLoc) || !reflect.DeepEqual(d.Loc[:len(tt.wantLoc)], tt.wantLoc) {
				t.Errorf("loc = %v, want it to start with %v", d.Loc, tt.wantLoc)
			}
			if d.Type != tt.typ || d.Msg == "" {
				t.Errorf("type %q msg %q, want type %q", d.Type, d.Msg, tt.typ)
			}
			for k, want := range tt.ctx {
				if d.Ctx[k] != want {
					t.Errorf("ctx[%s] = %v, want %v", k, d.Ctx[k], want)
				}
			}
			if len(r.body) > 64<<10 {
				t.Errorf("the 422 is %d bytes: refused input is echoed whole", len(r.body))
			}
		})
	}
	// Nothing refused was stored, and the project answers queries.
	r := e.ok("POST", "/calls/stream_query", bearer(aliceKey), `{"project_id":"team-a/bounds"}`)
	if lines := r.lines(t); len(lines) != 0 {
		t.Errorf("refused writes stored %d calls: %v", len(lines), lines)
	}
}

// TestTraceServiceBoundsAdmitRealUse checks the bounds from the inside:
// bodies at each bound are served, on the engine under test.
func TestTraceServiceBoundsAdmitRealUse(t *testing.T) {
	e := newEnv(t)
	e.ok("POST", "/call/start", bearer(aliceKey),
		`{"start":{"project_id":"team-a/bounds","id":"`+strings.Repeat("i", 512)+`","op_name":"`+strings.Repeat("o", 1024)+
			`","started_at":"2026-11-21T10:00:00Z","inputs":`+nest(60, `"deep"`)+`}}`)
	e.ok("POST", "/call/start", bearer(aliceKey), `{"start":`+boundsStart+`}`)
	for _, body := range []string{
		// The deepest call stored above is read back by a JSON query.
		`{"project_id":"team-a/bounds","query":{"$expr":{"$eq":[{"$getField":"inputs.a.a"},{"$literal":"x"}]}}}`,
		`{"project_id":"team-a/bounds","filter":{"trace_ids":` + idList(10000) + `}}`,
		`{"project_id":"team-a/bounds","filter":{"call_ids":` + idList(5000) + `,"trace_ids":` + idList(5000) + `},` +
			`"query":{"$expr":{"$in":[{"$getField":"id"},` + literals(4998) + `]}}}`,
		`{"project_id":"team-a/bounds","query":{"$expr":` + notNest(20) + `}}`,
		`{"project_id":"team-a/bounds","sort_by":[` + strings.TrimSuffix(strings.Repeat(`{"field":"started_at","direction":"asc"},`, 100), ",") + `]}`,
	} {
		e.ok("POST", "/calls/stream_query", bearer(aliceKey), body)
	}
	r := e.ok("POST", "/calls/stream_query", bearer(aliceKey), `{"project_id":"team-a/bounds"}`)
	if n := len(r.lines(t)); n != 2 {
		t.Errorf("%d calls stored, want 2", n)
	}
}
