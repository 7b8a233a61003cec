package backends

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/config"
)

// TestMain checks that no test leaves a goroutine behind: health checkers must be stopped and
// in-process simulated backends shut down. fasthttp's client connection cleaner and its global
// date ticker are not ours and are ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.init.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
}

// testHealth is the health configuration of the backends built by newTestBackend.
var testHealth = config.Health{FailuresToEject: 3, Cooldown: time.Second, MaxCooldown: 5 * time.Second, Interval: time.Hour}

// newTestBackend returns a backend with no connection to anything, enough for the selection,
// health and queue logic, which never send a request.
func newTestBackend(name string, weight, maxConcurrency int) *Backend {
	b := &Backend{Name: name, weight: int64(max(weight, 1)), maxConcurrency: int64(maxConcurrency), seed: nameSeed(name)}
	b.health.init(testHealth)
	return b
}

// newTestRoute puts backends in a route that shares one slot signal with them, as NewRegistry
// wires them.
func newTestRoute(q config.Queue, bs ...*Backend) *Route {
	r := &Route{Name: "m", Upstream: "m", backends: bs, queue: q, slots: newSlotSignal()}
	for _, b := range bs {
		r.totalWeight += b.weight
		b.slots = r.slots
	}
	return r
}

// eject takes b out as passive ejection does, with enough failures.
func eject(b *Backend) {
	for range b.health.cfg.FailuresToEject {
		b.ReportFailure()
	}
}

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

func TestRetryBudget(t *testing.T) {
	t.Run("starts full, then only the ratio refills it", func(t *testing.T) {
		// A ratio exact in binary, so that the sums below are exact.
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.25, BudgetMin: 10})
		now := b.last // no time passes: no refill by time
		if n := drain(b, now); n != 100 {
			t.Fatalf("a fresh budget allowed %d retries, want ten seconds of budget_min = 100", n)
		}
		for range 8 {
			b.Request()
		}
		if n := drain(b, now); n != 2 {
			t.Fatalf("8 requests at ratio 0.25 allowed %d retries, want 2", n)
		}
		for range 3 {
			b.Request()
		}
		if n := drain(b, now); n != 0 {
			t.Fatalf("0.75 of a token allowed %d retries", n)
		}
		b.Request()
		if n := drain(b, now); n != 1 {
			t.Fatalf("the fourth request completed a token, yet %d retries", n)
		}
	})
	t.Run("a decimal ratio adds up", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.2, BudgetMin: 10})
		now := b.last
		drain(b, now)
		for range 10 {
			b.Request()
		}
		if n := drain(b, now); n != 2 {
			t.Errorf("10 requests at ratio 0.2 allowed %d retries, want 2", n)
		}
	})
	t.Run("time refills budget_min a second", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.2, BudgetMin: 10})
		now := b.last
		drain(b, now)
		now = now.Add(time.Second)
		if n := drain(b, now); n != 10 {
			t.Fatalf("one second refilled %d retries, want 10", n)
		}
		// A clock going backwards refills nothing.
		if n := drain(b, now.Add(-time.Minute)); n != 0 {
			t.Fatalf("a clock going backwards refilled %d", n)
		}
	})
	t.Run("capped at ten seconds' worth", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 1, BudgetMin: 10})
		now := b.last
		for range 1000 {
			b.Request()
		}
		if n := drain(b, now); n != 100 {
			t.Fatalf("1000 requests at ratio 1 allowed %d retries, want the cap of 100", n)
		}
		if n := drain(b, now.Add(time.Hour)); n != 100 {
			t.Fatalf("an hour allowed %d retries, want the cap of 100", n)
		}
	})
	t.Run("no minimum", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.5, BudgetMin: 0})
		now := b.last
		if n := drain(b, now.Add(time.Hour)); n != 1 {
			t.Fatalf("budget_min 0 allowed %d retries, want a bucket of 1", n)
		}
		b.Request()
		b.Request()
		if n := drain(b, now.Add(time.Hour)); n != 1 {
			t.Fatalf("two requests at ratio 0.5 allowed %d retries, want 1", n)
		}
	})
}

// drain takes retries from b at now until it refuses, and returns how many it allowed.
func drain(b *RetryBudget, now time.Time) int {
	n := 0
	for b.Retry(now) {
		n++
		if n > 1e6 {
			panic("the retry budget never runs out")
		}
	}
	return n
}

// pickCounts picks n times and counts the picks by backend name ("" for
// nil). Each pick's slot is released at once, as by a finished request, so
// the picks do not load the backends.
func pickCounts(r *Route, n int, tried Tried, key uint64) map[string]int {
	counts := make(map[string]int)
	for range n {
		name := ""
		if b := r.Pick(tried, key); b != nil {
			name = b.Name
			b.Release()
		}
		counts[name]++
	}
	return counts
}

func TestPick(t *testing.T) {
	type setup func(a, b, c *Backend)
	tests := []struct {
		name   string
		setup  setup
		tried  []int // indexes of a, b, c
		allow  []string
		full   bool // Full(tried)
		ejectd string
	}{
		{name: "all usable", setup: func(a, b, c *Backend) {}, allow: []string{"a", "b", "c"}, ejectd: "a"},
		{name: "tried are skipped", setup: func(a, b, c *Backend) {}, tried: []int{0, 2}, allow: []string{"b"}, ejectd: "b"},
		{name: "every backend tried", setup: func(a, b, c *Backend) {}, tried: []int{0, 1, 2}, allow: []string{""}},
		{name: "full are skipped", setup: func(a, b, c *Backend) { a.inflight.Add(1); c.inflight.Add(1) }, allow: []string{"b"}, ejectd: "b"},
		{name: "all full", setup: func(a, b, c *Backend) { a.inflight.Add(1); b.inflight.Add(1); c.inflight.Add(1) }, allow: []string{""}, full: true},
		{name: "full or tried", setup: func(a, b, c *Backend) { a.inflight.Add(1) }, tried: []int{1, 2}, allow: []string{""}, full: true},
		{
			name: "unhealthy are skipped and ignored by Full",
			setup: func(a, b, c *Backend) {
				a.inflight.Add(1)
				b.health.probed(false, time.Now())
				c.health.probed(false, time.Now())
			},
			allow: []string{""}, full: true,
		},
		{
			name: "all unhealthy: not full, so no wait, and no last resort",
			setup: func(a, b, c *Backend) {
				a.health.probed(false, time.Now())
				b.health.probed(false, time.Now())
				c.health.probed(false, time.Now())
			},
			allow: []string{""},
		},
		{
			name:  "ejected are skipped; PickEjected takes the least loaded",
			setup: func(a, b, c *Backend) { eject(a); eject(b); eject(c); a.inflight.Add(1) },
			allow: []string{""}, ejectd: "b",
		},
		{
			name: "PickEjected skips backends whose probe fails, full and tried ones",
			setup: func(a, b, c *Backend) {
				eject(a)
				eject(b)
				eject(c)
				a.health.probed(false, time.Now().Add(-time.Hour))
				b.inflight.Add(1)
			},
			tried: []int{2}, allow: []string{""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b, c := newTestBackend("a", 1, 1), newTestBackend("b", 1, 1), newTestBackend("c", 1, 1)
			r := newTestRoute(config.Queue{}, a, b, c)
			tt.setup(a, b, c)
			var tried Tried
			for _, i := range tt.tried {
				tried = append(tried, r.backends[i])
			}
			counts := pickCounts(r, 300, tried, 0)
			for name := range counts {
				if !contains(tt.allow, name) {
					t.Errorf("picked %q (%v), want only %q", name, counts, tt.allow)
				}
			}
			if got := r.Full(tried); got != tt.full {
				t.Errorf("Full = %v, want %v", got, tt.full)
			}
			got := ""
			if e := r.PickEjected(tried); e != nil {
				got = e.Name
			}
			if got != tt.ejectd {
				t.Errorf("PickEjected = %q, want %q", got, tt.ejectd)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestPickSingleBackend(t *testing.T) {
	a := newTestBackend("a", 1, 1)
	r := newTestRoute(config.Queue{}, a)
	for _, key := range []uint64{0, 42} {
		if r.Pick(nil, key) != a {
			t.Fatal("the only backend was not picked")
		}
		a.Release()
	}
	if r.Pick(Tried{a}, 0) != nil {
		t.Error("a tried backend was picked")
	}
	a.inflight.Add(1)
	if r.Pick(nil, 0) != nil || !r.Full(nil) {
		t.Error("a full backend was picked, or the route is not full")
	}
	a.Release()
	eject(a)
	if r.Pick(nil, 0) != nil || r.PickEjected(nil) != a {
		t.Error("an ejected backend was picked, or not offered as the last resort")
	}
	if r := newTestRoute(config.Queue{}); r.Pick(nil, 0) != nil || r.PickEjected(nil) != nil || r.Full(nil) {
		t.Error("an empty route picked something or is full")
	}
}

// TestPickDraws checks the two halves of weighted P2C in isolation: draws follow the weights, and
// of two equally weighted backends the less loaded one wins three times in four (it loses only
// when it is not drawn at all).
func TestPickDraws(t *testing.T) {
	a, b, c := newTestBackend("a", 1, 0), newTestBackend("b", 2, 0), newTestBackend("c", 3, 0)
	r := newTestRoute(config.Queue{}, a, b, c)
	const n = 60000
	counts := map[string]int{}
	for range n {
		counts[r.draw().Name]++
	}
	for _, x := range []*Backend{a, b, c} {
		want := float64(x.weight) / 6
		if got := float64(counts[x.Name]) / n; got < want-0.02 || got > want+0.02 {
			t.Errorf("draw share of %s = %.3f, want %.3f", x.Name, got, want)
		}
	}

	busy, idle := newTestBackend("busy", 1, 0), newTestBackend("idle", 1, 0)
	r = newTestRoute(config.Queue{}, busy, idle)
	for range 5 {
		busy.inflight.Add(1)
	}
	got := float64(pickCounts(r, n, nil, 0)["idle"]) / n
	if got < 0.73 || got > 0.77 {
		t.Errorf("the idle backend won %.3f of the picks, want 0.75", got)
	}
	// A backend that answers slowly counts as loaded even with nothing in flight.
	for range 5 {
		busy.Release()
	}
	busy.ReportSuccess(500 * time.Millisecond)
	idle.ReportSuccess(50 * time.Millisecond)
	if got := float64(pickCounts(r, n, nil, 0)["idle"]) / n; got < 0.73 || got > 0.77 {
		t.Errorf("the fast backend won %.3f of the picks, want 0.75", got)
	}
}

func TestAffinity(t *testing.T) {
	bs := make([]*Backend, 5)
	for i := range bs {
		bs[i] = newTestBackend(fmt.Sprintf("vllm-%d", i), 1, 0)
	}
	r := newTestRoute(config.Queue{}, bs...)
	const keys = 5000
	owner := make([]*Backend, keys)
	perBackend := map[*Backend]int{}
	for k := range keys {
		key := AffinityKey(fmt.Appendf(nil, "prefix %d", k))
		// Pick takes a slot; each is released at once, as a finished
		// request would, so that load does not build up and move keys.
		owner[k] = r.Pick(nil, key)
		owner[k].Release()
		perBackend[owner[k]]++
		again := r.Pick(nil, key)
		again.Release()
		if again != owner[k] {
			t.Fatalf("key %d moved from %s to %s with nothing changed", k, owner[k].Name, again.Name)
		}
	}
	for _, b := range bs {
		if share := float64(perBackend[b]) / keys; share < 0.15 || share > 0.25 {
			t.Errorf("backend %s owns %.3f of the keys, want about 0.2", b.Name, share)
		}
	}

	// Removing a backend moves only its own keys; the others stay where they were.
	removed := bs[2]
	r = newTestRoute(config.Queue{}, bs[0], bs[1], bs[3], bs[4])
	moved := 0
	for k := range keys {
		now := r.Pick(nil, AffinityKey(fmt.Appendf(nil, "prefix %d", k)))
		now.Release()
		switch {
		case owner[k] == removed:
			moved++
		case now != owner[k]:
			t.Fatalf("key %d moved from %s to %s though its backend stayed", k, owner[k].Name, now.Name)
		}
	}
	if moved != perBackend[removed] {
		t.Errorf("%d keys moved, want the removed backend's %d", moved, perBackend[removed])
	}

	// An unhealthy owner moves its keys elsewhere, and they come back with it.
	r = newTestRoute(config.Queue{}, bs...)
	key := AffinityKey([]byte("prefix 7"))
	first := r.Pick(nil, key)
	first.health.probed(false, time.Now())
	if b := r.Pick(nil, key); b == first || b == nil {
		t.Errorf("an unhealthy owner was picked: %v", b)
	}
	first.health.probed(true, time.Now())
	if b := r.Pick(nil, key); b != first {
		t.Errorf("the key did not come back to %s", first.Name)
	}

	// An owner loaded well above the least loaded gives way to load balancing.
	for range 3 {
		first.inflight.Add(1)
	}
	counts := pickCounts(r, 400, nil, key)
	if counts[first.Name] > 150 {
		t.Errorf("an overloaded owner still took %d of 400 picks: %v", counts[first.Name], counts)
	}
	for range 3 {
		first.Release()
	}

	if AffinityKey(nil) != 0 || AffinityKey([]byte{}) != 0 {
		t.Error("an empty prefix must mean no affinity")
	}
	for i := range 1000 {
		if AffinityKey(fmt.Appendf(nil, "%d", i)) == 0 {
			t.Fatal("AffinityKey returned the no-affinity key for a prefix")
		}
	}
}

func TestWaitForSlot(t *testing.T) {
	t.Run("wakes on release", func(t *testing.T) {
		a := newTestBackend("a", 1, 1)
		r := newTestRoute(config.Queue{Depth: 2, Wait: time.Minute}, a)
		a.inflight.Add(1)
		got := make(chan bool, 1)
		go func() { got <- r.WaitForSlot(nil, nil, nil) }()
		waitFor(t, "a queued request", 5*time.Second, func() bool { return r.queued.Load() == 1 })
		a.Release()
		select {
		case ok := <-got:
			if !ok {
				t.Fatal("WaitForSlot = false after a release")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a release did not wake the queued request")
		}
		if r.queued.Load() != 0 || r.slots.waiters.Load() != 0 {
			t.Errorf("queued %d, waiters %d after the wait", r.queued.Load(), r.slots.waiters.Load())
		}
	})
	t.Run("refuses past the depth", func(t *testing.T) {
		a := newTestBackend("a", 1, 1)
		r := newTestRoute(config.Queue{Depth: 2, Wait: time.Minute}, a)
		a.inflight.Add(1)
		var wg sync.WaitGroup
		results := make(chan bool, 2)
		for range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); results <- r.WaitForSlot(nil, nil, nil) }()
		}
		waitFor(t, "two queued requests", 5*time.Second, func() bool { return r.queued.Load() == 2 })
		if r.WaitForSlot(nil, nil, nil) {
			t.Error("a third request was queued past depth 2")
		}
		a.Release()
		wg.Wait()
		close(results)
		for ok := range results {
			if !ok {
				t.Error("a queued request was not woken by the release")
			}
		}
	})
	t.Run("times out", func(t *testing.T) {
		a := newTestBackend("a", 1, 1)
		r := newTestRoute(config.Queue{Depth: 2, Wait: 30 * time.Millisecond}, a)
		a.inflight.Add(1)
		if r.WaitForSlot(nil, nil, nil) {
			t.Fatal("WaitForSlot = true with the only backend still full")
		}
		if r.queued.Load() != 0 || r.slots.waiters.Load() != 0 {
			t.Errorf("queued %d, waiters %d after the timeout", r.queued.Load(), r.slots.waiters.Load())
		}
	})
	t.Run("a release elsewhere does not satisfy it", func(t *testing.T) {
		a, b := newTestBackend("a", 1, 1), newTestBackend("b", 1, 1)
		r := newTestRoute(config.Queue{Depth: 2, Wait: 100 * time.Millisecond}, a, b)
		a.inflight.Add(1)
		b.inflight.Add(1)
		// b is tried already: its slot freeing up does not help this request.
		done := make(chan bool, 1)
		go func() { done <- r.WaitForSlot(Tried{b}, nil, nil) }()
		waitFor(t, "a queued request", 5*time.Second, func() bool { return r.queued.Load() == 1 })
		b.Release()
		if <-done {
			t.Error("WaitForSlot = true though only a tried backend freed up")
		}
	})
	// A queued request whose client left, or whose server is shutting
	// down, stops waiting at once instead of at the end of its queue wait.
	for _, which := range []string{"client gone", "shutdown"} {
		t.Run("ends when "+which, func(t *testing.T) {
			a := newTestBackend("a", 1, 1)
			r := newTestRoute(config.Queue{Depth: 2, Wait: time.Hour}, a)
			a.inflight.Add(1)
			gone, shutdown := make(chan struct{}), make(chan struct{})
			done := make(chan bool, 1)
			go func() { done <- r.WaitForSlot(nil, gone, shutdown) }()
			waitFor(t, "a queued request", 5*time.Second, func() bool { return r.queued.Load() == 1 })
			if which == "shutdown" {
				close(shutdown)
			} else {
				close(gone)
			}
			select {
			case ok := <-done:
				if ok {
					t.Error("WaitForSlot = true though no slot freed up")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the wait did not end with its request")
			}
			if r.queued.Load() != 0 || r.slots.waiters.Load() != 0 {
				t.Errorf("queued %d, waiters %d after the wait", r.queued.Load(), r.slots.waiters.Load())
			}
		})
	}
}

// timeoutErr is a net.Error that timed out, like a read past its deadline.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
		bfb  bool
	}{
		{"dial timeout", fasthttp.ErrDialTimeout, "dial", false},
		{"no free connections", fasthttp.ErrNoFreeConns, "dial", false},
		{"refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, "dial", false},
		{"awaiting headers", fasthttp.ErrTimeout, "timeout", true},
		{"mid-body", &net.OpError{Op: "read", Err: timeoutErr{}}, "timeout", false},
		{"deadline", os.ErrDeadlineExceeded, "timeout", false},
		{"closed", io.EOF, "conn", false},
		{"reset", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, "conn", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := classify(tt.err)
			var (
				de DialError
				te TimeoutError
				ce ConnError
			)
			got := ""
			switch {
			case errors.As(err, &de):
				got = "dial"
			case errors.As(err, &te):
				got = "timeout"
				if te.BeforeFirstByte != tt.bfb {
					t.Errorf("BeforeFirstByte = %v, want %v", te.BeforeFirstByte, tt.bfb)
				}
			case errors.As(err, &ce):
				got = "conn"
			}
			if got != tt.want || !errors.Is(err, tt.err) {
				t.Errorf("classify(%v) = %T, want a %s error wrapping it", tt.err, err, tt.want)
			}
		})
	}
	if classify(nil) != nil {
		t.Error("classify(nil) != nil")
	}
}
