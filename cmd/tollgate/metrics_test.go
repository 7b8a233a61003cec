package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/tollgate-dev/tollgate/config"
)

// metricsConfig serves model primary from a backend whose probe passes but
// whose every completion fails with 503 (sick), and one nobody listens on
// (dead); primary falls back to backup, served by the simulator. Two teams
// are limited: one to a request a minute, one to a budget of 10 tokens.
func metricsConfig(t *testing.T, sickURL, deadURL string) *config.Config {
	t.Helper()
	yaml := fmt.Sprintf(`
listen: "127.0.0.1:0"
log: {level: error}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: sick
    url: %q
    health: {failures_to_eject: 1, interval: 1h, cooldown: 1h, max_cooldown: 1h}
  - name: dead
    url: %q
    timeouts: {connect: 500ms}
    health: {interval: 1h, timeout: 1s}
  - name: sim
    simulated: {inter_token: 5ms, tokens: 16}
models:
  - name: primary
    backends: [sick, dead]
    fallbacks: [backup]
  - name: backup
    backends: [sim]
store: {path: %q}
usage: {flush_interval: 20ms}
limits:
  - {team: rpm-team, rpm: 1}
  - {team: budget-team, token_budget: 10, budget_window: day}
metrics: {projects: [named]}
`, adminKey, sickURL, deadURL, filepath.Join(t.TempDir(), "tollgate.db"))
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// scrape returns /metrics as text and as series ("name{labels}") to values.
func scrape(t *testing.T, g *running) (string, map[string]float64) {
	t.Helper()
	code, body := g.do(t, "GET", "/metrics", adminKey, "")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %.300s", code, body)
	}
	series := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		series[line[:i]] = v
	}
	return body, series
}

// waitSeries scrapes until series has the value want. It bounds nothing
// about time: a value that never comes is reported by the test timeout,
// with the last scrape logged.
func waitSeries(t *testing.T, g *running, series string, want float64) {
	t.Helper()
	for {
		_, got := scrape(t, g)
		if got[series] == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetricsAfterFaults runs the gateway into each fault the metrics are
// for: a backend that fails requests is ejected and the request falls
// back, one whose probe fails is marked unhealthy, a budget and a rate
// limit refuse, a client hangs up on a stream. Each new series must say
// so, a thousand distinct Compat-Project values must add no series, and
// the whole exposition must pass promlint, as promtool check metrics does.
func TestMetricsAfterFaults(t *testing.T) {
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"list","data":[]}`)
			return
		}
		http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
	}))
	defer sick.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + ln.Addr().String() + "/v1"
	ln.Close() // nobody listens there any more

	g := start(t, metricsConfig(t, sick.URL+"/v1", deadURL))
	// The start-up probe finds dead unreachable.
	waitSeries(t, g, `tollgate_backend_state{backend="dead",state="unhealthy"}`, 1)

	body := func(model string, maxTokens int, extra string) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"say hello to me"}],"max_tokens":%d%s}`, model, maxTokens, extra)
	}
	// sick answers 503 and is ejected; the retry finds no backend of
	// primary left and falls back to backup.
	if code, out := g.do(t, "POST", "/v1/chat/completions", adminKey, body("primary", 4, ""), "Compat-Project: acme/named"); code != http.StatusOK {
		t.Fatalf("primary with fallback: %d %s", code, out)
	}
	if code, out := g.do(t, "POST", "/v1/chat/completions", adminKey, body("backup", 20, ""), "Compat-Project: budget-team/x"); code != http.StatusTooManyRequests {
		t.Fatalf("over budget: %d %s", code, out)
	}
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if code, out := g.do(t, "POST", "/v1/chat/completions", adminKey, body("backup", 2, ""), "Compat-Project: rpm-team/x"); code != want {
			t.Fatalf("rpm request %d: %d %s, want %d", i, code, out, want)
		}
	}
	// A model nobody configured is refused and makes no series either.
	if code, _ := g.do(t, "POST", "/v1/chat/completions", adminKey, body("no-such-model", 2, "")); code != http.StatusNotFound {
		t.Fatalf("unknown model: %d", code)
	}

	// A client reads the first events of a long stream and hangs up.
	req, _ := http.NewRequest(http.MethodPost, g.base+"/v1/chat/completions", strings.NewReader(body("backup", 2000, `,"stream":true`)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminKey)
	req.Header.Set("Compat-Project", "acme/named")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for events := 0; events < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data:") {
			events++
		}
	}
	resp.Body.Close()
	waitSeries(t, g, `tollgate_stream_aborts_total{model="backup",side="client"}`, 1)

	// A thousand projects no configuration names, under two teams.
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if code, out := g.do(t, "POST", "/v1/chat/completions", adminKey, body("backup", 1, ""),
					fmt.Sprintf("Compat-Project: %s/p%d", []string{"acme", "stranger"}[i%2], i)); code != http.StatusOK {
					t.Errorf("project p%d: %d %s", i, code, out)
				}
			}
		}()
	}
	for i := range 1000 {
		next <- i
	}
	close(next)
	wg.Wait()
	// The last of them is written, and so counted, within the flush interval.
	waitSeries(t, g, `tollgate_usage_records_written_total`, 1005)

	text, got := scrape(t, g)
	for _, tt := range []struct {
		series string
		want   float64
	}{
		{`tollgate_backend_ejections_total{backend="sick"}`, 1},
		{`tollgate_backend_ejections_total{backend="dead"}`, 0},
		{`tollgate_backend_state{backend="sick",state="ejected"}`, 1},
		{`tollgate_backend_state{backend="sick",state="healthy"}`, 0},
		{`tollgate_backend_state{backend="sim",state="healthy"}`, 1},
		{`tollgate_backend_probe_failures_total{backend="dead"}`, 1},
		{`tollgate_backend_probe_failures_total{backend="sick"}`, 0},
		{`tollgate_retries_total{model="primary"}`, 1},
		{`tollgate_fallbacks_total{from="primary",to="backup"}`, 1},
		{`tollgate_limit_refusals_total{kind="budget"}`, 1},
		{`tollgate_limit_refusals_total{kind="rpm"}`, 1},
		{`tollgate_limit_refusals_total{kind="tpm"}`, 0},
		{`tollgate_stream_aborts_total{model="backup",side="client"}`, 1},
		{`tollgate_queue_depth{model="primary"}`, 0},
		{`tollgate_backend_requests_in_flight{backend="sim"}`, 0},
		{`tollgate_requests_total{backend="sim",endpoint="chat.completions",model="primary",status="200"}`, 1},
		// One non-streamed reply each: the fallback, the rpm team's
		// first, and the thousand; the stream adds its first event.
		{`tollgate_gateway_overhead_seconds_count{model="primary"}`, 1},
		{`tollgate_gateway_overhead_seconds_count{model="backup"}`, 1002},
		{`tollgate_queue_wait_seconds_count{model="backup"}`, 0},
	} {
		if v, ok := got[tt.series]; !ok || v != tt.want {
			t.Errorf("%s = %v (present %v), want %v", tt.series, v, ok, tt.want)
		}
	}
	// primary's backends are not vLLM servers: the scheduler reads no
	// metrics of theirs (sick answers a page without vLLM's gauges, dead
	// nothing), counts each failed read, and scores them on its own counts.
	for _, b := range []string{"sick", "dead"} {
		if v, ok := got[`tollgate_backend_server_metrics_fresh{backend="`+b+`"}`]; !ok || v != 0 {
			t.Errorf("%s: metrics fresh = %v (present %v), want 0", b, v, ok)
		}
		if v := got[`tollgate_backend_server_metrics_failures_total{backend="`+b+`"}`]; v < 1 {
			t.Errorf("%s: failed metrics reads = %v, want some", b, v)
		}
	}
	// Every tollgate series is in the operator's table of docs/operations.md.
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE tollgate_"); ok {
			name = "tollgate_" + strings.Fields(name)[0]
			if !strings.Contains(string(ops), name) {
				t.Errorf("%s is not in docs/operations.md's metrics table", name)
			}
		}
	}
	// The retry budget (full at start) refused nothing: no series yet.
	if v, ok := got[`tollgate_retry_budget_exhausted_total{model="primary"}`]; ok {
		t.Errorf("retry budget refusals: %v, want none", v)
	}
	// The gateway's share of a reply is less than the whole of it.
	if o, d := got[`tollgate_gateway_overhead_seconds_sum{model="backup"}`], got[`tollgate_request_duration_seconds_sum{endpoint="chat.completions",model="backup"}`]; !(o < d) {
		t.Errorf("overhead of backup %vs, not below its requests' total %vs", o, d)
	}

	// Token series: only the projects and teams the configuration names
	// (acme by the key, the limits' teams; named by metrics.projects,
	// inference by default), the rest as "other"; only configured models.
	var tokenSeries []string
	for s := range got {
		if strings.HasPrefix(s, "tollgate_prompt_tokens_total{") {
			tokenSeries = append(tokenSeries, s)
		}
	}
	sort.Strings(tokenSeries)
	want := []string{
		`tollgate_prompt_tokens_total{model="backup",project="named",team="acme"}`,
		`tollgate_prompt_tokens_total{model="backup",project="other",team="acme"}`,
		`tollgate_prompt_tokens_total{model="backup",project="other",team="other"}`,
		`tollgate_prompt_tokens_total{model="backup",project="other",team="rpm-team"}`,
		`tollgate_prompt_tokens_total{model="primary",project="named",team="acme"}`,
	}
	if strings.Join(tokenSeries, "\n") != strings.Join(want, "\n") {
		t.Errorf("prompt token series:\n%s\nwant\n%s", strings.Join(tokenSeries, "\n"), strings.Join(want, "\n"))
	}
	// 500 requests of 8 prompt tokens each under stranger, a team no
	// configuration names.
	if v := got[`tollgate_prompt_tokens_total{model="backup",project="other",team="other"}`]; v != 500*promptTokens {
		t.Errorf("prompt tokens of other/other = %v, want %d", v, 500*promptTokens)
	}
	if strings.Contains(text, "no-such-model") || strings.Contains(text, `"p1"`) || strings.Contains(text, "stranger") {
		t.Error("a client-supplied name became a label value")
	}

	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	g.stop(t)
}

// TestMetricsLabelsFollowReload names a project in metrics.projects by a
// reload: its tokens get a series of their own from then on, what was
// counted under "other" stays, and the gauges drop the backend and model
// the new file removed.
func TestMetricsLabelsFollowReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tollgate.yaml")
	render := func(tail string) string {
		return fmt.Sprintf(`listen: "127.0.0.1:0"
log: {level: error}
reload: {watch: true, interval: 20ms}
store: {path: %q}
usage: {flush_interval: 20ms}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: sim
    simulated: {tokens: 4}
%s`, filepath.Join(dir, "tollgate.db"), adminKey, tail)
	}
	write := func(content string) {
		t.Helper()
		// Beside and renamed, so the watcher never reads half a file.
		if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write(render(`  - name: sim2
    simulated: {tokens: 4}
models:
  - name: demo
    backends: [sim]
  - name: demo2
    backends: [sim2]
`))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	g := start(t, cfg)
	chat := func() {
		t.Helper()
		if code, out := g.do(t, "POST", "/v1/chat/completions", adminKey,
			`{"model":"demo","messages":[{"role":"user","content":"say hello to me"}]}`, "Compat-Project: acme/launch"); code != http.StatusOK {
			t.Fatalf("chat: %d %s", code, out)
		}
	}
	chat()
	waitSeries(t, g, `tollgate_prompt_tokens_total{model="demo",project="other",team="acme"}`, promptTokens)

	write(render(`models:
  - name: demo
    backends: [sim]
metrics: {projects: [launch]}
`))
	// The gauges follow the new configuration once it is in place.
	for {
		_, got := scrape(t, g)
		if _, ok := got[`tollgate_backend_state{backend="sim2",state="healthy"}`]; !ok {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	chat()
	waitSeries(t, g, `tollgate_prompt_tokens_total{model="demo",project="launch",team="acme"}`, promptTokens)
	text, got := scrape(t, g)
	if v := got[`tollgate_prompt_tokens_total{model="demo",project="other",team="acme"}`]; v != promptTokens {
		t.Errorf("tokens counted under other before the reload: %v, want %d", v, promptTokens)
	}
	if strings.Contains(text, `tollgate_queue_depth{model="demo2"}`) {
		t.Error("the queue gauge still reports demo2, which the reload removed")
	}
	if got[`tollgate_backend_state{backend="sim",state="healthy"}`] != 1 {
		t.Error("sim is not reported healthy after the reload")
	}
	g.stop(t)
}
