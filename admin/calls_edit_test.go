package admin_test

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// detailTypes returns the FastAPI error types of a 422, by dotted location.
func detailTypes(t *testing.T, r response) map[string]string {
	t.Helper()
	if r.status != fasthttp.StatusUnprocessableEntity {
		t.Fatalf("status %d, want 422: %s", r.status, r.body)
	}
	out := map[string]string{}
	for _, d := range r.object(t)["detail"].([]any) {
		m := d.(map[string]any)
		var loc []string
		for _, l := range m["loc"].([]any) {
			switch x := l.(type) {
			case string:
				loc = append(loc, x)
			case float64:
				loc = append(loc, strconv.Itoa(int(x)))
			}
		}
		out[strings.Join(loc, ".")] = m["type"].(string)
	}
	return out
}

// seedTree ingests, in team-a/p, root r → child c → grandchild g in trace
// t, and a separate root o in trace u.
func seedTree(t *testing.T, e *env) {
	t.Helper()
	e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"r","trace_id":"t","op_name":"root","started_at":"2026-11-21T10:00:00Z","wb_user_id":"u-1","wb_run_id":"run-1"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"c","trace_id":"t","parent_id":"r","op_name":"child","started_at":"2026-11-21T10:00:01Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"g","trace_id":"t","parent_id":"c","op_name":"grandchild","started_at":"2026-11-21T10:00:02Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"o","trace_id":"u","op_name":"other","started_at":"2026-11-21T10:00:03Z"}}}
	]}`)
}

func readCall(t *testing.T, e *env, id string) map[string]any {
	t.Helper()
	c, _ := e.ok("POST", "/call/read", bearer(aliceKey), `{"project_id":"team-a/p","id":"`+id+`"}`).object(t)["call"].(map[string]any)
	return c
}

func TestCallUpdate(t *testing.T) {
	e := newEnv(t)
	seedTree(t, e)
	if r := e.ok("POST", "/call/update", basic(aliceKey), `{"project_id":"team-a/p","call_id":"c","display_name":"Renamed","wb_user_id":"ignored"}`); string(r.body) != "{}\n" {
		t.Fatalf("update = %s", r.body)
	}
	if c := readCall(t, e, "c"); c["display_name"] != "Renamed" || c["wb_user_id"] != "alice" {
		t.Fatalf("after update: %v", c)
	}
	if r := e.do("POST", "/call/update", bearer(aliceKey), `{"project_id":"team-a/p","call_id":"ghost","display_name":"x"}`); r.status != fasthttp.StatusNotFound {
		t.Fatalf("unknown call: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/call/update", bearer(aliceKey), `{"project_id":"team-a/nothing","call_id":"c","display_name":"x"}`); r.status != fasthttp.StatusNotFound {
		t.Fatalf("unknown project: %d %s", r.status, r.body)
	}
	for body, want := range map[string]map[string]string{
		`{"project_id":"team-a/p","call_id":"c"}`:                         {"body.display_name": "missing"},
		`{"project_id":"team-a/p","display_name":"x"}`:                    {"body.call_id": "missing"},
		`{"project_id":"team-a/p","call_id":"c","display_name":3}`:        {"body.display_name": "string_type"},
		`{"call_id":"c","display_name":"x"}`:                              {"body.project_id": "missing"},
		`{"project_id":"team-a/p","call_id":["c"],"display_name":"name"}`: {"body.call_id": "string_type"},
	} {
		if got := detailTypes(t, e.do("POST", "/call/update", bearer(aliceKey), body)); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, want %v", body, got, want)
		}
	}
	if r := e.do("POST", "/call/update", bearer(bobKey), `{"project_id":"team-a/p","call_id":"c","display_name":"bob was here"}`); r.status != fasthttp.StatusForbidden {
		t.Fatalf("cross-team update: %d", r.status)
	}
	if c := readCall(t, e, "c"); c["display_name"] != "Renamed" {
		t.Fatalf("a refused update changed the call: %v", c)
	}
}

func TestCallsDelete(t *testing.T) {
	e := newEnv(t)
	seedTree(t, e)
	// A pending end (its start never came) goes with its id too.
	e.ok("POST", "/call/end", bearer(aliceKey), `{"end":{"project_id":"team-a/p","id":"early","ended_at":"2026-11-21T10:00:09Z"}}`)

	if r := e.do("POST", "/calls/delete", bearer(bobKey), `{"project_id":"team-a/p","call_ids":["r"]}`); r.status != fasthttp.StatusForbidden {
		t.Fatalf("cross-team delete: %d", r.status)
	}
	if readCall(t, e, "g") == nil {
		t.Fatal("a refused delete deleted")
	}
	// Deleting the child takes the grandchild, not the parent.
	if r := e.ok("POST", "/calls/delete", bearer(aliceKey), `{"project_id":"team-a/p","call_ids":["c","ghost","early"]}`); string(r.body) != `{"num_deleted":2}`+"\n" {
		t.Fatalf("delete = %s", r.body)
	}
	for id, want := range map[string]bool{"r": true, "c": false, "g": false, "o": true} {
		if got := readCall(t, e, id) != nil; got != want {
			t.Errorf("call %s exists = %v, want %v", id, got, want)
		}
	}
	// The pending end is gone: a late start of "early" stays unfinished.
	e.ok("POST", "/call/start", bearer(aliceKey), `{"start":{"project_id":"team-a/p","id":"early","trace_id":"x","op_name":"late","started_at":"2026-11-21T10:00:00Z"}}`)
	if c := readCall(t, e, "early"); c["ended_at"] != nil {
		t.Fatalf("the deleted end was applied: %v", c)
	}
	if n := e.ok("POST", "/calls/query_stats", bearer(aliceKey), `{"project_id":"team-a/p","filter":{"trace_ids":["t"]}}`).object(t)["count"]; n != float64(1) {
		t.Fatalf("trace t holds %v calls after the delete, want 1", n)
	}

	many := make([]string, 1001)
	for i := range many {
		many[i] = `"c` + strconv.Itoa(i) + `"`
	}
	for body, want := range map[string]map[string]string{
		`{"project_id":"team-a/p"}`:                                              {"body.call_ids": "missing"},
		`{"project_id":"team-a/p","call_ids":"r"}`:                               {"body.call_ids": "list_type"},
		`{"project_id":"team-a/p","call_ids":[` + strings.Join(many, ",") + `]}`: {"body.call_ids": "too_long"},
	} {
		got := detailTypes(t, e.do("POST", "/calls/delete", bearer(aliceKey), body))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%.60s: %v, want %v", body, got, want)
		}
	}
	// Unknown projects delete nothing and are not an error.
	e.ok("POST", "/calls/delete", bearer(aliceKey), `{"project_id":"team-a/nothing","call_ids":["r"]}`)
}

func TestCallsQueryStats(t *testing.T) {
	e := newEnv(t)
	seedTree(t, e)
	count := func(body string) any {
		t.Helper()
		return e.ok("POST", "/calls/query_stats", bearer(aliceKey), body).object(t)["count"]
	}
	for body, want := range map[string]float64{
		`{"project_id":"team-a/p"}`:                                                                           4,
		`{"project_id":"team-a/p","filter":{"trace_roots_only":true}}`:                                        2,
		`{"project_id":"team-a/p","filter":{"wb_user_ids":["u-1"]}}`:                                          1,
		`{"project_id":"team-a/p","filter":{"svc_run_ids":["run-1"]}}`:                                        1,
		`{"project_id":"team-a/p","filter":{"wb_run_ids":["none"]}}`:                                          0,
		`{"project_id":"team-a/p","query":{"$expr":{"$eq":[{"$getField":"wb_user_id"},{"$literal":"u-1"}]}}}`: 1,
		`{"project_id":"team-a/p","filter":{"trace_ids":["t"]},"query":{"$expr":{"$gt":[{"$getField":"started_at"},{"$literal":"2026-11-21T10:00:00Z"}]}}}`: 2,
		`{"project_id":"team-a/p","limit":3}`:                         3,
		`{"project_id":"team-a/p","include_total_storage_size":true}`: 4,
		`{"project_id":"team-a/nothing"}`:                             0,
	} {
		if got := count(body); got != want {
			t.Errorf("%s: count %v, want %v", body, got, want)
		}
	}
	for body, want := range map[string]map[string]string{
		`{"project_id":"team-a/p","filter":{"nope":1}}`:             {"body.filter.nope": "extra_forbidden"},
		`{"project_id":"team-a/p","limit":-1}`:                      {"body.limit": "greater_than_equal"},
		`{"project_id":"team-a/p","query":{"$expr":{"$bogus":[]}}}`: nil,
		`{}`: {"body.project_id": "missing"},
	} {
		got := detailTypes(t, e.do("POST", "/calls/query_stats", bearer(aliceKey), body))
		if want != nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, want %v", body, got, want)
		}
	}
	if r := e.do("POST", "/calls/query_stats", bearer(bobKey), `{"project_id":"team-a/p"}`); r.status != fasthttp.StatusForbidden {
		t.Fatalf("cross-team stats: %d", r.status)
	}
}

// TestEndBeforeStartOverTheWire: the orders an SDK's batches may take all
// store the same call, and no batch fails for its order.
func TestEndBeforeStartOverTheWire(t *testing.T) {
	e := newEnv(t)
	start := func(id string) string {
		return `{"project_id":"team-a/p","id":"` + id + `","trace_id":"t","op_name":"op","started_at":"2026-11-21T10:00:00Z","inputs":{"x":1}}`
	}
	end := func(id string) string {
		return `{"project_id":"team-a/p","id":"` + id + `","ended_at":"2026-11-21T10:00:01Z","output":"done","summary":{"usage":{"m":{"prompt_tokens":2}}}}`
	}
	// Separate requests, end first.
	if r := e.ok("POST", "/call/end", bearer(aliceKey), `{"end":`+end("apart")+`}`); string(r.body) != "{}\n" {
		t.Fatalf("early end = %s", r.body)
	}
	if c := readCall(t, e, "apart"); c != nil {
		t.Fatalf("an end alone reads as a call: %v", c)
	}
	e.ok("POST", "/call/start", bearer(aliceKey), `{"start":`+start("apart")+`}`)
	// Same batch, end first; and an end in one batch whose start comes in
	// the next.
	res := e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"end","req":{"end":`+end("same")+`}},
		{"mode":"start","req":{"start":`+start("same")+`}},
		{"mode":"end","req":{"end":`+end("next")+`}}
	]}`).object(t)
	if want := []any{map[string]any{}, map[string]any{"id": "same", "trace_id": "t"}, map[string]any{}}; !reflect.DeepEqual(res["res"], want) {
		t.Fatalf("res = %v", res["res"])
	}
	e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[{"mode":"start","req":{"start":`+start("next")+`}}]}`)
	// In order, for comparison.
	e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":`+start("inorder")+`}},
		{"mode":"end","req":{"end":`+end("inorder")+`}}
	]}`)
	want := readCall(t, e, "inorder")
	for _, id := range []string{"apart", "same", "next"} {
		got := readCall(t, e, id)
		got["id"] = "inorder"
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v\nwant %v", id, got, want)
		}
	}
	// An early end of another team's project is refused like any write.
	if r := e.do("POST", "/call/end", bearer(bobKey), `{"end":`+end("x")+`}`); r.status != fasthttp.StatusForbidden {
		t.Fatalf("cross-team early end: %d", r.status)
	}
}

func TestEvaluationRunFinishAndDelete(t *testing.T) {
	e := newEnv(t)
	create := func() string {
		return e.ok("POST", "/v2/team-a/p/evaluation_runs", bearer(aliceKey),
			`{"evaluation":"weave:///team-a/p/object/Evaluation:abc","model":"weave:///team-a/p/object/Model:def"}`).object(t)["evaluation_run_id"].(string)
	}
	run := create()
	e.ok("POST", "/v2/team-a/p/evaluation_runs/"+run+"/finish", bearer(aliceKey), `{"summary":{"accuracy":{"mean":0.75}}}`)
	c := readCall(t, e, run)
	if !reflect.DeepEqual(c["output"], map[string]any{"accuracy": map[string]any{"mean": 0.75}}) {
		t.Fatalf("run output = %v", c["output"])
	}
	kids := e.ok("POST", "/calls/stream_query", bearer(aliceKey), `{"project_id":"team-a/p","filter":{"parent_ids":["`+run+`"]}}`).lines(t)
	if len(kids) != 1 || kids[0]["op_name"] != "Evaluation.summarize" || kids[0]["trace_id"] != run || kids[0]["ended_at"] == nil ||
		!reflect.DeepEqual(kids[0]["output"], c["output"]) ||
		!reflect.DeepEqual(kids[0]["inputs"], map[string]any{"self": "weave:///team-a/p/object/Evaluation:abc"}) {
		t.Fatalf("summarize child = %v", kids)
	}
	// Finishing again logs no second child.
	e.ok("POST", "/v2/team-a/p/evaluation_runs/"+run+"/finish", bearer(aliceKey), "")
	if n := e.ok("POST", "/calls/query_stats", bearer(aliceKey), `{"project_id":"team-a/p","filter":{"parent_ids":["`+run+`"]}}`).object(t)["count"]; n != float64(1) {
		t.Fatalf("children after a second finish: %v", n)
	}

	second := create()
	e.ok("POST", "/call/start", bearer(aliceKey), `{"start":{"project_id":"team-a/p","id":"plain","trace_id":"x","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}`)
	if r := e.do("DELETE", "/v2/team-a/p/evaluation_runs?evaluation_run_ids="+run, bearer(bobKey), ""); r.status != fasthttp.StatusForbidden {
		t.Fatalf("cross-team delete: %d", r.status)
	}
	// Repeated and comma-separated ids; a plain call and unknown ids are
	// not runs and stay.
	r := e.ok("DELETE", "/v2/team-a/p/evaluation_runs?evaluation_run_ids="+run+",plain&evaluation_run_ids="+second+"&evaluation_run_ids=ghost", bearer(aliceKey), "")
	if got := r.object(t); !reflect.DeepEqual(got, map[string]any{"num_deleted": float64(2)}) {
		t.Fatalf("delete = %v", got)
	}
	if readCall(t, e, run) != nil || readCall(t, e, second) != nil || readCall(t, e, "plain") == nil {
		t.Fatal("wrong calls deleted")
	}
	if n := e.ok("POST", "/calls/query_stats", bearer(aliceKey), `{"project_id":"team-a/p","filter":{"trace_ids":["`+run+`"]}}`).object(t)["count"]; n != float64(0) {
		t.Fatalf("the run's summarize child outlived it: %v", n)
	}
	if got := detailTypes(t, e.do("DELETE", "/v2/team-a/p/evaluation_runs", bearer(aliceKey), "")); !reflect.DeepEqual(got, map[string]string{"query.evaluation_run_ids": "missing"}) {
		t.Fatalf("no ids: %v", got)
	}
}

// TestSDKEvaluationRuns: an Evaluation.evaluate call a Weave SDK logs
// under its op ref is an evaluation run too: listed, read and deleted.
func TestSDKEvaluationRuns(t *testing.T) {
	e := newEnv(t)
	e.ok("POST", "/call/upsert_batch", bearer(aliceKey), `{"batch":[
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"sdk-run","trace_id":"t","op_name":"weave:///team-a/p/op/Evaluation.evaluate:d1","started_at":"2026-11-21T10:00:00Z","inputs":{"self":"weave:///team-a/p/object/Evaluation:e1","model":"weave:///team-a/p/op/model:m1"},"attributes":{"weave":{"source":"js-sdk"}}}}},
		{"mode":"end","req":{"end":{"project_id":"team-a/p","id":"sdk-run","ended_at":"2026-11-21T10:00:09Z","output":{"score":{"mean":1}}}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"decoy","trace_id":"u","op_name":"weave:///team-a/other/op/Evaluation.evaluate:d1","started_at":"2026-11-21T10:00:00Z"}}},
		{"mode":"start","req":{"start":{"project_id":"team-a/p","id":"lookalike","trace_id":"v","op_name":"weave:///team-a/p/op/Evaluation.evaluate_more:d1","started_at":"2026-11-21T10:00:00Z"}}}
	]}`)
	list := e.ok("GET", "/v2/team-a/p/evaluation_runs", bearer(aliceKey), "").lines(t)
	if len(list) != 1 || list[0]["evaluation_run_id"] != "sdk-run" || list[0]["status"] != "success" ||
		list[0]["evaluation"] != "weave:///team-a/p/object/Evaluation:e1" || list[0]["model"] != "weave:///team-a/p/op/model:m1" {
		t.Fatalf("list = %v", list)
	}
	if r := e.ok("GET", "/v2/team-a/p/evaluation_runs/sdk-run", bearer(aliceKey), "").object(t); r["finished_at"] != "2026-11-21T10:00:09.000000Z" {
		t.Fatalf("read = %v", r)
	}
	for _, id := range []string{"decoy", "lookalike"} {
		if r := e.do("GET", "/v2/team-a/p/evaluation_runs/"+id, bearer(aliceKey), ""); r.status != fasthttp.StatusNotFound {
			t.Fatalf("%s read as a run: %d", id, r.status)
		}
	}
	if got := e.ok("DELETE", "/v2/team-a/p/evaluation_runs?evaluation_run_ids=sdk-run,decoy,lookalike", bearer(aliceKey), "").object(t); got["num_deleted"] != float64(1) {
		t.Fatalf("delete = %v", got)
	}
	if readCall(t, e, "sdk-run") != nil || readCall(t, e, "decoy") == nil {
		t.Fatal("wrong calls deleted")
	}
}
