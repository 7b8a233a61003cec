package backends

import (
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

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
