package admin_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestOps(t *testing.T) {
	e := newEnv(t)
	create := func(name, code string) map[string]any {
		t.Helper()
		return e.ok("POST", "/v2/team-a/p/ops", bearer(aliceKey), `{"name":"`+name+`","source_code":"`+code+`"}`).object(t)
	}
	v0 := create("score", "def score(): return 1")
	if v0["object_id"] != "score" || v0["version_index"] != float64(0) || v0["digest"] == "" {
		t.Fatalf("first version = %v", v0)
	}
	if same := create("score", "def score(): return 1"); !reflect.DeepEqual(same, v0) {
		t.Fatalf("same code = %v, want %v", same, v0)
	}
	v1 := create("score", "def score(): return 2")
	if v1["version_index"] != float64(1) || v1["digest"] == v0["digest"] {
		t.Fatalf("new code = %v", v1)
	}
	create("adder", "def add(a, b): return a + b")
	create("zeta", "pass")
	// Another project's ops stay apart.
	e.ok("POST", "/v2/team-a/elsewhere/ops", bearer(aliceKey), `{"name":"score","source_code":"other"}`)

	type op struct {
		ObjectID     string `json:"object_id"`
		Digest       string `json:"digest"`
		VersionIndex int    `json:"version_index"`
		CreatedAt    string `json:"created_at"`
		Code         string `json:"code"`
	}
	// list reads the listing as a JSON array (Accept: application/json),
	// or, with jsonl, as the JSON Lines it streams by default.
	list := func(query string, jsonl ...bool) []string {
		t.Helper()
		var out []string
		if len(jsonl) > 0 {
			r := e.ok("GET", "/v2/team-a/p/ops"+query, basic(aliceKey), "")
			if r.contentType != "application/jsonl" {
				t.Fatalf("content type %q", r.contentType)
			}
			for _, l := range r.lines(t) {
				out = append(out, l["object_id"].(string)+":"+string(rune('0'+int(l["version_index"].(float64)))))
			}
			return out
		}
		r := e.ok("GET", "/v2/team-a/p/ops"+query, basic(aliceKey), "", "Accept", "application/json")
		if r.contentType != "application/json" {
			t.Fatalf("content type %q", r.contentType)
		}
		var ops []op
		if err := jsonUnmarshal(r.body, &ops); err != nil {
			t.Fatal(err)
		}
		for _, o := range ops {
			if _, err := time.Parse(time.RFC3339Nano, o.CreatedAt); err != nil || o.Code == "" || o.Digest == "" {
				t.Fatalf("op %+v", o)
			}
			out = append(out, o.ObjectID+":"+string(rune('0'+o.VersionIndex)))
		}
		return out
	}
	if got, want := list(""), []string{"adder:0", "score:1", "score:0", "zeta:0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("list = %v, want %v", got, want)
	}
	if got, want := list("?limit=2&offset=1"), []string{"score:1", "score:0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("page = %v, want %v", got, want)
	}
	if got := list("?limit=0"); len(got) != 0 {
		t.Fatalf("limit 0 = %v", got)
	}
	if got, want := list("?offset=3", true), []string{"zeta:0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("jsonl = %v, want %v", got, want)
	}

	// Deleted ops leave the listing.
	if r := e.ok("DELETE", "/v2/team-a/p/ops/score", bearer(aliceKey), "").object(t); r["num_deleted"] != float64(2) {
		t.Fatalf("delete = %v", r)
	}
	if got, want := list(""), []string{"adder:0", "zeta:0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after delete = %v, want %v", got, want)
	}
	if r := e.do("DELETE", "/v2/team-a/p/ops/score", bearer(aliceKey), ""); r.status != fasthttp.StatusNotFound {
		t.Fatalf("second delete: status %d", r.status)
	}

	// An unknown project lists nothing.
	if r := e.ok("GET", "/v2/team-a/nothing/ops", bearer(aliceKey), "", "Accept", "application/json"); string(r.body) != "[]\n" {
		t.Fatalf("unknown project = %q", r.body)
	}
	if r := e.ok("GET", "/v2/team-a/nothing/ops", bearer(aliceKey), ""); len(r.body) != 0 || r.contentType != "application/jsonl" {
		t.Fatalf("unknown project as JSON Lines = %q (%s)", r.body, r.contentType)
	}
}
