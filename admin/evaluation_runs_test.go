package admin_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func TestEvaluationRuns(t *testing.T) {
	e := newEnv(t)
	created := e.ok("POST", "/v2/team-a/p/evaluation_runs", basic(aliceKey),
		`{"evaluation":"weave:///team-a/p/object/Evaluation:abc","model":"weave:///team-a/p/object/Model:def"}`).object(t)
	id, _ := created["evaluation_run_id"].(string)
	u, err := uuid.Parse(id)
	if err != nil || u.Version() != 7 {
		t.Fatalf("evaluation_run_id %q is not a UUIDv7: %v", id, err)
	}

	run := e.ok("GET", "/v2/team-a/p/evaluation_runs/"+id, bearer(aliceKey), "").object(t)
	if run["evaluation_run_id"] != id || run["status"] != "running" || run["finished_at"] != nil ||
		run["evaluation"] != "weave:///team-a/p/object/Evaluation:abc" || run["model"] != "weave:///team-a/p/object/Model:def" ||
		run["source_evaluation_run_id"] != nil || !reflect.DeepEqual(run["summary"], map[string]any{}) {
		t.Fatalf("run = %v", run)
	}
	if _, err := time.Parse(time.RFC3339Nano, run["started_at"].(string)); err != nil {
		t.Fatalf("started_at: %v", err)
	}

	// The run is a root call: id = trace_id, op Evaluation.evaluate, the
	// refs as inputs.
	call := e.ok("POST", "/call/read", bearer(aliceKey), `{"project_id":"team-a/p","id":"`+id+`"}`).object(t)["call"].(map[string]any)
	if call["trace_id"] != id || call["op_name"] != "Evaluation.evaluate" || call["parent_id"] != nil ||
		!reflect.DeepEqual(call["inputs"], map[string]any{"self": "weave:///team-a/p/object/Evaluation:abc", "model": "weave:///team-a/p/object/Model:def"}) {
		t.Fatalf("run call = %v", call)
	}
	if _, ok := call["attributes"].(map[string]any)["evaluation_run"]; !ok {
		t.Fatalf("run call attributes = %v", call["attributes"])
	}

	// A second run names the first as its source; refs are not checked.
	second := e.ok("POST", "/v2/team-a/p/evaluation_runs", basic(aliceKey),
		`{"evaluation":"not-a-ref","model":"m","source_evaluation_run_id":"`+id+`"}`).object(t)["evaluation_run_id"].(string)
	if r := e.ok("GET", "/v2/team-a/p/evaluation_runs/"+second, bearer(aliceKey), "").object(t); r["source_evaluation_run_id"] != id {
		t.Fatalf("second run = %v", r)
	}

	// Listing is newest first, paged.
	list := e.ok("GET", "/v2/team-a/p/evaluation_runs", bearer(aliceKey), "", "Accept", "application/json").json(t).([]any)
	if len(list) != 2 || list[0].(map[string]any)["evaluation_run_id"] != second || list[1].(map[string]any)["evaluation_run_id"] != id {
		t.Fatalf("list = %v", list)
	}
	page := e.ok("GET", "/v2/team-a/p/evaluation_runs?limit=1&offset=1", bearer(aliceKey), "", "Accept", "text/html, application/json;q=0.9").json(t).([]any)
	if len(page) != 1 || page[0].(map[string]any)["evaluation_run_id"] != id {
		t.Fatalf("page = %v", page)
	}
	// JSON Lines by default, as Weave streams it, and when asked for.
	for _, accept := range []string{"", "application/jsonl", "*/*"} {
		r := e.ok("GET", "/v2/team-a/p/evaluation_runs", bearer(aliceKey), "", "Accept", accept)
		if lines := r.lines(t); r.contentType != "application/jsonl" || len(lines) != 2 || lines[0]["evaluation_run_id"] != second {
			t.Fatalf("Accept %q: %s %v", accept, r.contentType, lines)
		}
	}

	// Finishing: success with a summary, error with an exception.
	if r := e.ok("POST", "/v2/team-a/p/evaluation_runs/"+id+"/finish", bearer(aliceKey), `{"summary":{"accuracy":0.9}}`).object(t); r["success"] != true {
		t.Fatalf("finish = %v", r)
	}
	done := e.ok("GET", "/v2/team-a/p/evaluation_runs/"+id, bearer(aliceKey), "").object(t)
	if done["status"] != "success" || done["finished_at"] == nil || !reflect.DeepEqual(done["summary"], map[string]any{"accuracy": 0.9}) {
		t.Fatalf("finished run = %v", done)
	}
	e.ok("POST", "/v2/team-a/p/evaluation_runs/"+second+"/finish", bearer(aliceKey), `{"exception":"scorer crashed"}`)
	if r := e.ok("GET", "/v2/team-a/p/evaluation_runs/"+second, bearer(aliceKey), "").object(t); r["status"] != "error" {
		t.Fatalf("failed run = %v", r)
	}
	// A body-less finish works too.
	third := e.ok("POST", "/v2/team-a/p/evaluation_runs", basic(aliceKey), `{"evaluation":"e","model":"m"}`).object(t)["evaluation_run_id"].(string)
	e.ok("POST", "/v2/team-a/p/evaluation_runs/"+third+"/finish", bearer(aliceKey), "")

	// Unknown runs are 404 with a detail; so is a call that is not a run.
	e.ok("POST", "/call/start", bearer(aliceKey), `{"start":{"project_id":"team-a/p","id":"plain","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}`)
	for _, path := range []string{
		"/v2/team-a/p/evaluation_runs/nope", "/v2/team-a/p/evaluation_runs/plain", "/v2/team-a/unknown/evaluation_runs/" + id,
	} {
		r := e.do("GET", path, bearer(aliceKey), "")
		if r.status != fasthttp.StatusNotFound {
			t.Fatalf("GET %s: status %d", path, r.status)
		}
		if d, _ := r.object(t)["detail"].(string); d == "" {
			t.Fatalf("GET %s: body %s", path, r.body)
		}
		if r := e.do("POST", path+"/finish", bearer(aliceKey), ""); r.status != fasthttp.StatusNotFound {
			t.Fatalf("finish %s: status %d", path, r.status)
		}
	}
}
