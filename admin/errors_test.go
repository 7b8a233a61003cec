package admin_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestValidationErrorBodyShape(t *testing.T) {
	e := newEnv(t)
	r := e.do("POST", "/trace/usage", basic(aliceKey), `{}`)
	if r.status != fasthttp.StatusUnprocessableEntity || r.contentType != "application/json" {
		t.Fatalf("status %d (%s): %s", r.status, r.contentType, r.body)
	}
	var body struct {
		Detail []struct {
			Loc  []any  `json:"loc"`
			Msg  string `json:"msg"`
			Type string `json:"type"`
		} `json:"detail"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatal(err)
	}
	want := []any{"body", "project_id"}
	if len(body.Detail) != 1 || !reflect.DeepEqual(body.Detail[0].Loc, want) ||
		body.Detail[0].Msg != "Field required" || body.Detail[0].Type != "missing" {
		t.Fatalf("detail = %+v", body.Detail)
	}
}

// TestValidationErrors checks the FastAPI loc and type of every kind of
// malformed request, endpoint by endpoint.
func TestValidationErrors(t *testing.T) {
	e := newEnv(t)
	runID := seedTeamA(t, e)
	const start = `"project_id":"team-a/p","op_name":"x","started_at":"2026-11-21T10:00:00Z"`
	tests := []struct {
		name         string
		method, path string
		body         string
		loc          []any
		typ          string
	}{
		// The body as a whole.
		{"empty body", "POST", "/trace/usage", "", []any{"body"}, "missing"},
		{"invalid JSON", "POST", "/trace/usage", `{"project_id":`, []any{"body", float64(14)}, "json_invalid"},
		{"JSON with trailing data", "POST", "/trace/usage", `{"project_id":"team-a/p"} x`, []any{"body", float64(26)}, "json_invalid"},
		{"body not an object", "POST", "/trace/usage", `[1]`, []any{"body"}, "model_attributes_type"},
		{"body a string", "POST", "/service/projects_info", `"x"`, []any{"body"}, "model_attributes_type"},

		// Trace usage: strict at every level.
		{"trace usage: project_id missing", "POST", "/trace/usage", `{"limit":1}`, []any{"body", "project_id"}, "missing"},
		{"trace usage: project_id not a string", "POST", "/trace/usage", `{"project_id":5}`, []any{"body", "project_id"}, "string_type"},
		{"trace usage: malformed project_id", "POST", "/trace/usage", `{"project_id":"a/b/c"}`, []any{"body", "project_id"}, "value_error"},
		{"trace usage: unknown key", "POST", "/trace/usage", `{"project_id":"team-a/p","bogus":1}`, []any{"body", "bogus"}, "extra_forbidden"},
		{"trace usage: unknown filter key", "POST", "/trace/usage", `{"project_id":"team-a/p","filter":{"bogus":[]}}`, []any{"body", "filter", "bogus"}, "extra_forbidden"},
		{"trace usage: unknown query key", "POST", "/trace/usage", `{"project_id":"team-a/p","query":{"$expr":{"$and":[]},"bogus":1}}`, []any{"body", "query", "bogus"}, "extra_forbidden"},
		{"trace usage: filter not an object", "POST", "/trace/usage", `{"project_id":"team-a/p","filter":[]}`, []any{"body", "filter"}, "model_type"},
		{"trace usage: filter list not a list", "POST", "/trace/usage", `{"project_id":"team-a/p","filter":{"trace_ids":"t"}}`, []any{"body", "filter", "trace_ids"}, "list_type"},
		{"trace usage: filter item not a string", "POST", "/trace/usage", `{"project_id":"team-a/p","filter":{"call_ids":["a",2]}}`, []any{"body", "filter", "call_ids", float64(1)}, "string_type"},
		{"trace usage: trace_roots_only not a bool", "POST", "/trace/usage", `{"project_id":"team-a/p","filter":{"trace_roots_only":"perhaps"}}`, []any{"body", "filter", "trace_roots_only"}, "bool_parsing"},
		{"trace usage: $expr missing", "POST", "/trace/usage", `{"project_id":"team-a/p","query":{}}`, []any{"body", "query", "$expr"}, "missing"},
		{"trace usage: bad operand", "POST", "/trace/usage", `{"project_id":"team-a/p","query":{"$expr":{"$and":[{"$literal":"x","$nope":1}]}}}`, []any{"body", "query", "$expr", "$and", float64(0), "$nope"}, "extra_forbidden"},
		{"trace usage: include_costs not a bool", "POST", "/trace/usage", `{"project_id":"team-a/p","include_costs":"sometimes"}`, []any{"body", "include_costs"}, "bool_parsing"},
		{"trace usage: include_costs a list", "POST", "/trace/usage", `{"project_id":"team-a/p","include_costs":[]}`, []any{"body", "include_costs"}, "bool_type"},
		{"trace usage: limit not an integer", "POST", "/trace/usage", `{"project_id":"team-a/p","limit":"many"}`, []any{"body", "limit"}, "int_parsing"},
		{"trace usage: limit fractional", "POST", "/trace/usage", `{"project_id":"team-a/p","limit":1.5}`, []any{"body", "limit"}, "int_from_float"},
		{"trace usage: limit negative", "POST", "/trace/usage", `{"project_id":"team-a/p","limit":-1}`, []any{"body", "limit"}, "greater_than_equal"},

		// Projects info.
		{"projects_info: project_ids missing", "POST", "/service/projects_info", `{}`, []any{"body", "project_ids"}, "missing"},
		{"projects_info: unknown key", "POST", "/service/projects_info", `{"project_ids":[],"x":1}`, []any{"body", "x"}, "extra_forbidden"},
		{"projects_info: not a list", "POST", "/service/projects_info", `{"project_ids":"team-a/p"}`, []any{"body", "project_ids"}, "list_type"},
		{"projects_info: item not a string", "POST", "/service/projects_info", `{"project_ids":[7]}`, []any{"body", "project_ids", float64(0)}, "string_type"},
		{"projects_info: malformed id", "POST", "/service/projects_info", `{"project_ids":["team-a/p","nope"]}`, []any{"body", "project_ids", float64(1)}, "value_error"},
		{"projects_info: empty entity", "POST", "/service/projects_info", `{"project_ids":["/p"]}`, []any{"body", "project_ids", float64(0)}, "value_error"},

		// Ops.
		{"list ops: limit not an integer", "GET", "/v2/team-a/p/ops?limit=ten", "", []any{"query", "limit"}, "int_parsing"},
		{"list ops: limit negative", "GET", "/v2/team-a/p/ops?limit=-1", "", []any{"query", "limit"}, "greater_than_equal"},
		{"list ops: offset not an integer", "GET", "/v2/team-a/p/ops?offset=1.5", "", []any{"query", "offset"}, "int_parsing"},
		{"create op: name missing", "POST", "/v2/team-a/p/ops", `{"source_code":"x"}`, []any{"body", "name"}, "missing"},
		{"create op: source_code missing", "POST", "/v2/team-a/p/ops", `{"name":"x"}`, []any{"body", "source_code"}, "missing"},
		{"create op: source_code not a string", "POST", "/v2/team-a/p/ops", `{"name":"x","source_code":1}`, []any{"body", "source_code"}, "string_type"},
		{"create op: name with a slash", "POST", "/v2/team-a/p/ops", `{"name":"a/b","source_code":"x"}`, []any{"body", "name"}, "value_error"},

		// Evaluation runs.
		{"create run: evaluation missing", "POST", "/v2/team-a/p/evaluation_runs", `{"model":"m"}`, []any{"body", "evaluation"}, "missing"},
		{"create run: model missing", "POST", "/v2/team-a/p/evaluation_runs", `{"evaluation":"e"}`, []any{"body", "model"}, "missing"},
		{"create run: model not a string", "POST", "/v2/team-a/p/evaluation_runs", `{"evaluation":"e","model":{}}`, []any{"body", "model"}, "string_type"},
		{"create run: source not a string", "POST", "/v2/team-a/p/evaluation_runs", `{"evaluation":"e","model":"m","source_evaluation_run_id":3}`, []any{"body", "source_evaluation_run_id"}, "string_type"},
		{"list runs: offset negative", "GET", "/v2/team-a/p/evaluation_runs?offset=-5", "", []any{"query", "offset"}, "greater_than_equal"},
		{"finish run: summary not an object", "POST", "/v2/team-a/p/evaluation_runs/" + runID + "/finish", `{"summary":[]}`, []any{"body", "summary"}, "dict_type"},
		{"finish run: exception not a string", "POST", "/v2/team-a/p/evaluation_runs/" + runID + "/finish", `{"exception":false}`, []any{"body", "exception"}, "string_type"},

		// Calls.
		{"call start: start missing", "POST", "/call/start", `{}`, []any{"body", "start"}, "missing"},
		{"call end: end missing", "POST", "/call/end", `{}`, []any{"body", "end"}, "missing"},
		{"call start: start not an object", "POST", "/call/start", `{"start":1}`, []any{"body", "start"}, "model_type"},
		{"call start: project_id missing", "POST", "/call/start", `{"start":{"op_name":"x","started_at":"2026-11-21T10:00:00Z"}}`, []any{"body", "start", "project_id"}, "missing"},
		{"call start: op_name missing", "POST", "/call/start", `{"start":{"project_id":"team-a/p","started_at":"2026-11-21T10:00:00Z"}}`, []any{"body", "start", "op_name"}, "missing"},
		{"call start: started_at missing", "POST", "/call/start", `{"start":{"project_id":"team-a/p","op_name":"x"}}`, []any{"body", "start", "started_at"}, "missing"},
		{"call start: started_at not a time", "POST", "/call/start", `{"start":{"project_id":"team-a/p","op_name":"x","started_at":"yesterday"}}`, []any{"body", "start", "started_at"}, "datetime_from_date_parsing"},
		{"call start: started_at a list", "POST", "/call/start", `{"start":{"project_id":"team-a/p","op_name":"x","started_at":[]}}`, []any{"body", "start", "started_at"}, "datetime_type"},
		{"call start: inputs not an object", "POST", "/call/start", `{"start":{` + start + `,"inputs":[1]}}`, []any{"body", "start", "inputs"}, "dict_type"},
		{"call start: parent_id not a string", "POST", "/call/start", `{"start":{` + start + `,"parent_id":1}}`, []any{"body", "start", "parent_id"}, "string_type"},
		{"call start: unknown parent without trace_id", "POST", "/call/start", `{"start":{` + start + `,"parent_id":"ghost"}}`, []any{"body", "start", "trace_id"}, "missing"},
		{"call start: malformed project_id", "POST", "/call/start", `{"start":{"project_id":"nope","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}`, []any{"body", "start", "project_id"}, "value_error"},
		{"call end: id missing", "POST", "/call/end", `{"end":{"project_id":"team-a/p","ended_at":"2026-11-21T10:00:00Z"}}`, []any{"body", "end", "id"}, "missing"},
		{"call end: ended_at missing", "POST", "/call/end", `{"end":{"project_id":"team-a/p","id":"call-1"}}`, []any{"body", "end", "ended_at"}, "missing"},
		{"call end: summary not an object", "POST", "/call/end", `{"end":{"project_id":"team-a/p","id":"call-1","ended_at":"2026-11-21T10:00:00Z","summary":1}}`, []any{"body", "end", "summary"}, "dict_type"},
		{"upsert batch: batch missing", "POST", "/call/upsert_batch", `{}`, []any{"body", "batch"}, "missing"},
		{"upsert batch: batch not a list", "POST", "/call/upsert_batch", `{"batch":{}}`, []any{"body", "batch"}, "list_type"},
		{"upsert batch: bad mode", "POST", "/call/upsert_batch", `{"batch":[{"mode":"middle","req":{}}]}`, []any{"body", "batch", float64(0), "mode"}, "literal_error"},
		{"upsert batch: req missing", "POST", "/call/upsert_batch", `{"batch":[{"mode":"start"}]}`, []any{"body", "batch", float64(0), "req"}, "missing"},
		{"upsert batch: nested field", "POST", "/call/upsert_batch", `{"batch":[{"mode":"start","req":{"start":{` + start + `}}},{"mode":"end","req":{"end":{"project_id":"team-a/p","ended_at":"2026-11-21T10:00:00Z"}}}]}`, []any{"body", "batch", float64(1), "req", "end", "id"}, "missing"},
		{"call read: id missing", "POST", "/call/read", `{"project_id":"team-a/p"}`, []any{"body", "id"}, "missing"},
		{"stream query: project_id missing", "POST", "/calls/stream_query", `{}`, []any{"body", "project_id"}, "missing"},
		{"stream query: limit negative", "POST", "/calls/stream_query", `{"project_id":"team-a/p","limit":-2}`, []any{"body", "limit"}, "greater_than_equal"},
		{"stream query: offset not an integer", "POST", "/calls/stream_query", `{"project_id":"team-a/p","offset":"x"}`, []any{"body", "offset"}, "int_parsing"},
		{"stream query: unknown filter key", "POST", "/calls/stream_query", `{"project_id":"team-a/p","filter":{"op_name":["x"]}}`, []any{"body", "filter", "op_name"}, "extra_forbidden"},
		{"stream query: bad sort direction", "POST", "/calls/stream_query", `{"project_id":"team-a/p","sort_by":[{"field":"started_at","direction":"up"}]}`, []any{"body", "sort_by", float64(0), "direction"}, "literal_error"},
		{"stream query: bad sort field", "POST", "/calls/stream_query", `{"project_id":"team-a/p","sort_by":[{"field":"nope","direction":"asc"}]}`, []any{"body", "sort_by", float64(0), "field"}, "value_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(tt.method, tt.path, basic(aliceKey), tt.body)
			if r.status != fasthttp.StatusUnprocessableEntity {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			var body struct {
				Detail []map[string]any `json:"detail"`
			}
			if err := json.Unmarshal(r.body, &body); err != nil {
				t.Fatal(err)
			}
			for _, d := range body.Detail {
				if _, ok := d["msg"].(string); !ok {
					t.Fatalf("entry without msg: %v", d)
				}
				if reflect.DeepEqual(d["loc"], tt.loc) && d["type"] == tt.typ {
					return
				}
			}
			t.Fatalf("no %s at %v in %s", tt.typ, tt.loc, r.body)
		})
	}
}

// TestValidationReportsEveryError checks that one request gets all its
// errors at once, as FastAPI answers.
func TestValidationReportsEveryError(t *testing.T) {
	e := newEnv(t)
	r := e.do("POST", "/trace/usage", bearer(aliceKey), `{"bogus":1,"limit":-1,"filter":{"x":1}}`)
	var body struct {
		Detail []struct {
			Loc  []any  `json:"loc"`
			Type string `json:"type"`
		} `json:"detail"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatal(err)
	}
	got := make([]string, 0, len(body.Detail))
	for _, d := range body.Detail {
		got = append(got, fmt.Sprint(d.Loc, " ", d.Type))
	}
	want := []string{
		"[body bogus] extra_forbidden",
		"[body project_id] missing",
		"[body filter x] extra_forbidden",
		"[body limit] greater_than_equal",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("errors = %v\nwant %v", got, want)
	}
}
