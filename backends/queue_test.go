package backends

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

func TestWaitForSlot(t *testing.T) {
	t.Run("a release hands the slot over", func(t *testing.T) {
		a := newTestBackend("a", 1, 1)
		r := newTestRoute(config.Queue{Depth: 2, Wait: time.Minute}, a)
		a.inflight.Add(1)
		got := make(chan outcome, 1)
		go func() { b, err := r.WaitForSlot(nil, nil, 0, Claim{}, nil, nil, nil); got <- outcome{b: b, err: err} }()
		waitFor(t, "a queued request", 5*time.Second, func() bool { return r.queued.Load() == 1 })
		a.Release()
		select {
		case o := <-got:
			if o.b != a || o.err != nil {
				t.Fatalf("WaitForSlot = %v, %v after a release; want a, nil", o.b, o.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a release did not serve the queued request")
		}
		// The slot went to the queued request: nobody else can take it.
		if a.InFlight() != 1 || a.tryAcquire() {
			t.Errorf("in flight %d after the hand-over, want the one slot held", a.InFlight())
		}
		if r.queued.Load() != 0 || len(r.waitq.bands) != 0 {
			t.Errorf("queued %d, bands %d after the wait", r.queued.Load(), len(r.waitq.bands))
		}
	})
	t.Run("refuses past the depth", func(t *testing.T) {
		a := newTestBackend("a", 1, 1)
		r := newTestRoute(config.Queue{Depth: 2, Wait: time.Minute}, a)
		a.inflight.Add(1)
		var wg sync.WaitGroup
		results := make(chan outcome, 2)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b, err := r.WaitForSlot(nil, nil, 0, Claim{}, nil, nil, nil)
				results <- outcome{b: b, err: err}
			}()
		}
		waitFor(t, "two queued requests", 5*time.Second, func() bool { return r.queued.Load() == 2 })
		if b, err := r.WaitForSlot(nil, nil, 0, Claim{}, nil, nil, nil); b != nil || err != ErrQueueFull {
			t.Errorf("a third request past depth 2: %v, %v; want nil, ErrQueueFull", b, err)
		}
		a.Release()
		(<-results).b.Release()
		wg.Wait()
		if o := <-results; o.b != a || o.err != nil {
			t.Errorf("the second queued request got %v, %v; want a, nil", o.b, o.err)
		}
	})
	t.Run("times out", func(t *testing.T) {
		a := newTestBackend("a", 1, 1)
		r := newTestRoute(config.Queue{Depth: 2, Wait: 30 * time.Millisecond}, a)
		a.inflight.Add(1)
		if b, err := r.WaitForSlot(nil, nil, 0, Claim{}, nil, nil, nil); b != nil || err != ErrQueueTimeout {
			t.Fatalf("WaitForSlot with the only backend still full = %v, %v; want nil, ErrQueueTimeout", b, err)
		}
		if r.queued.Load() != 0 || len(r.waitq.bands) != 0 {
			t.Errorf("queued %d, bands %d after the timeout", r.queued.Load(), len(r.waitq.bands))
		}
	})
	t.Run("a release elsewhere does not satisfy it", func(t *testing.T) {
		a, b := newTestBackend("a", 1, 1), newTestBackend("b", 1, 1)
		r := newTestRoute(config.Queue{Depth: 2, Wait: 100 * time.Millisecond}, a, b)
		a.inflight.Add(1)
		b.inflight.Add(1)
		// b is tried already: its slot freeing up does not help this request.
		done := make(chan outcome, 1)
		go func() {
			got, err := r.WaitForSlot(Tried{b}, nil, 0, Claim{}, nil, nil, nil)
			done <- outcome{b: got, err: err}
		}()
		waitFor(t, "a queued request", 5*time.Second, func() bool { return r.queued.Load() == 1 })
		b.Release()
		if o := <-done; o.b != nil || o.err != ErrQueueTimeout {
			t.Errorf("WaitForSlot = %v, %v though only a tried backend freed up; want nil, ErrQueueTimeout", o.b, o.err)
		}
		if b.InFlight() != 0 {
			t.Errorf("b holds %d requests: its freed slot was taken for a request that tried it", b.InFlight())
		}
	})
	t.Run("no healthy backend left: pick again", func(t *testing.T) {
		a := newTestBackend("a", 1, 1)
		r := newTestRoute(config.Queue{Depth: 2, Wait: time.Hour}, a)
		a.inflight.Add(1)
		done := make(chan outcome, 1)
		go func() {
			got, err := r.WaitForSlot(nil, nil, 0, Claim{}, nil, nil, nil)
			done <- outcome{b: got, err: err}
		}()
		waitFor(t, "a queued request", 5*time.Second, func() bool { return r.queued.Load() == 1 })
		eject(a)
		a.Release()
		select {
		case o := <-done:
			if o.b != nil || o.err != nil {
				t.Errorf("WaitForSlot = %v, %v with no healthy backend; want nil, nil (pick again)", o.b, o.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the wait went on with no healthy backend left to wait for")
		}
	})
	t.Run("a release serves another model sharing the backend", func(t *testing.T) {
		a := newTestBackend("a", 1, 1)
		r1 := newTestRoute(config.Queue{Depth: 2, Wait: time.Minute}, a)
		r2 := newTestRoute(config.Queue{Depth: 2, Wait: time.Minute}, a)
		a.inflight.Add(1)
		done := make(chan outcome, 1)
		go func() {
			got, err := r2.WaitForSlot(nil, nil, 0, Claim{}, nil, nil, nil)
			done <- outcome{b: got, err: err}
		}()
		waitFor(t, "a queued request", 5*time.Second, func() bool { return r2.queued.Load() == 1 })
		a.Release()
		if o := <-done; o.b != a || o.err != nil {
			t.Errorf("the second model's request got %v, %v; want a, nil", o.b, o.err)
		}
		if r1.queued.Load() != 0 {
			t.Errorf("first model queued %d", r1.queued.Load())
		}
	})
}

// TestWaitEndsWithItsRequest checks that a queued request whose client left, or whose server is
// shutting down, stops waiting at once with the error that says which, holds no slot, and that
// the next release goes to the request still waiting.
func TestWaitEndsWithItsRequest(t *testing.T) {
	for _, tt := range []struct {
		name string
		want error
	}{
		{"client gone", ErrClientLeft},
		{"shutdown", ErrShutdown},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newQueueHarness(t, 4)
			gone, shutdown := make(chan struct{}), make(chan struct{})
			left := make(chan outcome, 1)
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				b, err := h.r.WaitForSlot(nil, nil, 0, Claim{}, nil, gone, shutdown)
				left <- outcome{b: b, err: err}
			}()
			waitFor(t, "a queued request", 5*time.Second, func() bool { return h.r.queued.Load() == 1 })
			h.join("stays", Claim{})
			if tt.want == ErrShutdown {
				close(shutdown)
			} else {
				close(gone)
			}
			select {
			case o := <-left:
				if o.b != nil || !errors.Is(o.err, tt.want) {
					t.Errorf("WaitForSlot = %v, %v; want nil, %v", o.b, o.err, tt.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the wait did not end with its request")
			}
			if got := h.grant(); got != "stays" {
				t.Errorf("the release went to %q, want the request still waiting", got)
			}
			if h.r.queued.Load() != 0 {
				t.Errorf("queued %d after the waits", h.r.queued.Load())
			}
		})
	}
}

// TestQueueOrder checks who a saturated model's freed slots go to: bands by priority, fair
// tokens across tenants within a band, first come first served otherwise. Each request is named
// its prefix and its rank among the requests of that prefix (a1, a2, ...).
func TestQueueOrder(t *testing.T) {
	type join struct {
		prefix string
		claim  Claim
		times  int // 0 means once
		// grantsFirst slots are granted, and counted in the order, before it joins.
		grantsFirst int
	}
	a := func(prio, tokens int64) Claim { return Claim{Priority: prio, Tenant: "acme/a", Tokens: tokens} }
	b := func(prio, tokens int64) Claim { return Claim{Priority: prio, Tenant: "beta/b", Tokens: tokens} }
	tests := []struct {
		name  string
		joins []join
		want  []string // the grants, in order
	}{
		{
			name:  "one tenant, one band: first come, first served",
			joins: []join{{prefix: "x", claim: Claim{Tokens: 500}}, {prefix: "x", claim: Claim{Tokens: 10}}, {prefix: "x"}},
			want:  []string{"x1", "x2", "x3"},
		},
		{
			name: "a waiting high-priority request goes before earlier low ones",
			joins: []join{{prefix: "low", claim: a(5, 100)}, {prefix: "low", claim: b(5, 100)},
				{prefix: "high", claim: a(-1, 100)}, {prefix: "mid", claim: b(0, 100)}},
			want: []string{"high1", "mid1", "low1", "low2"},
		},
		{
			name:  "two tenants, one flooding first: slots alternate",
			joins: []join{{prefix: "a", claim: a(0, 100), times: 10}, {prefix: "b", claim: b(0, 100), times: 2}},
			want:  []string{"a1", "b1", "a2", "b2", "a3", "a4"},
		},
		{
			name: "the flooder enqueues 5x as often: it gets no more than its share",
			joins: []join{{prefix: "a", claim: a(0, 100), times: 5}, {prefix: "b", claim: b(0, 100)},
				{prefix: "a", claim: a(0, 100), times: 5}, {prefix: "b", claim: b(0, 100)}},
			want: []string{"a1", "b1", "a2", "b2", "a3"},
		},
		{
			name:  "fair by tokens, not by requests: twice the tokens, half the slots",
			joins: []join{{prefix: "a", claim: a(0, 200), times: 4}, {prefix: "b", claim: b(0, 100), times: 4}},
			want:  []string{"b1", "a1", "b2", "b3", "a2", "b4", "a3", "a4"},
		},
		{
			// Without the band's virtual time b would join with tags 100,
			// 200, 300 and take three slots in a row for having waited
			// nowhere.
			name: "a tenant idle while others were served earns no credit",
			joins: []join{{prefix: "a", claim: a(0, 100), times: 6},
				{prefix: "b", claim: b(0, 100), times: 3, grantsFirst: 3}},
			want: []string{"a1", "a2", "a3", "a4", "b1", "a5", "b2", "a6", "b3"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newQueueHarness(t, 64)
			var got []string
			ranks := map[string]int{}
			for _, j := range tt.joins {
				for range j.grantsFirst {
					got = append(got, h.grant())
				}
				for range max(j.times, 1) {
					ranks[j.prefix]++
					h.join(j.prefix+strconv.Itoa(ranks[j.prefix]), j.claim)
				}
			}
			for len(got) < len(tt.want) {
				got = append(got, h.grant())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("grants %v, want %v", got, tt.want)
			}
		})
	}
}

// TestQueueFairShareOverTime checks the fairness goal with a flooding tenant's requests arriving
// five times as often as the other's, and three times as large: while both wait, the tokens
// served to each stay within one request of each tenant of one another (self-clocked fair
// queueing's bound), so the flooder gets no more than its share.
func TestQueueFairShareOverTime(t *testing.T) {
	h := newQueueHarness(t, 512)
	flood, other := Claim{Tenant: "acme/flood", Tokens: 300}, Claim{Tenant: "beta/b", Tokens: 100}
	n := 0
	join := func(c Claim) {
		n++
		h.join(c.Tenant+"#"+strconv.Itoa(n), c)
	}
	served := map[string]int64{}
	for round := range 40 {
		for range 5 {
			join(flood)
		}
		join(other)
		name := h.grant()
		c := flood
		if strings.HasPrefix(name, other.Tenant+"#") {
			c = other
		}
		served[c.Tenant] += c.Tokens
		if d := served[flood.Tenant] - served[other.Tenant]; d > flood.Tokens+other.Tokens || -d > flood.Tokens+other.Tokens {
			t.Fatalf("after %d grants: served %v, apart by more than one request of each", round+1, served)
		}
	}
	if served[other.Tenant] == 0 || served[flood.Tenant] == 0 {
		t.Errorf("served %v: a tenant got nothing", served)
	}
}

// TestQueueSheds checks who a full queue sheds: the request last in line (the lowest band, the
// latest tag in it) when the newcomer goes before it, else the newcomer.
func TestQueueSheds(t *testing.T) {
	tests := []struct {
		name     string
		queued   []Claim
		newcomer Claim
		wantShed int // index in queued of the request shed; -1: the newcomer is refused
	}{
		{
			name:     "a higher priority sheds the lowest band's newest",
			queued:   []Claim{{Priority: 5, Tenant: "x"}, {Priority: 5, Tenant: "x"}, {Priority: 1, Tenant: "x"}},
			newcomer: Claim{Priority: 0, Tenant: "y"},
			wantShed: 1,
		},
		{
			name:     "a middle priority sheds the lowest band too",
			queued:   []Claim{{Priority: 1, Tenant: "x"}, {Priority: 9, Tenant: "x"}, {Priority: 5, Tenant: "x"}},
			newcomer: Claim{Priority: 5, Tenant: "y"},
			wantShed: 1,
		},
		{
			name:     "the lowest priority is refused",
			queued:   []Claim{{Priority: 0, Tenant: "x"}, {Priority: 3, Tenant: "x"}, {Priority: 0, Tenant: "y"}},
			newcomer: Claim{Priority: 7, Tenant: "z"},
			wantShed: -1,
		},
		{
			name:     "in one band another tenant sheds the flooder's newest",
			queued:   []Claim{{Tenant: "flood", Tokens: 100}, {Tenant: "flood", Tokens: 100}, {Tenant: "flood", Tokens: 100}},
			newcomer: Claim{Tenant: "quiet", Tokens: 100},
			wantShed: 2,
		},
		{
			name:     "the flooder cannot shed its own requests",
			queued:   []Claim{{Tenant: "flood", Tokens: 100}, {Tenant: "flood", Tokens: 100}, {Tenant: "quiet", Tokens: 100}},
			newcomer: Claim{Tenant: "flood", Tokens: 1},
			wantShed: -1,
		},
		{
			name:     "one tenant, one band: the newcomer is refused, as before",
			queued:   []Claim{{}, {}, {}},
			newcomer: Claim{},
			wantShed: -1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newQueueHarness(t, len(tt.queued))
			for i, c := range tt.queued {
				h.join(strconv.Itoa(i), c)
			}
			if tt.wantShed < 0 {
				if b, err := h.r.WaitForSlot(nil, nil, 0, tt.newcomer, nil, nil, nil); b != nil || err != ErrQueueFull {
					t.Fatalf("the newcomer got %v, %v; want nil, ErrQueueFull", b, err)
				}
				if q := h.r.queued.Load(); q != int64(len(tt.queued)) {
					t.Errorf("queued %d after refusing, want %d", q, len(tt.queued))
				}
				return
			}
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				b, err := h.r.WaitForSlot(nil, nil, 0, tt.newcomer, nil, nil, h.shutdown)
				h.out <- outcome{name: "newcomer", b: b, err: err}
			}()
			select {
			case o := <-h.out:
				if want := strconv.Itoa(tt.wantShed); o.name != want || o.err != ErrQueueShed {
					t.Fatalf("%s ended with %v; want %s shed (ErrQueueShed)", o.name, o.err, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("nobody was shed")
			}
			waitFor(t, "the newcomer queued", 5*time.Second, func() bool { return h.r.queued.Load() == int64(len(tt.queued)) })
		})
	}
}

// TestQueueLowerBandsNotStarved checks the guaranteed share: under a stream of higher-priority
// requests that never lets their band empty, a lower-band request is served within
// lowerBandTurn × (lower-band requests queued before it + 1) grants.
func TestQueueLowerBandsNotStarved(t *testing.T) {
	for _, older := range []int{0, 2} {
		t.Run(strconv.Itoa(older)+" older lower requests", func(t *testing.T) {
			h := newQueueHarness(t, 64)
			for i := range older {
				h.join("older"+strconv.Itoa(i), Claim{Priority: 3 + int64(i)})
			}
			h.join("low", Claim{Priority: 9})
			high := 0
			addHigh := func() {
				high++
				h.join("high"+strconv.Itoa(high), Claim{Priority: -5, Tenant: "t"})
			}
			addHigh()
			addHigh()
			bound := lowerBandTurn * (older + 1)
			for n := 1; ; n++ {
				if h.grant() == "low" {
					break
				}
				if n >= bound {
					t.Fatalf("no slot for the low request within %d grants", bound)
				}
				addHigh()
			}
		})
	}
}

// TestReleaseWithoutWaiters checks that the uncontended path stays free once the queue was used:
// taking and releasing a slot allocates nothing, and the queue keeps no band for nobody.
func TestReleaseWithoutWaiters(t *testing.T) {
	h := newQueueHarness(t, 4)
	h.join("x", Claim{Priority: 2, Tenant: "acme/a", Tokens: 10})
	h.b.Release() // the slot held from the start goes to x
	o := <-h.out
	o.b.Release()
	if n := testing.AllocsPerRun(200, func() { h.r.Pick(nil, nil, 0).Release() }); n != 0 {
		t.Errorf("Pick and Release with no request queued allocate %v times", n)
	}
	if len(h.r.waitq.bands) != 0 {
		t.Errorf("%d bands left with nobody queued", len(h.r.waitq.bands))
	}
}

// outcome is how one WaitForSlot ended.
type outcome struct {
	name string
	b    *Backend
	err  error
	// t is the count the slot is in, for a route that counts tenants.
	t *Tenancy
}

// queueHarness is a route of one backend with one slot, taken, so that every request joins the
// queue, and each grant is one release of that slot.
type queueHarness struct {
	t        *testing.T
	r        *Route
	b        *Backend
	out      chan outcome
	shutdown chan struct{}
	wg       sync.WaitGroup
}

func newQueueHarness(t *testing.T, depth int) *queueHarness {
	b := newTestBackend("a", 1, 1)
	h := &queueHarness{t: t, b: b, r: newTestRoute(config.Queue{Depth: depth, Wait: time.Hour}, b),
		out: make(chan outcome, 1024), shutdown: make(chan struct{})}
	b.inflight.Add(1)
	t.Cleanup(func() {
		close(h.shutdown)
		h.wg.Wait()
	})
	return h
}

// join queues a request named name and waits until it is in the queue.
func (h *queueHarness) join(name string, c Claim) {
	h.t.Helper()
	h.r.waitq.mu.Lock()
	seq := h.r.waitq.seq
	h.r.waitq.mu.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		b, err := h.r.WaitForSlot(nil, nil, 0, c, nil, nil, h.shutdown)
		h.out <- outcome{name: name, b: b, err: err}
	}()
	waitFor(h.t, name+" queued", 5*time.Second, func() bool {
		h.r.waitq.mu.Lock()
		defer h.r.waitq.mu.Unlock()
		return h.r.waitq.seq > seq
	})
}

// grant frees the slot and returns the name of the request it went to.
func (h *queueHarness) grant() string {
	h.t.Helper()
	h.b.Release()
	select {
	case o := <-h.out:
		if o.b != h.b || o.err != nil {
			h.t.Fatalf("%s ended with %v, %v; want the slot", o.name, o.b, o.err)
		}
		return o.name
	case <-time.After(10 * time.Second):
		h.t.Fatal("the release served nobody")
	}
	return ""
}

// TestQueuePassesHigherBands checks that, for a model whose backends schedule by priority, a
// request of a band above every waiting request goes past max_concurrency at once (its server
// preempts a lower-priority sequence for it), up to twice the limit, to the backend holding its
// prompt and then to the one with the smallest share of its limit in flight; and that it queues
// otherwise.
func TestQueuePassesHigherBands(t *testing.T) {
	tests := []struct {
		name       string
		scheduling bool
		waiting    []int64 // the priorities of the requests already queued
		inflight   [2]int64
		priority   int64
		want       string // the backend it gets at once, or "" when it queues
		aHolds     bool   // a was sent the request's prompt
	}{
		{"above every waiting band: past the limit", true, []int64{1, 1}, [2]int64{2, 2}, 0, "a", false},
		{"the backend with the smaller share in flight", true, []int64{1}, [2]int64{3, 2}, 0, "b", false},
		{"the backend holding the prompt, though busier", true, []int64{1}, [2]int64{3, 2}, 0, "a", true},
		{"without priority scheduling it queues", false, []int64{1}, [2]int64{2, 2}, 0, "", false},
		{"with nothing waiting it queues, first in line", true, nil, [2]int64{2, 2}, 0, "", false},
		{"behind a request of its own band it queues", true, []int64{0, 1}, [2]int64{2, 2}, 0, "", false},
		{"below the waiting band it queues", true, []int64{1}, [2]int64{2, 2}, 3, "", false},
		{"every backend at twice its limit: it queues", true, []int64{1}, [2]int64{4, 4}, 0, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newTestBackend("a", 1, 2), newTestBackend("b", 1, 2)
			r := newTestRoute(config.Queue{Depth: 16, Wait: time.Hour}, a, b)
			r.PriorityScheduling = tt.scheduling
			chain := testChain(8)
			for _, be := range r.backends {
				be.index = new(prefixIndex)
			}
			if tt.aHolds {
				a.index.insert(chain)
			}
			a.inflight.Store(tt.inflight[0])
			b.inflight.Store(tt.inflight[1])
			gone := make(chan struct{})
			var wg sync.WaitGroup
			defer wg.Wait()
			defer close(gone)
			for i, p := range tt.waiting {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = r.WaitForSlot(nil, nil, 0, Claim{Priority: p, Tenant: "t"}, nil, gone, nil)
				}()
				waitFor(t, "a queued request", 5*time.Second, func() bool { return r.queued.Load() == int64(i+1) })
			}
			got := make(chan outcome, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				be, err := r.WaitForSlot(nil, chain, 0, Claim{Priority: tt.priority, Tenant: "u"}, nil, gone, nil)
				got <- outcome{b: be, err: err}
			}()
			if tt.want == "" {
				waitFor(t, "the newcomer queued", 5*time.Second, func() bool { return r.queued.Load() == int64(len(tt.waiting)+1) })
				if a.InFlight() != tt.inflight[0] || b.InFlight() != tt.inflight[1] {
					t.Errorf("in flight %d and %d, want %d and %d: a slot was taken", a.InFlight(), b.InFlight(), tt.inflight[0], tt.inflight[1])
				}
				return
			}
			var o outcome
			select {
			case o = <-got:
			case <-time.After(5 * time.Second):
				t.Fatalf("the newcomer waited; want %s at once", tt.want)
			}
			if o.err != nil || o.b == nil || o.b.Name != tt.want {
				t.Fatalf("WaitForSlot = %v, %v; want %s at once", o.b, o.err, tt.want)
			}
			if n, want := o.b.InFlight(), tt.inflight[slices.Index([]string{"a", "b"}, tt.want)]+1; n != want {
				t.Errorf("%s has %d in flight, want %d", tt.want, n, want)
			}
			if r.queued.Load() != int64(len(tt.waiting)) {
				t.Errorf("queued %d, want the %d that waited before", r.queued.Load(), len(tt.waiting))
			}
		})
	}
}
