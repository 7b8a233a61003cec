package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-dev/tollgate/accounting"
)

func testRing(size int) *recordRing {
	return newRecordRing(size, 1,
		prometheus.NewCounter(prometheus.CounterOpts{Name: "full"}),
		prometheus.NewCounter(prometheus.CounterOpts{Name: "shutdown"}))
}

// calls collects the call ids of the records built, in order.
type calls struct {
	mu  sync.Mutex
	ids []string
}

func (c *calls) build(rec *accounting.Record) {
	c.mu.Lock()
	c.ids = append(c.ids, rec.CallID)
	c.mu.Unlock()
}

func (c *calls) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.ids, ",")
}

func pushN(r *recordRing, from, to int) (pushed []bool) {
	for i := from; i <= to; i++ {
		pushed = append(pushed, r.push(&accounting.Record{CallID: fmt.Sprint(i), Output: []byte("reply")}))
	}
	return pushed
}

// TestRecordRingOrderAndFull checks that records are built in the order
// pushed, across the ring's wrap, that a full ring refuses a record and
// counts it, and that a built record's slot is cleared.
func TestRecordRingOrderAndFull(t *testing.T) {
	r := testRing(5)
	var got calls
	if fmt.Sprint(pushN(r, 1, 3)) != "[true true true]" {
		t.Fatal("a ring with room refused a record")
	}
	if !r.drain(got.build) || got.String() != "1,2,3" {
		t.Fatalf("built %q, want 1,2,3", got.String())
	}
	// head is now 3: these wrap, and the sixth finds the ring full.
	if p := fmt.Sprint(pushN(r, 4, 9)); p != "[true true true true true false]" {
		t.Errorf("pushes %s, want five taken and the sixth refused", p)
	}
	if n := testutil.ToFloat64(r.full); n != 1 {
		t.Errorf("queue_full counted %v, want 1", n)
	}
	if r.slots[0].Output != nil {
		t.Errorf("a queued record kept its payload")
	}
	if !r.drain(got.build) || got.String() != "1,2,3,4,5,6,7,8" {
		t.Errorf("built %q, want 1 to 8 in order", got.String())
	}
	for i, s := range r.slots {
		if s.CallID != "" {
			t.Errorf("slot %d still holds call %q once built", i, s.CallID)
		}
	}
	if r.drain(got.build) {
		t.Errorf("drain of an empty ring built something")
	}
}

// TestRecordRingConcurrentOrder checks, under the race detector, that
// what one producer pushes while the consumer runs is built in order, and
// that every record is either built or counted.
func TestRecordRingConcurrentOrder(t *testing.T) {
	r := testRing(16)
	var got calls
	go r.run(got.build, nil, func() {})
	const n = 2000
	pushed := 0
	for i := 1; i <= n; i++ {
		if r.push(&accounting.Record{CallID: fmt.Sprint(i)}) {
			pushed++
		}
	}
	if err := r.close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	if len(got.ids) != pushed || float64(n-pushed) != testutil.ToFloat64(r.full) {
		t.Errorf("%d built and %v dropped of %d pushed, %d taken", len(got.ids), testutil.ToFloat64(r.full), n, pushed)
	}
	last := 0
	for _, id := range got.ids {
		var k int
		fmt.Sscan(id, &k)
		if k <= last {
			t.Fatalf("built %d after %d", k, last)
		}
		last = k
	}
}

// blocked is a build that waits, on its first record, until released.
type blocked struct {
	calls
	started, release chan struct{}
	once             sync.Once
}

func newBlocked() *blocked {
	return &blocked{started: make(chan struct{}), release: make(chan struct{})}
}

func (b *blocked) build(rec *accounting.Record) {
	b.once.Do(func() {
		close(b.started)
		<-b.release
	})
	b.calls.build(rec)
}

// TestRecordRingCloseDrains checks that close builds everything queued
// before it returns, stops the consumer, and refuses (and counts) records
// pushed after it began.
func TestRecordRingCloseDrains(t *testing.T) {
	r := testRing(8)
	b := newBlocked()
	go r.run(b.build, nil, func() {})
	pushN(r, 1, 1)
	<-b.started
	pushN(r, 2, 5)
	closed := make(chan error, 1)
	go func() { closed <- r.close(context.Background()) }()
	waitFor(t, "close to refuse pushes", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.closed
	})
	if r.push(&accounting.Record{CallID: "late"}) {
		t.Errorf("a record was taken after close began")
	}
	close(b.release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	default:
		t.Fatal("close returned with the consumer running")
	}
	if b.calls.String() != "1,2,3,4,5" {
		t.Errorf("built %q, want 1 to 5", b.calls.String())
	}
	if n := testutil.ToFloat64(r.shutdown); n != 1 {
		t.Errorf("shutdown counted %v, want the late record", n)
	}
}

// TestRecordRingCloseAbandons checks that when close's context ends
// first, what is left is counted as dropped, and close still returns only
// once the consumer has.
func TestRecordRingCloseAbandons(t *testing.T) {
	r := testRing(8)
	b := newBlocked()
	go r.run(b.build, nil, func() {})
	pushN(r, 1, 1)
	<-b.started
	pushN(r, 2, 4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	go func() {
		waitFor(t, "close to abandon", r.abandon.Load)
		close(b.release)
	}()
	if err := r.close(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("close = %v, want the context's error", err)
	}
	select {
	case <-r.done:
	default:
		t.Fatal("close returned with the consumer running")
	}
	if b.calls.String() != "1" || testutil.ToFloat64(r.shutdown) != 3 {
		t.Errorf("built %q and dropped %v, want 1 built and 3 dropped", b.calls.String(), testutil.ToFloat64(r.shutdown))
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("timed out waiting for %s", what)
			return
		}
	}
}

// discard is a usage recorder that keeps nothing.
type discard struct{}

func (discard) Record(accounting.Record) {}

// TestRecordAllocatesNothing checks that with export on, the decorator's
// Record, which runs on the request goroutine, only copies the record into
// the ring. The ring's consumer is not started, since AllocsPerRun counts
// every goroutine's allocations; BenchmarkBuildSpan measures it.
func TestRecordAllocatesNothing(t *testing.T) {
	e := &Exporter{records: testRing(4096)}
	rec := e.Recorder(discard{})
	now := time.Now()
	r := accounting.Record{CallID: "c", Model: "demo", Team: "acme", Status: 200, Started: now, Ended: now,
		Attempts: []accounting.Attempt{{Backend: "bad"}}, Input: []byte("{}")}
	if n := testing.AllocsPerRun(1000, func() { rec.Record(r) }); n != 0 {
		t.Errorf("Record allocated %v times per call", n)
	}
	if e.records.n != 1001 {
		t.Errorf("%d records queued, want 1001", e.records.n)
	}
}

// TestRecordRingWakesAtThreshold checks that the consumer is woken only
// once wakeAt records are queued, and that a tick takes what is queued
// before then and flushes.
func TestRecordRingWakesAtThreshold(t *testing.T) {
	r := newRecordRing(8, 3,
		prometheus.NewCounter(prometheus.CounterOpts{Name: "full"}),
		prometheus.NewCounter(prometheus.CounterOpts{Name: "shutdown"}))
	pushN(r, 1, 2)
	if len(r.wake) != 0 {
		t.Fatal("woken with 2 records queued, below wakeAt 3")
	}
	pushN(r, 3, 3)
	if len(r.wake) != 1 {
		t.Fatal("not woken with wakeAt records queued")
	}
	<-r.wake

	var got calls
	tick := make(chan time.Time)
	flushed := make(chan string, 4)
	go r.run(got.build, tick, func() { flushed <- got.String() })
	waitFor(t, "the woken consumer to build", func() bool { return got.String() == "1,2,3" })
	pushN(r, 4, 4)
	tick <- time.Now()
	if f := <-flushed; f != "1,2,3,4" {
		t.Errorf("flushed after %q, want the record queued below wakeAt built first", f)
	}
	if err := r.close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f := <-flushed; f != "1,2,3,4" {
		t.Errorf("close flushed after %q", f)
	}
}
