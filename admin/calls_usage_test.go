package admin_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/valyala/fasthttp"
)

// usageOf is one model's entry of a call_usage answer.
type usageOf struct {
	Requests         int64    `json:"requests"`
	PromptTokens     int64    `json:"prompt_tokens"`
	CompletionTokens int64    `json:"completion_tokens"`
	TotalTokens      int64    `json:"total_tokens"`
	PromptCost       *float64 `json:"prompt_tokens_total_cost"`
	CompletionCost   *float64 `json:"completion_tokens_total_cost"`
}

type usageAnswer struct {
	CallUsage  map[string]map[string]usageOf `json:"call_usage"`
	Unfinished []string                      `json:"unfinished_call_ids"`
}

func decodeUsage(t *testing.T, r response) usageAnswer {
	t.Helper()
	var out usageAnswer
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	return out
}

func u(req, p, c int64) map[string]usageOf {
	return map[string]usageOf{"m": {Requests: req, PromptTokens: p, CompletionTokens: c, TotalTokens: p + c}}
}

// seedSDKTrace logs, as the Weave TypeScript SDK does, a trace whose
// summaries already hold their children's usage: root R → A (an LLM call,
// 5+5 tokens) and B (its own LLM use 3+1) → B1 (2+2), and B2, unfinished.
// Ends arrive child first, as the SDK sends them. A gateway call G, not
// from an SDK, hangs under S, an SDK root of another trace whose summary
// cannot know it.
func seedSDKTrace(t *testing.T, e *env) {
	t.Helper()
	const sdk = `"attributes":{"weave":{"source":"js-sdk","client_version":"0.11.1"}}`
	start := func(id, parent, trace string, attrs string) string {
		p := ""
		if parent != "" {
			p = `"parent_id":"` + parent + `",`
		}
		return `{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"` + id + `",` + p + `"trace_id":"` + trace +
			`","op_name":"op-` + id + `","started_at":"2026-11-21T10:00:00Z",` + attrs + `}}}`
	}
	end := func(id, usage string) string {
		return `{"mode":"end","req":{"end":{"project_id":"team-a/p","id":"` + id + `","ended_at":"2026-11-21T10:00:05Z","summary":{"usage":{"m":` + usage + `}}}}}`
	}
	e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[`+
		start("R", "", "t", sdk)+","+start("A", "R", "t", sdk)+","+start("B", "R", "t", sdk)+","+
		start("B1", "B", "t", sdk)+","+start("B2", "B", "t", sdk)+","+
		end("A", `{"requests":1,"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}`)+","+
		end("B1", `{"requests":1,"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}`)+","+
		end("B", `{"requests":2,"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}`)+","+
		end("R", `{"requests":3,"prompt_tokens":10,"completion_tokens":8,"total_tokens":18}`)+","+
		start("S", "", "s", sdk)+","+start("G", "S", "s", `"attributes":{"backend":"demo"}`)+","+
		end("G", `{"requests":1,"prompt_tokens":4,"completion_tokens":4,"total_tokens":8}`)+","+
		end("S", `{"requests":1,"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}`)+
		`]}`)
}

// TestSDKUsageCountedOnce: an SDK call's own usage is its summary minus
// its SDK children's, so each roll-up is exactly the tokens used, once.
func TestSDKUsageCountedOnce(t *testing.T) {
	e := newEnv(t)
	seedSDKTrace(t, e)

	got := decodeUsage(t, e.ok("POST", "/trace/usage", bearer(aliceKey), `{"project_id":"team-a/p"}`))
	want := map[string]map[string]usageOf{
		"R": u(3, 10, 8), "A": u(1, 5, 5), "B": u(2, 5, 3), "B1": u(1, 2, 2), "B2": {},
		// S's own 1+1 plus G's 4+4: a child that is not an SDK's is not
		// in S's summary, so nothing is taken off for it.
		"S": u(2, 5, 5), "G": u(1, 4, 4),
	}
	if !reflect.DeepEqual(got.CallUsage, want) {
		t.Fatalf("call_usage = %v\nwant %v", got.CallUsage, want)
	}
	if !reflect.DeepEqual(got.Unfinished, []string{"B2"}) {
		t.Fatalf("unfinished = %v", got.Unfinished)
	}
	// Selecting a call alone gives its own usage: its SDK children are
	// taken off even when they are not selected.
	got = decodeUsage(t, e.ok("POST", "/trace/usage", bearer(aliceKey), `{"project_id":"team-a/p","filter":{"call_ids":["R"]}}`))
	if want := map[string]map[string]usageOf{"R": {}}; !reflect.DeepEqual(got.CallUsage, want) {
		t.Fatalf("R alone = %v, want %v", got.CallUsage, want)
	}
	got = decodeUsage(t, e.ok("POST", "/trace/usage", bearer(aliceKey), `{"project_id":"team-a/p","filter":{"call_ids":["R","B"]}}`))
	// R itself used nothing, B's own is its 3+1, and R rolls B's up.
	if want := map[string]map[string]usageOf{"R": u(1, 3, 1), "B": u(1, 3, 1)}; !reflect.DeepEqual(got.CallUsage, want) {
		t.Fatalf("R and B alone = %v, want %v", got.CallUsage, want)
	}
}

func TestCallsUsage(t *testing.T) {
	e := newEnv(t)
	seedSDKTrace(t, e)
	got := decodeUsage(t, e.ok("POST", "/calls/usage", basic(aliceKey), `{"project_id":"team-a/p","call_ids":["B","R","ghost","B"]}`))
	if want := map[string]map[string]usageOf{"R": u(3, 10, 8), "B": u(2, 5, 3)}; !reflect.DeepEqual(got.CallUsage, want) {
		t.Fatalf("call_usage = %v, want %v", got.CallUsage, want)
	}
	if !reflect.DeepEqual(got.Unfinished, []string{"B2"}) {
		t.Fatalf("unfinished = %v", got.Unfinished)
	}
	got = decodeUsage(t, e.ok("POST", "/calls/usage", basic(aliceKey), `{"project_id":"team-a/p","call_ids":["A"],"include_costs":true}`))
	a := got.CallUsage["A"]["m"]
	if a.PromptCost == nil || *a.PromptCost != 5 || a.CompletionCost == nil || *a.CompletionCost != 10 || len(got.Unfinished) != 0 {
		t.Fatalf("A with costs = %+v, unfinished %v", a, got.Unfinished)
	}
	// Without costs, the cost fields are null.
	got = decodeUsage(t, e.ok("POST", "/calls/usage", basic(aliceKey), `{"project_id":"team-a/p","call_ids":["A"]}`))
	if a := got.CallUsage["A"]["m"]; a.PromptCost != nil {
		t.Fatalf("A without costs = %+v", a)
	}
	// The limit bounds the calls read, by started_at then id: all of
	// trace t start together, so with 1 only A is read, and R gets no key.
	got = decodeUsage(t, e.ok("POST", "/calls/usage", basic(aliceKey), `{"project_id":"team-a/p","call_ids":["R"],"limit":1}`))
	if len(got.CallUsage) != 0 {
		t.Fatalf("limit 1 = %v", got.CallUsage)
	}
	if r := e.ok("POST", "/calls/usage", basic(aliceKey), `{"project_id":"team-a/nothing","call_ids":["R"]}`); string(r.body) != `{"call_usage":{},"unfinished_call_ids":[]}` {
		t.Fatalf("unknown project = %s", r.body)
	}
	for body, want := range map[string]map[string]string{
		`{"project_id":"team-a/p"}`:                            {"body.call_ids": "missing"},
		`{"project_id":"team-a/p","call_ids":["R"],"extra":1}`: {"body.extra": "extra_forbidden"},
		`{"project_id":"team-a/p","call_ids":[1]}`:             {"body.call_ids.0": "string_type"},
		`{"project_id":"team-a/p","call_ids":[],"limit":"x"}`:  {"body.limit": "int_parsing"},
	} {
		if got := detailTypes(t, e.do("POST", "/calls/usage", bearer(aliceKey), body)); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, want %v", body, got, want)
		}
	}
	if r := e.do("POST", "/calls/usage", bearer(bobKey), `{"project_id":"team-a/p","call_ids":["R"]}`); r.status != fasthttp.StatusForbidden {
		t.Fatalf("cross-team: %d", r.status)
	}
}

// TestIncludeCostsUsesProjectPrices: include_costs prices a model at the
// project's own price (/cost/create) where it set one, at the configured
// price otherwise; other projects keep the configured price.
func TestIncludeCostsUsesProjectPrices(t *testing.T) {
	e := newEnv(t)
	seedSDKTrace(t, e)
	costOf := func(route, body string) usageOf {
		t.Helper()
		return decodeUsage(t, e.ok("POST", route, bearer(aliceKey), body)).CallUsage["A"]["m"]
	}
	// Configured: 1 per prompt token, 2 per completion token; A is 5+5.
	if a := costOf("/trace/usage", `{"project_id":"team-a/p","include_costs":true}`); *a.PromptCost != 5 || *a.CompletionCost != 10 {
		t.Fatalf("configured price: %+v", a)
	}
	e.ok("POST", "/cost/create", bearer(aliceKey), `{"project_id":"team-a/p","costs":{"m":{"prompt_token_cost":0.5,"completion_token_cost":0.25}}}`)
	for _, route := range []string{"/trace/usage", "/calls/usage"} {
		body := `{"project_id":"team-a/p","include_costs":true}`
		if route == "/calls/usage" {
			body = `{"project_id":"team-a/p","call_ids":["A"],"include_costs":true}`
		}
		if a := costOf(route, body); *a.PromptCost != 2.5 || *a.CompletionCost != 1.25 {
			t.Fatalf("%s with the project's price: %+v", route, a)
		}
	}
	// Another project of the team keeps the configured price.
	e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":{"project_id":"team-a/q","id":"A","trace_id":"t","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}},
		{"mode":"end","req":{"end":{"project_id":"team-a/q","id":"A","ended_at":"2026-11-21T10:00:01Z","summary":{"usage":{"m":{"prompt_tokens":5,"completion_tokens":5}}}}}}
	]}`)
	if a := costOf("/trace/usage", `{"project_id":"team-a/q","include_costs":true}`); *a.PromptCost != 5 || *a.CompletionCost != 10 {
		t.Fatalf("other project: %+v", a)
	}
}

// TestCostsInCallQueries: /calls/stream_query with include_costs fills
// summary.weave.costs; a call whose summary recorded its prices keeps
// them, in stream_query and in /trace/usage.
func TestCostsInCallQueries(t *testing.T) {
	e := newEnv(t)
	e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"plain","trace_id":"t","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}},
		{"mode":"end","req":{"end":{"project_id":"team-a/p","id":"plain","ended_at":"2026-11-21T10:00:01Z","summary":{"usage":{"m":{"requests":1,"prompt_tokens":4,"completion_tokens":2},"unpriced":{"prompt_tokens":9}}}}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"priced","trace_id":"u","op_name":"x","started_at":"2026-11-21T10:00:02Z"}}},
		{"mode":"end","req":{"end":{"project_id":"team-a/p","id":"priced","ended_at":"2026-11-21T10:00:03Z","summary":{"usage":{"m":{"prompt_tokens":4,"completion_tokens":2}},"weave":{"costs":{"m":{"prompt_token_cost":0.25,"completion_token_cost":0.5}}}}}}}
	]}`)
	calls := e.ok("POST", "/calls/stream_query", bearer(aliceKey), `{"project_id":"team-a/p","include_costs":true}`).lines(t)
	costs := map[string]any{}
	for _, c := range calls {
		costs[c["id"].(string)] = c["summary"].(map[string]any)["weave"].(map[string]any)["costs"]
	}
	want := map[string]any{
		"plain": map[string]any{"m": map[string]any{
			"requests": float64(1), "prompt_tokens": float64(4), "completion_tokens": float64(2), "total_tokens": float64(6),
			"prompt_token_cost": float64(1), "completion_token_cost": float64(2),
			"prompt_tokens_total_cost": float64(4), "completion_tokens_total_cost": float64(4),
			"prompt_token_cost_unit": "USD", "completion_token_cost_unit": "USD",
		}},
		"priced": map[string]any{"m": map[string]any{
			"requests": float64(0), "prompt_tokens": float64(4), "completion_tokens": float64(2), "total_tokens": float64(6),
			"prompt_token_cost": 0.25, "completion_token_cost": 0.5,
			"prompt_tokens_total_cost": float64(1), "completion_tokens_total_cost": float64(1),
			"prompt_token_cost_unit": "USD", "completion_token_cost_unit": "USD",
		}},
	}
	if !reflect.DeepEqual(costs, want) {
		t.Fatalf("weave.costs = %v\nwant %v", costs, want)
	}
	// Without include_costs the summaries are as logged.
	for _, c := range e.ok("POST", "/calls/stream_query", bearer(aliceKey), `{"project_id":"team-a/p"}`).lines(t) {
		if c["id"] == "plain" && c["summary"].(map[string]any)["weave"] != nil {
			t.Fatalf("costs without include_costs: %v", c["summary"])
		}
	}
	got := decodeUsage(t, e.ok("POST", "/trace/usage", bearer(aliceKey), `{"project_id":"team-a/p","include_costs":true}`))
	if p := got.CallUsage["priced"]["m"]; *p.PromptCost != 1 || *p.CompletionCost != 1 {
		t.Fatalf("trace usage of priced = %+v", p)
	}
}
