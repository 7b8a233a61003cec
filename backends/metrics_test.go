package backends

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate-dev/tollgate/config"
)

const metricsTestConfig = `auth:
  keys:
    - {name: dev, key: sk-test-0001}
backends:
  - name: a
    simulated: {}
    max_concurrency: 1
    health: {failures_to_eject: 2, interval: 1h}
  - name: b
    simulated: {}
    health: {interval: 1h}
models:
  - name: m
    backends: [a]
    queue: {depth: 4, wait: 10ms}
  - name: n
    backends: [b]
`

// newMeasuredRegistry builds cfg's registry with its metrics registered on
// a Prometheus registry of their own and tracked, as the gateway does; the
// registry closes with the test.
func newMeasuredRegistry(t *testing.T, cfg *config.Config) (*Registry, *prometheus.Registry, *Metrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	r, err := NewRegistryWith(cfg, RegistryOptions{Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	m.Track(r)
	return r, reg, m
}

func TestMetricsCountBackendEvents(t *testing.T) {
	cfg, err := config.Parse([]byte(metricsTestConfig), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, reg, m := newMeasuredRegistry(t, cfg)
	a, b := r.Backends()[0], r.Backends()[1]

	// a's only slot is taken: a request waits the queue's 10ms in vain.
	rt := r.Route([]byte("m"))
	if !a.tryAcquire() {
		t.Fatal("no slot on a")
	}
	if got, err := rt.WaitForSlot(nil, nil, 0, Claim{}, nil, nil, nil); got != nil || err != ErrQueueTimeout {
		t.Errorf("WaitForSlot on a full backend = %v, %v; want nil, ErrQueueTimeout", got, err)
	}
	a.Release()
	// Two failures eject a; a probe of b fails.
	a.ReportFailure()
	a.ReportFailure()
	b.health.probed(false, time.Now())

	want := `
# HELP tollgate_backend_ejections_total Times a backend was taken out of rotation for a cooldown: after consecutive failures, or again when its probe failed on return.
# TYPE tollgate_backend_ejections_total counter
tollgate_backend_ejections_total{backend="a"} 1
tollgate_backend_ejections_total{backend="b"} 0
# HELP tollgate_backend_probe_failures_total Active health probes of a backend that failed (no answer in time, or a non-2xx status).
# TYPE tollgate_backend_probe_failures_total counter
tollgate_backend_probe_failures_total{backend="a"} 0
tollgate_backend_probe_failures_total{backend="b"} 1
# HELP tollgate_backend_state A backend's standing: 1 for its current state (healthy, ejected after failures, or unhealthy: its probe fails), 0 for the others.
# TYPE tollgate_backend_state gauge
tollgate_backend_state{backend="a",state="ejected"} 1
tollgate_backend_state{backend="a",state="healthy"} 0
tollgate_backend_state{backend="a",state="unhealthy"} 0
tollgate_backend_state{backend="b",state="ejected"} 0
tollgate_backend_state{backend="b",state="healthy"} 0
tollgate_backend_state{backend="b",state="unhealthy"} 1
# HELP tollgate_queue_depth Requests waiting in a model's queue for a backend slot.
# TYPE tollgate_queue_depth gauge
tollgate_queue_depth{model="m"} 0
tollgate_queue_depth{model="n"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tollgate_backend_ejections_total", "tollgate_backend_probe_failures_total", "tollgate_backend_state", "tollgate_queue_depth"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.queueWait, "tollgate_queue_wait_seconds"); n != 2 {
		t.Errorf("queue wait series: %d, want 2 (models m and n)", n)
	}
	var pb dto.Metric
	if err := m.queueWait.WithLabelValues("m").(prometheus.Histogram).Write(&pb); err != nil {
		t.Fatal(err)
	}
	if got := pb.GetHistogram().GetSampleCount(); got != 1 {
		t.Errorf("queue waits observed for m: %d, want 1", got)
	}
}

// TestMetricsServerReadings checks the series of what the scheduler reads of its servers: a
// backend whose server answers is fresh, with the sequences it runs and queues and the running
// limit learned from them; one whose server stops answering counts each failed read and, past
// stale_after, shows as falling back to the gateway's own counts. A backend whose metrics are
// off has no such series.
func TestMetricsServerReadings(t *testing.T) {
	answering, failing := newMetricsServer(t, gauges(8, 4)), newMetricsServer(t, gauges(2, 0))
	poll := config.BackendMetrics{Interval: 5 * time.Millisecond, StaleAfter: 20 * time.Millisecond}
	cfg := provisioned(t, []config.Backend{
		{Name: "a", URL: answering.url, Metrics: poll},
		{Name: "b", URL: failing.url, Metrics: poll},
		{Name: "off", URL: failing.url, Metrics: config.BackendMetrics{Path: "off"}},
	}, []config.Model{{Name: "fleet", Backends: []string{"a", "b", "off"}}})
	r, reg, _ := newMeasuredRegistry(t, cfg)
	a, b := r.Backends()[0], r.Backends()[1]
	waitFor := func(what string, done func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !done(); time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 10s", what)
			}
		}
	}
	waitFor("first readings", func() bool { return a.server.Load() != nil && b.server.Load() != nil })
	failing.broken.Store(true)
	waitFor("stale reading of b", func() bool { return b.server.Load() == nil })

	const want = `
# HELP tollgate_backend_server_max_running The most sequences a backend's server runs at once, as the scheduler learned it (the largest running count read while some waited), in the fresh reading; 0 until the server has queued.
# TYPE tollgate_backend_server_max_running gauge
tollgate_backend_server_max_running{backend="a"} 8
# HELP tollgate_backend_server_metrics_fresh For a backend whose own metrics the scheduler reads: 1 while it scores the backend on a fresh reading, 0 while it falls back to the gateway's own in-flight count (no reading yet, or the last one older than metrics.stale_after).
# TYPE tollgate_backend_server_metrics_fresh gauge
tollgate_backend_server_metrics_fresh{backend="a"} 1
tollgate_backend_server_metrics_fresh{backend="b"} 0
# HELP tollgate_backend_server_requests Sequences a backend's server said it runs and queues, in the fresh reading the scheduler scores it on.
# TYPE tollgate_backend_server_requests gauge
tollgate_backend_server_requests{backend="a",state="running"} 8
tollgate_backend_server_requests{backend="a",state="waiting"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tollgate_backend_server_max_running",
		"tollgate_backend_server_metrics_fresh", "tollgate_backend_server_requests"); err != nil {
		t.Error(err)
	}
	// b failed every read since it broke (at least the ones that made it stale); a none.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	failures := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_backend_server_metrics_failures_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			failures[mt.GetLabel()[0].GetValue()] = mt.GetCounter().GetValue()
		}
	}
	if failures["a"] != 0 || failures["b"] < 1 || len(failures) != 2 {
		t.Errorf("failed reads by backend = %v, want none for a, some for b, no series for off", failures)
	}
}
