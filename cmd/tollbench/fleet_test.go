package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
)

var testShape = fleetShape{apps: 8, promptWords: 1500, think: time.Second}

func TestFleetWorkloadIsDeterministicForASeed(t *testing.T) {
	a, b := newFleetWorkload(7, testShape), newFleetWorkload(7, testShape)
	if !reflect.DeepEqual(a.apps, b.apps) {
		t.Fatal("same seed, different system prompts")
	}
	for _, i := range []int{0, 1, 63, 64, 1 << 20} {
		ca, cb := a.conversation(i), b.conversation(i)
		if !reflect.DeepEqual(ca, cb) {
			t.Fatalf("conversation %d differs for the same seed", i)
		}
		for turn := range ca.turns {
			if string(a.body("m", ca, turn, 0)) != string(b.body("m", cb, turn, 0)) {
				t.Fatalf("conversation %d turn %d: bodies differ", i, turn)
			}
		}
	}
	other := newFleetWorkload(8, testShape)
	if reflect.DeepEqual(a.apps, other.apps) || reflect.DeepEqual(a.conversation(3), other.conversation(3)) {
		t.Error("another seed gives the same workload")
	}
	for i, p := range a.apps {
		// The header sentence and 1,500 words.
		if n := len(strings.Fields(p)); n != 7+1500 {
			t.Errorf("app %d: %d words", i, n)
		}
	}
	apps := map[int]bool{}
	for i := range 64 {
		c := a.conversation(i)
		apps[c.app] = true
		if len(c.turns) < a.minTurns || len(c.turns) > a.maxTurns {
			t.Errorf("conversation %d: %d turns", i, len(c.turns))
		}
	}
	if len(apps) != 8 {
		t.Errorf("64 conversations use %d of the 8 apps", len(apps))
	}
}

func TestFleetBodyReplaysTheConversation(t *testing.T) {
	w := newFleetWorkload(1, fleetShape{apps: 2, promptWords: 10, think: time.Second})
	c := w.conversation(5)
	var got struct {
		Model    string        `json:"model"`
		Messages []chatMessage `json:"messages"`
		Max      int           `json:"max_tokens"`
		Stream   bool          `json:"stream"`
		Options  struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Priority *int `json:"priority"`
	}
	if err := json.Unmarshal(w.body("fleet", c, 2, 0), &got); err != nil {
		t.Fatal(err)
	}
	want := []chatMessage{
		{"system", w.apps[c.app]},
		{"user", c.turns[0].user}, {"assistant", simulatedReply(c.turns[0].maxTokens)},
		{"user", c.turns[1].user}, {"assistant", simulatedReply(c.turns[1].maxTokens)},
		{"user", c.turns[2].user},
	}
	if !reflect.DeepEqual(got.Messages, want) {
		t.Errorf("messages %+v\nwant %+v", got.Messages, want)
	}
	if got.Model != "fleet" || got.Max != c.turns[2].maxTokens || !got.Stream || !got.Options.IncludeUsage || got.Priority != nil {
		t.Errorf("body %+v", got)
	}
	if err := json.Unmarshal(w.body("fleet", c, 0, -1), &got); err != nil || got.Priority == nil || *got.Priority != -1 {
		t.Errorf("priority -1 not sent: %v %v", err, got.Priority)
	}
	if simulatedReply(3) != "tok0 tok1 tok2 " {
		t.Errorf("simulatedReply(3) = %q", simulatedReply(3))
	}
	// A phase's number opens the system prompt: two phases' prompts differ from their first
	// block on, and are as long as each other.
	c.session = 2
	if err := json.Unmarshal(w.body("fleet", c, 2, 0), &got); err != nil {
		t.Fatal(err)
	}
	want[0].Content = "Session 0002. " + w.apps[c.app]
	if !reflect.DeepEqual(got.Messages, want) {
		t.Errorf("session 2: messages %+v\nwant %+v", got.Messages, want)
	}
	two := w.body("fleet", c, 2, 0)
	c.session = 13
	thirteen := w.body("fleet", c, 2, 0)
	start := bytes.Index(two, []byte(`"messages":[`))
	if len(two) != len(thirteen) || start < 0 || bytes.Equal(two[start:start+64], thirteen[start:start+64]) {
		t.Errorf("sessions 2 and 13: %d and %d bytes, messages at %d:\n%s\n%s", len(two), len(thirteen), start, two, thirteen)
	}
}

func TestThinkForBusy(t *testing.T) {
	tests := []struct {
		workers, slots int
		busy           float64
		service, want  time.Duration
	}{
		{64, 32, 0.6, 300 * time.Millisecond, 700 * time.Millisecond}, // 64 / 19.2 = 3.33 per slot
		{32, 32, 1, time.Second, 0},                                   // every worker always in service
		{8, 32, 1, time.Second, 0},                                    // too few workers: never busy enough
		{10, 10, 0.5, time.Second, time.Second},
		{10, 10, 0, time.Second, 0},
	}
	for _, tc := range tests {
		got := thinkForBusy(tc.workers, tc.slots, tc.busy, tc.service)
		if d := got - tc.want; d > time.Millisecond || d < -time.Millisecond {
			t.Errorf("thinkForBusy(%d, %d, %v, %s) = %s, want %s", tc.workers, tc.slots, tc.busy, tc.service, got, tc.want)
		}
	}
}

// ms returns n samples spread evenly from lo to hi milliseconds.
func ms(n int, lo, hi float64) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration((lo + (hi-lo)*float64(i)/float64(n-1)) * float64(time.Millisecond))
	}
	return out
}

func rowByMetric(t *testing.T, rows []fleetRow, metric string) fleetRow {
	t.Helper()
	for _, r := range rows {
		if r.Metric == metric {
			return r
		}
	}
	t.Fatalf("no row %q", metric)
	return fleetRow{}
}

func TestConversationRows(t *testing.T) {
	tests := []struct {
		name   string
		res    [numRoutes]*routeResult
		status map[string]string
		value  map[string]float64
	}{
		{
			name: "tollgate beats both",
			res: [numRoutes]*routeResult{
				{TTFT: ms(101, 10, 110), Requests: 101, Queries: 1000, Hits: 900},
				{TTFT: ms(101, 20, 220), Requests: 101, Queries: 1000, Hits: 700},
				{TTFT: ms(101, 10, 300), Requests: 101, Queries: 1000, Hits: 850},
			},
			status: map[string]string{"TTFT p50": "PASS", "TTFT p90": "PASS", "TTFT p99": "PASS", "prefix cache hit rate": "PASS", "errors": "PASS"},
			value:  map[string]float64{"TTFT p50": 60.0 / 155, "errors": 0},
		},
		{
			// The tails are held to the better of round-robin (p90) and the oracle.
			name: "tollgate's median better than the oracle's, tails worse than round-robin's, cache worse than the oracle's, an error",
			res: [numRoutes]*routeResult{
				{TTFT: ms(101, 10, 410), Requests: 102, Errors: 1, FirstError: "status 500", Queries: 1000, Hits: 800},
				{TTFT: ms(101, 100, 200), Requests: 101, Queries: 1000, Hits: 700},
				{TTFT: ms(101, 50, 450), Requests: 101, Queries: 1000, Hits: 900},
			},
			status: map[string]string{"TTFT p50": "PASS", "TTFT p90": "MISS", "TTFT p99": "MISS", "prefix cache hit rate": "MISS", "errors": "MISS"},
			value:  map[string]float64{"TTFT p50": 210.0 / 250, "TTFT p90": 370.0 / 190, "prefix cache hit rate": 0.8 / 0.9, "errors": 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rows := conversationRows(tc.res)
			if len(rows) != 5 {
				t.Fatalf("%d rows", len(rows))
			}
			for metric, want := range tc.status {
				if got := rowByMetric(t, rows, metric).Status; got != want {
					t.Errorf("%s: %s, want %s (%+v)", metric, got, want, rowByMetric(t, rows, metric))
				}
			}
			for metric, want := range tc.value {
				if got := rowByMetric(t, rows, metric).Value; got-want > 1e-9 || want-got > 1e-9 {
					t.Errorf("%s = %v, want %v", metric, got, want)
				}
			}
		})
	}
}

func TestFairnessRows(t *testing.T) {
	tenant := func(name string, ttft []time.Duration, offered, served int) *tenantLoad {
		return &tenantLoad{Name: name, TTFT: ttft, Sent: len(ttft), OfferedTokens: offered, ServedTokens: served}
	}
	alone := []*tenantLoad{tenant("a", ms(100, 10, 20), 1000, 1000), tenant("b", ms(100, 10, 20), 1000, 1000)}
	tests := []struct {
		name          string
		loaded        []*tenantLoad
		others, share string
		shareValue    float64
	}{
		{"fair: the others keep their latency and get what they ask",
			[]*tenantLoad{tenant("a", ms(100, 10, 25), 1000, 1000), tenant("b", ms(100, 10, 29), 1000, 1000), tenant("flood", ms(100, 10, 900), 5000, 3000)},
			"PASS", "PASS", 0.6},
		{"unfair: the flooder crowds the others out",
			[]*tenantLoad{tenant("a", ms(100, 10, 200), 1000, 500), tenant("b", ms(100, 10, 25), 1000, 500), tenant("flood", ms(100, 10, 200), 5000, 4000)},
			"MISS", "MISS", 0.8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rows := fairnessRows(alone, tc.loaded)
			if len(rows) != 2 {
				t.Fatalf("%d rows", len(rows))
			}
			if rows[0].Status != tc.others || rows[1].Status != tc.share {
				t.Errorf("statuses %s %s, want %s %s (%+v)", rows[0].Status, rows[1].Status, tc.others, tc.share, rows)
			}
			if rows[1].Value != tc.shareValue {
				t.Errorf("share %v, want %v", rows[1].Value, tc.shareValue)
			}
		})
	}
	// The worst of the others decides: a at about 200 ms against 20 ms alone is 10×.
	rows := fairnessRows(alone, tests[1].loaded)
	if rows[0].Value < 9.9 || rows[0].Value > 10.1 || !strings.Contains(rows[0].Note, "a:") {
		t.Errorf("others' row %+v", rows[0])
	}
	// With 3 tenants asking 2,000 of 5,000 served tokens, the flooder's fair share is 3/5.
	if rows := fairnessRows(alone, tests[0].loaded); rows[1].Target.Limit != 0.6 {
		t.Errorf("fair share %v, want 0.6", rows[1].Target.Limit)
	}
}

// TestTenantLoadTail checks that a request sent too late to be answered within its phase
// keeps its TTFT but counts its tokens neither as asked for nor as served.
func TestTenantLoadTail(t *testing.T) {
	var l tenantLoad
	l.add(fleetSample{ttft: time.Millisecond, tokens: 10})
	l.add(fleetSample{ttft: 2 * time.Millisecond, tokens: 20, tail: true, late: true})
	l.add(fleetSample{ttft: 3 * time.Millisecond, tokens: 40, late: true})
	if l.Sent != 3 || len(l.TTFT) != 3 || l.OfferedTokens != 50 || l.ServedTokens != 10 {
		t.Errorf("sent %d, %d TTFTs, offered %d, served %d; want 3, 3, 50, 10", l.Sent, len(l.TTFT), l.OfferedTokens, l.ServedTokens)
	}
}

func TestPriorityRows(t *testing.T) {
	alone := &tenantLoad{TTFT: ms(100, 10, 20)}
	for _, tc := range []struct {
		hi     float64
		status string
	}{{23, "PASS"}, {25, "MISS"}} {
		rows := priorityRows(alone, &tenantLoad{TTFT: ms(100, 10, tc.hi)}, &tenantLoad{})
		if len(rows) != 1 || rows[0].Status != tc.status {
			t.Errorf("high p99 %v ms against 20 alone: %+v, want %s", tc.hi, rows, tc.status)
		}
	}
}

func TestFleetConfigLoads(t *testing.T) {
	for _, spread := range []bool{true, false} {
		y := fleetConfig{key: "sk-tollbench-x", logLevel: "info", store: "/tmp/t.db", servers: []string{"127.0.0.1:1", "127.0.0.1:2"}, maxNumSeqs: 8, spread: spread}.yaml()
		cfg, err := config.Parse([]byte(y), "fleet.yaml")
		if err != nil {
			t.Fatalf("%v\n%s", err, y)
		}
		if len(cfg.Models) != 2 || len(cfg.Models[0].Backends) != 2 || !cfg.Models[1].PriorityScheduling {
			t.Errorf("models %+v", cfg.Models)
		}
		if cfg.Server.MetricsAuth != config.MetricsAuthPublic {
			t.Errorf("server.metrics_auth %q: the bench reads the gateway's placements from /metrics without a key", cfg.Server.MetricsAuth)
		}
		for _, m := range cfg.Models {
			if got := m.Routing.Spread == config.SignalOn; got != spread {
				t.Errorf("model %s: spread %q, want on %v", m.Name, m.Routing.Spread, spread)
			}
		}
		for _, b := range cfg.Backends {
			capped := strings.HasPrefix(b.Name, "fair-")
			if (b.MaxConcurrency == 8) != capped {
				t.Errorf("backend %s: max_concurrency %d", b.Name, b.MaxConcurrency)
			}
		}
	}
}

func TestParseOptionsFleetOnly(t *testing.T) {
	for _, part := range []string{"conversations", "fairness", "priority"} {
		o, err := parseOptions([]string{"-fleet", "-only", part, "-fleet-log", "x.jsonl"}, io.Discard)
		if err != nil || o.only != part || o.fleetLog != "x.jsonl" || o.fleetColdGateway {
			t.Errorf("-fleet -only %s: %+v, %v", part, o, err)
		}
	}
	if o, err := parseOptions([]string{"-fleet", "-fleet-cold-gateway"}, io.Discard); err != nil || !o.fleetColdGateway {
		t.Errorf("-fleet -fleet-cold-gateway: %+v, %v", o, err)
	}
	if o, err := parseOptions([]string{"-fleet", "-fleet-apps", "32", "-fleet-no-spread"}, io.Discard); err != nil || o.fleetApps != 32 || !o.fleetNoSpread {
		t.Errorf("-fleet -fleet-apps 32 -fleet-no-spread: %+v, %v", o, err)
	}
	if o, err := parseOptions([]string{"-fleet"}, io.Discard); err != nil || o.fleetApps != fleetApps || o.fleetNoSpread {
		t.Errorf("-fleet: apps %d, no spread %v, %v", o.fleetApps, o.fleetNoSpread, err)
	}
	for _, args := range [][]string{{"-fleet", "-only", "soak"}, {"-only", "fairness"}, {"-fleet", "-fleet-apps", "0"}, {"-fleet", "-fleet-apps", "65"}} {
		if _, err := parseOptions(args, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// TestFleetLogJoinsServerAndClient checks that a line of -fleet-log joins what the client
// measured with what the server reported of the same request, and lists every server's view of
// a cold one.
func TestFleetLogJoinsServerAndClient(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.jsonl")
	l, err := newFleetLog(path)
	if err != nil {
		t.Fatal(err)
	}
	servers := []*simulated.Server{simulated.New(simulated.Options{Engine: simulated.Engine{KVCacheBlocks: 16}})}
	l.start("fairness flood")
	began := time.Unix(1000, 0)
	sent := began.Add(2 * time.Second)
	body := `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hello there"}]}`
	l.observer(0, &servers)(simulated.SequenceStat{Arrived: sent.Add(3 * time.Millisecond), Admitted: sent.Add(5 * time.Millisecond),
		Running: 4, PromptTokens: 11, CachedTokens: 0, Prefill: 7 * time.Millisecond, Body: []byte(body)})
	l.add("bench/tenant-0", "hello there", began, sent, sent.Add(time.Second), 2, fleetSample{ttft: 20 * time.Millisecond})
	l.add("bench/tenant-1", "unreported", began, sent, sent, 1, fleetSample{ttft: time.Millisecond})
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"scenario":"fairness flood","tenant":"bench/tenant-0","sent_ms":2000,"ttft_ms":20,"end_ms":3000,"in_flight":2,"server":0,` +
		`"gateway_ms":3,"wait_ms":2,"running":4,"prompt":11,"cached":0,"prefill_ms":7,"elsewhere":[{"server":0,"cached":0,"running":0,"waiting":0}]}` + "\n" +
		`{"scenario":"fairness flood","tenant":"bench/tenant-1","sent_ms":2000,"ttft_ms":1,"end_ms":2000,"in_flight":1,"server":-1,` +
		`"gateway_ms":0,"wait_ms":0,"running":0,"prompt":0,"cached":0,"prefill_ms":0}` + "\n"
	if string(b) != want {
		t.Errorf("log:\n%s\nwant:\n%s", b, want)
	}
}

// -fleet runs the example config's fleet; a fleet it cannot run is refused with the reason.
func TestExampleFleet(t *testing.T) {
	e, err := exampleFleet()
	if err != nil {
		t.Fatal(err)
	}
	if e.servers < 2 || e.maxNumSeqs < 1 || e.prefillPerToken <= 0 || e.kvBlocks < 1 || e.loadFactor < 1 || !e.priorityPreemption {
		t.Errorf("config.example.yaml's %s: %+v, want a fleet with a running limit, per-token prefill, a prefix cache and priority preemption", exampleFleetModel, e)
	}
	const fleetYAML = `
auth: {keys: [{name: k, key: sk-tollbench-x, teams: [t], default_team: t}]}
backends:
  - {name: a, simulated: {max_num_seqs: 8, block_size: 16, prefill_per_token: 50us}}
  - {name: b, simulated: {max_num_seqs: 8, block_size: 16, prefill_per_token: 50us}}
  - {name: c, simulated: {max_num_seqs: 4, block_size: 16}}
  - {name: d, simulated: {block_size: 16}}
  - {name: e, simulated: {block_size: 16}}
  - {name: u, url: "http://127.0.0.1:1/v1"}
models:
  - {name: two, backends: [a, b]}
  - {name: unlike, backends: [a, c]}
  - {name: one, backends: [a]}
  - {name: unlimited, backends: [d, e]}
  - {name: real, backends: [a, u]}
`
	cfg, err := config.Parse([]byte(fleetYAML), "fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := fleetEngine{servers: 2, maxNumSeqs: 8, blockSize: 16, prefillPerToken: 50 * time.Microsecond, loadFactor: 1}
	if got, err := fleetOf(cfg, "two"); err != nil || got != want {
		t.Errorf("fleetOf(two) = %+v, %v; want %+v", got, err, want)
	}
	for _, tc := range []struct{ model, err string }{
		{"unlike", "backend c is simulated unlike a"},
		{"one", "want two backends or more"},
		{"unlimited", "with max_num_seqs"},
		{"real", "backend u is not simulated"},
		{"missing", "not in the config"},
	} {
		t.Run(tc.model, func(t *testing.T) {
			if _, err := fleetOf(cfg, tc.model); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("err %v, want one saying %q", err, tc.err)
			}
		})
	}
}

// The report's placements are one model's, from the gateway's /metrics, counted between two
// scrapes.
func TestPlacementsIn(t *testing.T) {
	page := func(kept, moved float64) []byte {
		return fmt.Appendf(nil, `# HELP tollgate_placements_total Requests placed.
# TYPE tollgate_placements_total counter
tollgate_placements_total{model="fleet",placement="kept"} %g
tollgate_placements_total{model="fleet",placement="moved"} %g
tollgate_placements_total{model="fleet-fair",placement="kept"} 99
# HELP tollgate_backend_requests_in_flight In flight.
# TYPE tollgate_backend_requests_in_flight gauge
tollgate_backend_requests_in_flight{backend="sim-0"} 3
`, kept, moved)
	}
	before, err := placementsIn(page(10, 1), "fleet")
	if err != nil {
		t.Fatal(err)
	}
	after, err := placementsIn(page(110, 4), "fleet")
	if err != nil {
		t.Fatal(err)
	}
	got := placementsSince(before, after)
	if want := map[string]float64{"kept": 100, "moved": 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("placements = %v, want %v", got, want)
	}
	if note, want := placementsNote(got), "kept 100, moved 3, spread 0, score 0, queued 0, priority 0"; !strings.HasSuffix(note, want) {
		t.Errorf("note %q, want it to end %q", note, want)
	}
	if _, err := placementsIn([]byte("# TYPE go_goroutines gauge\ngo_goroutines 7\n"), "fleet"); err == nil || !strings.Contains(err.Error(), placementsFamily) {
		t.Errorf("a page without placements: err %v, want one naming %s", err, placementsFamily)
	}
}
