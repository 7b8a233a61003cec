package main

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// usagePage is a usage API query for a fixed three hours around the test,
// so that two reads of it list the same buckets.
var usagePage = func() string {
	start := time.Now().Add(-time.Hour).Truncate(time.Hour).Unix()
	return fmt.Sprintf("/v1/organization/usage/completions?bucket_width=1h&start_time=%d&end_time=%d", start, start+3*3600)
}()

// tenant is a team with a key that may use only that team, and the data
// the team made in its project "app".
type tenant struct {
	team, key string
	runID     string // an evaluation run of team/app
	callID    string // an unfinished call of team/app
	internal  string // the internal project id of team/app
}

// seedTenant makes data in team/app with the team's own key: a charged
// chat completion, an op, an evaluation run and an unfinished call.
func seedTenant(t *testing.T, g *running, team, key string) *tenant {
	t.Helper()
	tn := &tenant{team: team, key: key, callID: team + "-call-1"}
	must := func(what string) func(int, string) string {
		return func(code int, body string) string {
			t.Helper()
			if code != 200 {
				t.Fatalf("seed %s %s: %d %s", team, what, code, body)
			}
			return body
		}
	}
	must("chat")(g.do(t, "POST", "/v1/chat/completions", key, chatBody(3, ""), "Compat-Project: "+team+"/app"))
	must("op")(g.do(t, "POST", "/v2/"+team+"/app/ops", key, `{"name":"predict","source_code":"def predict(): return 1"}`))
	body := must("run")(g.do(t, "POST", "/v2/"+team+"/app/evaluation_runs", key,
		`{"evaluation":"weave:///`+team+`/app/object/e:v1","model":"weave:///`+team+`/app/object/m:v1"}`))
	tn.runID = gjson.Get(body, "evaluation_run_id").String()
	must("call")(g.do(t, "POST", "/call/start", key, fmt.Sprintf(
		`{"start":{"project_id":"%s/app","id":%q,"op_name":"step","trace_id":%q,"parent_id":%q,"started_at":%q,"inputs":{"q":"private"}}}`,
		team, tn.callID, tn.runID, tn.runID, time.Now().UTC().Format(time.RFC3339Nano))))
	body = must("projects")(g.do(t, "POST", "/service/projects_info", key, `{"project_ids":["`+team+`/app"]}`))
	tn.internal = gjson.Get(body, "0.internal_project_id").String()
	if tn.runID == "" || tn.internal == "" {
		t.Fatalf("seed %s: no run id or internal id", team)
	}
	return tn
}

// snapshot is everything a tenant reads back of its own project, to tell
// whether another team's requests changed any of it.
func (tn *tenant) snapshot(t *testing.T, g *running) map[string]string {
	t.Helper()
	project := tn.team + "/app"
	reads := map[string][3]string{
		"ops":          {"GET", "/v2/" + project + "/ops", ""},
		"runs":         {"GET", "/v2/" + project + "/evaluation_runs", ""},
		"run":          {"GET", "/v2/" + project + "/evaluation_runs/" + tn.runID, ""},
		"call":         {"POST", "/call/read", fmt.Sprintf(`{"project_id":%q,"id":%q}`, project, tn.callID)},
		"calls":        {"POST", "/calls/stream_query", fmt.Sprintf(`{"project_id":%q}`, project)},
		"trace usage":  {"POST", "/trace/usage", fmt.Sprintf(`{"project_id":%q}`, project)},
		"projects":     {"POST", "/service/projects_info", fmt.Sprintf(`{"project_ids":[%q]}`, project)},
		"usage by key": {"GET", usagePage + "&group_by=project_id,api_key_id", ""},
	}
	out := map[string]string{}
	for name, r := range reads {
		code, body := g.do(t, r[0], r[1], tn.key, r[2])
		if code != 200 {
			t.Fatalf("%s reading its own %s: %d %s", tn.team, name, code, body)
		}
		out[name] = body
	}
	return out
}

// TestTeamIsolation checks, for every endpoint that takes a team, that a
// key of one team can neither charge nor read nor change another team: each
// attempt is refused with 403 and the other team's data stays exactly as
// it was and unseen. It runs both ways, acme against globex and globex
// against acme. Then the admin-only parts: the admin key reads every team,
// team keys only their own, and /metrics with metrics_require_admin wants
// the admin key.
func TestTeamIsolation(t *testing.T) {
	cfg := gatewayConfig(t, t.TempDir(), "server: {metrics_require_admin: true}\n")
	g := start(t, cfg)
	acme := seedTenant(t, g, "acme", "sk-acme-test-key")
	globex := seedTenant(t, g, "globex", "sk-globex-test-key")
	waitForUsage(t, g, "acme/app", "globex/app")

	for _, pair := range [][2]*tenant{{acme, globex}, {globex, acme}} {
		attacker, victim := pair[0], pair[1]
		t.Run(attacker.team+" against "+victim.team, func(t *testing.T) {
			before := victim.snapshot(t, g)
			attack(t, g, attacker, victim)
			after := victim.snapshot(t, g)
			for name, b := range before {
				if after[name] != b {
					t.Errorf("%s's %s changed under %s's requests:\nbefore %s\nafter  %s", victim.team, name, attacker.team, b, after[name])
				}
			}
		})
	}

	t.Run("admin reads every team, team keys their own", func(t *testing.T) {
		for _, tn := range []*tenant{acme, globex} {
			for _, r := range []struct{ method, path, body string }{
				{"GET", "/v2/" + tn.team + "/app/ops", ""},
				{"GET", "/v2/" + tn.team + "/app/evaluation_runs/" + tn.runID, ""},
				{"POST", "/call/read", fmt.Sprintf(`{"project_id":%q,"id":%q}`, tn.internal, tn.callID)},
				{"POST", "/trace/usage", fmt.Sprintf(`{"project_id":"%s/app"}`, tn.team)},
				{"GET", usagePage + "&project_ids=" + tn.team + "/app", ""},
			} {
				if code, body := g.do(t, r.method, r.path, adminKey, r.body); code != 200 {
					t.Errorf("admin %s %s: %d %.200s", r.method, r.path, code, body)
				}
			}
		}
		seen := func(key string) map[string]bool {
			_, body := g.do(t, "GET", usagePage+"&group_by=project_id", key, "")
			out := map[string]bool{}
			for _, id := range gjson.Get(body, "data.#.results.#.project_id").Array() {
				for _, p := range id.Array() {
					out[p.String()] = true
				}
			}
			return out
		}
		if s := seen(adminKey); !s["acme/app"] || !s["globex/app"] {
			t.Errorf("the admin key's usage shows %v, want both teams", s)
		}
		for _, tn := range []*tenant{acme, globex} {
			for p := range seen(tn.key) {
				if !strings.HasPrefix(p, tn.team+"/") {
					t.Errorf("%s's key sees the usage of %s", tn.team, p)
				}
			}
		}
	})

	t.Run("metrics_require_admin", func(t *testing.T) {
		for _, tt := range []struct {
			key  string
			want int
		}{
			{"", 401},
			{"sk-not-a-key", 401},
			{acme.key, 403},
			{globex.key, 403},
			{adminKey, 200},
		} {
			code, body := g.do(t, "GET", "/metrics", tt.key, "")
			if code != tt.want {
				t.Errorf("/metrics with key %q: %d, want %d: %.200s", tt.key, code, tt.want, body)
			}
			if code != 200 && strings.Contains(body, "tollgate_") {
				t.Errorf("/metrics refused with key %q but shows metrics: %.200s", tt.key, body)
			}
		}
	})

	g.stop(t)
	// Each team was charged its own two completions (the seed, and the one
	// naming the other team's trace) and nothing else: every attempt to
	// charge the other team was refused before it could be charged.
	rows := usageByProject(t, cfg)
	for _, p := range []string{"acme/app", "globex/app"} {
		if rows[p].Requests != 2 {
			t.Errorf("%s: %d requests charged, want its own 2", p, rows[p].Requests)
		}
	}
	for p := range rows {
		if team, _, _ := strings.Cut(p, "/"); team != "acme" && team != "globex" {
			t.Errorf("usage charged to %s, a team no key may use", p)
		}
	}
}

// waitForUsage waits (up to 5 s) until the usage API shows every project,
// so that snapshots are taken once the seeding usage is stored.
func waitForUsage(t *testing.T, g *running, projects ...string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, body := g.do(t, "GET", usagePage+"&group_by=project_id", adminKey, "")
		missing := ""
		for _, p := range projects {
			if !strings.Contains(body, `"`+p+`"`) {
				missing = p
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage of %s not stored after 5s: %s", missing, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// attack sends, with the attacker's key, every request that would charge,
// read or change the victim's team, and expects each to be refused with
// 403.
func attack(t *testing.T, g *running, attacker, victim *tenant) {
	t.Helper()
	v := victim.team
	now := time.Now().UTC().Format(time.RFC3339Nano)
	type req struct {
		name, method, path, body string
		headers                  []string
	}
	chat := chatBody(3, "")
	reqs := []req{
		// Charging the other team.
		{"chat charged to the other team", "POST", "/v1/chat/completions", chat, []string{"Compat-Project: " + v + "/app"}},
		{"chat charged to the other team, team only", "POST", "/v1/chat/completions", chat, []string{"Compat-Project: " + v}},
		{"chat charged to the other team, trailing slash", "POST", "/v1/chat/completions", chat, []string{"Compat-Project: " + v + "/"}},
		{"chat charged to the other team, padded", "POST", "/v1/chat/completions", chat, []string{"Compat-Project:  " + v + "/app\t"}},
		{"chat charged to the other team, other case", "POST", "/v1/chat/completions", chat, []string{"Compat-Project: " + strings.ToUpper(v) + "/app"}},
		{"chat stream charged to the other team", "POST", "/v1/chat/completions/", chatBody(3, `,"stream":true`), []string{"Compat-Project: " + v + "/app"}},
		{"chat into the other team's trace", "POST", "/v1/chat/completions", chat, []string{"Compat-Project: " + v + "/app", "Compat-Trace-Id: " + victim.runID, "Compat-Parent-Id: " + victim.callID}},

		// The usage API.
		{"usage of the other team's project", "GET", usagePage + "&project_ids=" + v + "/app", "", nil},
		{"usage of the other team's project, array form", "GET", usagePage + "&project_ids[]=" + v + "/app", "", nil},
		{"usage of the other team's project among its own", "GET", usagePage + "&project_ids=" + attacker.team + "/app," + v + "/app", "", nil},

		// The service API, by name and by internal id.
		{"projects_info", "POST", "/service/projects_info", `{"project_ids":["` + v + `/app"]}`, nil},
		{"projects_info among its own", "POST", "/service/projects_info", `{"project_ids":["` + attacker.team + `/app","` + v + `/app"]}`, nil},
		{"ops list", "GET", "/v2/" + v + "/app/ops", "", nil},
		{"ops create", "POST", "/v2/" + v + "/app/ops", `{"name":"predict","source_code":"def predict(): return 2"}`, nil},
		{"ops create in a new project", "POST", "/v2/" + v + "/new/ops", `{"name":"predict","source_code":"x"}`, nil},
		{"ops delete", "DELETE", "/v2/" + v + "/app/ops/predict", "", nil},
		{"evaluation run create", "POST", "/v2/" + v + "/app/evaluation_runs", `{"evaluation":"e","model":"m"}`, nil},
		{"evaluation runs list", "GET", "/v2/" + v + "/app/evaluation_runs", "", nil},
		{"evaluation run read", "GET", "/v2/" + v + "/app/evaluation_runs/" + victim.runID, "", nil},
		{"evaluation run finish", "POST", "/v2/" + v + "/app/evaluation_runs/" + victim.runID + "/finish", `{"summary":{"hijacked":true}}`, nil},
		{"call start", "POST", "/call/start", fmt.Sprintf(`{"start":{"project_id":"%s/app","op_name":"x","trace_id":%q,"parent_id":%q,"started_at":%q}}`, v, victim.runID, victim.callID, now), nil},
		{"call start by internal id", "POST", "/call/start", fmt.Sprintf(`{"start":{"project_id":%q,"op_name":"x","started_at":%q}}`, victim.internal, now), nil},
		{"call end", "POST", "/call/end", fmt.Sprintf(`{"end":{"project_id":"%s/app","id":%q,"ended_at":%q,"exception":"hijacked"}}`, v, victim.callID, now), nil},
		{"call end by internal id", "POST", "/call/end", fmt.Sprintf(`{"end":{"project_id":%q,"id":%q,"ended_at":%q}}`, victim.internal, victim.callID, now), nil},
		{"upsert_batch", "POST", "/call/upsert_batch", fmt.Sprintf(`{"batch":[{"mode":"end","req":{"end":{"project_id":"%s/app","id":%q,"ended_at":%q}}}]}`, v, victim.callID, now), nil},
		{"upsert_batch mixing its own project", "POST", "/call/upsert_batch", fmt.Sprintf(
			`{"batch":[{"mode":"start","req":{"start":{"project_id":"%s/app","id":"mixed-own","op_name":"x","started_at":%q}}},`+
				`{"mode":"start","req":{"start":{"project_id":"%s/app","id":"mixed-other","op_name":"x","started_at":%q}}}]}`,
			attacker.team, now, v, now), nil},
		{"call read", "POST", "/call/read", fmt.Sprintf(`{"project_id":"%s/app","id":%q}`, v, victim.callID), nil},
		{"call read by internal id", "POST", "/call/read", fmt.Sprintf(`{"project_id":%q,"id":%q}`, victim.internal, victim.callID), nil},
		{"calls stream_query", "POST", "/calls/stream_query", fmt.Sprintf(`{"project_id":"%s/app"}`, v), nil},
		{"calls stream_query by internal id", "POST", "/calls/stream_query", fmt.Sprintf(`{"project_id":%q,"filter":{"call_ids":[%q]}}`, victim.internal, victim.callID), nil},
		{"trace usage", "POST", "/trace/usage", fmt.Sprintf(`{"project_id":"%s/app","filter":{"trace_ids":[%q]}}`, v, victim.runID), nil},
		{"trace usage by internal id", "POST", "/trace/usage", fmt.Sprintf(`{"project_id":%q}`, victim.internal), nil},
	}
	for _, r := range reqs {
		t.Run(r.name, func(t *testing.T) {
			code, body := g.do(t, r.method, r.path, attacker.key, r.body, r.headers...)
			if code != 403 {
				t.Fatalf("%s %s with %s's key: %d, want 403: %.300s", r.method, r.path, attacker.team, code, body)
			}
			for _, secret := range []string{victim.callID, "private", `"` + v + `/app"`} {
				if strings.Contains(body, secret) && !strings.Contains(r.body+r.path, secret) {
					t.Errorf("the refusal shows the other team's data %q: %s", secret, body)
				}
			}
		})
	}
	// The Basic scheme reaches the same decisions.
	t.Run("Basic credentials", func(t *testing.T) {
		req, _ := http.NewRequest("POST", g.base+"/call/read", strings.NewReader(fmt.Sprintf(`{"project_id":"%s/app","id":%q}`, v, victim.callID)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:"+attacker.key)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 403 {
			t.Fatalf("Basic: %d, want 403", resp.StatusCode)
		}
	})
	// The refused batch wrote nothing, not even its item in the
	// attacker's own project: batches are all or nothing.
	// (An unknown call reads as {"call": null}, as Weave answers.)
	if code, body := g.do(t, "POST", "/call/read", attacker.key, fmt.Sprintf(`{"project_id":"%s/app","id":"mixed-own"}`, attacker.team)); code != 200 || strings.TrimSpace(string(body)) != `{"call":null}` {
		t.Errorf("the refused batch's own item: read %d %s, want {\"call\":null}", code, body)
	}
	// A trace id names a trace within a project: a completion charged to
	// the attacker's own project that claims the victim's trace stays in
	// the attacker's project and adds nothing to the victim's trace.
	code, body := g.do(t, "POST", "/v1/chat/completions", attacker.key, chatBody(3, ""),
		"Compat-Project: "+attacker.team+"/app", "Compat-Trace-Id: "+victim.runID, "Compat-Parent-Id: "+victim.callID)
	if code != 200 {
		t.Fatalf("a completion in its own project naming another team's trace: %d %s", code, body)
	}
	// Its call is written with the usage, asynchronously: wait until it is
	// in the attacker's project, so that the victim's next snapshot would
	// show it had it gone to the victim's.
	query := fmt.Sprintf(`{"project_id":"%s/app","filter":{"parent_ids":[%q]}}`, attacker.team, victim.callID)
	for deadline := time.Now().Add(5 * time.Second); ; {
		code, body := g.do(t, "POST", "/calls/stream_query", attacker.key, query)
		if code == 200 && strings.Contains(body, victim.runID) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the completion's call is not in %s/app after 5s: %d %s", attacker.team, code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
