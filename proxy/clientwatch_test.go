package proxy

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A request answered before the first check costs no allocation and no
// timer for its client watch: the watch is recycled and the watcher's one
// goroutine does the checks.
func TestClientWatchAllocatesNothing(t *testing.T) {
	cw := newClientWatcher()
	defer cw.close()
	var ctx fasthttp.RequestCtx
	cw.watch(&ctx, time.Now()).stop()
	if n := testing.AllocsPerRun(100, func() { cw.watch(&ctx, time.Now()).stop() }); n != 0 {
		t.Errorf("watch and stop allocate %.1f times, want 0", n)
	}
}

// Watches leave the list in any order, and the watcher's goroutine stops
// with close even while requests are watched.
func TestClientWatcherList(t *testing.T) {
	cw := newClientWatcher()
	var ctx fasthttp.RequestCtx
	a, b, c := cw.watch(&ctx, time.Now()), cw.watch(&ctx, time.Now()), cw.watch(&ctx, time.Now())
	count := func() int {
		cw.mu.Lock()
		defer cw.mu.Unlock()
		n := 0
		for w := cw.head; w != nil; w = w.next {
			n++
		}
		return n
	}
	if n := count(); n != 3 {
		t.Fatalf("%d watches listed, want 3", n)
	}
	b.stop()
	if n := count(); n != 2 {
		t.Fatalf("after stopping the middle one: %d listed, want 2", n)
	}
	c.stop()
	a.stop()
	if n := count(); n != 0 {
		t.Fatalf("after stopping all: %d listed, want 0", n)
	}
	d := cw.watch(&ctx, time.Now())
	cw.close() // returns once the goroutine has exited; goleak checks it
	d.stop()
	cw.close()
}

// TestClientWatchSleep checks that a backoff ends with shutdown and with
// the client, and runs its course otherwise.
func TestClientWatchSleep(t *testing.T) {
	w := &clientWatch{gone: make(chan struct{})}
	if !w.sleep(time.Millisecond, nil) {
		t.Error("a short sleep did not run its course")
	}
	shutdown := make(chan struct{})
	close(shutdown)
	if w.sleep(time.Hour, shutdown) {
		t.Error("a sleep went on through shutdown")
	}
	if e := w.waitError(); e.Status != 503 || e.Code != "shutting_down" {
		t.Errorf("shutdown error = %+v", e)
	}
	close(w.gone)
	if w.sleep(time.Hour, nil) {
		t.Error("a sleep went on after the client left")
	}
	if e := w.waitError(); e.Status != statusClientClosed {
		t.Errorf("client-gone error = %+v", e)
	}
}
