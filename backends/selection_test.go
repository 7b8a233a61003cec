package backends

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

// pickCounts picks n times and counts the picks by backend name ("" for
// nil). Each pick's slot is released at once, as by a finished request, so
// the picks do not load the backends.
func pickCounts(r *Route, n int, tried Tried, blocks []uint64) map[string]int {
	counts := make(map[string]int)
	for range n {
		name := ""
		if b := r.Pick(tried, blocks, 0); b != nil {
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
			counts := pickCounts(r, 300, tried, nil)
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
	for _, blocks := range [][]uint64{nil, {42, 43}} {
		if r.Pick(nil, blocks, 0) != a {
			t.Fatal("the only backend was not picked")
		}
		a.Release()
	}
	if r.Pick(Tried{a}, nil, 0) != nil {
		t.Error("a tried backend was picked")
	}
	a.inflight.Add(1)
	if r.Pick(nil, nil, 0) != nil || !r.Full(nil) {
		t.Error("a full backend was picked, or the route is not full")
	}
	a.Release()
	eject(a)
	if r.Pick(nil, nil, 0) != nil || r.PickEjected(nil) != a {
		t.Error("an ejected backend was picked, or not offered as the last resort")
	}
	if r := newTestRoute(config.Queue{}); r.Pick(nil, nil, 0) != nil || r.PickEjected(nil) != nil || r.Full(nil) {
		t.Error("an empty route picked something or is full")
	}
}

// TestPickLoad checks the scheduler without metrics: at idle every score ties and picks follow
// the weights; under load the backend with fewer requests in flight, per unit of weight, wins.
func TestPickLoad(t *testing.T) {
	a, b, c := newTestBackend("a", 1, 0), newTestBackend("b", 2, 0), newTestBackend("c", 3, 0)
	r := newTestRoute(config.Queue{}, a, b, c)
	const n = 60000
	counts := pickCounts(r, n, nil, nil)
	for _, x := range []*Backend{a, b, c} {
		want := float64(x.weight) / 6
		if got := float64(counts[x.Name]) / n; got < want-0.02 || got > want+0.02 {
			t.Errorf("idle share of %s = %.3f, want %.3f", x.Name, got, want)
		}
	}

	tests := []struct {
		name         string
		busy, idle   int // weights
		busyN, idleN int // requests in flight
		want         string
	}{
		{"fewer in flight wins", 1, 1, 5, 0, "idle"},
		{"in flight counts per unit of weight", 4, 1, 3, 3, "busy"},
		{"a heavier backend with more in flight still loses past its share", 2, 1, 5, 1, "idle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			busy, idle := newTestBackend("busy", tt.busy, 0), newTestBackend("idle", tt.idle, 0)
			busy.inflight.Add(int64(tt.busyN))
			idle.inflight.Add(int64(tt.idleN))
			r := newTestRoute(config.Queue{}, busy, idle)
			if got := pickCounts(r, 200, nil, nil); got[tt.want] != 200 {
				t.Errorf("picks = %v, want all on %s", got, tt.want)
			}
		})
	}
}
