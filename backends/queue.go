package backends

import (
	"sync"
	"sync/atomic"
	"time"
)

// slotSignal wakes requests waiting for a backend slot. Waiters take the
// current channel; a release closes it (waking them all to re-check) and
// installs a fresh one. The release path costs one atomic load when nobody
// waits.
type slotSignal struct {
	waiters atomic.Int64
	mu      sync.Mutex
	ch      chan struct{}
}

func newSlotSignal() *slotSignal { return &slotSignal{ch: make(chan struct{})} }

// subscribe registers a waiter and returns the channel that closes on the
// next release. Every subscribe is paired with one unsubscribe.
func (s *slotSignal) subscribe() <-chan struct{} {
	s.waiters.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ch
}

func (s *slotSignal) unsubscribe() { s.waiters.Add(-1) }

func (s *slotSignal) notify() {
	if s.waiters.Load() == 0 {
		return
	}
	s.mu.Lock()
	close(s.ch)
	s.ch = make(chan struct{})
	s.mu.Unlock()
}

// WaitForSlot waits, up to the model's queue wait, for a healthy backend of
// the route to drop below its max_concurrency. It returns false at once
// when the queue is at its depth, and false when the wait runs out or
// either channel closes: gone when the request's client has left, and
// shutdown when the server stops (nil channels never close), so that a
// queued request holds nothing once nobody waits for its answer.
func (r *Route) WaitForSlot(tried Tried, gone, shutdown <-chan struct{}) bool {
	if r.queued.Add(1) > int64(r.queue.Depth) {
		r.queued.Add(-1)
		return false
	}
	defer r.queued.Add(-1)
	defer r.observeQueueWait(time.Now())
	timer := time.NewTimer(r.queue.Wait)
	defer timer.Stop()
	for {
		ch := r.slots.subscribe()
		// Re-check after subscribing, so a release between the caller's
		// failed Pick and the subscription is not missed.
		if !r.Full(tried) {
			r.slots.unsubscribe()
			return true
		}
		select {
		case <-ch:
			r.slots.unsubscribe()
		case <-timer.C:
			r.slots.unsubscribe()
			return false
		case <-gone:
			r.slots.unsubscribe()
			return false
		case <-shutdown:
			r.slots.unsubscribe()
			return false
		}
	}
}
