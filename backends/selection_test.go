package backends

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

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
