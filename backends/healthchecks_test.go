package backends

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

// TestHealthCheckerBringsBack runs the real checker against an in-process simulated backend: an
// ejected backend whose probe succeeds is back once the cooldown has passed.
func TestHealthCheckerBringsBack(t *testing.T) {
	reg, b := simulatedRegistry(t, "interval: 1h, cooldown: 100ms, max_cooldown: 1s, failures_to_eject: 1")
	hc := reg.StartHealthChecks()
	defer hc.Stop()
	b.ReportFailure()
	if b.State() != StateEjected {
		t.Fatalf("state %s, want ejected", b.State())
	}
	waitState(t, b, StateHealthy, 5*time.Second)
}

// TestHealthCheckerKeepsEjectedForCooldown checks that the regular probe, at the backend's
// interval, does not end an ejection before its cooldown has passed: an ejected backend is
// brought back only by a successful probe after the cooldown.
func TestHealthCheckerKeepsEjectedForCooldown(t *testing.T) {
	reg, b := simulatedRegistry(t, "interval: 50ms, cooldown: 1m, max_cooldown: 2m, failures_to_eject: 1")
	hc := reg.StartHealthChecks()
	defer hc.Stop()
	// Let the first probes run, so the next ones are the regular interval's.
	waitFor(t, "a first probe", 5*time.Second, func() bool { return b.sim.ModelListings() > 0 })
	b.ReportFailure()
	// Three health ticks: every one of them has the interval probe due.
	time.Sleep(3*healthTick + 50*time.Millisecond)
	if got := b.State(); got != StateEjected {
		t.Errorf("an ejected backend is back (state %s) after %d probes, 1m before its cooldown ends; "+
			"it must stay out for the whole cooldown",
			got, b.sim.ModelListings())
	}
}

// simulatedRegistry builds a registry of one in-process simulated backend with the given health
// settings, closed when the test ends.
func simulatedRegistry(t *testing.T, health string) (*Registry, *Backend) {
	t.Helper()
	yaml := fmt.Sprintf(`auth:
  keys:
    - {name: dev, key: sk-test-0001}
backends:
  - name: demo
    simulated: {}
    health: {%s}
models:
  - name: demo
    backends: [demo]
`, health)
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reg, err := NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := reg.Close(); err != nil {
			t.Error(err)
		}
	})
	return reg, reg.Backends()[0]
}

func waitState(t *testing.T, b *Backend, want State, within time.Duration) {
	t.Helper()
	waitFor(t, fmt.Sprintf("backend %s to be %s", b.Name, want), within, func() bool { return b.State() == want })
}

func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
