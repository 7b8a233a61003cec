package admin_test

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestTableCreateQueryUpdate(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	// Row digests and the table digest, by Weave's algorithm (see
	// weave/digest_test.go): bytes_digest(json.dumps(row, sort_keys=True)),
	// and the hex SHA-256 of the row digests concatenated.
	const (
		r1    = "4AyQSRRsY71h5G0LnrJKkmtgs2vtUgoY3lef86WLN5A"
		r2    = "0S9DGT9WaTh3NmpAYXd7YBefvlTW2psFGfzNGj9yHu8"
		table = "df60df8796b210077f29f741e4cd5c03816fd705d2da6bc52a03e7d326e88c76"
	)
	created := e.ok("POST", "/table/create", a, `{"table":{"project_id":"team-a/p","rows":[{"q":"1+1","a":"2"},{"a":"4","q":"2+2"}]}}`).object(t)
	if created["digest"] != table || compact(t, created["row_digests"]) != `["`+r1+`","`+r2+`"]` {
		t.Fatalf("create = %v", created)
	}
	query := func(body string) []any {
		t.Helper()
		return e.ok("POST", "/table/query", a, body).object(t)["rows"].([]any)
	}
	rows := query(`{"project_id":"team-a/p","digest":"` + table + `"}`)
	if compact(t, rows) != `[{"digest":"`+r1+`","original_index":0,"val":{"a":"2","q":"1+1"}},{"digest":"`+r2+`","original_index":1,"val":{"a":"4","q":"2+2"}}]` {
		t.Fatalf("rows = %s", compact(t, rows))
	}

	updated := e.ok("POST", "/table/update", a, `{"project_id":"team-a/p","base_digest":"`+table+`","updates":[
		{"append":{"row":{"q":"3+3","a":"6"}}},{"pop":{"index":0}},{"insert":{"index":0,"row":{"q":"0+0","a":"0"}}}]}`).object(t)
	newDigest := updated["digest"].(string)
	if newDigest == table || len(updated["updated_row_digests"].([]any)) != 3 || updated["updated_row_digests"].([]any)[1] != r1 {
		t.Fatalf("update = %v", updated)
	}
	rows = query(`{"project_id":"team-a/p","digest":"` + newDigest + `"}`)
	var qs []string
	for _, r := range rows {
		qs = append(qs, r.(map[string]any)["val"].(map[string]any)["q"].(string))
	}
	if strings.Join(qs, " ") != "0+0 2+2 3+3" {
		t.Fatalf("rows after update = %v", qs)
	}
	// The base table is unchanged.
	if n := e.ok("POST", "/table/query_stats", a, `{"project_id":"team-a/p","digest":"`+table+`"}`).object(t)["count"]; n != float64(2) {
		t.Fatalf("base count = %v", n)
	}
	if n := e.ok("POST", "/table/query_stats", a, `{"project_id":"team-a/p","digest":"`+newDigest+`"}`).object(t)["count"]; n != float64(3) {
		t.Fatalf("new count = %v", n)
	}

	rows = query(`{"project_id":"team-a/p","digest":"` + newDigest + `","sort_by":[{"field":"q","direction":"desc"}],"limit":2,"offset":1}`)
	if len(rows) != 2 || rows[0].(map[string]any)["val"].(map[string]any)["q"] != "2+2" || rows[0].(map[string]any)["original_index"] != float64(1) {
		t.Fatalf("sorted page = %s", compact(t, rows))
	}
	rows = query(`{"project_id":"team-a/p","digest":"` + newDigest + `","filter":{"row_digests":["` + r2 + `"]}}`)
	if len(rows) != 1 || rows[0].(map[string]any)["digest"] != r2 {
		t.Fatalf("filtered = %s", compact(t, rows))
	}
	rows = query(`{"project_id":"team-a/p","digest":"` + newDigest + `","limit":1,"offset":2}`)
	if len(rows) != 1 || rows[0].(map[string]any)["original_index"] != float64(2) {
		t.Fatalf("page = %s", compact(t, rows))
	}

	for _, path := range []string{"/table/query", "/table/query_stats"} {
		if r := e.do("POST", path, a, `{"project_id":"team-a/p","digest":"nope"}`); r.status != fasthttp.StatusNotFound {
			t.Errorf("%s of an unknown table: status %d", path, r.status)
		}
	}
	if r := e.do("POST", "/table/update", a, `{"project_id":"team-a/p","base_digest":"nope","updates":[]}`); r.status != fasthttp.StatusNotFound {
		t.Errorf("update of an unknown table: status %d", r.status)
	}
}

func TestTableValidation(t *testing.T) {
	e := newEnv(t)
	table := e.ok("POST", "/table/create", bearer(aliceKey), `{"table":{"project_id":"team-a/p","rows":[{"x":1}]}}`).object(t)["digest"].(string)
	tests := []struct {
		name, path, body, loc, typ string
	}{
		{"no table", "/table/create", `{}`, `["body","table"]`, "missing"},
		{"rows not a list", "/table/create", `{"table":{"project_id":"team-a/p","rows":{}}}`, `["body","table","rows"]`, "list_type"},
		{"a row not an object", "/table/create", `{"table":{"project_id":"team-a/p","rows":[{},3]}}`, `["body","table","rows",1]`, "dict_type"},
		{"unknown update", "/table/update", `{"project_id":"team-a/p","base_digest":"` + table + `","updates":[{"shift":{}}]}`, `["body","updates",0]`, "value_error"},
		{"pop without index", "/table/update", `{"project_id":"team-a/p","base_digest":"` + table + `","updates":[{"pop":{}}]}`, `["body","updates",0,"pop","index"]`, "missing"},
		{"pop out of range", "/table/update", `{"project_id":"team-a/p","base_digest":"` + table + `","updates":[{"pop":{"index":1}}]}`, `["body","updates",0]`, "value_error"},
		{"insert past the end", "/table/update", `{"project_id":"team-a/p","base_digest":"` + table + `","updates":[{"append":{"row":{}}},{"insert":{"index":3,"row":{}}}]}`, `["body","updates",1]`, "value_error"},
		{"bad filter", "/table/query", `{"project_id":"team-a/p","digest":"` + table + `","filter":{"rows":[]}}`, `["body","filter","rows"]`, "extra_forbidden"},
		{"bad sort", "/table/query", `{"project_id":"team-a/p","digest":"` + table + `","sort_by":[{"field":"a..b","direction":"asc"}]}`, `["body","sort_by",0,"field"]`, "value_error"},
		{"stats without digest", "/table/query_stats", `{"project_id":"team-a/p"}`, `["body","digest"]`, "missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.expect422(t, tt.path, tt.body, tt.loc, tt.typ)
		})
	}
}

// TestTableQueryStreamAndStatsBatch: the Python SDK's table routes.
func TestTableQueryStreamAndStatsBatch(t *testing.T) {
	e := newEnv(t)
	a := bearer(aliceKey)
	table := e.ok("POST", "/table/create", a, `{"table":{"project_id":"team-a/p","rows":[{"n":1},{"n":2},{"n":3}]}}`).object(t)["digest"].(string)
	r := e.ok("POST", "/table/query_stream", a, `{"project_id":"team-a/p","digest":"`+table+`","offset":1}`)
	lines := r.lines(t)
	if r.contentType != "application/jsonl" || len(lines) != 2 || lines[0]["original_index"] != float64(1) || lines[1]["val"].(map[string]any)["n"] != float64(3) {
		t.Fatalf("stream (%s) = %v", r.contentType, lines)
	}
	stats := e.ok("POST", "/table/query_stats_batch", a, `{"project_id":"team-a/p","digests":["`+table+`","nope"]}`).object(t)["tables"].([]any)
	if compact(t, stats) != `[{"count":3,"digest":"`+table+`"}]` {
		t.Fatalf("stats = %s", compact(t, stats))
	}
	for _, path := range []string{"/table/query_stream", "/table/query_stats_batch"} {
		if r := e.do("POST", path, bearer(bobKey), `{"project_id":"team-a/p","digest":"`+table+`","digests":[]}`); r.status != fasthttp.StatusForbidden {
			t.Errorf("%s by bob: status %d", path, r.status)
		}
	}
}
