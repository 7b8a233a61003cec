package proxy_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/backends/simulated"
)

// The fault tests of resilient routing: backends dying, failing, recovering, answering slowly,
// saturating, and the selection among them, all through a gateway on a real listener in front of
// simulated backends on real listeners (see routing_harness_test.go). They assert behaviour, not
// timings: the only clocks are generous bounds on waiting for a state change.

// TestBackendKilledUnderLoad kills one of three backends while eight clients keep sending
// requests: requests already sent to it fail with a connection error and are retried, the
// following ones go to the other two, and it is ejected, so no client sees an error. Restarted on
// the same port, it is probed back in once its cooldown has passed and takes traffic again.
func TestBackendKilledUnderLoad(t *testing.T) {
	nodes := newNodes(t, simulated.Options{TimeToFirstToken: 10 * time.Millisecond}, "b1", "b2", "b3")
	// The regular probe is rare (10s), so that it is passive ejection that takes b1 out, and the
	// probe at the end of each cooldown that brings it back.
	c := newHarness(t, harnessOptions{healthChecks: true,
		backends: sameSpecs("health: {interval: 10s, cooldown: 200ms, max_cooldown: 1s, failures_to_eject: 2}", nodes...),
		models:   "  - name: m\n    backends: [b1, b2, b3]\n",
		extra:    "retries: {backoff: 5ms, max_backoff: 20ms}",
	})
	victim := nodes[0]

	const workers, perWorker = 8, 50
	var (
		done     atomic.Int64
		mu       sync.Mutex
		failures []string
		wg       sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				r, err := c.do(routeChatBody("m", 2))
				if err != nil || r.status != http.StatusOK {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("worker %d request %d: %v status %d %s", w, i, err, r.status, r.body))
					mu.Unlock()
				}
				done.Add(1)
			}
		}()
	}
	// Kill b1 a quarter of the way through, with requests in flight on it.
	pollUntil(t, "a quarter of the requests", 30*time.Second, func() bool { return done.Load() >= workers*perWorker/4 })
	before := victim.sim().Stats()
	victim.kill()
	wg.Wait()
	t.Logf("b1 had served %d requests, %d of them in flight when it was killed",
		before.Requests, before.Requests-before.Completed-before.Cancelled)

	for _, f := range failures {
		t.Error(f)
	}
	if before.Requests == 0 {
		t.Error("b1 served nothing before it was killed; the test proves nothing")
	}
	if got := c.state("b1"); got != "ejected" {
		t.Fatalf("b1 is %q after it died under load, want ejected", got)
	}
	for _, n := range nodes[1:] {
		if st := c.state(n.name); st != "healthy" {
			t.Errorf("%s is %q, want healthy", n.name, st)
		}
	}
	for _, rec := range c.recorder.snapshot() {
		if rec.Status != http.StatusOK || rec.Backend == "" {
			t.Errorf("record: status %d backend %q error %q", rec.Status, rec.Backend, rec.Error)
		}
	}

	// Back on the same port, b1 is probed back in and takes a share of the traffic again.
	victim.restart()
	c.waitState("b1", "healthy", 5*time.Second)
	for i := 0; victim.sim().Stats().Requests == 0; i++ {
		if i == 300 {
			t.Fatal("b1 got none of 300 requests after it came back")
		}
		c.postOK(routeChatBody("m", 2))
	}
}

// TestBackendFailingThenRecovering has one of two backends answer 503 to everything, health
// probes included: it is ejected after failures_to_eject failures, gets no request while out
// (the requests that reached it were retried on the other backend), and once it answers again it
// is probed back in after its cooldown and takes traffic again.
func TestBackendFailingThenRecovering(t *testing.T) {
	nodes := newNodes(t, simulated.Options{}, "b1", "b2")
	c := newHarness(t, harnessOptions{healthChecks: true,
		backends: sameSpecs("health: {interval: 100ms, timeout: 1s, cooldown: 200ms, max_cooldown: 1s, failures_to_eject: 2}", nodes...),
		models:   "  - name: m\n    backends: [b1, b2]\n",
		extra:    "retries: {backoff: 1ms, max_backoff: 5ms}",
	})
	b1 := nodes[0]

	// The health checker probes every 250 ms. Start failing right after a probe succeeded, so
	// that the requests below, not the next probe, are what finds b1 failing: a failing probe
	// would mark it unhealthy before passive ejection could eject it.
	c.waitState("b1", "healthy", 5*time.Second)
	listings := b1.sim().ModelListings()
	pollUntil(t, "a health probe of b1", 5*time.Second, func() bool { return b1.sim().ModelListings() > listings })
	time.Sleep(20 * time.Millisecond) // let the gateway take in the probe's verdict
	b1.sim().SetFailStatus(http.StatusServiceUnavailable)

	for i := 0; c.state("b1") != "ejected"; i++ {
		if i == 200 {
			t.Fatalf("b1 is %q after 200 requests while it answers 503, want ejected", c.state("b1"))
		}
		// Every request is answered: a 503 from b1 is retried on b2.
		c.postOK(routeChatBody("m", 1))
	}
	if b1.sim().Stats().Requests < 2 {
		t.Fatalf("b1 saw %d requests before its ejection, want failures_to_eject = 2", b1.sim().Stats().Requests)
	}

	// While out, b1 gets no request; the health checker's probes do not count as requests.
	out := b1.sim().Stats().Requests
	for range 40 {
		c.postOK(routeChatBody("m", 1))
		time.Sleep(10 * time.Millisecond)
	}
	if got := b1.sim().Stats().Requests; got != out {
		t.Errorf("b1 got %d requests while ejected", got-out)
	}
	if got := c.state("b1"); got != "ejected" {
		t.Errorf("b1 is %q while it still fails its probes, want ejected", got)
	}

	// Recovered, it is probed back in and takes traffic again.
	b1.sim().SetFailStatus(0)
	c.waitState("b1", "healthy", 5*time.Second)
	for i := 0; b1.sim().Stats().Requests == out; i++ {
		if i == 200 {
			t.Fatal("b1 got none of 200 requests after it recovered")
		}
		c.postOK(routeChatBody("m", 1))
	}
}

// TestSlowBackend covers the per-phase timeouts: the first-byte timeout cuts a backend that does
// not answer, while a stream lives as long as its tokens keep coming, bounded by the idle gap
// between them and by the total timeout.
func TestSlowBackend(t *testing.T) {
	t.Run("first byte timeout with one backend is a 504", func(t *testing.T) {
		slow := newNode(t, "slow", simulated.Options{TimeToFirstToken: 2 * time.Second})
		c := newHarness(t, harnessOptions{healthChecks: true,
			backends: sameSpecs("timeouts: {first_byte: 600ms}", slow),
			models:   "  - name: m\n    backends: [slow]\n",
		})
		r := c.post(routeChatBody("m", 1))
		if r.status != http.StatusGatewayTimeout || r.json("error.code").String() != "upstream_timeout" {
			t.Fatalf("status %d %s, want 504 upstream_timeout", r.status, r.body)
		}
	})
	t.Run("first byte timeout is retried on another backend", func(t *testing.T) {
		slow := newNode(t, "slow", simulated.Options{TimeToFirstToken: 2 * time.Second})
		fast := newNode(t, "fast", simulated.Options{})
		// Between idle backends the weighted draw alone decides (see backends.better), so the
		// slow backend's weight of a million to one makes it the first choice in all but one
		// run in a million; at 100 to 1 this test failed about once in a hundred runs.
		c := newHarness(t, harnessOptions{healthChecks: true,
			backends: []backendSpec{
				{slow, "weight: 1000000\ntimeouts: {first_byte: 600ms}"},
				{fast, "timeouts: {first_byte: 600ms}"},
			},
			models: "  - name: m\n    backends: [slow, fast]\n",
		})
		r := c.postOK(routeChatBody("m", 1))
		if got := r.json("choices.0.message.content").String(); got != "tok0 " {
			t.Errorf("content %q", got)
		}
		if slow.requests() != 1 || fast.requests() != 1 {
			t.Errorf("requests: slow %d, fast %d; want the slow backend tried once, then the fast one", slow.requests(), fast.requests())
		}
		if rec := c.recorder.wait(t, 1); rec.Backend != "fast" {
			t.Errorf("record backend %q, want fast", rec.Backend)
		}
	})

	// The streams below have no first-byte wait (the simulator sends its headers and the role
	// event at once), so it is the gaps between tokens that the timeouts see. Each timeout is
	// far from the token cadence it is compared with (20× the 50 ms gaps, or a third of the
	// 3 s gap), so that a loaded CI machine running the race detector cannot stretch a gap
	// across it: with a 300 ms idle timeout, one stalled gap once cut the healthy stream.
	streams := []struct {
		name       string
		interToken time.Duration
		timeouts   string
		maxTokens  int
		wantTokens int // -1: fewer than maxTokens, then an in-band error
		wantCode   string
	}{
		{
			// 60 tokens take 3 s, three times the first-byte and idle timeouts.
			name:       "a long stream lives while tokens keep coming",
			interToken: 50 * time.Millisecond, timeouts: "{first_byte: 1s, idle: 1s}",
			maxTokens: 60, wantTokens: 60,
		},
		{
			name:       "an idle gap longer than the idle timeout ends the stream",
			interToken: 3 * time.Second, timeouts: "{first_byte: 1s, idle: 1s}",
			maxTokens: 5, wantTokens: 1, wantCode: "upstream_timeout",
		},
		{
			// The total timeout ends the 3 s stream at about its middle.
			name:       "the total timeout bounds the whole stream",
			interToken: 50 * time.Millisecond, timeouts: "{first_byte: 1s, idle: 1s, total: 1500ms}",
			maxTokens: 60, wantTokens: -1, wantCode: "upstream_timeout",
		},
	}
	for _, tt := range streams {
		t.Run(tt.name, func(t *testing.T) {
			sim := newNode(t, "sim", simulated.Options{InterTokenDelay: tt.interToken})
			c := newHarness(t, harnessOptions{healthChecks: true,
				backends: sameSpecs("timeouts: "+tt.timeouts, sim),
				models:   "  - name: m\n    backends: [sim]\n",
			})
			status, events := c.stream(routeStreamBody("m", tt.maxTokens))
			if status != http.StatusOK {
				t.Fatalf("status %d", status)
			}
			got := countTokenEvents(t, events)
			rec := c.recorder.wait(t, 1)
			if tt.wantCode == "" {
				for _, ev := range events {
					if gjson.Get(ev, "error").Exists() {
						t.Errorf("error event in a healthy stream: %s", ev)
					}
				}
				if got != tt.wantTokens || events[len(events)-1] != "[DONE]" {
					t.Fatalf("%d tokens, last event %q; want %d and [DONE]", got, events[len(events)-1], tt.wantTokens)
				}
				if rec.Error != "" || rec.Incomplete || rec.CompletionTokens != int64(tt.maxTokens) {
					t.Errorf("record: error %q incomplete %v completion %d", rec.Error, rec.Incomplete, rec.CompletionTokens)
				}
				return
			}
			code := endsWithInBandError(t, events)
			if tt.wantTokens >= 0 && got != tt.wantTokens || tt.wantTokens < 0 && (got == 0 || got >= tt.maxTokens) {
				t.Errorf("%d tokens before the error (want %d; -1 means some but not all)", got, tt.wantTokens)
			}
			if !rec.Incomplete || rec.Error == "" {
				t.Errorf("record: incomplete %v error %q; want an incomplete stream", rec.Incomplete, rec.Error)
			}
			if msg := gjson.Get(events[len(events)-2], "error.message").String(); code == "upstream_error" && strings.Contains(msg, "i/o timeout") {
				t.Errorf("a timeout mid-stream is reported in-band as code upstream_error (%q), want upstream_timeout", msg)
			}
			if code != tt.wantCode {
				t.Errorf("in-band error code %q, want %q: %s", code, tt.wantCode, events[len(events)-2])
			}
		})
	}
}

// TestSaturatedModel fires five concurrent requests at a model whose only backend takes one at
// a time, with a queue of two: one is served at once, two wait, and the others are refused at
// once with 503 overloaded and a Retry-After. The waiting ones are served if the slot frees up
// within the queue's wait, and refused the same way if not.
func TestSaturatedModel(t *testing.T) {
	tests := []struct {
		name    string
		ttft    time.Duration
		wait    string // the queue's wait
		minOK   int    // the requests served
		maxOK   int
		waiters string
	}{
		{name: "requests longer than the wait", ttft: time.Second, wait: "300ms", minOK: 1, maxOK: 1, waiters: "refused after the wait"},
		// Five arriving together: one served, two served after waiting (about 120ms, far
		// inside the wait even on a loaded machine), two refused. If arrivals spread out
		// more, more are served, never fewer.
		{name: "requests shorter than the wait", ttft: 60 * time.Millisecond, wait: "5s", minOK: 3, maxOK: 5, waiters: "served"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sim := newNode(t, "sim", simulated.Options{TimeToFirstToken: tt.ttft})
			c := newHarness(t, harnessOptions{healthChecks: true,
				backends: sameSpecs("max_concurrency: 1", sim),
				models:   "  - name: m\n    backends: [sim]\n    queue: {depth: 2, wait: " + tt.wait + "}\n",
			})
			const clients = 5
			replies := make([]response, clients)
			errs := make([]error, clients)
			var wg sync.WaitGroup
			for i := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					replies[i], errs[i] = c.do(routeChatBody("m", 1))
				}()
			}
			wg.Wait()
			ok := 0
			for i, r := range replies {
				switch {
				case errs[i] != nil:
					t.Fatal(errs[i])
				case r.status == http.StatusOK:
					ok++
				case r.status != http.StatusServiceUnavailable || r.json("error.code").String() != "overloaded":
					t.Errorf("status %d %s, want 200 or 503 overloaded", r.status, r.body)
				case r.header.Get("Retry-After") == "":
					t.Errorf("503 without Retry-After: %s", r.body)
				}
			}
			if max := sim.sim().MaxInFlight(); max > 1 {
				t.Errorf("%d requests in flight at once on a backend of max_concurrency 1", max)
			}
			if ok < tt.minOK || ok > tt.maxOK {
				t.Errorf("%d of %d requests served, want %d to %d (the waiting ones %s)", ok, clients, tt.minOK, tt.maxOK, tt.waiters)
			}
			if got := sim.requests(); got != int64(ok) {
				t.Errorf("the backend saw %d requests, want only the %d served", got, ok)
			}
		})
	}
}

// TestFallbackChain sends a request for model A, whose only backend is dead, with fallbacks
// B (dead too) and C (alive): C serves it, the Compat-Served-Model header names C, and the reply
// names C, or A with fallback_keeps_model.
func TestFallbackChain(t *testing.T) {
	tests := []struct {
		keeps     bool
		stream    bool
		wantModel string
	}{
		{false, false, "C"},
		{true, false, "A"},
		{false, true, "C"},
		{true, true, "A"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("keeps_model=%v stream=%v", tt.keeps, tt.stream), func(t *testing.T) {
			deadA, deadB := newNode(t, "deadA", simulated.Options{}), newNode(t, "deadB", simulated.Options{})
			alive := newNode(t, "alive", simulated.Options{})
			c := newHarness(t, harnessOptions{healthChecks: true,
				backends: sameSpecs("", deadA, deadB, alive),
				models: fmt.Sprintf(`  - name: A
    backends: [deadA]
    fallbacks: [B, C]
    fallback_keeps_model: %v
  - name: B
    backends: [deadB]
  - name: C
    backends: [alive]
`, tt.keeps),
				extra: "retries: {backoff: 1ms, max_backoff: 5ms}",
			})
			deadA.kill()
			deadB.kill()

			var models []string
			if tt.stream {
				status, events := c.stream(routeStreamBody("A", 3))
				if status != http.StatusOK {
					t.Fatalf("status %d", status)
				}
				if n := countTokenEvents(t, events); n != 3 || events[len(events)-1] != "[DONE]" {
					t.Fatalf("%d tokens: %v", n, events)
				}
				for _, ev := range events[:len(events)-1] {
					models = append(models, gjson.Get(ev, "model").String())
				}
			} else {
				r := c.postOK(routeChatBody("A", 3))
				if got := r.header.Get("Compat-Served-Model"); got != "C" {
					t.Errorf("Compat-Served-Model %q, want C", got)
				}
				models = append(models, r.json("model").String())
			}
			rec := c.recorder.wait(t, 1)
			if rec.Model != "A" || rec.ServedModel != "C" || rec.Backend != "alive" || rec.Status != http.StatusOK {
				t.Errorf("record: model %q served %q backend %q status %d", rec.Model, rec.ServedModel, rec.Backend, rec.Status)
			}
			if alive.requests() != 1 {
				t.Errorf("the live backend saw %d requests", alive.requests())
			}
			up, _ := alive.sim().LastRequest()
			if got := gjson.GetBytes(up, "model").String(); got == "A" {
				t.Errorf("a fallback's backend is sent the requested model %q instead of the fallback's upstream model C; reply models %v", got, models)
			} else if got != "C" {
				t.Errorf("the fallback's backend was sent model %q, want C", got)
			}
			for _, m := range models {
				if m != tt.wantModel {
					t.Errorf("reply names model %q, want %q", m, tt.wantModel)
				}
			}
		})
	}
}

// TestNoRetryAfterFirstByte checks that a request is retried only while no byte of a reply has
// reached the client, and only for failures another backend may not repeat.
func TestNoRetryAfterFirstByte(t *testing.T) {
	t.Run("a stream broken mid-way is not retried", func(t *testing.T) {
		nodes := newNodes(t, simulated.Options{}, "b1", "b2")
		c := newHarness(t, harnessOptions{healthChecks: true, backends: sameSpecs("", nodes...), models: "  - name: m\n    backends: [b1, b2]\n"})
		status, events := c.stream(routeStreamBody("m", 10), "X-Mock-Break-After: 3")
		if status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
		endsWithInBandError(t, events)
		if n := countTokenEvents(t, events); n != 3 {
			t.Errorf("%d tokens before the break, want 3: %v", n, events)
		}
		roles := 0
		for _, ev := range events {
			if gjson.Get(ev, "choices.0.delta.role").Exists() {
				roles++
			}
		}
		if roles != 1 {
			t.Errorf("%d role events: a second reply was spliced in: %v", roles, events)
		}
		rec := c.recorder.wait(t, 1)
		if got := nodes[0].requests() + nodes[1].requests(); got != 1 {
			t.Errorf("the backends saw %d requests, want exactly one", got)
		}
		if !rec.Incomplete {
			t.Errorf("record not incomplete: %+v", rec)
		}
	})

	// The failing backend's weight, a million to one, makes it the first choice in all but one
	// run in a million (between idle backends the weighted draw alone decides; at 100 to 1 a
	// run in a hundred drew the other first); the other one answers. Only statuses that
	// another backend may not repeat are retried. The failing backend starts failing after its
	// first health probe, and the next is 10s away, so it is still in rotation when the
	// request comes.
	tests := []struct {
		fail       int
		wantStatus int
		retried    bool
	}{
		{http.StatusInternalServerError, http.StatusBadGateway, false},
		{http.StatusBadRequest, http.StatusBadRequest, false},
		{http.StatusTooManyRequests, http.StatusOK, true},
		{http.StatusBadGateway, http.StatusOK, true},
		{http.StatusServiceUnavailable, http.StatusOK, true},
		{http.StatusGatewayTimeout, http.StatusOK, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("upstream %d", tt.fail), func(t *testing.T) {
			failing := newNode(t, "failing", simulated.Options{})
			good := newNode(t, "good", simulated.Options{})
			c := newHarness(t, harnessOptions{healthChecks: true,
				backends: []backendSpec{{failing, "weight: 1000000\nhealth: {interval: 10s}"}, {good, "health: {interval: 10s}"}},
				models:   "  - name: m\n    backends: [failing, good]\n",
				extra:    "retries: {backoff: 1ms, max_backoff: 5ms}",
			})
			pollUntil(t, "the first health probe", 5*time.Second, func() bool { return failing.sim().ModelListings() > 0 })
			failing.sim().SetFailStatus(tt.fail)
			r := c.post(routeChatBody("m", 1))
			if r.status != tt.wantStatus {
				t.Errorf("status %d %s, want %d", r.status, r.body, tt.wantStatus)
			}
			want := int64(1)
			if tt.retried {
				want = 2
			}
			if failing.requests() != 1 || failing.requests()+good.requests() != want {
				t.Errorf("requests: failing %d, good %d; want the failing backend once and %d in all",
					failing.requests(), good.requests(), want)
			}
		})
	}
}

// TestWeightedSelection measures how weighted power-of-two-choices spreads requests over three
// equally fast backends weighted 1:2:3, from what the backends saw. Selection also prefers a
// backend whose moving average of time to first token is half another's, so the backends take
// 10 ms: a scheduling stall must then last about 90 ms to make one of them look twice as slow,
// where with 2 ms one of 18 ms did, common enough on a loaded CI machine to skew the shares.
func TestWeightedSelection(t *testing.T) {
	tests := []struct {
		name    string
		workers int
	}{
		{"sequential", 1},
		{"lightly concurrent", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := newNodes(t, simulated.Options{TimeToFirstToken: 10 * time.Millisecond}, "w1", "w2", "w3")
			c := newHarness(t, harnessOptions{healthChecks: true,
				backends: []backendSpec{{nodes[0], "weight: 1"}, {nodes[1], "weight: 2"}, {nodes[2], "weight: 3"}},
				models:   "  - name: m\n    backends: [w1, w2, w3]\n",
			})
			const total = 600
			if failed := sendConcurrently(c, tt.workers, total, routeChatBody("m", 1)); failed != "" {
				t.Fatal(failed)
			}
			var shares []string
			off := false
			for i, n := range nodes {
				share := float64(n.requests()) / total
				want := float64(i+1) / 6
				shares = append(shares, fmt.Sprintf("%s %.3f (want %.3f)", n.name, share, want))
				off = off || share < want-0.07 || share > want+0.07
			}
			t.Logf("shares: %s", strings.Join(shares, ", "))
			if off {
				t.Errorf("weights 1:2:3 give shares %s", strings.Join(shares, ", "))
			}
		})
	}

	t.Run("a full backend is skipped", func(t *testing.T) {
		nodes := newNodes(t, simulated.Options{TimeToFirstToken: 20 * time.Millisecond}, "w1", "w2", "w3")
		c := newHarness(t, harnessOptions{healthChecks: true,
			backends: []backendSpec{{nodes[0], "weight: 1"}, {nodes[1], "weight: 2"}, {nodes[2], "weight: 3\nmax_concurrency: 1"}},
			models:   "  - name: m\n    backends: [w1, w2, w3]\n",
		})
		const total = 240
		if failed := sendConcurrently(c, 8, total, routeChatBody("m", 1)); failed != "" {
			t.Fatal(failed)
		}
		capped := nodes[2]
		if max := capped.sim().MaxInFlight(); max > 1 {
			t.Errorf("%d requests in flight at once on a backend of max_concurrency 1", max)
		}
		share := float64(capped.requests()) / total
		t.Logf("the capped backend of weight 3/6 served %.3f of the requests", share)
		if capped.requests() == 0 || share > 0.3 {
			t.Errorf("the capped backend served %.3f of the requests, want some but well under its weight's 0.5", share)
		}
	})
}

// sendConcurrently sends total requests from workers concurrent clients, and describes the first failure.
func sendConcurrently(c *harness, workers, total int, body string) string {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed string
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += workers {
				r, err := c.do(body)
				if err != nil || r.status != http.StatusOK {
					mu.Lock()
					if failed == "" {
						failed = fmt.Sprintf("request %d: %v status %d %s", i, err, r.status, r.body)
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return failed
}

// TestPrefixAffinityCacheHits measures, with the simulator's prefix cache model, how often a
// conversation finds its prefix cached on the backend it is sent to: 30 conversations of ten
// requests each, shuffled, over three backends that each remember 16 prefixes. With prefix
// affinity every conversation stays on one backend and misses only once; without it, each
// backend sees every conversation and its cache is too small for all of them.
func TestPrefixAffinityCacheHits(t *testing.T) {
	const conversations, turns, cacheSize = 30, 10, 16
	rates := map[bool]float64{}
	for _, affinity := range []bool{true, false} {
		t.Run(fmt.Sprintf("affinity=%v", affinity), func(t *testing.T) {
			nodes := newNodes(t, simulated.Options{PrefixCache: cacheSize}, "v1", "v2", "v3")
			model := "  - name: m\n    backends: [v1, v2, v3]\n"
			if affinity {
				model += "    affinity: prefix\n"
			} else {
				model += "    routing: {prefix: off}\n"
			}
			c := newHarness(t, harnessOptions{healthChecks: true, backends: sameSpecs("", nodes...), models: model})

			order := make([]int, 0, conversations*turns)
			for conv := range conversations {
				for range turns {
					order = append(order, conv)
				}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

			turn := make([]int, conversations)
			hits := 0
			for _, conv := range order {
				turn[conv]++
				r := c.postOK(conversationBody(conv, turn[conv]))
				if r.json("usage.prompt_tokens_details.cached_tokens").Int() > 0 {
					hits++
				}
			}
			rate := float64(hits) / float64(len(order))
			rates[affinity] = rate
			var spread []string
			for _, n := range nodes {
				spread = append(spread, fmt.Sprintf("%s %d", n.name, n.requests()))
			}
			t.Logf("affinity %v: prefix cache hit rate %.3f (%d of %d requests); requests per backend: %s",
				affinity, rate, hits, len(order), strings.Join(spread, ", "))
			// Usage records carry the cached tokens too.
			cached := 0
			for _, rec := range c.recorder.snapshot() {
				if rec.CachedTokens > 0 {
					cached++
				}
			}
			if cached != hits {
				t.Errorf("%d records with cached tokens, want %d", cached, hits)
			}
		})
	}
	t.Logf("prefix cache hit rate: %.3f with affinity, %.3f without", rates[true], rates[false])
	if rates[true] <= 0.8 || rates[false] >= 0.6 {
		t.Errorf("hit rate %.3f with affinity, %.3f without; want above 0.8 and below 0.6", rates[true], rates[false])
	}
}

// conversationBody is turn t of conversation conv: a system prompt and a first question that are
// the conversation's own, then a follow-up that changes every turn.
func conversationBody(conv, t int) string {
	return fmt.Sprintf(`{"model":"m","max_tokens":1,"messages":[`+
		`{"role":"system","content":"You are assistant number %d, answer briefly."},`+
		`{"role":"user","content":"Conversation %d starts with this question."},`+
		`{"role":"assistant","content":"Noted."},`+
		`{"role":"user","content":"Follow-up number %d."}]}`, conv, conv, t)
}

// TestOneKilledOneFailingUnderLoad is the resilience claim in one run: of
// three backends, one is killed and another starts answering 503 under a
// steady load, and no client request fails; afterwards streamed and
// non-streamed requests all succeed on the healthy one, and both faulty
// ones are ejected. The load across the faults is non-streamed: a stream
// already flowing from the backend that is killed must end with an in-band
// error, since nothing may be retried once bytes reached the client.
func TestOneKilledOneFailingUnderLoad(t *testing.T) {
	nodes := newNodes(t, simulated.Options{TimeToFirstToken: 5 * time.Millisecond}, "b1", "b2", "b3")
	c := newHarness(t, harnessOptions{healthChecks: true,
		backends: sameSpecs("health: {interval: 10s, cooldown: 5s, max_cooldown: 10s, failures_to_eject: 2}", nodes...),
		models:   "  - name: m\n    backends: [b1, b2, b3]\n",
		extra:    "retries: {backoff: 5ms, max_backoff: 20ms}",
	})
	killed, failing, healthy := nodes[0], nodes[1], nodes[2]

	var (
		mu       sync.Mutex
		failures []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	load := func(workers, perWorker int, streams bool, done *atomic.Int64) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWorker {
					if streams && (w+i)%2 == 0 {
						status, events := c.stream(routeStreamBody("m", 3))
						if status != http.StatusOK || len(events) == 0 || events[len(events)-1] != "[DONE]" ||
							strings.Contains(strings.Join(events, "\n"), `"error"`) {
							fail("worker %d stream %d: status %d events %v", w, i, status, events)
						}
					} else if r, err := c.do(routeChatBody("m", 2)); err != nil || r.status != http.StatusOK {
						fail("worker %d request %d: %v status %d %s", w, i, err, r.status, r.body)
					}
					done.Add(1)
				}
			}()
		}
		wg.Wait()
	}

	var done atomic.Int64
	const workers, perWorker = 8, 60
	faults := make(chan struct{})
	go func() {
		defer close(faults)
		// Not pollUntil: t.Fatal must not run off the test's goroutine. The
		// load always gets a quarter through, so the wait ends.
		for done.Load() < workers*perWorker/4 {
			time.Sleep(5 * time.Millisecond)
		}
		killed.kill()
		failing.sim().SetFailStatus(http.StatusServiceUnavailable)
	}()
	load(workers, perWorker, false, &done)
	<-faults
	before := healthy.requests()
	var after atomic.Int64
	load(4, 20, true, &after)

	for _, f := range failures {
		t.Error(f)
	}
	for _, n := range []*node{killed, failing} {
		if got := c.state(n.name); got != "ejected" {
			t.Errorf("%s is %q after failing under load, want ejected", n.name, got)
		}
	}
	if got := healthy.requests() - before; got != 80 {
		t.Errorf("the healthy backend served %d of the 80 requests after the faults, want all", got)
	}
}

// TestBackendLearnsBytesPerToken checks that a reply's usage, streamed or not, teaches the
// backend that served it how many bytes of the prompt's raw JSON its server counts as a token,
// and teaches the backend that did not serve nothing.
func TestBackendLearnsBytesPerToken(t *testing.T) {
	const messages = `[{"role":"system","content":"You are a terse assistant of the fleet."},` +
		`{"role":"user","content":"How many bytes make one token on this server?"}]`
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			nodes := newNodes(t, simulated.Options{}, "v1", "v2")
			c := newHarness(t, harnessOptions{backends: sameSpecs("", nodes...), models: "  - name: m\n    backends: [v1, v2]\n"})
			body := fmt.Sprintf(`{"model":"m","max_tokens":2,"stream":%v,"messages":%s}`, stream, messages)
			if stream {
				if status, _ := c.stream(body); status != http.StatusOK {
					t.Fatalf("status %d", status)
				}
			} else {
				c.postOK(body)
			}
			var recs []accounting.Record
			pollUntil(t, "usage record", 5*time.Second, func() bool {
				recs = c.recorder.snapshot()
				return len(recs) > 0
			})
			if recs[0].PromptTokens <= 0 {
				t.Fatalf("recorded %d prompt tokens", recs[0].PromptTokens)
			}
			want := float64(len(messages)) / float64(recs[0].PromptTokens)
			learned := map[string]float64{}
			for _, b := range c.reg.Route([]byte("m")).Backends() {
				learned[b.Name] = b.PromptBytesPerToken()
			}
			served, other := recs[0].Backend, "v1"
			if served == "v1" {
				other = "v2"
			}
			if got := learned[served]; got < want-0.01 || got > want+0.01 {
				t.Errorf("%s, which served, learned %.3f bytes a token, want %.3f (%d bytes, %d tokens)",
					served, got, want, len(messages), recs[0].PromptTokens)
			}
			if got := learned[other]; got != 4 {
				t.Errorf("%s, which did not serve, has %.3f bytes a token, want the default 4", other, got)
			}
		})
	}
}

// TestMessagesSystemPromptAffinity checks that the Messages API's system
// prompt, which its body keeps apart from the messages, leads the prompt
// the scheduler places by. With spread off, the conversations of an app
// that share a long system prompt all go to the backend holding it,
// although their first messages differ, where the messages alone would be
// drawn at random among idle backends. With spread on (the default), an
// idle fleet's backends each receive the app's system prompt, as its
// conversations open. Either way a later turn stays with its conversation,
// whose first question only its server holds.
func TestMessagesSystemPromptAffinity(t *testing.T) {
	for _, spread := range []string{"off", "on"} {
		t.Run("spread "+spread, func(t *testing.T) {
			// Spreading needs each server's cache size, from its metrics.
			nodes := newNodes(t, simulated.Options{Engine: simulated.Engine{KVCacheBlocks: 4096}}, "v1", "v2", "v3")
			h := newHarness(t, harnessOptions{
				backends: sameSpecs("messages: translate\nmetrics: {interval: 10ms}", nodes...),
				models:   "  - name: m\n    backends: [v1, v2, v3]\n    routing: {spread: " + spread + "}\n",
			})
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				known := 0
				for _, b := range h.reg.Backends() {
					if b.PrefixCacheTokens() > 0 {
						known++
					}
				}
				if known == len(nodes) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d backends' cache sizes read from their metrics", known, len(nodes))
				}
			}
			const apps, conversations = 2, 6
			sent := 0
			post := func(system string, msgs ...string) accounting.Record {
				t.Helper()
				var turns []string
				for i, m := range msgs {
					turns = append(turns, fmt.Sprintf(`{"role":%q,"content":%q}`, []string{"user", "assistant"}[i%2], m))
				}
				body := fmt.Sprintf(`{"model":"m","max_tokens":2,"system":%q,"messages":[%s]}`, system, strings.Join(turns, ","))
				if r := h.messages("", body); r.status != http.StatusOK || !strings.Contains(string(r.body), `"type":"message"`) {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				sent++
				return h.recorder.wait(t, sent)
			}
			for app := range apps {
				system := fmt.Sprintf("You are the assistant of app %d. ", app) + strings.Repeat("Answer in one short sentence, politely. ", 80)
				first := post(system, fmt.Sprintf("App %d, conversation 0: what is a prime?", app)).Backend
				reached := map[string]bool{first: true}
				for conv := 1; conv < conversations; conv++ {
					// A question of a few blocks, which the conversation's server
					// alone holds once it has answered it.
					question := fmt.Sprintf("App %d, conversation %d: name a colour.", app, conv) + strings.Repeat(" One that suits a kitchen.", 30)
					opened := post(system, question).Backend
					reached[opened] = true
					if spread == "off" && opened != first {
						t.Errorf("app %d: conversation %d went to %s, its system prompt is on %s", app, conv, opened, first)
					}
					if b := post(system, question, "Blue.", "Another one.").Backend; b != opened {
						t.Errorf("app %d: conversation %d's second turn went to %s, its first to %s", app, conv, b, opened)
					}
				}
				if spread == "on" && len(reached) != len(nodes) {
					t.Errorf("app %d: its conversations opened on %d backends of %d", app, len(reached), len(nodes))
				}
			}
		})
	}
}
