package proxy

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-dev/tollgate/accounting"
)

// TestMetricsOverheadResolvesOnce checks that observing the gateway's
// overhead costs no allocation once a model's child is resolved, and that
// each model gets one series.
func TestMetricsOverheadResolvesOnce(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	m.observeOverhead("demo", time.Millisecond)
	if allocs := testing.AllocsPerRun(200, func() {
		m.observeOverhead("demo", 50*time.Microsecond)
	}); allocs != 0 {
		t.Errorf("observeOverhead allocates %v times per call, want 0", allocs)
	}
	m.observeOverhead("other-model", -time.Millisecond) // a negative share counts as 0
	if n := testutil.CollectAndCount(m.overhead); n != 2 {
		t.Errorf("%d overhead series, want 2", n)
	}
}

func TestMetricsCountRefusalByKind(t *testing.T) {
	m := newMetrics(nil)
	for _, err := range []error{
		&accounting.LimitError{Kind: accounting.RefusedRPM},
		fmt.Errorf("wrapped: %w", &accounting.LimitError{Kind: accounting.RefusedBudget}),
		&accounting.LimitError{Kind: accounting.RefusedBudget},
		errors.New("redis down"), // not a refusal: counted nowhere
	} {
		m.countRefusal(err)
	}
	for kind, want := range map[string]float64{accounting.RefusedRPM: 1, accounting.RefusedTPM: 0, accounting.RefusedBudget: 2} {
		if got := testutil.ToFloat64(m.limitRefusals[kind]); got != want {
			t.Errorf("refusals of kind %s = %v, want %v", kind, got, want)
		}
	}
}

// TestMetricsCountRequestResolvesOnce checks that counting a finished
// request costs no allocation once its outcome's series are resolved, and
// that it counts into the series its labels name.
func TestMetricsCountRequestResolvesOnce(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	m.countRequest("demo", "gpu-1", 200, "chat.completions", time.Millisecond)
	if n := testing.AllocsPerRun(100, func() {
		m.countRequest("demo", "gpu-1", 200, "chat.completions", time.Millisecond)
	}); n != 0 {
		t.Errorf("countRequest allocates %.1f times per call, want 0", n)
	}
	m.countRequest("demo", "gpu-1", 418, "chat.completions", time.Millisecond)
	// One call, then AllocsPerRun's warm-up call and its 100 runs.
	if got := testutil.ToFloat64(m.requests.WithLabelValues("demo", "gpu-1", "200", "chat.completions")); got != 102 {
		t.Errorf("requests{status=200} = %v, want 102", got)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("demo", "gpu-1", "418", "chat.completions")); got != 1 {
		t.Errorf("requests{status=418} = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(m.duration); n != 1 {
		t.Errorf("duration series = %d, want 1 (model and endpoint only)", n)
	}
}
