package backends

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/config"
)

func TestParseVLLMMetrics(t *testing.T) {
	hashes := func(names ...string) []uint64 {
		var hs []uint64
		for _, n := range names {
			hs = append(hs, fnv1a([]byte(n)))
		}
		return hs
	}
	tests := []struct {
		name    string
		file    string
		text    string
		want    vllmReading
		wantErr error
	}{
		{
			name: "vLLM v1, recorded: _total counters, LoRA info with stale series, cache config",
			file: "testdata/vllm_metrics.txt",
			want: vllmReading{
				running: 8, waiting: 3, kvUsage: 0.4213,
				prefixQueries: 184320, prefixHits: 132096,
				kvTokens: 27000 * 16,
				// The series with the latest timestamp, not the last written.
				lora: loraInfo{running: hashes("sql-lora", "chat-lora"), waiting: hashes("summary-lora"), maxLoRA: 4},
			},
		},
		{
			name: "older vLLM: gpu_cache_usage_perc, no prefix counters",
			file: "testdata/vllm_metrics_old.txt",
			want: vllmReading{running: 2, waiting: 0, kvUsage: 0.125, prefixQueries: -1, prefixHits: -1},
		},
		{
			name: "two engines are summed, their KV use averaged",
			text: "# TYPE vllm:num_requests_running gauge\n" +
				"vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n" +
				"vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 5\n" +
				"# TYPE vllm:num_requests_waiting gauge\n" +
				"vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n" +
				"vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0\n" +
				"# TYPE vllm:kv_cache_usage_perc gauge\n" +
				"vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.2\n" +
				"vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.6",
			want: vllmReading{running: 8, waiting: 1, kvUsage: 0.4, prefixQueries: -1, prefixHits: -1},
		},
		{
			name:    "a page without vLLM's gauges",
			text:    "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n",
			wantErr: errNoVLLMMetrics,
		},
		{
			name:    "a wanted family that does not parse",
			text:    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\" 3\n",
			wantErr: errParse,
		},
	}
	// One parser reads every page in turn, as a poller does: nothing of a
	// page may carry over to the next.
	var parser metricsParser
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text := []byte(tt.text)
			if tt.file != "" {
				var err error
				if text, err = os.ReadFile(tt.file); err != nil {
					t.Fatal(err)
				}
			}
			got, err := parser.parse(text)
			switch {
			case tt.wantErr == errParse:
				if err == nil || errors.Is(err, errNoVLLMMetrics) {
					t.Fatalf("err = %v, want a parse error", err)
				}
				return
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			case err != nil:
				t.Fatalf("parse: %v", err)
			}
			if got.running != tt.want.running || got.waiting != tt.want.waiting ||
				fmt.Sprintf("%.4f", got.kvUsage) != fmt.Sprintf("%.4f", tt.want.kvUsage) ||
				got.prefixQueries != tt.want.prefixQueries || got.prefixHits != tt.want.prefixHits ||
				got.kvTokens != tt.want.kvTokens || got.lora.maxLoRA != tt.want.lora.maxLoRA ||
				!slices.Equal(got.lora.running, tt.want.lora.running) || !slices.Equal(got.lora.waiting, tt.want.lora.waiting) {
				t.Errorf("reading = %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// errParse marks a test case that wants some parse error.
var errParse = errors.New("any parse error")

// metricsServer serves a /metrics page a test can change or break.
type metricsServer struct {
	page   atomic.Pointer[string]
	broken atomic.Bool
	hits   atomic.Int64
	url    string
	srv    *fasthttp.Server
	done   chan error
}

func newMetricsServer(t *testing.T, page string) *metricsServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &metricsServer{url: "http://" + ln.Addr().String() + "/v1", done: make(chan error, 1)}
	m.page.Store(&page)
	m.srv = &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		m.hits.Add(1)
		if m.broken.Load() || string(ctx.Path()) != "/metrics" {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			return
		}
		ctx.SetBodyString(*m.page.Load())
	}}
	go func() { m.done <- m.srv.Serve(ln) }()
	t.Cleanup(func() {
		if err := m.srv.Shutdown(); err != nil {
			t.Error(err)
		}
		<-m.done
	})
	return m
}

// gauges is a metrics page with the two queue gauges.
func gauges(running, waiting int) string {
	return fmt.Sprintf("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} %d\n"+
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %d\n", running, waiting)
}

// provisioned is a backend configuration with every default filled in.
func provisioned(t *testing.T, bs []config.Backend, models []config.Model) *config.Config {
	t.Helper()
	cfg := &config.Config{Auth: config.Auth{Keys: []config.Key{{Name: "k", Key: "sk-test-0001"}}}, Backends: bs, Models: models}
	cfg.Provision()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestMetricsStaleness drives one backend's poller by hand: a reading is used, and kept through
// a failed read while it is younger than stale_after; past it the backend is scored on the
// gateway's own in-flight count until a read succeeds again.
func TestMetricsStaleness(t *testing.T) {
	srv := newMetricsServer(t, gauges(8, 4))
	cfg := provisioned(t, []config.Backend{{Name: "a", URL: srv.url}}, []config.Model{{Name: "m", Backends: []string{"a"}}})
	b, err := newBackend(cfg.Backends[0])
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	p, err := newMetricsPoller(b, cfg.Backends[0].Metrics)
	if err != nil {
		t.Fatal(err)
	}
	r := newTestRoute(config.Queue{}, b)
	b.inflight.Add(2)
	interval, stale := cfg.Backends[0].Metrics.Interval, cfg.Backends[0].Metrics.StaleAfter
	t0 := time.Unix(1000, 0)

	steps := []struct {
		name      string
		at        time.Duration
		broken    bool
		page      string
		wantFresh bool
		wantAhead int64
	}{
		{name: "a reading: queueing, 4 waiting, 8 running, learned as its limit", at: 0, wantFresh: true, wantAhead: 5},
		{name: "a failed read keeps the reading in force", at: interval, broken: true, wantFresh: true, wantAhead: 5},
		{name: "past stale_after, the gateway's own counts", at: stale, broken: true, wantAhead: 0},
		{name: "a read succeeds again", at: stale + interval, page: gauges(1, 0), wantFresh: true, wantAhead: 0},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			srv.broken.Store(st.broken)
			if st.page != "" {
				srv.page.Store(&st.page)
			}
			p.poll(t0.Add(st.at))
			s := b.server.Load()
			if (s != nil) != st.wantFresh {
				t.Fatalf("fresh reading = %v, want %v", s != nil, st.wantFresh)
			}
			a := r.assess(b, nil)
			if a.ahead != st.wantAhead {
				t.Errorf("ahead = %d, want %d", a.ahead, st.wantAhead)
			}
			if !st.wantFresh {
				// In flight 2 of the assumed 16 sequences per unit of weight.
				if want := 2.0 / assumedRunning; a.runShare != want {
					t.Errorf("run share = %v, want the in-flight count's %v", a.runShare, want)
				}
			}
		})
	}
}

// TestMetricsPollerLifecycle checks that NewRegistry starts a poller for each backend of a
// model with several backends, that its readings reach the backend, and that Close stops them
// (TestMain's goleak check fails otherwise). A backend of a single-backend model, or with its
// metrics off, is not polled.
func TestMetricsPollerLifecycle(t *testing.T) {
	a, b, solo, off := newMetricsServer(t, gauges(3, 0)), newMetricsServer(t, gauges(5, 1)), newMetricsServer(t, gauges(1, 0)), newMetricsServer(t, gauges(1, 0))
	cfg := provisioned(t, []config.Backend{
		{Name: "a", URL: a.url, Metrics: config.BackendMetrics{Interval: 10 * time.Millisecond}},
		{Name: "b", URL: b.url, Metrics: config.BackendMetrics{Interval: 10 * time.Millisecond}},
		{Name: "solo", URL: solo.url, Metrics: config.BackendMetrics{Interval: 10 * time.Millisecond}},
		{Name: "off", URL: off.url, Metrics: config.BackendMetrics{Path: "off"}},
	}, []config.Model{
		{Name: "pair", Backends: []string{"a", "b", "off"}},
		{Name: "single", Backends: []string{"solo"}},
	})
	reg, err := NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ba, bb := reg.backends[0], reg.backends[1]
	deadline := time.Now().Add(10 * time.Second)
	for (ba.server.Load() == nil || bb.server.Load() == nil) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if s := ba.server.Load(); s == nil || s.running != 3 || s.waiting != 0 {
		t.Errorf("backend a's reading = %+v, want 3 running", s)
	}
	if s := bb.server.Load(); s == nil || s.running != 5 || s.waiting != 1 || s.maxRunning != 5 {
		t.Errorf("backend b's reading = %+v, want 5 running, 1 waiting, limit 5", s)
	}
	if solo.hits.Load() != 0 || off.hits.Load() != 0 {
		t.Errorf("a single-backend model's backend was read %d times, one with metrics off %d times; want none",
			solo.hits.Load(), off.hits.Load())
	}
	if reg.backends[3].index == nil || reg.backends[2].index != nil {
		t.Error("want a prefix index on each backend of the model with several backends, and only there")
	}
}

// BenchmarkMetricsParse is one poll's parse of a recorded vLLM page, with
// the parser a poller keeps from one read to the next.
func BenchmarkMetricsParse(b *testing.B) {
	text, err := os.ReadFile("testdata/vllm_metrics.txt")
	if err != nil {
		b.Fatal(err)
	}
	var parser metricsParser
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := parser.parse(text); err != nil {
			b.Fatal(err)
		}
	}
}
