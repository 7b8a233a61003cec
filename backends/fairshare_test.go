package backends

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-dev/tollgate/config"
)

// fairHarness is a route of two backends of four slots each, keeping two
// free for tenants under their share.
type fairHarness struct {
	t    *testing.T
	r    *Route
	held map[string][]*heldSlot
	out  chan outcome
	// pending counts the waiting requests whose outcome is not taken.
	pending  int
	shutdown chan struct{}
}

// heldSlot is a slot a test request holds, and the count it is in.
type heldSlot struct {
	b *Backend
	t *Tenancy
}

func newFairHarness(t *testing.T) *fairHarness {
	r := newTestRoute(config.Queue{Depth: 16, Wait: time.Hour}, newTestBackend("a", 1, 4), newTestBackend("b", 1, 4))
	r.reserve = defaultReserve(2, r.backends)
	h := &fairHarness{t: t, r: r, held: make(map[string][]*heldSlot), out: make(chan outcome, 16), shutdown: make(chan struct{})}
	t.Cleanup(func() { close(h.shutdown) })
	return h
}

// take picks a slot for tenant, reporting whether it got one at once.
func (h *fairHarness) take(tenant string) bool {
	tn := &Tenancy{}
	b := h.r.PickFor(tn, Claim{Tenant: tenant}, nil, nil, 0)
	if b == nil {
		if !tn.HeldBack() {
			h.t.Fatalf("%s: no slot and not held back; the route has %d free", tenant, h.free())
		}
		return false
	}
	h.held[tenant] = append(h.held[tenant], &heldSlot{b, tn})
	return true
}

// release frees one of tenant's slots.
func (h *fairHarness) release(tenant string) {
	s := h.held[tenant][0]
	h.held[tenant] = h.held[tenant][1:]
	s.t.Release(s.b)
}

// wait queues a request of tenant, which takes its slot into held when
// served.
func (h *fairHarness) wait(tenant string) {
	tn := &Tenancy{}
	h.pending++
	go func() {
		b, err := h.r.WaitForSlot(nil, nil, 0, Claim{Tenant: tenant, Tokens: 10}, tn, nil, h.shutdown)
		if b != nil {
			h.out <- outcome{name: tenant, b: b, err: err, t: tn}
			return
		}
		h.out <- outcome{name: tenant, err: err}
	}()
	waitFor(h.t, tenant+" waiting", 5*time.Second, func() bool { _, w := h.r.TenantLoad(tenant); return w > 0 })
}

// served takes the next outcome of a waiting request, which must be a slot.
func (h *fairHarness) served() string {
	h.t.Helper()
	select {
	case o := <-h.out:
		h.pending--
		if o.b == nil {
			h.t.Fatalf("%s ended with %v, want a slot", o.name, o.err)
		}
		h.held[o.name] = append(h.held[o.name], &heldSlot{o.b, o.t})
		return o.name
	case <-time.After(5 * time.Second):
		h.t.Fatal("no waiting request was served")
	}
	return ""
}

// none checks that no waiting request was served.
func (h *fairHarness) none() {
	h.t.Helper()
	select {
	case o := <-h.out:
		h.t.Fatalf("%s served (%v, %v) while the reserve should hold", o.name, o.b, o.err)
	case <-time.After(50 * time.Millisecond):
	}
}

func (h *fairHarness) free() int64 {
	_, free := h.r.slots()
	return free
}

// counts is each tenant's slots and waiting requests as the route counts
// them, "tenant=slots/waiting", sorted.
func (h *fairHarness) counts() []string {
	h.r.waitq.mu.Lock()
	defer h.r.waitq.mu.Unlock()
	var out []string
	for name, l := range h.r.waitq.loads {
		out = append(out, fmt.Sprintf("%s=%d/%d", name, l.inflight, l.waiting))
	}
	slices.Sort(out)
	return out
}

func TestFairReserve(t *testing.T) {
	tests := []struct {
		name string
		run  func(h *fairHarness)
		// want is the counts at the end, and free the slots left free.
		want []string
		free int64
	}{{
		// b holds one slot: shares are 4 each, and a, over its share,
		// stops with two slots free (the reserve, under b's 3 unused).
		name: "kept while an over-share tenant waits",
		run: func(h *fairHarness) {
			h.take("b")
			for h.take("a") {
			}
			h.wait("a")
			h.none()
			// A slot of a's freeing goes to a's waiting request, and the
			// two stay free.
			h.release("a")
			if got := h.served(); got != "a" {
				h.t.Errorf("the freed slot went to %s, want a", got)
			}
			h.none()
		},
		want: []string{"a=5/0", "b=1/0"},
		free: 2,
	}, {
		// b's last slot ending leaves a alone: its share is every slot,
		// and its waiting requests take the reserve at once.
		name: "released when no tenant under its share is left",
		run: func(h *fairHarness) {
			h.take("b")
			for h.take("a") {
			}
			h.wait("a")
			h.wait("a")
			h.none()
			h.release("b")
			h.served()
			h.served()
		},
		want: []string{"a=7/0"},
		free: 1,
	}, {
		// Nobody over its share wants a slot: a takes every slot up to
		// the limit, b holding one, since the reserve only holds back a
		// tenant at or over its share.
		name: "no reserve while the share allows",
		run: func(h *fairHarness) {
			h.take("b")
			for range 4 {
				if !h.take("a") {
					h.t.Fatal("a under its share of 4 was held back")
				}
			}
		},
		want: []string{"a=4/0", "b=1/0"},
		free: 3,
	}, {
		// a holds back with two free; c, new, is under its share and
		// takes one at once, from the reserve, though a waits.
		name: "an under-share tenant served at once from the reserve",
		run: func(h *fairHarness) {
			h.take("b")
			for h.take("a") {
			}
			h.wait("a")
			if !h.take("c") {
				h.t.Error("c, under its share, was held back")
			}
			if !h.take("b") {
				h.t.Error("b, under its share, was held back")
			}
			h.none()
		},
		want: []string{"a=5/1", "b=2/0", "c=1/0"},
		free: 0,
	}, {
		// A waiting under-share tenant is served before the over-share
		// one, out of fair queueing's order.
		name: "a waiting under-share tenant goes first",
		run: func(h *fairHarness) {
			for range 8 {
				h.take("a")
			}
			h.wait("a")
			h.wait("b")
			h.release("a")
			if got := h.served(); got != "b" {
				h.t.Errorf("the freed slot went to %s, want b", got)
			}
			h.none()
		},
		want: []string{"a=7/1", "b=1/0"},
		free: 0,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFairHarness(t)
			tt.run(h)
			if got := h.counts(); !slices.Equal(got, tt.want) {
				t.Errorf("counts %v, want %v", got, tt.want)
			}
			if got := h.free(); got != tt.free {
				t.Errorf("%d slots free, want %d", got, tt.free)
			}
			h.releaseAll()
			if got := h.free(); got != 8 {
				t.Errorf("%d slots free after every release, want 8", got)
			}
		})
	}
}

// TestFairReserveBurst checks that a tenant bursting past its equal share,
// with fewer of its requests waiting than it holds slots, takes the
// reserve's free slots while another tenant floods (over its share, with
// more requests waiting than it holds slots), and that the flooding tenant
// is still held to the reserve.
func TestFairReserveBurst(t *testing.T) {
	h := newFairHarness(t)
	h.r = newTestRoute(config.Queue{Depth: 16, Wait: time.Hour}, newTestBackend("a", 1, 8), newTestBackend("b", 1, 8))
	h.r.reserve = 4
	// Shares of 16 slots among b, c and f are 5. c holds 1, b 5, f 6:
	// f, over its share and holding most, stops with 4 free (under c's 4
	// unused), and more of its requests wait than it holds slots: a flood.
	h.take("c")
	for range 5 {
		h.take("b")
	}
	for h.take("f") {
	}
	for range 7 {
		h.wait("f")
	}
	waitFor(t, "f's 7 waiting", 5*time.Second, func() bool { _, w := h.r.TenantLoad("f"); return w == 7 })
	h.none()
	if got, want := h.counts(), []string{"b=5/0", "c=1/0", "f=6/7"}; !slices.Equal(got, want) {
		t.Fatalf("counts %v before the burst, want %v", got, want)
	}
	// b, at its share, bursts: f floods, so b takes the free slots.
	for range 4 {
		if !h.take("b") {
			t.Fatalf("b, bursting while f floods, was held back with %d free; counts %v", h.free(), h.counts())
		}
	}
	h.none()
	if got, want := h.counts(), []string{"b=9/0", "c=1/0", "f=6/7"}; !slices.Equal(got, want) {
		t.Errorf("counts %v after the burst, want %v", got, want)
	}
	// A slot of b's freeing stays free: f floods, and c's 4 unused are
	// kept.
	h.release("b")
	h.none()
	// b's next request takes it, though f's requests wait: b bursts, f
	// floods.
	if !h.take("b") {
		t.Errorf("b, bursting while f floods, was held back with %d free; counts %v", h.free(), h.counts())
	}
	h.releaseAll()
}

// releaseAll releases every slot held, and those the waiting requests
// are then served, and checks that no tenant is left counted.
func (h *fairHarness) releaseAll() {
	h.t.Helper()
	for name := range h.held {
		for len(h.held[name]) > 0 {
			h.release(name)
		}
	}
	h.drain()
	if n := h.r.TenantsCounted(); n != 0 {
		h.t.Errorf("%d tenants counted after every slot's release: %v", n, h.counts())
	}
}

// drain releases what waiting requests the last releases served.
func (h *fairHarness) drain() {
	for ; h.pending > 0; h.pending-- {
		select {
		case o := <-h.out:
			if o.b != nil {
				o.t.Release(o.b)
			}
		case <-time.After(5 * time.Second):
			h.t.Fatal("a waiting request was not served once every slot was free")
		}
	}
}

// TestReserveWhereTenantsRun checks that the reserve is kept on the
// backend where the tenant under its share holds slots, its prompt being
// cached there.
func TestReserveWhereTenantsRun(t *testing.T) {
	for _, home := range []int{0, 1} {
		t.Run("tenant on backend "+strconv.Itoa(home), func(t *testing.T) {
			r := newTestRoute(config.Queue{Depth: 16, Wait: time.Hour}, newTestBackend("a", 1, 8), newTestBackend("b", 1, 8))
			r.reserve = 4
			on, off := r.backends[home], r.backends[1-home]
			var held []*heldSlot
			take := func(tenant string, b *Backend) {
				tn := &Tenancy{}
				if got := r.PickFor(tn, Claim{Tenant: tenant}, Tried{b}, nil, 0); got == nil || got == b {
					t.Fatalf("%s's request took %v, want the other backend than %s", tenant, got, b.Name)
				}
				held = append(held, &heldSlot{b: r.backends[1-slices.Index(r.backends, b)], t: tn})
			}
			// u holds 2 slots on its backend; f, at its share of 8, holds
			// 2 there and 6 on the other: 6 slots free, 4 of them kept.
			take("u", off)
			take("u", off)
			take("f", off)
			take("f", off)
			for range 6 {
				take("f", on)
			}
			for range 2 {
				tn := &Tenancy{}
				b := r.PickFor(tn, Claim{Tenant: "f"}, nil, nil, 0)
				if b == nil {
					t.Fatal("f held back with 2 slots free beyond the reserve")
				}
				held = append(held, &heldSlot{b: b, t: tn})
			}
			// The 4 kept are all on u's backend, where u holds every slot
			// it holds: f's 2 went to the other.
			if free := on.maxConcurrency - on.InFlight(); free != 4 {
				t.Errorf("%d slots free on u's backend, want 4", free)
			}
			if b := r.PickFor(&Tenancy{}, Claim{Tenant: "f"}, nil, nil, 0); b != nil {
				t.Errorf("f took a slot on %s past the reserve", b.Name)
			}
			for _, s := range held {
				s.t.Release(s.b)
			}
			if n := r.TenantsCounted(); n != 0 {
				t.Errorf("%d tenants counted after every release", n)
			}
		})
	}
}

// TestPickForPassesHigherBands checks that a request of a band above every
// waiting one goes to the backend holding its prompt, past its limit, as
// from the queue, rather than to the slot the reserve left free elsewhere.
func TestPickForPassesHigherBands(t *testing.T) {
	a, b := newTestBackend("a", 1, 3), newTestBackend("b", 1, 3)
	r := newTestRoute(config.Queue{Depth: 16, Wait: time.Hour}, a, b)
	r.PriorityScheduling, r.reserve = true, 1
	chain := testChain(8)
	for _, be := range r.backends {
		be.index = new(prefixIndex)
	}
	a.index.insert(chain)
	passed := prometheus.NewCounter(prometheus.CounterOpts{Name: "placed_priority"})
	r.placements[placedPriority] = passed
	var held []*heldSlot
	take := func(c Claim, not *Backend) {
		tn := &Tenancy{}
		got := r.PickFor(tn, c, Tried{not}, nil, 0)
		if got == nil {
			t.Fatalf("%s got no slot", c.Tenant)
		}
		held = append(held, &heldSlot{b: got, t: tn})
	}
	low := Claim{Tenant: "low", Priority: 1}
	// low holds a's 3 slots and 1 of b's, q 1 of b's: b has 1 free, the
	// reserve, which keeps low's next request waiting.
	for range 3 {
		take(low, b)
	}
	take(low, a)
	take(Claim{Tenant: "q", Priority: 1}, a)
	gone := make(chan struct{})
	waited := make(chan outcome, 1)
	go func() {
		tn := &Tenancy{}
		be, err := r.WaitForSlot(nil, nil, 0, low, tn, gone, nil)
		waited <- outcome{b: be, err: err, t: tn}
	}()
	waitFor(t, "low waiting", 5*time.Second, func() bool { _, w := r.TenantLoad("low"); return w == 1 })
	tn := &Tenancy{}
	got := r.PickFor(tn, Claim{Tenant: "high"}, nil, chain, 0)
	if got != a {
		t.Errorf("the high-priority request went to %v, want a, holding its prompt, past its limit", got)
	}
	if n, _ := r.TenantLoad("high"); n != 1 {
		t.Errorf("high counts %d slots, want 1", n)
	}
	if v := testutil.ToFloat64(passed); v != 1 {
		t.Errorf("placements counted as priority: %v, want the high-priority request's 1", v)
	}
	if got != nil {
		tn.Release(got)
	}
	close(gone)
	if o := <-waited; o.b != nil {
		o.t.Release(o.b)
	}
	for _, s := range held {
		s.t.Release(s.b)
	}
	if n := r.TenantsCounted(); n != 0 {
		t.Errorf("%d tenants counted after every release", n)
	}
}
