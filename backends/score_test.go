package backends

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-dev/tollgate/config"
)

// reading publishes a metrics reading on b, as the poller does.
func reading(b *Backend, running, waiting, maxRunning int64, kv float64, adapters ...string) {
	s := &serverLoad{running: running, waiting: waiting, maxRunning: maxRunning, kvUsage: kv, prefixHitRate: -1,
		inflightAtRead: b.InFlight()}
	s.lora.running = adapterHashesOf(adapters)
	s.lora.maxLoRA = 4
	b.server.Store(s)
}

func adapterHashesOf(names []string) []uint64 {
	var hs []uint64
	for _, n := range names {
		hs = append(hs, fnv1a([]byte(n)))
	}
	return hs
}

// testBlocks is the chain's length of the tests' prompt: 18 KiB, a long
// system prompt and a conversation's turns within the coarse blocks.
const testBlocks = fineBlocks + coarseBlocks

// pairRoute is a route over two backends of weight 1 without a cap, each
// with a prefix index, scheduling on routing's signals.
func pairRoute(routing config.Routing, first, second string) (*Route, *Backend, *Backend) {
	a, b := newTestBackend(first, 1, 0), newTestBackend(second, 1, 0)
	r := newTestRoute(config.Queue{}, a, b)
	routing.QueueCostTokens = testQueueCostTokens
	r.signals = signalsOf(&config.Model{Routing: routing})
	a.index, b.index = new(prefixIndex), new(prefixIndex)
	return r, a, b
}

// testChain is a prompt's chain of n blocks.
func testChain(n int) []uint64 {
	c := make([]uint64, n, MaxPrefixBlocks)
	for i := range c {
		c[i] = mix(uint64(7000 + i))
	}
	return c
}

// TestScheduleQueueRule checks the rule: a backend where the request would queue is avoided
// while another has a free slot, unless the prefix it holds beyond the free one's exceeds
// queue_cost_tokens per request ahead of it.
func TestScheduleQueueRule(t *testing.T) {
	const n = testBlocks
	tests := []struct {
		name      string
		costTok   int
		heldQueue int // leading blocks the queueing backend holds
		heldFree  int // leading blocks the free backend holds
		waiting   int64
		prefixOff bool
		want      string
	}{
		{name: "no prefix anywhere: the free backend", heldQueue: 0, waiting: 1, want: "free"},
		{name: "a prefix gain under the cost: the free backend", heldQueue: 40, waiting: 1, want: "free"},
		{name: "a prefix gain over the cost of one request ahead: the queueing backend", heldQueue: n, waiting: 0, want: "queued"},
		{name: "the same gain with more requests ahead: the free backend", heldQueue: n, waiting: 3, want: "free"},
		{name: "a lower configured cost lets a smaller gain pay", costTok: 200, heldQueue: 40, waiting: 1, want: "queued"},
		{name: "the gain is over the free backend's prefix", costTok: 200, heldQueue: 40, heldFree: 36, waiting: 1, want: "free"},
		{name: "prefix off: the free backend", heldQueue: n, waiting: 0, prefixOff: true, want: "free"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			queued, free := newTestBackend("queued", 1, 0), newTestBackend("free", 1, 0)
			r := newTestRoute(config.Queue{}, queued, free)
			m := config.Model{Routing: config.Routing{QueueCostTokens: testQueueCostTokens}}
			if tt.costTok != 0 {
				m.Routing.QueueCostTokens = tt.costTok
			}
			if tt.prefixOff {
				m.Routing.Prefix = config.SignalOff
			}
			r.signals = signalsOf(&m)
			for _, b := range r.backends {
				b.index = new(prefixIndex)
			}
			c := testChain(n)
			queued.index.insert(c[:tt.heldQueue])
			free.index.insert(c[:tt.heldFree])
			// Eight running of eight: a new request waits behind the queue.
			reading(queued, 8, tt.waiting, 8, 0.5)
			reading(free, 3, 0, 8, 0.5)
			got, _ := r.schedule(nil, c, 0)
			if got == nil || got.Name != tt.want {
				t.Fatalf("chose %v, want %s", got, tt.want)
			}
			ahead := r.assess(queued, nil).ahead
			gain := heldTokens(tt.heldQueue) - heldTokens(tt.heldFree)
			if pays := !tt.prefixOff && gain > ahead*int64(m.Routing.QueueCostTokens); pays != (tt.want == "queued") {
				t.Errorf("the case is mislabelled: gain %d tokens, %d ahead, cost %d", gain, ahead, m.Routing.QueueCostTokens)
			}
		})
	}
}

// TestScheduleSignals checks each signal between two backends with free slots, and that turning
// it off takes it out of the score.
func TestScheduleSignals(t *testing.T) {
	const adapter = "sql-lora"
	tests := []struct {
		name     string
		routing  config.Routing
		upstream string
		setup    func(a, b *Backend, c []uint64)
		want     string
	}{
		{
			name: "prefix: the backend holding the conversation, though busier",
			setup: func(a, b *Backend, c []uint64) {
				a.index.insert(c)
				reading(a, 5, 0, 8, 0.2)
				reading(b, 1, 0, 8, 0.2)
			},
			want: "a",
		},
		{
			// The turns are a small share of the prompt beside the system prompt both hold:
			// a request less busy must not draw the conversation away from them.
			name: "prefix: the backend holding the conversation's turns, not one holding only its system prompt",
			setup: func(a, b *Backend, c []uint64) {
				a.index.insert(c)
				b.index.insert(c[:testBlocks-6])
				reading(a, 3, 0, 8, 0.2)
				reading(b, 2, 0, 8, 0.2)
			},
			want: "a",
		},
		{
			name: "prefix: the turns' holder while it has a free slot, however busy",
			setup: func(a, b *Backend, c []uint64) {
				a.index.insert(c)
				b.index.insert(c[:testBlocks-6])
				reading(a, 7, 0, 8, 0.9)
				reading(b, 1, 0, 8, 0.2)
			},
			want: "a",
		},
		{
			name: "prefix: the system prompt's holder once the turns' holder is full",
			setup: func(a, b *Backend, c []uint64) {
				a.index.insert(c)
				b.index.insert(c[:testBlocks-6])
				reading(a, 8, 0, 8, 0.2)
				reading(b, 7, 0, 8, 0.2)
			},
			want: "b",
		},
		{
			name:    "prefix off: the less busy",
			routing: config.Routing{Prefix: config.SignalOff},
			setup: func(a, b *Backend, c []uint64) {
				a.index.insert(c)
				reading(a, 5, 0, 8, 0.2)
				reading(b, 1, 0, 8, 0.2)
			},
			want: "b",
		},
		{
			name: "queue: the server's own running count, not the gateway's",
			setup: func(a, b *Backend, c []uint64) {
				reading(a, 7, 0, 8, 0.2)
				reading(b, 1, 0, 8, 0.2)
				b.inflight.Add(3) // sent since the reading: 4 of 8 now
			},
			want: "b",
		},
		{
			name:    "queue off: the gateway's in-flight counts",
			routing: config.Routing{Queue: config.SignalOff},
			setup: func(a, b *Backend, c []uint64) {
				reading(a, 7, 0, 8, 0.2)
				reading(b, 1, 0, 8, 0.2)
				b.inflight.Add(3)
			},
			want: "a",
		},
		{
			name: "kv: the emptier cache",
			setup: func(a, b *Backend, c []uint64) {
				reading(a, 2, 0, 8, 0.95)
				reading(b, 2, 0, 8, 0.10)
			},
			want: "b",
		},
		{
			name:     "lora: the backend with the adapter loaded, though busier",
			upstream: adapter,
			setup: func(a, b *Backend, c []uint64) {
				reading(a, 6, 0, 8, 0.2, adapter)
				reading(b, 1, 0, 8, 0.2, "other-lora")
			},
			want: "a",
		},
		{
			name:     "lora within load limits: not once it would queue",
			upstream: adapter,
			setup: func(a, b *Backend, c []uint64) {
				reading(a, 8, 2, 8, 0.2, adapter)
				reading(b, 1, 0, 8, 0.2)
			},
			want: "b",
		},
		{
			name:     "lora off: the less busy",
			upstream: adapter,
			routing:  config.Routing{LoRA: config.SignalOff},
			setup: func(a, b *Backend, c []uint64) {
				reading(a, 6, 0, 8, 0.2, adapter)
				reading(b, 1, 0, 8, 0.2)
			},
			want: "b",
		},
		{
			name: "no free backend: the shorter queue",
			setup: func(a, b *Backend, c []uint64) {
				reading(a, 8, 5, 8, 0.9)
				reading(b, 8, 1, 8, 0.9)
			},
			want: "b",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, a, b := pairRoute(tt.routing, "a", "b")
			if tt.upstream != "" {
				r.Upstream = tt.upstream
			}
			r.adapter = fnv1a([]byte(r.Upstream))
			c := testChain(testBlocks)
			tt.setup(a, b, c)
			if got := pickCounts(r, 50, nil, c); got[tt.want] != 50 {
				t.Errorf("picks = %v, want all on %s", got, tt.want)
			}
		})
	}
}

// TestScheduleSpread checks where a request opening a conversation goes: to a backend without
// its instructions when that one is as free as the best holding them or one request busier, and
// its cache has room for them beside the prompts it serves, so that an app's instructions reach
// every server; to a holder otherwise, or when spread is off.
func TestScheduleSpread(t *testing.T) {
	const opening = testBlocks - 20 // the instructions' whole blocks
	const testCacheUnits = 1000
	on := config.Routing{Spread: config.SignalOn}
	tests := []struct {
		name    string
		routing config.Routing
		// running and kv are the holder's, then the other backend's; held the blocks the
		// holder holds (opening when zero).
		running [2]int64
		kv      float64 // the other backend's KV cache in use
		held    int
		// reuse is the other's reuse distance, in units of PrefixBlockBytes; cacheUnknown
		// says its server's KV cache size is not known.
		reuse        uint64
		cacheUnknown bool
		want         string
	}{
		{name: "as free: the other", routing: on, running: [2]int64{3, 3}, want: "other"},
		{name: "one request busier: the other", routing: on, running: [2]int64{3, 4}, want: "other"},
		{name: "two requests busier: the holder", routing: on, running: [2]int64{3, 5}, want: "holder"},
		{name: "the holder full: the other, though much busier", routing: on, running: [2]int64{8, 7}, want: "other"},
		{name: "the other's KV cache half in use: the holder", routing: on, running: [2]int64{3, 2}, kv: 0.5, want: "holder"},
		{name: "spread off: the holder", routing: config.Routing{Spread: config.SignalOff}, running: [2]int64{3, 2}, want: "holder"},
		{name: "spread left out, off: the holder", routing: config.Routing{Spread: ""}, running: [2]int64{3, 2}, want: "holder"},
		{name: "the block after the instructions shared too: still starting", routing: on, running: [2]int64{3, 3}, held: opening + 1, want: "other"},
		{name: "a conversation's turns held: continuing, the holder", routing: on, running: [2]int64{3, 0}, held: opening + 2, want: "holder"},
		{name: "the other's cache with room for them beside what it reuses: the other", routing: on, running: [2]int64{3, 3}, reuse: testCacheUnits / 2, want: "other"},
		{name: "the other's cache without room for them: the holder", routing: on, running: [2]int64{3, 2}, reuse: testCacheUnits - 40, want: "holder"},
		{name: "the other's cache size unknown: the holder", routing: on, running: [2]int64{3, 2}, cacheUnknown: true, want: "holder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, holder, other := pairRoute(tt.routing, "holder", "other")
			c := testChain(testBlocks)
			held := tt.held
			if held == 0 {
				held = opening
			}
			holder.index.insert(c[:held])
			if !tt.cacheUnknown {
				// A cache of testCacheUnits blocks of PrefixBlockBytes, at the default bytes a token.
				other.index.kvTokens.Store(testCacheUnits * PrefixBlockBytes / defaultBytesPerToken)
			}
			other.index.reuse.Store(tt.reuse)
			reading(holder, tt.running[0], 0, 8, 0.2)
			reading(other, tt.running[1], 0, 8, tt.kv)
			for range 50 {
				if got, _ := r.schedule(nil, c, opening); got == nil || got.Name != tt.want {
					t.Fatalf("chose %v, want %s", got, tt.want)
				}
			}
			if n := testing.AllocsPerRun(50, func() { r.schedule(nil, c, opening) }); n != 0 {
				t.Errorf("schedule allocated %v times", n)
			}
		})
	}
}

// TestPickRecordsBlocks checks that Pick records a request's blocks on the backend it chose, so
// the conversation's next turn follows them, and that Pick does not allocate.
func TestPickRecordsBlocks(t *testing.T) {
	bs := []*Backend{newTestBackend("a", 1, 0), newTestBackend("b", 1, 0), newTestBackend("c", 1, 0)}
	r := newTestRoute(config.Queue{}, bs...)
	for _, b := range bs {
		b.index = new(prefixIndex)
	}
	c := testChain(testBlocks)
	first := r.Pick(nil, c[:40], 0)
	first.Release()
	for range 20 {
		b := r.Pick(nil, c, 0)
		if b != first {
			t.Fatalf("turn 2 went to %s, not to %s which holds turn 1", b.Name, first.Name)
		}
		b.Release()
	}
	if n := testing.AllocsPerRun(200, func() { r.Pick(nil, c, 0).Release() }); n != 0 {
		t.Errorf("Pick with a block chain allocates %v times", n)
	}
}

// TestRegistryRoutingSignals checks what the configuration's settings mean for a route:
// affinity: prefix (the older spelling) and the default both use the prefix signal.
func TestRegistryRoutingSignals(t *testing.T) {
	tests := []struct {
		name        string
		model       config.Model
		wantBlocks  bool
		wantSignals signals
	}{
		{"default: every signal but spread", config.Model{}, true, signals{true, true, true, true, false, 2048}},
		{"affinity: prefix", config.Model{Affinity: "prefix"}, true, signals{true, true, true, true, false, 2048}},
		{"spread on", config.Model{Routing: config.Routing{Spread: "on"}}, true, signals{true, true, true, true, true, 2048}},
		{"every signal off", config.Model{Routing: config.Routing{Prefix: "off", Queue: "off", KV: "off", LoRA: "off", Spread: "off", QueueCostTokens: 100}},
			false, signals{false, false, false, false, false, 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.model
			m.Name, m.Backends = "m", []string{"a", "b"}
			cfg := provisioned(t, []config.Backend{
				{Name: "a", Simulated: &config.Simulated{}, Metrics: config.BackendMetrics{Path: "off"}},
				{Name: "b", Simulated: &config.Simulated{}, Metrics: config.BackendMetrics{Path: "off"}},
			}, []config.Model{m})
			reg, err := NewRegistry(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			rt := reg.Route([]byte("m"))
			if rt.WantsBlocks() != tt.wantBlocks || rt.signals != tt.wantSignals {
				t.Errorf("WantsBlocks %v, signals %+v; want %v, %+v", rt.WantsBlocks(), rt.signals, tt.wantBlocks, tt.wantSignals)
			}
		})
	}
}

// TestScheduleSkipsUnusable checks that the draw reads each backend's own assessment: a backend
// that holds the prompt but was tried, or is ejected, is never chosen, in a route small enough
// to keep its assessments on the stack and in one too large to; neither allocates.
func TestScheduleSkipsUnusable(t *testing.T) {
	tests := []struct {
		name        string
		backends    int
		usableHolds bool // the last backend, usable, holds the prompt too
	}{
		{"a few backends, no usable one holds the prompt", 4, false},
		{"a few backends, the last one holds the prompt", 4, true},
		{"more than the stack holds, no usable one holds the prompt", scheduleBackendsOnStack + 4, false},
		{"more than the stack holds, the last one holds the prompt", scheduleBackendsOnStack + 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := make([]*Backend, tt.backends)
			for i := range bs {
				bs[i] = newTestBackend(fmt.Sprintf("b%d", i), 1, 0)
				bs[i].index = new(prefixIndex)
				reading(bs[i], 1, 0, 8, 0.2)
			}
			r := newTestRoute(config.Queue{}, bs...)
			c := testChain(testBlocks)
			tried, ejected, last := bs[0], bs[1], bs[len(bs)-1]
			tried.index.insert(c)
			ejected.index.insert(c)
			eject(ejected)
			if tt.usableHolds {
				last.index.insert(c)
			}
			chosen := map[string]int{}
			for range 400 {
				b, _ := r.schedule(Tried{tried}, c, 0)
				if b == nil {
					t.Fatal("chose none")
				}
				chosen[b.Name]++
			}
			if n := testing.AllocsPerRun(50, func() { r.schedule(Tried{tried}, c, 0) }); n != 0 {
				t.Errorf("schedule allocates %v times", n)
			}
			if chosen[tried.Name] > 0 || chosen[ejected.Name] > 0 {
				t.Fatalf("chose the tried backend %d times and the ejected one %d times", chosen[tried.Name], chosen[ejected.Name])
			}
			if tt.usableHolds {
				if chosen[last.Name] != 400 {
					t.Errorf("chose the usable holder %d times of 400: %v", chosen[last.Name], chosen)
				}
				return
			}
			// The others are alike: the draw spreads the requests over all of them.
			if len(chosen) != tt.backends-2 {
				t.Errorf("chose %d backends, want the %d usable ones: %v", len(chosen), tt.backends-2, chosen)
			}
		})
	}
}

// TestSchedulePlacement checks why schedule says it chose a backend, and that Pick counts the
// placement it took a slot for: a conversation kept on its server, moved off it when full,
// queued there when what it holds pays for the wait, an opening spread, the score otherwise.
func TestSchedulePlacement(t *testing.T) {
	const opening = 2
	on := config.Routing{Spread: config.SignalOn}
	tests := []struct {
		name    string
		routing config.Routing
		opening int
		// held is how many leading blocks a holds (b holds none), running a's and b's
		// sequences (each runs at most 8); aWaits says a's server queues.
		held    int
		running [2]int64
		aWaits  bool
		want    string
		why     placement
	}{
		{name: "nothing held: the score", running: [2]int64{2, 6}, want: "a", why: placedScore},
		{name: "a conversation on its server, though busier", held: 4, running: [2]int64{6, 1}, want: "a", why: placedKept},
		{name: "its server full: moved", held: 4, running: [2]int64{8, 1}, aWaits: true, want: "b", why: placedMoved},
		{name: "its server full, what it holds pays for the wait: queued", held: testBlocks, running: [2]int64{8, 1}, aWaits: true, want: "a", why: placedQueued},
		{name: "an opening spread to a server without its instructions", routing: on, opening: opening, held: opening, running: [2]int64{3, 3}, want: "b", why: placedSpread},
		{name: "an opening not spread: the score", opening: opening, held: opening, running: [2]int64{3, 3}, want: "a", why: placedScore},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, a, b := pairRoute(tt.routing, "a", "b")
			var counts [numPlacements]prometheus.Counter
			for i := range counts {
				counts[i] = prometheus.NewCounter(prometheus.CounterOpts{Name: "placed_" + placementNames[i]})
				r.placements[i] = counts[i]
			}
			b.index.kvTokens.Store(1 << 20)
			c := testChain(testBlocks)
			a.index.insert(c[:tt.held])
			waiting := int64(0)
			if tt.aWaits {
				waiting = 1
			}
			reading(a, tt.running[0], waiting, 8, 0.2)
			reading(b, tt.running[1], 0, 8, 0.2)
			got, why := r.schedule(nil, c, tt.opening)
			if got == nil || got.Name != tt.want || why != tt.why {
				t.Fatalf("chose %v for %s, want %s for %s", got, placementNames[min(why, numPlacements-1)], tt.want, placementNames[tt.why])
			}
			if p := r.Pick(nil, c, tt.opening); p != got {
				t.Fatalf("Pick took %v, want %s", p, tt.want)
			}
			for i, c := range counts {
				want := 0.0
				if placement(i) == tt.why {
					want = 1
				}
				if v := testutil.ToFloat64(c); v != want {
					t.Errorf("placements counted as %s: %v, want %v", placementNames[i], v, want)
				}
			}
		})
	}
}
