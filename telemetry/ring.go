package telemetry

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/accounting"
)

// recordRing carries records from the request goroutines to the one
// goroutine that makes spans of them (see batcher). Its slots are allocated once, so a
// push is a copy under a mutex and never allocates; a full ring drops the
// record and counts it rather than make the request wait.
//
// The consumer builds from the slots in place: a slot stays counted in n
// until its span is built, so no producer writes it meanwhile, and the
// mutex orders each producer's copy before the consumer's read.
type recordRing struct {
	mu    sync.Mutex
	slots []accounting.Record
	// slots[head], and the n-1 after it (wrapping), are queued, oldest
	// first.
	head, n int
	// closed refuses pushes once Close has begun.
	closed bool
	// wake tells the consumer the ring holds wakeAt records; one pending
	// wake is enough, since the consumer takes everything queued. Fewer
	// wait for the consumer's tick: waking a parked goroutine for each
	// record costs more CPU than building its span.
	wake   chan struct{}
	wakeAt int
	// stop is closed by Close: drain what is queued, then return. abandon
	// makes the consumer drop what is left instead, when Close's context
	// ends first; ctx ends then too, for the consumer's calls to end.
	stop    chan struct{}
	abandon atomic.Bool
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}

	full, shutdown prometheus.Counter
}

// newRecordRing makes a ring of size slots whose consumer is woken when
// wakeAt (at most size) are queued.
func newRecordRing(size, wakeAt int, full, shutdown prometheus.Counter) *recordRing {
	ctx, cancel := context.WithCancel(context.Background())
	return &recordRing{
		slots:  make([]accounting.Record, size),
		wake:   make(chan struct{}, 1),
		wakeAt: min(wakeAt, size),
		stop:   make(chan struct{}),
		ctx:    ctx, cancel: cancel,
		done: make(chan struct{}),
		full: full, shutdown: shutdown,
	}
}

// push queues a copy of rec without its payloads, which no span carries;
// false when the ring is full or closed (the record is counted).
func (r *recordRing) push(rec *accounting.Record) bool {
	r.mu.Lock()
	if r.closed || r.n == len(r.slots) {
		closed := r.closed
		r.mu.Unlock()
		if closed {
			r.shutdown.Inc()
		} else {
			r.full.Inc()
		}
		return false
	}
	s := &r.slots[(r.head+r.n)%len(r.slots)]
	*s = *rec
	s.Input, s.Output = nil, nil
	r.n++
	wake := r.n == r.wakeAt
	r.mu.Unlock()
	if wake {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// run hands every record pushed to build, in order, until Close; it is
// the ring's one consumer. It takes the records queued when wakeAt are,
// and when tick fires (a nil tick never does), then calls flush; and once
// the last records are built at Close, it calls flush.
func (r *recordRing) run(build func(*accounting.Record), tick <-chan time.Time, flush func()) {
	defer close(r.done)
	defer r.cancel()
	for {
		if r.drain(build) {
			continue
		}
		select {
		case <-r.wake:
		case <-tick:
			r.drain(build)
			flush()
		case <-r.stop:
			// Close refuses pushes before it stops the consumer, so one
			// last drain takes everything.
			r.drain(build)
			flush()
			return
		}
	}
}

// drain builds what is queued now; false when nothing was. Once abandon
// is set, what is left is counted as dropped instead.
func (r *recordRing) drain(build func(*accounting.Record)) bool {
	r.mu.Lock()
	head, n := r.head, r.n
	r.mu.Unlock()
	if n == 0 {
		return false
	}
	for i := range n {
		if r.abandon.Load() {
			r.shutdown.Add(float64(n - i))
			break
		}
		build(&r.slots[(head+i)%len(r.slots)])
	}
	r.mu.Lock()
	for i := range n {
		// The strings of a built record must not stay reachable from its
		// slot until a push overwrites it.
		r.slots[(head+i)%len(r.slots)] = accounting.Record{}
	}
	r.head, r.n = (head+n)%len(r.slots), r.n-n
	r.mu.Unlock()
	return true
}

// close refuses further pushes and waits for the consumer to build what
// was queued and return; if ctx ends first, the rest is dropped (and
// counted) and close still waits for the consumer, which then returns
// after the span it is building.
func (r *recordRing) close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		<-r.done
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	close(r.stop)
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		r.abandon.Store(true)
		r.cancel()
		<-r.done
		return ctx.Err()
	}
}
