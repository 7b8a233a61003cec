package backends

import (
	"testing"
	"time"
)

// TestHealthEjection walks the passive ejection state machine through a fixed clock.
func TestHealthEjection(t *testing.T) {
	var h health
	h.init(testHealth)
	t0 := time.Unix(1_000_000, 0)

	// Failures below the threshold leave the backend in; a success resets the count.
	h.failure(t0)
	h.failure(t0)
	h.success(0)
	h.failure(t0)
	h.failure(t0)
	if h.state() != StateHealthy || !h.usable() {
		t.Fatalf("state %s after a success between failures, want healthy", h.state())
	}
	h.failure(t0)
	if h.state() != StateEjected || h.usable() {
		t.Fatalf("state %s after %d consecutive failures, want ejected", h.state(), testHealth.FailuresToEject)
	}

	// More failures while out (requests that were in flight) do not extend the ejection.
	h.failure(t0.Add(500 * time.Millisecond))

	// The cooldown doubles each time the probe after it fails, up to MaxCooldown.
	at := t0
	for i, cooldown := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		if h.dueForProbe(at.Add(cooldown - time.Millisecond)) {
			t.Fatalf("ejection %d: due for a probe before its cooldown of %v", i, cooldown)
		}
		at = at.Add(cooldown)
		if !h.dueForProbe(at) {
			t.Fatalf("ejection %d: not due for a probe after its cooldown of %v", i, cooldown)
		}
		h.probed(false, at)
		if h.state() != StateEjected {
			t.Fatalf("ejection %d: state %s after a failed probe, want ejected", i, h.state())
		}
	}

	// A successful probe brings it back and resets the cooldown and the failure count.
	at = at.Add(5 * time.Second)
	h.probed(true, at)
	if h.state() != StateHealthy || !h.usable() {
		t.Fatalf("state %s after a successful probe, want healthy", h.state())
	}
	for range testHealth.FailuresToEject - 1 {
		h.failure(at)
	}
	if h.state() != StateHealthy {
		t.Fatal("the failures before the ejection still counted after the return")
	}
	h.failure(at)
	if h.state() != StateEjected {
		t.Fatal("not ejected again")
	}
	if h.dueForProbe(at.Add(time.Second-time.Millisecond)) || !h.dueForProbe(at.Add(time.Second)) {
		t.Error("the cooldown was not reset to its base by the return")
	}
}

// TestHealthProbeVerdict checks the active probe alone: a failing probe makes a backend that
// was not ejected unhealthy, and the next good probe makes it healthy.
func TestHealthProbeVerdict(t *testing.T) {
	var h health
	h.init(testHealth)
	now := time.Unix(1_000_000, 0)
	steps := []struct {
		ok   bool
		want State
	}{
		{false, StateUnhealthy},
		{false, StateUnhealthy},
		{true, StateHealthy},
	}
	for i, s := range steps {
		h.probed(s.ok, now)
		if got := h.state(); got != s.want {
			t.Errorf("step %d: state %s, want %s", i, got, s.want)
		}
		if h.usable() != (s.want == StateHealthy) {
			t.Errorf("step %d: usable = %v in state %s", i, h.usable(), s.want)
		}
	}
	// An ejected backend whose probe also fails reports ejected, the stronger verdict.
	for range testHealth.FailuresToEject {
		h.failure(now)
	}
	h.probed(false, now.Add(time.Second))
	if got := h.state(); got != StateEjected {
		t.Errorf("state %s, want ejected", got)
	}
}

func TestTTFTMovingAverage(t *testing.T) {
	var h health
	h.init(testHealth)
	h.success(0) // no sample
	if got := h.ttft.Load(); got != 0 {
		t.Fatalf("ttft %d after a success without a sample", got)
	}
	h.success(800 * time.Millisecond)
	if got := time.Duration(h.ttft.Load()); got != 800*time.Millisecond {
		t.Fatalf("first sample: %v, want it as is", got)
	}
	h.success(0) // still no sample
	h.success(0 + 1600*time.Millisecond)
	if got := time.Duration(h.ttft.Load()); got != 900*time.Millisecond {
		t.Fatalf("second sample: %v, want 800ms + (1600ms - 800ms)/8", got)
	}
}
