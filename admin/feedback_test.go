package admin_test

import (
	"testing"

	"github.com/valyala/fasthttp"
)

func TestFeedbackLifecycle(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	create := func(ref, typ, payload string) map[string]any {
		t.Helper()
		return e.ok("POST", "/feedback/create", a, `{"project_id":"team-a/p","weave_ref":"`+ref+`","feedback_type":"`+typ+`","payload":`+payload+`,"wb_user_id":"someone-else"}`).object(t)
	}
	f1 := create("weave:///team-a/p/call/c1", "wandb.reaction.1", `{"emoji":"👍"}`)
	if f1["wb_user_id"] != "alice" || f1["payload"].(map[string]any)["emoji"] != "👍" || f1["id"] == "" || f1["created_at"] == "" {
		t.Fatalf("create = %v", f1)
	}
	f2 := create("weave:///team-a/p/call/c1", "score", `{"output":{"correct":true},"score":0.9}`)
	create("weave:///team-a/p/call/c2", "score", `{"score":0.2}`)

	result := func(body string) []any {
		t.Helper()
		return e.ok("POST", "/feedback/query", a, body).object(t)["result"].([]any)
	}
	all := result(`{"project_id":"team-a/p"}`)
	if len(all) != 3 {
		t.Fatalf("all = %v", all)
	}
	first := all[0].(map[string]any)
	for _, k := range []string{"id", "project_id", "weave_ref", "wb_user_id", "creator", "created_at", "feedback_type", "payload", "annotation_ref", "runnable_ref", "call_ref", "trigger_ref"} {
		if _, ok := first[k]; !ok {
			t.Errorf("feedback lacks %s: %v", k, first)
		}
	}
	got := result(`{"project_id":"team-a/p","query":{"$expr":{"$and":[{"$eq":[{"$getField":"weave_ref"},{"$literal":"weave:///team-a/p/call/c1"}]},{"$gt":[{"$getField":"payload.score"},{"$literal":0.5}]}]}},"fields":["id","payload"]}`)
	if len(got) != 1 || got[0].(map[string]any)["id"] != f2["id"] || len(got[0].(map[string]any)) != 2 {
		t.Fatalf("filtered = %v", got)
	}
	got = result(`{"project_id":"team-a/p","sort_by":[{"field":"payload.score","direction":"desc"}],"limit":1,"offset":1}`)
	if len(got) != 1 || got[0].(map[string]any)["payload"].(map[string]any)["score"] != 0.2 {
		t.Fatalf("sorted page = %v", got)
	}

	replaced := e.ok("POST", "/feedback/replace", a, `{"project_id":"team-a/p","feedback_id":"`+f2["id"].(string)+`","weave_ref":"weave:///team-a/p/call/c1","feedback_type":"score","payload":{"score":1}}`).object(t)
	if replaced["id"] == f2["id"] || replaced["payload"].(map[string]any)["score"] != float64(1) {
		t.Fatalf("replace = %v", replaced)
	}
	if r := e.do("POST", "/feedback/replace", a, `{"project_id":"team-a/p","feedback_id":"`+f2["id"].(string)+`","weave_ref":"weave:///team-a/p/call/c1","feedback_type":"score","payload":{}}`); r.status != fasthttp.StatusNotFound {
		t.Fatalf("replacing a replaced item: status %d", r.status)
	}

	e.ok("POST", "/feedback/purge", a, `{"project_id":"team-a/p","query":{"$expr":{"$or":[{"$eq":[{"$getField":"id"},{"$literal":"`+f1["id"].(string)+`"}]},{"$eq":[{"$getField":"id"},{"$literal":"`+replaced["id"].(string)+`"}]}]}}}`)
	if left := result(`{"project_id":"team-a/p"}`); len(left) != 1 || left[0].(map[string]any)["weave_ref"] != "weave:///team-a/p/call/c2" {
		t.Fatalf("after purge = %v", left)
	}
	if got := result(`{"project_id":"team-a/unknown"}`); len(got) != 0 {
		t.Fatalf("unknown project = %v", got)
	}
}

func TestFeedbackValidation(t *testing.T) {
	e := newEnv(t)
	const ref = `"weave_ref":"weave:///team-a/p/call/c1"`
	tests := []struct {
		name, path, body, loc, typ string
	}{
		{"no payload", "/feedback/create", `{"project_id":"team-a/p",` + ref + `,"feedback_type":"x"}`, `["body","payload"]`, "missing"},
		{"payload not an object", "/feedback/create", `{"project_id":"team-a/p",` + ref + `,"feedback_type":"x","payload":[1]}`, `["body","payload"]`, "dict_type"},
		{"not a ref", "/feedback/create", `{"project_id":"team-a/p","weave_ref":"call c1","feedback_type":"x","payload":{}}`, `["body","weave_ref"]`, "value_error"},
		{"ref in another project", "/feedback/create", `{"project_id":"team-a/p","weave_ref":"weave:///team-a/q/call/c1","feedback_type":"x","payload":{}}`, `["body","weave_ref"]`, "value_error"},
		{"reaction without emoji", "/feedback/create", `{"project_id":"team-a/p",` + ref + `,"feedback_type":"wandb.reaction.1","payload":{"note":"x"}}`, `["body","payload","emoji"]`, "string_type"},
		{"reserved type", "/feedback/create", `{"project_id":"team-a/p",` + ref + `,"feedback_type":"wandb.other","payload":{}}`, `["body","feedback_type"]`, "value_error"},
		{"runnable without its ref", "/feedback/create", `{"project_id":"team-a/p",` + ref + `,"feedback_type":"wandb.runnable.s","payload":{}}`, `["body","runnable_ref"]`, "missing"},
		{"replace without id", "/feedback/replace", `{"project_id":"team-a/p",` + ref + `,"feedback_type":"x","payload":{}}`, `["body","feedback_id"]`, "missing"},
		{"bad query operator", "/feedback/query", `{"project_id":"team-a/p","query":{"$expr":{"$nope":[]}}}`, `["body","query","$expr"]`, "value_error"},
		{"purge without query", "/feedback/purge", `{"project_id":"team-a/p"}`, `["body","query"]`, "missing"},
		{"purge by other than ids", "/feedback/purge", `{"project_id":"team-a/p","query":{"$expr":{"$eq":[{"$getField":"feedback_type"},{"$literal":"x"}]}}}`, `["body","query"]`, "value_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.expect422(t, tt.path, tt.body, tt.loc, tt.typ)
		})
	}
}

func TestCostsLifecycle(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	ids := e.ok("POST", "/cost/create", a, `{"project_id":"team-a/p","costs":{
		"gpt-x":{"prompt_token_cost":0.000001,"completion_token_cost":0.000002,"effective_date":"2026-01-01T00:00:00Z"},
		"m":{"prompt_token_cost":3,"completion_token_cost":4,"provider_id":"acme","prompt_token_cost_unit":"EUR"}}}`).object(t)["ids"].([]any)
	if len(ids) != 2 || ids[0].([]any)[1] != "gpt-x" || ids[1].([]any)[1] != "m" {
		t.Fatalf("ids = %v", ids)
	}
	results := e.ok("POST", "/cost/query", a, `{"project_id":"team-a/p","query":{"$expr":{"$eq":[{"$getField":"llm_id"},{"$literal":"m"}]}}}`).object(t)["results"].([]any)
	if len(results) != 1 {
		t.Fatalf("results = %v", results)
	}
	m := results[0].(map[string]any)
	if m["prompt_token_cost"] != float64(3) || m["completion_token_cost"] != float64(4) || m["provider_id"] != "acme" ||
		m["prompt_token_cost_unit"] != "EUR" || m["completion_token_cost_unit"] != "USD" || m["id"] != ids[1].([]any)[0] {
		t.Fatalf("cost = %v", m)
	}
	all := e.ok("POST", "/cost/query", a, `{"project_id":"team-a/p","sort_by":[{"field":"llm_id","direction":"asc"}],"fields":["llm_id","effective_date"]}`).object(t)["results"].([]any)
	if len(all) != 2 || all[0].(map[string]any)["effective_date"] != "2026-01-01T00:00:00.000000Z" || len(all[0].(map[string]any)) != 2 {
		t.Fatalf("all = %v", all)
	}
	e.ok("POST", "/cost/purge", a, `{"project_id":"team-a/p","query":{"$expr":{"$in":[{"$getField":"id"},[{"$literal":"`+ids[0].([]any)[0].(string)+`"}]]}}}`)
	if left := e.ok("POST", "/cost/query", a, `{"project_id":"team-a/p"}`).object(t)["results"].([]any); len(left) != 1 || left[0].(map[string]any)["llm_id"] != "m" {
		t.Fatalf("after purge = %v", left)
	}
	for _, tt := range []struct{ name, body, loc, typ string }{
		{"no costs", `{"project_id":"team-a/p"}`, `["body","costs"]`, "missing"},
		{"negative price", `{"project_id":"team-a/p","costs":{"m":{"prompt_token_cost":-1,"completion_token_cost":1}}}`, `["body","costs","m","prompt_token_cost"]`, "float_type"},
		{"missing price", `{"project_id":"team-a/p","costs":{"m":{"prompt_token_cost":1}}}`, `["body","costs","m","completion_token_cost"]`, "missing"},
		{"bad date", `{"project_id":"team-a/p","costs":{"m":{"prompt_token_cost":1,"completion_token_cost":1,"effective_date":"soon"}}}`, `["body","costs","m","effective_date"]`, "datetime_from_date_parsing"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e.expect422(t, "/cost/create", tt.body, tt.loc, tt.typ)
		})
	}
}
