package admin_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/tollgate-dev/tollgate/admin"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/route"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
	"github.com/tollgate-dev/tollgate/trace"
	"github.com/tollgate-dev/tollgate/weave"
)

// Keys of the test keyring: alice may use team-a, bob team-b, root is an
// admin and star has teams ["*"].
const (
	aliceKey = "sk-alice"
	bobKey   = "sk-bob"
	rootKey  = "sk-root"
	starKey  = "sk-star"
)

// env is a service API served by a real fasthttp server over an in-memory
// listener, backed by a real store (on PostgreSQL when TOLLGATE_TEST_PG_DSN
// is set, else on SQLite).
type env struct {
	t  *testing.T
	ln *fasthttputil.InmemoryListener
	db *store.DB
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOn(t, storetest.OpenOne(t))
}

// forEachEnv runs fn as a subtest per store engine (see storetest.ForEach),
// each with its own service.
func forEachEnv(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	storetest.ForEach(t, func(t *testing.T, db *store.DB) { fn(t, newEnvOn(t, db)) })
}

// newEnvOn serves the test keys' service API backed by db.
func newEnvOn(t *testing.T, db *store.DB) *env {
	t.Helper()
	return newEnvStores(t, db, db, db)
}

// newEnvStores is newEnvOn with ts in front of db for projects and calls
// and ws for the Weave objects, as a test that watches the store's reads
// needs.
func newEnvStores(t *testing.T, db *store.DB, ts trace.Store, ws weave.Store) *env {
	t.Helper()
	kr, err := auth.NewKeyring(config.Auth{Keys: []config.Key{
		{Name: "alice", Key: aliceKey, Teams: []string{"team-a"}},
		{Name: "bob", Key: bobKey, Teams: []string{"team-b"}},
		{Name: "root", Key: rootKey, Admin: true},
		{Name: "star", Key: starKey, Teams: []string{"*"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	svc := admin.New(admin.Options{Keys: kr, Store: ts, Weave: ws, Pricing: map[string]config.Pricing{
		"m": {PromptPerMTok: 1e6, CompletionPerMTok: 2e6},
	}})
	return serveEnv(t, db, svc)
}

// serveEnv serves svc, backed by db, on an in-memory listener until the
// test ends, and then closes db.
func serveEnv(t *testing.T, db *store.DB, svc *admin.Service) *env {
	t.Helper()
	router, err := route.New(svc.Routes(), func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetBodyString(`{"detail":"Not Found","router":"fallback"}`)
	}, admin.MethodNotAllowed)
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{
		Handler:       router.Serve,
		NoDefaultDate: true,
		// The worker pool's cleaner notices Shutdown only after sleeping
		// this long; keep it short so that goleak sees it gone.
		MaxIdleWorkerDuration: 10 * time.Millisecond,
	}
	ln := fasthttputil.NewInmemoryListener()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		if err := srv.Shutdown(); err != nil {
			t.Error(err)
		}
		if err := <-served; err != nil {
			t.Error(err)
		}
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return &env{t: t, ln: ln, db: db}
}

func basic(key string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("anyone:"+key))
}

func bearer(key string) string { return "Bearer " + key }

type response struct {
	status      int
	body        []byte
	contentType string
}

func (r response) json(t *testing.T) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	return v
}

func (r response) object(t *testing.T) map[string]any {
	t.Helper()
	m, ok := r.json(t).(map[string]any)
	if !ok {
		t.Fatalf("not an object: %s", r.body)
	}
	return m
}

// lines decodes a JSON Lines body.
func (r response) lines(t *testing.T) []map[string]any {
	t.Helper()
	out := []map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(string(r.body)), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("decode line %s: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// do sends one request on its own connection; the connection is closed
// after it, so that no client goroutine or pooled connection outlives the
// test.
func (e *env) do(method, path, authz, body string, headers ...string) response {
	e.t.Helper()
	conn, err := e.ln.Dial()
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI("http://tollgate" + path)
	if authz != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, authz)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	if body != "" {
		req.Header.SetContentType("application/json")
		req.SetBodyString(body)
	}
	req.SetConnectionClose()
	bw := bufio.NewWriter(conn)
	if err := req.Write(bw); err != nil {
		e.t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		e.t.Fatal(err)
	}
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(conn)); err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode(), body: append([]byte(nil), resp.Body()...), contentType: string(resp.Header.ContentType())}
}

// ok sends a request that must succeed and returns the response.
func (e *env) ok(method, path, authz, body string, headers ...string) response {
	e.t.Helper()
	r := e.do(method, path, authz, body, headers...)
	if r.status != fasthttp.StatusOK {
		e.t.Fatalf("%s %s: status %d: %s", method, path, r.status, r.body)
	}
	return r
}

func TestUnroutedPathsAreLeftToTheCaller(t *testing.T) {
	e := newEnv(t)
	for _, path := range []string{
		"/v1/organization/usage/completions", "/metrics", "/v2/team-a/p/other", "/v2/team-a", "/v2//p/ops", "/call",
	} {
		t.Run(path, func(t *testing.T) {
			r := e.do("GET", path, bearer(aliceKey), "")
			if r.status != fasthttp.StatusNotFound || !strings.Contains(string(r.body), "fallback") {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
		})
	}
}

func TestWrongMethodIs405(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/trace/usage", bearer(aliceKey), "")
	if r.status != fasthttp.StatusMethodNotAllowed {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	r = e.do("PUT", "/v2/team-a/p/ops", bearer(aliceKey), "")
	if r.status != fasthttp.StatusMethodNotAllowed {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
}

func TestTrailingSlashIsAccepted(t *testing.T) {
	e := newEnv(t)
	e.ok("POST", "/service/projects_info/", bearer(aliceKey), `{"project_ids":[]}`)
}

// seedTeamA creates team-a/p with an op, an evaluation run and a call, as
// alice, and returns the run id.
func seedTeamA(t *testing.T, e *env) string {
	t.Helper()
	e.ok("POST", "/v2/team-a/p/ops", bearer(aliceKey), `{"name":"op1","source_code":"def f(): pass"}`)
	run := e.ok("POST", "/v2/team-a/p/evaluation_runs", bearer(aliceKey), `{"evaluation":"weave:///team-a/p/object/ev:1","model":"weave:///team-a/p/object/m:1"}`)
	e.ok("POST", "/call/start", bearer(aliceKey), `{"start":{"project_id":"team-a/p","id":"call-1","trace_id":"trace-1","op_name":"op","started_at":"2026-11-21T10:00:00Z"}}`)
	return run.object(t)["evaluation_run_id"].(string)
}

func TestAuthAndCrossTeamOnEveryEndpoint(t *testing.T) {
	e := newEnv(t)
	runID := seedTeamA(t, e)
	internal := admin.InternalProjectID(1)
	if r := e.ok("POST", "/service/projects_info", bearer(aliceKey), `{"project_ids":["team-a/p"]}`); !strings.Contains(string(r.body), internal) {
		t.Fatalf("team-a/p is not project 1: %s", r.body)
	}
	endpoints := []struct {
		name, method, path, body string
	}{
		{"projects_info", "POST", "/service/projects_info", `{"project_ids":["team-a/p"]}`},
		{"list ops", "GET", "/v2/team-a/p/ops", ""},
		{"create op", "POST", "/v2/team-a/p/ops", `{"name":"op2","source_code":"x"}`},
		{"delete op", "DELETE", "/v2/team-a/p/ops/never-created", ""},
		{"list runs", "GET", "/v2/team-a/p/evaluation_runs", ""},
		{"create run", "POST", "/v2/team-a/p/evaluation_runs", `{"evaluation":"e","model":"m"}`},
		{"read run", "GET", "/v2/team-a/p/evaluation_runs/" + runID, ""},
		{"finish run", "POST", "/v2/team-a/p/evaluation_runs/" + runID + "/finish", ""},
		{"call start", "POST", "/call/start", `{"start":{"project_id":"team-a/p","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}`},
		{"call start by internal id", "POST", "/call/start", `{"start":{"project_id":"` + internal + `","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}`},
		{"call end", "POST", "/call/end", `{"end":{"project_id":"team-a/p","id":"call-1","ended_at":"2026-11-21T10:00:01Z"}}`},
		{"upsert batch", "POST", "/call/upsert_batch", `{"batch":[{"mode":"start","req":{"start":{"project_id":"team-a/p","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}}]}`},
		{"call read", "POST", "/call/read", `{"project_id":"team-a/p","id":"call-1"}`},
		{"call read by internal id", "POST", "/call/read", `{"project_id":"` + internal + `","id":"call-1"}`},
		{"stream query", "POST", "/calls/stream_query", `{"project_id":"team-a/p"}`},
		{"trace usage", "POST", "/trace/usage", `{"project_id":"team-a/p"}`},
		{"trace usage by internal id", "POST", "/trace/usage", `{"project_id":"` + internal + `"}`},
		{"call update", "POST", "/call/update", `{"project_id":"team-a/p","call_id":"call-1","display_name":"renamed"}`},
		{"calls query stats", "POST", "/calls/query_stats", `{"project_id":"team-a/p"}`},
		{"calls usage", "POST", "/calls/usage", `{"project_id":"team-a/p","call_ids":["call-1"]}`},
		{"calls usage by internal id", "POST", "/calls/usage", `{"project_id":"` + internal + `","call_ids":["call-1"]}`},
		{"calls delete", "POST", "/calls/delete", `{"project_id":"team-a/p","call_ids":["never-created"]}`},
		{"delete runs", "DELETE", "/v2/team-a/p/evaluation_runs?evaluation_run_ids=never-created", ""},
	}
	refused := []struct {
		name   string
		authz  string
		status int
	}{
		{"no credentials", "", fasthttp.StatusUnauthorized},
		{"unknown key", bearer("sk-nobody"), fasthttp.StatusUnauthorized},
		{"unknown key in Basic", basic("sk-nobody"), fasthttp.StatusUnauthorized},
		{"malformed Basic", "Basic !!!", fasthttp.StatusUnauthorized},
		{"unknown scheme", "Token " + aliceKey, fasthttp.StatusUnauthorized},
		{"other team, Bearer", bearer(bobKey), fasthttp.StatusForbidden},
		{"other team, Basic", basic(bobKey), fasthttp.StatusForbidden},
	}
	allowed := []struct{ name, authz string }{
		{"own team, Basic", basic(aliceKey)},
		{"own team, Bearer", bearer(aliceKey)},
		{"admin", bearer(rootKey)},
		{"any team", basic(starKey)},
	}
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			for _, c := range refused {
				r := e.do(ep.method, ep.path, c.authz, ep.body)
				if r.status != c.status {
					t.Errorf("%s: status %d, want %d: %s", c.name, r.status, c.status, r.body)
					continue
				}
				detail, ok := r.object(t)["detail"].(string)
				if !ok || detail == "" {
					t.Errorf("%s: body %s lacks a detail string", c.name, r.body)
				}
			}
			for _, c := range allowed {
				r := e.do(ep.method, ep.path, c.authz, ep.body)
				// Deleting an op that never existed is 404; everything
				// else succeeds.
				if r.status != fasthttp.StatusOK && !(ep.name == "delete op" && r.status == fasthttp.StatusNotFound) {
					t.Errorf("%s: status %d: %s", c.name, r.status, r.body)
				}
			}
		})
	}

	// Nothing bob sent reached team-a's project.
	ops := e.ok("GET", "/v2/team-a/p/ops", bearer(aliceKey), "", "Accept", "application/json").json(t).([]any)
	for _, op := range ops {
		if op.(map[string]any)["object_id"] != "op1" && op.(map[string]any)["object_id"] != "op2" {
			t.Fatalf("unexpected op %v", op)
		}
	}
	// A projects_info request naming any forbidden project is refused whole.
	if r := e.do("POST", "/service/projects_info", bearer(bobKey), `{"project_ids":["team-b/x","team-a/p"]}`); r.status != fasthttp.StatusForbidden {
		t.Fatalf("mixed projects_info: status %d: %s", r.status, r.body)
	}
	// Bob can use his own team.
	e.ok("POST", "/call/start", bearer(bobKey), `{"start":{"project_id":"team-b/q","op_name":"x","started_at":"2026-11-21T10:00:00Z"}}`)
	if r := e.do("GET", "/v2/team-b/q/ops", bearer(aliceKey), ""); r.status != fasthttp.StatusForbidden {
		t.Fatalf("alice reading team-b: status %d", r.status)
	}
}
