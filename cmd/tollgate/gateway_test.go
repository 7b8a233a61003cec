package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
)

const adminKey = "sk-admin-test-key"

// running is a whole gateway, as main builds it, serving on a real port.
type running struct {
	base   string
	cfg    *config.Config
	cancel context.CancelFunc
	done   chan error
}

// gatewayConfig is a configuration with a simulated backend, an admin key,
// a team key, and the store in dir.
func gatewayConfig(t *testing.T, dir, extra string) *config.Config {
	t.Helper()
	yaml := fmt.Sprintf(`
listen: "127.0.0.1:0"
log: {level: error}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
    - {name: acme-key, key: "sk-acme-test-key", teams: [acme], default_team: acme}
    - {name: globex-key, key: "sk-globex-test-key", teams: [globex], default_team: globex}
backends:
  - name: sim
    simulated: {inter_token: 2ms, tokens: 16}
models:
  - name: demo
    backends: [sim]
store: {path: %q}
usage: {flush_interval: 50ms}
%s
`, adminKey, filepath.Join(dir, "tollgate.db"), extra)
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// start runs the gateway until stop; the caller checks stop's error.
func start(t *testing.T, cfg *config.Config) *running {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{base: "http://" + ln.Addr().String(), cfg: cfg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- serveListener(ctx, cfg, ln, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// stop shuts the gateway down as SIGTERM does and waits for it.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatalf("gateway exited with %v", err)
	}
	r.done <- nil // for the cleanup
}

func (r *running) do(t *testing.T, method, path, key, body string, headers ...string) (int, string) {
	t.Helper()
	status, _, reply := r.doHeader(t, method, path, key, body, headers...)
	return status, reply
}

// doHeader is do that also returns the reply's headers.
func (r *running) doHeader(t *testing.T, method, path, key, body string, headers ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, r.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// usageByProject reads the stored usage totals per team/project.
func usageByProject(t *testing.T, cfg *config.Config) map[string]accounting.UsageRow {
	t.Helper()
	st, err := store.Open(context.Background(), cfg.Store)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.UsageBuckets(context.Background(), accounting.UsageQuery{
		Start: time.Now().Add(-time.Hour), End: time.Now().Add(time.Hour), BucketWidth: 2 * time.Hour, GroupByProject: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]accounting.UsageRow{}
	for _, r := range rows {
		k := r.Team + "/" + r.Project
		sum := out[k]
		sum.InputTokens += r.InputTokens
		sum.OutputTokens += r.OutputTokens
		sum.Requests += r.Requests
		out[k] = sum
	}
	return out
}

// The simulated backend counts the prompt "say hello to me" as 4 words + 4.
const promptTokens = 8

func chatBody(maxTokens int, stream string) string {
	return fmt.Sprintf(`{"model":"demo","messages":[{"role":"user","content":"say hello to me"}],"max_tokens":%d%s}`, maxTokens, stream)
}

// TestUsageExactUnderMixedLoad sends concurrent non-streaming requests,
// streams with and without include_usage, abandoned streams and failing
// requests, and checks that the store holds, per team and project,
// exactly what the backend reported.
func TestUsageExactUnderMixedLoad(t *testing.T) {
	cfg := gatewayConfig(t, t.TempDir(), "")
	g := start(t, cfg)

	type kind struct {
		project        string
		body           string
		headers        []string
		abandonAfter   int   // read this many events, then hang up (streams)
		wantPrompt     int64 // per request
		wantCompletion int64 // per request
	}
	kinds := []kind{
		{project: "acme/plain", body: chatBody(5, ""), wantPrompt: promptTokens, wantCompletion: 5},
		{project: "acme/stream-usage", body: chatBody(7, `,"stream":true,"stream_options":{"include_usage":true}`), wantPrompt: promptTokens, wantCompletion: 7},
		{project: "acme/stream-bare", body: chatBody(9, `,"stream":true`), wantPrompt: promptTokens, wantCompletion: 9},
		{project: "globex/errors", body: chatBody(5, ""), headers: []string{"X-Mock-Status: 500"}},
		// The backend reported usage (continuous, on every chunk) before
		// its in-band error, so that usage is charged.
		{project: "globex/inband", body: chatBody(5, `,"stream":true`), headers: []string{"X-Mock-Fail-After: 2"}, wantPrompt: promptTokens, wantCompletion: 2},
		{project: "globex/abandoned", body: chatBody(2000, `,"stream":true`), abandonAfter: 4, wantPrompt: promptTokens},
	}
	const perKind = 12
	var wg sync.WaitGroup
	for _, k := range kinds {
		for range perKind {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := "sk-acme-test-key"
				if strings.HasPrefix(k.project, "globex") {
					key = "sk-globex-test-key"
				}
				req, _ := http.NewRequest(http.MethodPost, g.base+"/v1/chat/completions", strings.NewReader(k.body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Compat-Project", k.project)
				for _, h := range k.headers {
					name, v, _ := strings.Cut(h, ":")
					req.Header.Set(name, strings.TrimSpace(v))
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				if k.abandonAfter > 0 {
					br := bufio.NewReader(resp.Body)
					for events := 0; events < k.abandonAfter; {
						line, err := br.ReadString('\n')
						if err != nil {
							t.Error(err)
							return
						}
						if strings.HasPrefix(line, "data:") {
							events++
						}
					}
					return // closing the body hangs up mid-stream
				}
				_, _ = io.Copy(io.Discard, resp.Body)
			}()
		}
	}
	wg.Wait()
	g.stop(t)

	got := usageByProject(t, cfg)
	for _, k := range kinds {
		row := got[k.project]
		if row.Requests != perKind {
			t.Errorf("%s: %d requests recorded, want %d", k.project, row.Requests, perKind)
		}
		if k.abandonAfter > 0 {
			// The backend reports cumulative usage on every chunk, so the
			// prompt is exact, and the completion is what was streamed:
			// at least what the client read, far less than asked for.
			if row.InputTokens != perKind*k.wantPrompt {
				t.Errorf("%s: prompt tokens %d, want %d", k.project, row.InputTokens, perKind*k.wantPrompt)
			}
			if row.OutputTokens < perKind*int64(k.abandonAfter-1) || row.OutputTokens >= perKind*2000 {
				t.Errorf("%s: completion tokens %d, want what was streamed before the client left", k.project, row.OutputTokens)
			}
			continue
		}
		if row.InputTokens != perKind*k.wantPrompt || row.OutputTokens != perKind*k.wantCompletion {
			t.Errorf("%s: stored %d prompt / %d completion tokens, want exactly %d / %d",
				k.project, row.InputTokens, row.OutputTokens, perKind*k.wantPrompt, perKind*k.wantCompletion)
		}
	}
}

// TestShutdownUnderLoadLosesNothing stops the gateway (as SIGTERM does)
// while clients keep sending, and checks that every request that got a
// reply has its usage record in the store.
func TestShutdownUnderLoadLosesNothing(t *testing.T) {
	cfg := gatewayConfig(t, t.TempDir(), "")
	g := start(t, cfg)
	var replied atomic.Int64
	var wg sync.WaitGroup
	stopLoad := make(chan struct{})
	client := &http.Client{Timeout: 5 * time.Second}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				select {
				case <-stopLoad:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, g.base+"/v1/chat/completions", strings.NewReader(chatBody(3, "")))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+adminKey)
				resp, err := client.Do(req)
				if err != nil {
					continue // refused once the gateway stopped accepting
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode == 200 {
					replied.Add(1)
				}
			}
		}()
	}
	// Let the load run, then stop the gateway under it.
	deadline := time.Now().Add(5 * time.Second)
	for replied.Load() < 200 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	g.stop(t)
	close(stopLoad)
	wg.Wait()

	rows := usageByProject(t, cfg)
	stored := rows["acme/inference"].Requests
	if replied.Load() == 0 {
		t.Fatal("no request got a reply before shutdown")
	}
	if stored != replied.Load() {
		t.Fatalf("%d requests got a 200, %d usage records stored", replied.Load(), stored)
	}
}

// TestBudgetSurvivesRestart spends part of a budget, restarts the gateway
// on the same store, and checks that the rest of the budget, and no more,
// can be spent.
func TestBudgetSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	// Each request costs exactly 8 prompt + 10 completion tokens, and the
	// gateway's estimate for it is the same 18, so 5 fit in 100.
	limits := "limits:\n  - {team: acme, token_budget: 100, budget_window: day}\n"
	cfg := gatewayConfig(t, dir, limits)
	g := start(t, cfg)
	for i := range 3 {
		if code, body := g.do(t, "POST", "/v1/chat/completions", "sk-acme-test-key", chatBody(10, "")); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	g.stop(t)

	g = start(t, gatewayConfig(t, dir, limits))
	ok, refused := 0, 0
	for range 4 {
		code, body := g.do(t, "POST", "/v1/chat/completions", "sk-acme-test-key", chatBody(10, ""))
		switch {
		case code == 200:
			ok++
		case code == 429 && gjson.Get(body, "error.code").String() == "insufficient_quota":
			refused++
		default:
			t.Fatalf("unexpected %d %s", code, body)
		}
	}
	if ok != 2 || refused != 2 {
		t.Fatalf("after restart: %d served, %d refused; want 2 and 2 (54 of 100 tokens were spent before)", ok, refused)
	}
}

// TestLimitsUnderConcurrency fires 100 requests at once at a budget and at
// a rate limit.
func TestLimitsUnderConcurrency(t *testing.T) {
	limits := "limits:\n  - {team: acme, project: budget, token_budget: 500, budget_window: day}\n  - {team: acme, project: rate, rpm: 10}\n"
	cfg := gatewayConfig(t, t.TempDir(), limits)
	g := start(t, cfg)

	fire := func(project string) (ok int, refused map[string]int) {
		refused = map[string]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, body := g.do(t, "POST", "/v1/chat/completions", "sk-acme-test-key", chatBody(10, ""), "Compat-Project: acme/"+project)
				mu.Lock()
				defer mu.Unlock()
				if code == 200 {
					ok++
				} else {
					refused[fmt.Sprintf("%d %s", code, gjson.Get(body, "error.code").String())]++
				}
			}()
		}
		wg.Wait()
		return ok, refused
	}

	ok, refused := fire("budget")
	// 18 tokens each: 27 fit in 500 (486 tokens).
	if ok != 27 || refused["429 insufficient_quota"] != 73 {
		t.Errorf("budget: %d served, refusals %v; want 27 served and 73 insufficient_quota", ok, refused)
	}
	ok, refused = fire("rate")
	if ok != 10 || refused["429 rate_limit_exceeded"] != 90 {
		t.Errorf("rate: %d served, refusals %v; want 10 served and 90 rate_limit_exceeded", ok, refused)
	}
	g.stop(t)
	if got := usageByProject(t, cfg)["acme/budget"]; got.InputTokens+got.OutputTokens > 500 {
		t.Errorf("budget overrun: %d tokens stored against a budget of 500", got.InputTokens+got.OutputTokens)
	}
}

// TestEvaluationRunTraceUsage creates an evaluation run, sends chat
// completions into its trace through the gateway, logs an application call
// under it, and checks that /trace/usage rolls the exact counts up to the
// run's root call.
func TestEvaluationRunTraceUsage(t *testing.T) {
	cfg := gatewayConfig(t, t.TempDir(), "")
	g := start(t, cfg)

	code, body := g.do(t, "POST", "/v2/acme/evals/evaluation_runs", "sk-acme-test-key", `{"evaluation":"weave:///acme/evals/object/qa:v1","model":"weave:///acme/evals/object/demo:v1"}`)
	if code != 200 {
		t.Fatalf("create run: %d %s", code, body)
	}
	runID := gjson.Get(body, "evaluation_run_id").String()

	// An application step under the run, logged through the Weave wire.
	now := time.Now().UTC().Format(time.RFC3339Nano)
	code, body = g.do(t, "POST", "/call/start", "sk-acme-test-key", fmt.Sprintf(
		`{"start":{"project_id":"acme/evals","op_name":"predict","trace_id":%q,"parent_id":%q,"started_at":%q,"attributes":{},"inputs":{}}}`,
		runID, runID, now))
	if code != 200 {
		t.Fatalf("call start: %d %s", code, body)
	}
	stepID := gjson.Get(body, "id").String()

	// Chat completions: two under the step, one directly under the run.
	var wantPrompt, wantCompletion int64
	for i, parent := range []string{stepID, stepID, runID} {
		code, body := g.do(t, "POST", "/v1/chat/completions", "sk-acme-test-key", chatBody(3+i, ""),
			"Compat-Project: acme/evals", "Compat-Trace-Id: "+runID, "Compat-Parent-Id: "+parent)
		if code != 200 {
			t.Fatalf("completion %d: %d %s", i, code, body)
		}
		wantPrompt += gjson.Get(body, "usage.prompt_tokens").Int()
		wantCompletion += gjson.Get(body, "usage.completion_tokens").Int()
	}
	code, body = g.do(t, "POST", "/call/end", "sk-acme-test-key", fmt.Sprintf(
		`{"end":{"project_id":"acme/evals","id":%q,"ended_at":%q,"summary":{}}}`, stepID, time.Now().UTC().Format(time.RFC3339Nano)))
	if code != 200 {
		t.Fatalf("call end: %d %s", code, body)
	}

	// Usage records reach the store within the flush interval.
	var usage string
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, usage = g.do(t, "POST", "/trace/usage", "sk-acme-test-key", fmt.Sprintf(`{"project_id":"acme/evals","filter":{"trace_ids":[%q]}}`, runID))
		if code != 200 {
			t.Fatalf("trace usage: %d %s", code, usage)
		}
		if gjson.Get(usage, "call_usage.@keys.#").Int() == 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	root := gjson.Get(usage, "call_usage."+gjson.Escape(runID)+".demo")
	if root.Get("prompt_tokens").Int() != wantPrompt || root.Get("completion_tokens").Int() != wantCompletion ||
		root.Get("total_tokens").Int() != wantPrompt+wantCompletion || root.Get("requests").Int() != 3 {
		t.Fatalf("root usage = %s, want %d prompt / %d completion over 3 requests\n%s", root.Raw, wantPrompt, wantCompletion, usage)
	}
	step := gjson.Get(usage, "call_usage."+gjson.Escape(stepID)+".demo")
	if step.Get("requests").Int() != 2 || step.Get("completion_tokens").Int() != 3+4 {
		t.Errorf("step usage = %s, want 2 requests with 7 completion tokens", step.Raw)
	}
	if unfinished := gjson.Get(usage, "unfinished_call_ids").Array(); len(unfinished) != 1 || unfinished[0].String() != runID {
		t.Errorf("unfinished = %v, want only the run (not finished yet)", unfinished)
	}

	// Another team's key reads nothing of it.
	if code, body := g.do(t, "POST", "/trace/usage", "sk-globex-test-key", `{"project_id":"acme/evals"}`); code != 403 {
		t.Errorf("globex key reading acme's trace: %d %s, want 403", code, body)
	}
}

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, good, "auth: {keys: [{name: k, key: sk-12345678}]}\nbackends: [{name: s, simulated: {}}]\nmodels: [{name: m, backends: [s]}]\n")
	writeFile(t, bad, "auth: {keys: [{name: k, key: sk-12345678}]}\nbackends: [{name: s, simulated: {}}]\nmodels: [{name: m, backends: [nope]}]\n")
	var out strings.Builder
	if err := run([]string{"-check-config", good}, &out, io.Discard); err != nil {
		t.Fatalf("good config: %v", err)
	}
	err := run([]string{"-check-config", bad}, &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `models[0].backends[0]: no backend named "nope"`) {
		t.Fatalf("bad config error = %v", err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsAuth checks who may read /metrics, whose series name every
// team's token counts: by default an admin key or server.metrics_token
// (which reads nothing else), never no key or a team's key; metrics_auth:
// public answers anyone, as /metrics did before; metrics_require_admin, the
// old opt-in, still loads and means the default.
func TestMetricsAuth(t *testing.T) {
	const token = "metrics-scrape-token"
	for _, tt := range []struct {
		name, extra string
		want        map[string]int // key sent -> status
	}{
		{"default", "", map[string]int{"": 401, "sk-not-a-key": 401, "sk-acme-test-key": 403, token: 401, adminKey: 200}},
		{"metrics token", "server: {metrics_token: " + token + "}\n",
			map[string]int{"": 401, "sk-not-a-key": 401, "sk-acme-test-key": 403, token: 200, adminKey: 200}},
		{"metrics_require_admin", "server: {metrics_require_admin: true}\n",
			map[string]int{"": 401, "sk-acme-test-key": 403, adminKey: 200}},
		{"public", "server: {metrics_auth: public}\n",
			map[string]int{"": 200, "sk-not-a-key": 200, "sk-acme-test-key": 200, adminKey: 200}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := start(t, gatewayConfig(t, t.TempDir(), tt.extra))
			// A request, so that the metrics name a team.
			if code, body := g.do(t, "POST", "/v1/chat/completions", "sk-acme-test-key", chatBody(3, "")); code != 200 {
				t.Fatalf("chat: %d %.200s", code, body)
			}
			for key, want := range tt.want {
				code, h, body := g.doHeader(t, "GET", "/metrics", key, "")
				if code != want {
					t.Errorf("/metrics with key %q: %d, want %d: %.200s", key, code, want, body)
				}
				shows := strings.Contains(body, "tollgate_requests_total")
				switch {
				case code == 200 && !shows:
					t.Errorf("/metrics with key %q: 200 without the gateway's series: %.200s", key, body)
				case code != 200 && shows:
					t.Errorf("/metrics refused key %q but shows metrics: %.200s", key, body)
				case code == 401 && !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer"):
					t.Errorf("/metrics 401 without a Bearer challenge: %q", h.Get("WWW-Authenticate"))
				}
			}
			if tt.name == "metrics token" {
				// The token reads /metrics and nothing else.
				if code, body := g.do(t, "GET", "/v1/models", token, ""); code != 401 {
					t.Errorf("/v1/models with the metrics token: %d %.200s, want 401", code, body)
				}
				if code, body := g.do(t, "GET", "/v1/organization/usage/completions?start_time=0", token, ""); code != 401 {
					t.Errorf("the usage API with the metrics token: %d %.200s, want 401", code, body)
				}
			}
		})
	}
}

// TestMaxStreams holds one stream open at a limit of one: a second stream
// gets a 503 with Retry-After while non-streaming requests still pass, and
// the slot is free again once the first stream ends.
func TestMaxStreams(t *testing.T) {
	cfg := gatewayConfig(t, t.TempDir(), "server: {max_streams: 1}\n")
	cfg.Backends[0].Simulated.InterTokenDelay = 20 * time.Millisecond
	g := start(t, cfg)
	req, _ := http.NewRequest(http.MethodPost, g.base+"/v1/chat/completions", strings.NewReader(chatBody(50, `,"stream":true`)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	code, body := g.do(t, "POST", "/v1/chat/completions", adminKey, chatBody(5, `,"stream":true`))
	if code != 503 || gjson.Get(body, "error.code").String() != "too_many_streams" {
		t.Errorf("second stream: %d %s, want 503 too_many_streams", code, body)
	}
	if code, body := g.do(t, "POST", "/v1/chat/completions", adminKey, chatBody(5, "")); code != 200 {
		t.Errorf("non-streaming request at the stream limit: %d %s", code, body)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if code, body := g.do(t, "POST", "/v1/chat/completions", adminKey, chatBody(5, `,"stream":true`)); code != 200 {
		t.Errorf("stream after the first ended: %d %s", code, body)
	}
}

// TestMaxConnections holds the gateway at its connection limit: the next
// connection gets a 503 in the OpenAI shape with Retry-After, and once a
// held connection closes a new one is served.
func TestMaxConnections(t *testing.T) {
	g := start(t, gatewayConfig(t, t.TempDir(), "server: {max_connections: 2}\n"))
	addr := strings.TrimPrefix(g.base, "http://")
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The gateway accepts in the background: until it has counted the two
	// held connections, a third may still be served, so ask until refused.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	req, _ := http.NewRequest(http.MethodGet, g.base+"/healthz", nil)
	var (
		resp *http.Response
		body []byte
		err  error
	)
	for deadline := time.Now().Add(5 * time.Second); ; {
		resp, err = client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || gjson.GetBytes(body, "error.code").String() != "overloaded" {
		t.Fatalf("connection over the limit: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection served after one was freed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	held[1].Close()
}

// TestBudgetsAPI checks that the budgets endpoint reports each budget's
// exact spend, and that a team key sees only its own team's budgets.
func TestBudgetsAPI(t *testing.T) {
	limits := "limits:\n  - {team: acme, project: \"*\", token_budget: 1000, budget_window: day}\n" +
		"  - {team: \"*\", token_budget: 5000, budget_window: month}\n  - {token_budget: 100000}\n"
	g := start(t, gatewayConfig(t, t.TempDir(), limits))
	for _, p := range []string{"acme/chat", "acme/chat", "acme/eval"} {
		if code, body := g.do(t, "POST", "/v1/chat/completions", "sk-acme-test-key", chatBody(10, ""), "Compat-Project: "+p); code != 200 {
			t.Fatalf("%d %s", code, body)
		}
	}
	if code, body := g.do(t, "POST", "/v1/chat/completions", "sk-globex-test-key", chatBody(10, "")); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	find := func(body, team, project string) gjson.Result {
		return gjson.Get(body, fmt.Sprintf(`data.#(team==%q)#|#(project==%q)`, team, project))
	}
	var body string
	deadline := time.Now().Add(5 * time.Second)
	for {
		var code int
		code, body = g.do(t, "GET", "/v1/tollgate/budgets", adminKey, "")
		if code != 200 {
			t.Fatalf("budgets: %d %s", code, body)
		}
		// Every request's record is in once the budget counting them all is.
		if find(body, "", "").Get("used").Int() == 72 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// 18 tokens per request (8 prompt + 10 completion).
	for _, tt := range []struct {
		team, project, window string
		budget, used          int64
	}{
		{"acme", "chat", "day", 1000, 36},
		{"acme", "eval", "day", 1000, 18},
		{"acme", "", "month", 5000, 54},
		{"globex", "", "month", 5000, 18},
		{"", "", "month", 100000, 72},
	} {
		b := find(body, tt.team, tt.project)
		if b.Get("window").String() != tt.window || b.Get("budget").Int() != tt.budget || b.Get("used").Int() != tt.used {
			t.Errorf("budget %s/%s = %s, want %s window, %d of %d", tt.team, tt.project, b.Raw, tt.window, tt.used, tt.budget)
		}
	}
	_, body = g.do(t, "GET", "/v1/tollgate/budgets", "sk-acme-test-key", "")
	for _, b := range gjson.Get(body, "data").Array() {
		if b.Get("team").String() != "acme" {
			t.Errorf("the acme key sees a budget of team %q: %s", b.Get("team").String(), b.Raw)
		}
	}
	if n := len(gjson.Get(body, "data").Array()); n != 3 {
		t.Errorf("the acme key sees %d budgets, want its 3: %s", n, body)
	}
}
