package admin_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"
)

func TestCallIngestAndRead(t *testing.T) {
	e := newEnv(t)

	// Without id and trace_id both are generated, as UUIDv7.
	res := e.ok("POST", "/call/start", bearer(aliceKey),
		`{"start":{"project_id":"team-a/p","op_name":"agent.run","started_at":"2026-11-21T10:00:00.123456Z","inputs":{"q":"hi"},"attributes":{"env":"test"}}}`).object(t)
	rootID, traceID := res["id"].(string), res["trace_id"].(string)
	for _, s := range []string{rootID, traceID} {
		if u, err := uuid.Parse(s); err != nil || u.Version() != 7 {
			t.Fatalf("%q is not a UUIDv7", s)
		}
	}
	// With only a parent, the trace id is the parent's.
	child := e.ok("POST", "/call/start", bearer(aliceKey),
		`{"start":{"project_id":"team-a/p","id":"child","parent_id":"`+rootID+`","op_name":"tool","started_at":"2026-11-21T10:00:01Z","thread_id":"th","turn_id":"tu","display_name":"Tool","wb_run_id":"run-9"}}`).object(t)
	if child["id"] != "child" || child["trace_id"] != traceID {
		t.Fatalf("child start = %v", child)
	}
	if r := e.ok("POST", "/call/end", bearer(aliceKey),
		`{"end":{"project_id":"team-a/p","id":"child","ended_at":"2026-11-21T10:00:02.5Z","output":{"answer":42},"summary":{"usage":{"m":{"prompt_tokens":1}}},"exception":null}}`); string(r.body) != "{}\n" {
		t.Fatalf("end = %q", r.body)
	}

	call := e.ok("POST", "/call/read", basic(aliceKey), `{"project_id":"team-a/p","id":"child"}`).object(t)["call"].(map[string]any)
	want := map[string]any{
		"id": "child", "project_id": "team-a/p", "op_name": "tool", "display_name": "Tool", "trace_id": traceID,
		"parent_id": rootID, "thread_id": "th", "turn_id": "tu",
		"started_at": "2026-11-21T10:00:01.000000Z", "ended_at": "2026-11-21T10:00:02.500000Z", "exception": nil,
		"attributes": map[string]any{}, "inputs": map[string]any{}, "output": map[string]any{"answer": float64(42)},
		"summary":     map[string]any{"usage": map[string]any{"m": map[string]any{"prompt_tokens": float64(1)}}},
		"svc_user_id": "alice", "svc_run_id": "run-9", "wb_user_id": "alice", "wb_run_id": "run-9",
	}
	if !reflect.DeepEqual(call, want) {
		t.Fatalf("call = %v\nwant %v", call, want)
	}
	root := e.ok("POST", "/call/read", basic(aliceKey), `{"project_id":"team-a/p","id":"`+rootID+`"}`).object(t)["call"].(map[string]any)
	if root["started_at"] != "2026-11-21T10:00:00.123456Z" || root["ended_at"] != nil || root["output"] != nil ||
		!reflect.DeepEqual(root["inputs"], map[string]any{"q": "hi"}) {
		t.Fatalf("root = %v", root)
	}

	// A retried start answers the stored call's ids and changes nothing.
	again := e.ok("POST", "/call/start", bearer(aliceKey),
		`{"start":{"project_id":"team-a/p","id":"child","parent_id":"`+rootID+`","op_name":"changed","started_at":"2026-11-21T11:00:00Z"}}`).object(t)
	if again["trace_id"] != traceID {
		t.Fatalf("retried start = %v", again)
	}

	// Unknown calls read as {"call": null}, as Weave answers.
	for _, body := range []string{
		`{"project_id":"team-a/p","id":"ghost"}`,
		`{"project_id":"team-a/never","id":"child"}`,
	} {
		if r := e.ok("POST", "/call/read", bearer(aliceKey), body); string(r.body) != `{"call":null}`+"\n" {
			t.Fatalf("read %s: %s", body, r.body)
		}
	}
	// Unix seconds are accepted for timestamps, as pydantic does.
	e.ok("POST", "/call/start", bearer(aliceKey), `{"start":{"project_id":"team-a/p","id":"unix","trace_id":"t-unix","op_name":"x","started_at":1795255200.25}}`)
	if c := e.ok("POST", "/call/read", bearer(aliceKey), `{"project_id":"team-a/p","id":"unix"}`).object(t)["call"].(map[string]any); c["started_at"] != "2026-11-21T10:00:00.250000Z" {
		t.Fatalf("unix started_at = %v", c["started_at"])
	}
}

func TestUpsertBatch(t *testing.T) {
	e := newEnv(t)
	res := e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"r","trace_id":"t","op_name":"root","started_at":"2026-11-21T10:00:00Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"c","parent_id":"r","op_name":"child","started_at":"2026-11-21T10:00:01Z"}}},
		{"mode":"end","req":{"end":{"project_id":"team-a/p","id":"c","ended_at":"2026-11-21T10:00:02Z","summary":{}}}}
	]}`).object(t)
	want := []any{
		map[string]any{"id": "r", "trace_id": "t"},
		map[string]any{"id": "c", "trace_id": "t"},
		map[string]any{},
	}
	if !reflect.DeepEqual(res["res"], want) {
		t.Fatalf("res = %v", res["res"])
	}
	// A batch with a failing item is refused whole: a start whose parent
	// is unknown cannot take its trace id.
	r := e.do("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"new","trace_id":"t2","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"orphan","parent_id":"ghost","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}}
	]}`)
	if r.status != fasthttp.StatusUnprocessableEntity {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if r := e.ok("POST", "/call/read", bearer(aliceKey), `{"project_id":"team-a/p","id":"new"}`); string(r.body) != `{"call":null}`+"\n" {
		t.Fatalf("the refused batch left call new behind: %s", r.body)
	}
	// An item of a team the key may not use refuses the batch.
	r = e.do("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"ok","trace_id":"t3","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-b/p","id":"nope","trace_id":"t3","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}}
	]}`)
	if r.status != fasthttp.StatusForbidden {
		t.Fatalf("cross-team batch: status %d", r.status)
	}
}

func TestStreamQuery(t *testing.T) {
	e := newEnv(t)
	e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"a","trace_id":"t1","op_name":"root","started_at":"2026-11-21T10:00:00Z","attributes":{"rank":2}}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"b","parent_id":"a","op_name":"child","started_at":"2026-11-21T10:00:01Z","attributes":{"rank":3}}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"c","trace_id":"t2","op_name":"root","started_at":"2026-11-21T10:00:02Z","attributes":{"rank":1}}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/q","id":"d","trace_id":"t1","op_name":"root","started_at":"2026-11-21T10:00:00Z"}}}
	]}`)
	ids := func(body string) []string {
		t.Helper()
		r := e.ok("POST", "/calls/stream_query", bearer(aliceKey), body)
		if r.contentType != "application/jsonl" {
			t.Fatalf("content type %q", r.contentType)
		}
		out := []string{}
		for _, l := range r.lines(t) {
			if l["project_id"] != "team-a/p" {
				t.Fatalf("call from another project: %v", l)
			}
			out = append(out, l["id"].(string))
		}
		return out
	}
	tests := []struct {
		name, body string
		want       []string
	}{
		{"all, by started_at", `{"project_id":"team-a/p"}`, []string{"a", "b", "c"}},
		{"filter", `{"project_id":"team-a/p","filter":{"trace_ids":["t1"]}}`, []string{"a", "b"}},
		{"query", `{"project_id":"team-a/p","query":{"$expr":{"$eq":[{"$getField":"op_name"},{"$literal":"root"}]}}}`, []string{"a", "c"}},
		{"sort by a JSON field", `{"project_id":"team-a/p","sort_by":[{"field":"attributes.rank","direction":"desc"}]}`, []string{"b", "a", "c"}},
		{"limit and offset", `{"project_id":"team-a/p","limit":1,"offset":1}`, []string{"b"}},
		{"ignored Weave keys", `{"project_id":"team-a/p","columns":["id"],"expand_columns":[],"include_feedback":true,"limit":null}`, []string{"a", "b", "c"}},
		{"unknown project", `{"project_id":"team-a/none"}`, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ids(tt.body); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTraceUsageEndpoint(t *testing.T) {
	e := newEnv(t)
	// The reference's worked example, ingested the Weave way, plus an
	// unfinished sibling and a call of another trace.
	e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"root","trace_id":"tr","op_name":"a","started_at":"2026-11-21T10:00:00Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"child","parent_id":"root","op_name":"b","started_at":"2026-11-21T10:00:01Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"grandchild","parent_id":"child","op_name":"c","started_at":"2026-11-21T10:00:02Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"open","parent_id":"root","op_name":"d","started_at":"2026-11-21T10:00:03Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"elsewhere","trace_id":"other","op_name":"a","started_at":"2026-11-21T10:00:04Z"}}},
		{"mode":"end","req":{"end":{"project_id":"team-a/p","id":"grandchild","ended_at":"2026-11-21T10:00:03Z","summary":{"usage":{"m":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}}}}},
		{"mode":"end","req":{"end":{"project_id":"team-a/p","id":"child","ended_at":"2026-11-21T10:00:04Z","summary":{"usage":{"m":{"input_tokens":2,"output_tokens":1}}}}}},
		{"mode":"end","req":{"end":{"project_id":"team-a/p","id":"root","ended_at":"2026-11-21T10:00:05Z","summary":{"usage":{"m":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}}}}},
		{"mode":"end","req":{"end":{"project_id":"team-a/p","id":"elsewhere","ended_at":"2026-11-21T10:00:05Z","summary":{"usage":{"m":{"prompt_tokens":100}}}}}}
	]}`)
	counts := func(u map[string]any, id string) []float64 {
		t.Helper()
		m, ok := u["call_usage"].(map[string]any)[id].(map[string]any)
		if !ok {
			t.Fatalf("no call_usage for %s in %v", id, u)
		}
		e, ok := m["m"].(map[string]any)
		if !ok {
			return nil
		}
		return []float64{e["prompt_tokens"].(float64), e["completion_tokens"].(float64), e["total_tokens"].(float64)}
	}
	u := e.ok("POST", "/trace/usage", basic(aliceKey), `{"project_id":"team-a/p","filter":{"trace_ids":["tr"]}}`).object(t)
	if got := counts(u, "root"); !reflect.DeepEqual(got, []float64{10, 7, 17}) {
		t.Fatalf("root = %v, want p10 c7 t17", got)
	}
	if got := counts(u, "child"); !reflect.DeepEqual(got, []float64{5, 2, 7}) {
		t.Fatalf("child = %v, want p5 c2 t7", got)
	}
	if got := counts(u, "grandchild"); !reflect.DeepEqual(got, []float64{3, 1, 4}) {
		t.Fatalf("grandchild = %v", got)
	}
	if got := u["call_usage"].(map[string]any)["open"]; !reflect.DeepEqual(got, map[string]any{}) {
		t.Fatalf("open = %v, want {}", got)
	}
	if len(u["call_usage"].(map[string]any)) != 4 || !reflect.DeepEqual(u["unfinished_call_ids"], []any{"open"}) {
		t.Fatalf("usage = %v", u)
	}
	entry := u["call_usage"].(map[string]any)["root"].(map[string]any)["m"].(map[string]any)
	if entry["prompt_tokens_total_cost"] != nil || entry["completion_tokens_total_cost"] != nil {
		t.Fatalf("costs without include_costs: %v", entry)
	}

	tests := []struct {
		name, body string
		check      func(t *testing.T, u map[string]any)
	}{
		{"a parent outside the selection", `{"project_id":"team-a/p","filter":{"call_ids":["child","grandchild"]}}`, func(t *testing.T, u map[string]any) {
			if got := counts(u, "child"); !reflect.DeepEqual(got, []float64{5, 2, 7}) {
				t.Fatalf("child = %v", got)
			}
		}},
		{"the spec's query shape", `{"project_id":"team-a/p","query":{"$expr":{"$and":[{"$literal":"x"}]}},"filter":{"trace_ids":["tr"]}}`, func(t *testing.T, u map[string]any) {
			if len(u["call_usage"].(map[string]any)) != 4 {
				t.Fatalf("usage = %v", u)
			}
		}},
		{"a query on usage", `{"project_id":"team-a/p","query":{"$expr":{"$gt":[{"$getField":"summary.usage.m.prompt_tokens"},{"$literal":4}]}}}`, func(t *testing.T, u map[string]any) {
			got := u["call_usage"].(map[string]any)
			if len(got) != 2 || got["root"] == nil || got["elsewhere"] == nil {
				t.Fatalf("usage = %v", got)
			}
			// Only root is selected of its trace, so it holds its own usage.
			if c := counts(u, "root"); !reflect.DeepEqual(c, []float64{5, 5, 10}) {
				t.Fatalf("root = %v", c)
			}
		}},
		{"limit truncates without error", `{"project_id":"team-a/p","limit":2}`, func(t *testing.T, u map[string]any) {
			got := u["call_usage"].(map[string]any)
			if len(got) != 2 || got["root"] == nil || got["child"] == nil {
				t.Fatalf("usage = %v", got)
			}
		}},
		{"limit 0", `{"project_id":"team-a/p","limit":0}`, func(t *testing.T, u map[string]any) {
			if len(u["call_usage"].(map[string]any)) != 0 || len(u["unfinished_call_ids"].([]any)) != 0 {
				t.Fatalf("usage = %v", u)
			}
		}},
		{"null optional fields", `{"project_id":"team-a/p","filter":null,"query":null,"include_costs":null,"limit":null}`, func(t *testing.T, u map[string]any) {
			if len(u["call_usage"].(map[string]any)) != 5 {
				t.Fatalf("usage = %v", u)
			}
		}},
		{"include_costs", `{"project_id":"team-a/p","filter":{"call_ids":["grandchild"]},"include_costs":true}`, func(t *testing.T, u map[string]any) {
			m := u["call_usage"].(map[string]any)["grandchild"].(map[string]any)["m"].(map[string]any)
			// Prices per million tokens are 1e6 and 2e6: 3×1 + 1×2.
			if m["prompt_tokens_total_cost"] != float64(3) || m["completion_tokens_total_cost"] != float64(2) ||
				m["cache_read_input_tokens_total_cost"] != float64(0) || m["cache_creation_input_tokens_total_cost"] != float64(0) {
				t.Fatalf("costs = %v", m)
			}
		}},
		{"unknown project", `{"project_id":"team-a/none"}`, func(t *testing.T, u map[string]any) {
			if len(u["call_usage"].(map[string]any)) != 0 || u["unfinished_call_ids"] == nil {
				t.Fatalf("usage = %v", u)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.ok("POST", "/trace/usage", basic(aliceKey), tt.body)
			if !strings.HasPrefix(r.contentType, "application/json") {
				t.Fatalf("content type %q", r.contentType)
			}
			tt.check(t, r.object(t))
		})
	}
}
