package admin_test

import (
	"encoding/base64"
	"reflect"
	"strings"
	"testing"
)

func TestProjectsInfo(t *testing.T) {
	e := newEnv(t)
	// Projects come to exist on first use: an op, a call, a run.
	e.ok("POST", "/v2/team-a/ops-first/ops", bearer(aliceKey), `{"name":"f","source_code":"x"}`)
	e.ok("POST", "/call/start", bearer(aliceKey), `{"start":{"project_id":"team-a/call-first","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}`)
	e.ok("POST", "/v2/team-a/run-first/evaluation_runs", bearer(aliceKey), `{"evaluation":"e","model":"m"}`)
	e.ok("POST", "/call/start", bearer(bobKey), `{"start":{"project_id":"team-b/other","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}`)
	// Reads do not create projects.
	e.ok("GET", "/v2/team-a/read-only/ops", bearer(aliceKey), "")

	r := e.ok("POST", "/service/projects_info", basic(aliceKey),
		`{"project_ids":["team-a/run-first","team-a/unknown","team-a/ops-first","team-a/call-first","team-a/read-only","team-a/ops-first"]}`)
	got := r.json(t).([]any)
	var ids []string
	seen := map[string]bool{}
	for _, it := range got {
		m := it.(map[string]any)
		ids = append(ids, m["external_project_id"].(string))
		internal := m["internal_project_id"].(string)
		raw, err := base64.StdEncoding.DecodeString(internal)
		if err != nil || !strings.HasPrefix(string(raw), "ProjectInternalId:") {
			t.Fatalf("internal id %q decodes to %q, %v", internal, raw, err)
		}
		if seen[internal] {
			t.Fatalf("internal id %s given twice", internal)
		}
		seen[internal] = true
	}
	if want := []string{"team-a/run-first", "team-a/ops-first", "team-a/call-first"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("projects = %v, want %v (request order, known only, once each)", ids, want)
	}

	// The internal id is stable and usable wherever a project_id is.
	again := e.ok("POST", "/service/projects_info", bearer(aliceKey), `{"project_ids":["team-a/call-first"]}`).json(t).([]any)
	internal := again[0].(map[string]any)["internal_project_id"].(string)
	for _, it := range got {
		if m := it.(map[string]any); m["external_project_id"] == "team-a/call-first" && m["internal_project_id"] != internal {
			t.Fatalf("internal id changed: %v vs %s", m, internal)
		}
	}
	lines := e.ok("POST", "/calls/stream_query", bearer(aliceKey), `{"project_id":"`+internal+`"}`).lines(t)
	if len(lines) != 1 || lines[0]["project_id"] != "team-a/call-first" {
		t.Fatalf("stream_query by internal id = %v", lines)
	}

	// An admin key sees every team's projects; an empty list is fine.
	all := e.ok("POST", "/service/projects_info", bearer(rootKey), `{"project_ids":["team-b/other","team-a/ops-first"]}`).json(t).([]any)
	if len(all) != 2 {
		t.Fatalf("admin projects_info = %v", all)
	}
	if empty := e.ok("POST", "/service/projects_info", bearer(aliceKey), `{"project_ids":[]}`); string(empty.body) != "[]\n" {
		t.Fatalf("empty request = %q", empty.body)
	}
}
