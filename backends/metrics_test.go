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

func TestMetricsCountBackendEvents(t *testing.T) {
	cfg, err := config.Parse([]byte(metricsTestConfig), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	r, err := NewRegistryWith(cfg, RegistryOptions{Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m.Track(r)
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
