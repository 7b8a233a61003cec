package admin_test

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestHealthAndServerInfo(t *testing.T) {
	e := newEnv(t)
	if r := e.ok("GET", "/health", basic(aliceKey), ""); r.object(t)["status"] != "ok" {
		t.Fatalf("health: %s", r.body)
	}
	if r := e.do("GET", "/health", basic("sk-nobody"), ""); r.status != fasthttp.StatusUnauthorized {
		t.Fatalf("health with a wrong key: status %d", r.status)
	}
	info := e.ok("GET", "/server_info", bearer(aliceKey), "").object(t)
	if v, ok := info["min_required_weave_python_version"].(string); !ok || v == "" {
		t.Fatalf("server_info: %v", info)
	}
}

// TestObjectLifecycle creates versions, reads them by digest, alias and
// index, lists and deletes them, as the SDKs do.
func TestObjectLifecycle(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	// json.dumps({"a": "\u00e9", "b": 1}, sort_keys=True) hashed as Weave's
	// bytes_digest (see weave/digest_test.go).
	const d0 = "1zkT77MJtZhs3JWS7IaXxaAkwiQM4yF893fTlsTjg60"
	for _, val := range []string{`{"b":1,"a":"é"}`, `{"a":"é","b":1}`} {
		r := e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"cfg","val":`+val+`}}`).object(t)
		if r["digest"] != d0 || r["object_id"] != "cfg" {
			t.Fatalf("create %s = %v, want digest %s", val, r, d0)
		}
	}
	d1 := e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"cfg","val":{"a":2}}}`).object(t)["digest"].(string)
	ds := e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"qa","val":{"_type":"Dataset","_class_name":"Dataset","_bases":["Object","BaseModel"],"rows":"x"}}}`).object(t)
	// The same by hand: json.dumps of the dataset value, sort_keys=True.
	if ds["digest"] != "rQmENNtOjWNll8qsZEM9lTdNKqgranWbRlqHXnQLYkI" {
		t.Fatalf("dataset digest = %v", ds["digest"])
	}

	read := func(sel string) map[string]any {
		t.Helper()
		return e.ok("POST", "/obj/read", a, `{"project_id":"team-a/p","object_id":"cfg","digest":"`+sel+`"}`).object(t)["obj"].(map[string]any)
	}
	for _, sel := range []string{"latest", "v1", d1} {
		o := read(sel)
		if o["digest"] != d1 || o["version_index"] != float64(1) || o["is_latest"] != float64(1) || o["kind"] != "object" ||
			o["project_id"] != "team-a/p" || o["wb_user_id"] != "alice" || o["val"].(map[string]any)["a"] != float64(2) {
			t.Fatalf("read %s = %v", sel, o)
		}
	}
	if o := read("v0"); o["digest"] != d0 || o["is_latest"] != float64(0) || o["val"].(map[string]any)["a"] != "é" {
		t.Fatalf("read v0 = %v", o)
	}
	if r := e.do("POST", "/obj/read", a, `{"project_id":"team-a/p","object_id":"cfg","digest":"nope"}`); r.status != fasthttp.StatusNotFound {
		t.Fatalf("unknown digest: status %d", r.status)
	}
	if r := e.do("POST", "/obj/read", a, `{"project_id":"team-a/other","object_id":"cfg","digest":"latest"}`); r.status != fasthttp.StatusNotFound {
		t.Fatalf("unknown project: status %d", r.status)
	}

	objs := e.ok("POST", "/objs/query", a, `{"project_id":"team-a/p","filter":{"latest_only":true},"sort_by":[{"field":"object_id","direction":"desc"}]}`).object(t)["objs"].([]any)
	if len(objs) != 2 || objs[0].(map[string]any)["object_id"] != "qa" || objs[1].(map[string]any)["digest"] != d1 {
		t.Fatalf("latest objects = %v", objs)
	}
	q := objs[0].(map[string]any)
	if q["base_object_class"] != "Dataset" || q["leaf_object_class"] != "Dataset" {
		t.Fatalf("dataset classes = %v", q)
	}
	objs = e.ok("POST", "/objs/query", a, `{"project_id":"team-a/p","filter":{"base_object_classes":["Dataset"]},"metadata_only":true}`).object(t)["objs"].([]any)
	if len(objs) != 1 || len(objs[0].(map[string]any)["val"].(map[string]any)) != 0 {
		t.Fatalf("datasets, metadata only = %v", objs)
	}

	if n := e.ok("POST", "/obj/delete", a, `{"project_id":"team-a/p","object_id":"cfg","digests":["`+d1+`"]}`).object(t)["num_deleted"]; n != float64(1) {
		t.Fatalf("num_deleted = %v", n)
	}
	if o := read("latest"); o["digest"] != d0 {
		t.Fatalf("latest after deleting v1 = %v", o)
	}
	if r := e.do("POST", "/obj/read", a, `{"project_id":"team-a/p","object_id":"cfg","digest":"`+d1+`"}`); r.status != fasthttp.StatusNotFound || !strings.Contains(string(r.body), "deleted") {
		t.Fatalf("deleted version: status %d: %s", r.status, r.body)
	}
	if r := e.do("POST", "/obj/delete", a, `{"project_id":"team-a/p","object_id":"cfg","digests":["`+d1+`"]}`); r.status != fasthttp.StatusNotFound {
		t.Fatalf("deleting again: status %d", r.status)
	}
}

func TestObjCreateOpIsListed(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	code := "const add = (a, b) => a + b;"
	digest := e.uploadFile(t, a, "team-a/p", "obj.py", []byte(code)).object(t)["digest"].(string)
	r := e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"add","val":{"_type":"CustomWeaveType","weave_type":{"type":"Op"},"files":{"obj.py":"`+digest+`"},"load_op":"NO_LOAD_OP"}}}`).object(t)
	o := e.ok("POST", "/obj/read", a, `{"project_id":"team-a/p","object_id":"add","digest":"latest"}`).object(t)["obj"].(map[string]any)
	if o["kind"] != "op" {
		t.Fatalf("kind = %v", o["kind"])
	}
	ops := e.ok("GET", "/v2/team-a/p/ops", a, "", "Accept", "application/json").json(t).([]any)
	if len(ops) != 1 || ops[0].(map[string]any)["digest"] != r["digest"] || ops[0].(map[string]any)["code"] != code {
		t.Fatalf("ops listing = %v", ops)
	}
	if objs := e.ok("POST", "/objs/query", a, `{"project_id":"team-a/p","filter":{"is_op":false}}`).object(t)["objs"].([]any); len(objs) != 0 {
		t.Fatalf("non-ops = %v", objs)
	}
}

func TestObjectValidation(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name, path, body, loc, typ string
	}{
		{"no obj", "/obj/create", `{}`, `["body","obj"]`, "missing"},
		{"no val", "/obj/create", `{"obj":{"project_id":"team-a/p","object_id":"x"}}`, `["body","obj","val"]`, "missing"},
		{"bad object id", "/obj/create", `{"obj":{"project_id":"team-a/p","object_id":"a/b","val":1}}`, `["body","obj","object_id"]`, "value_error"},
		{"class mismatch", "/obj/create", `{"obj":{"project_id":"team-a/p","object_id":"x","builtin_object_class":"Leaderboard","val":{"_class_name":"Dataset","_bases":["Object","BaseModel"]}}}`, `["body","obj","builtin_object_class"]`, "value_error"},
		{"bad project id", "/obj/read", `{"project_id":"nope","object_id":"x","digest":"latest"}`, `["body","project_id"]`, "value_error"},
		{"read without digest", "/obj/read", `{"project_id":"team-a/p","object_id":"x"}`, `["body","digest"]`, "missing"},
		{"unknown filter key", "/objs/query", `{"project_id":"team-a/p","filter":{"nope":1}}`, `["body","filter","nope"]`, "extra_forbidden"},
		{"bad sort field", "/objs/query", `{"project_id":"team-a/p","sort_by":[{"field":"val","direction":"asc"}]}`, `["body","sort_by"]`, "value_error"},
		{"negative limit", "/objs/query", `{"project_id":"team-a/p","limit":-1}`, `["body","limit"]`, "greater_than_equal"},
		{"too many digests", "/obj/delete", `{"project_id":"team-a/p","object_id":"x","digests":[` + strings.Repeat(`"d",`, 100) + `"d"]}`, `["body","digests"]`, "too_long"},
		{"refs not a list", "/refs/read_batch", `{"refs":"weave:///a/b/object/c:d"}`, `["body","refs"]`, "list_type"},
		{"malformed ref", "/refs/read_batch", `{"refs":["weave:///a/b"]}`, `["body","refs",0]`, "value_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.expect422(t, tt.path, tt.body, tt.loc, tt.typ)
		})
	}
}

// TestRefsReadBatch resolves object, table, row and call refs, and extra
// paths through a dataset into its table's rows.
func TestRefsReadBatch(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	tbl := e.ok("POST", "/table/create", a, `{"table":{"project_id":"team-a/p","rows":[{"q":"1+1","a":"2"},{"q":"2+2","a":"4"}]}}`).object(t)
	tdigest := tbl["digest"].(string)
	row1 := tbl["row_digests"].([]any)[1].(string)
	tref := "weave:///team-a/p/table/" + tdigest
	ds := e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"qa","val":{"_type":"Dataset","name":"qa","rows":"`+tref+`"}}}`).object(t)["digest"].(string)
	e.ok("POST", "/call/start", a, `{"start":{"project_id":"team-a/p","id":"c1","trace_id":"t1","op_name":"op","started_at":"2026-11-21T10:00:00Z","inputs":{"x":1}}}`)
	oref := "weave:///team-a/p/object/qa:" + ds
	refs := []string{
		oref, "weave:///team-a/p/object/qa:latest", oref + "/attr/name", oref + "/attr/rows/index/1", oref + "/attr/rows/id/" + row1,
		tref, tref + "/index/0/key/q", "weave:///team-a/p/call/c1/attr/inputs/key/x",
		"weave:///team-a/p/object/qa:nope", oref + "/attr/missing", "weave:///team-a/p/call/nope", "weave:///team-a/nowhere/object/x:y",
	}
	body := `{"refs":["` + strings.Join(refs, `","`) + `"]}`
	vals := e.ok("POST", "/refs/read_batch", a, body).object(t)["vals"].([]any)
	if len(vals) != len(refs) {
		t.Fatalf("%d vals for %d refs", len(vals), len(refs))
	}
	want := []string{
		`{"_type":"Dataset","name":"qa","rows":"` + tref + `"}`, `{"_type":"Dataset","name":"qa","rows":"` + tref + `"}`, `"qa"`,
		`{"a":"4","q":"2+2"}`, `{"a":"4","q":"2+2"}`, `[{"a":"2","q":"1+1"},{"a":"4","q":"2+2"}]`, `"1+1"`, `1`,
		`null`, `null`, `null`, `null`,
	}
	for i, w := range want {
		if got := compact(t, vals[i]); got != w {
			t.Errorf("%s = %s, want %s", refs[i], got, w)
		}
	}
	// A table past a batch's size reads by row, not whole.
	big := e.ok("POST", "/table/create", a, `{"table":{"project_id":"team-a/p","rows":[`+strings.TrimSuffix(strings.Repeat(`{"n":1},`, 1000), ",")+`,{"n":2}]}}`).object(t)
	bref := "weave:///team-a/p/table/" + big["digest"].(string)
	vals = e.ok("POST", "/refs/read_batch", a, `{"refs":["`+bref+`","`+bref+`/index/1000/key/n","`+bref+`/id/`+big["row_digests"].([]any)[0].(string)+`"]}`).object(t)["vals"].([]any)
	if compact(t, vals) != `[null,2,{"n":1}]` {
		t.Fatalf("big table refs = %s", compact(t, vals))
	}
	if r := e.do("POST", "/refs/read_batch", bearer(bobKey), `{"refs":["`+oref+`"]}`); r.status != fasthttp.StatusForbidden {
		t.Fatalf("bob reading team-a's ref: status %d: %s", r.status, r.body)
	}
	// A value naming another team's object reads as null, not as that object.
	e.ok("POST", "/obj/create", bearer(bobKey), `{"obj":{"project_id":"team-b/p","object_id":"secret","val":{"k":"v"}}}`)
	e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"pointer","val":{"to":"weave:///team-b/p/object/secret:latest"}}}`)
	vals = e.ok("POST", "/refs/read_batch", a, `{"refs":["weave:///team-a/p/object/pointer:latest/attr/to/key/k"]}`).object(t)["vals"].([]any)
	if vals[0] != nil {
		t.Fatalf("followed a ref into another team: %v", vals[0])
	}
}

// TestWeaveEndpointsRefuseOtherTeams: every objects, tables, files,
// feedback and prices endpoint refuses a project of a team the key may not
// use, and takes the key's own.
func TestWeaveEndpointsRefuseOtherTeams(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	digest := e.ok("POST", "/table/create", a, `{"table":{"project_id":"team-a/p","rows":[{"x":1}]}}`).object(t)["digest"].(string)
	file := e.uploadFile(t, a, "team-a/p", "f.txt", []byte("data")).object(t)["digest"].(string)
	endpoints := []struct{ name, path, body string }{
		{"obj create", "/obj/create", `{"obj":{"project_id":"team-a/p","object_id":"o","val":1}}`},
		{"obj read", "/obj/read", `{"project_id":"team-a/p","object_id":"o","digest":"latest"}`},
		{"objs query", "/objs/query", `{"project_id":"team-a/p"}`},
		{"obj delete", "/obj/delete", `{"project_id":"team-a/p","object_id":"o","digests":["v9"]}`},
		{"table create", "/table/create", `{"table":{"project_id":"team-a/p","rows":[]}}`},
		{"table update", "/table/update", `{"project_id":"team-a/p","base_digest":"` + digest + `","updates":[]}`},
		{"table query", "/table/query", `{"project_id":"team-a/p","digest":"` + digest + `"}`},
		{"table query stats", "/table/query_stats", `{"project_id":"team-a/p","digest":"` + digest + `"}`},
		{"refs read", "/refs/read_batch", `{"refs":["weave:///team-a/p/table/` + digest + `"]}`},
		{"file content", "/file/content", `{"project_id":"team-a/p","digest":"` + file + `"}`},
		{"feedback create", "/feedback/create", `{"project_id":"team-a/p","weave_ref":"weave:///team-a/p/call/c","feedback_type":"x","payload":{}}`},
		{"feedback query", "/feedback/query", `{"project_id":"team-a/p"}`},
		{"feedback purge", "/feedback/purge", `{"project_id":"team-a/p","query":{"$expr":{"$eq":[{"$getField":"id"},{"$literal":"x"}]}}}`},
		{"feedback replace", "/feedback/replace", `{"project_id":"team-a/p","feedback_id":"x","weave_ref":"weave:///team-a/p/call/c","feedback_type":"x","payload":{}}`},
		{"cost create", "/cost/create", `{"project_id":"team-a/p","costs":{"m":{"prompt_token_cost":1,"completion_token_cost":2}}}`},
		{"cost query", "/cost/query", `{"project_id":"team-a/p"}`},
		{"cost purge", "/cost/purge", `{"project_id":"team-a/p","query":{"$expr":{"$eq":[{"$getField":"id"},{"$literal":"x"}]}}}`},
	}
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			if r := e.do("POST", ep.path, "", ep.body); r.status != fasthttp.StatusUnauthorized {
				t.Errorf("no key: status %d", r.status)
			}
			if r := e.do("POST", ep.path, bearer(bobKey), ep.body); r.status != fasthttp.StatusForbidden {
				t.Errorf("bob: status %d: %s", r.status, r.body)
			}
			r := e.do("POST", ep.path, a, ep.body)
			if r.status == fasthttp.StatusForbidden || r.status == fasthttp.StatusUnauthorized {
				t.Errorf("alice: status %d: %s", r.status, r.body)
			}
		})
	}
	if r := e.uploadFile(t, bearer(bobKey), "team-a/p", "f.txt", []byte("x")); r.status != fasthttp.StatusForbidden {
		t.Errorf("file create by bob: status %d", r.status)
	}
	// Nothing bob sent reached team-a/p: one object (alice's), no costs.
	if objs := e.ok("POST", "/objs/query", a, `{"project_id":"team-a/p"}`).object(t)["objs"].([]any); len(objs) != 1 {
		t.Errorf("team-a/p objects = %v", objs)
	}
}

// TestWeaveListBounds: the lists a request names are bounded, with
// pydantic's too_long.
func TestWeaveListBounds(t *testing.T) {
	e := newEnv(t)
	ids := `"x"` + strings.Repeat(`,"x"`, 10_000)
	refs := `"weave:///team-a/p/object/o:d"` + strings.Repeat(`,"weave:///team-a/p/object/o:d"`, 1000)
	e.expect422(t, "/objs/query", `{"project_id":"team-a/p","filter":{"object_ids":[`+ids+`]}}`, `["body","filter","object_ids"]`, "too_long")
	e.expect422(t, "/refs/read_batch", `{"refs":[`+refs+`]}`, `["body","refs"]`, "too_long")
	e.expect422(t, "/table/query_stats_batch", `{"project_id":"team-a/p","digests":[`+ids+`]}`, `["body","digests"]`, "too_long")
	// A query with more operands than the bound is refused before it is
	// evaluated.
	eq := `{"$eq":[{"$getField":"id"},{"$literal":"x"}]}`
	e.expect422(t, "/feedback/query", `{"project_id":"team-a/p","query":{"$expr":{"$or":[`+eq+strings.Repeat(","+eq, 2000)+`]}}}`,
		`["body","query","$expr"]`, "value_error")
}
