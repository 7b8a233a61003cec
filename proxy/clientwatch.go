package proxy

import (
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/openai"
)

// clientPollInterval is how often the client of a request that waits on a
// backend is checked. It bounds how long a non-streamed request keeps a
// backend generating, a queue place or a retry backoff after its client
// has gone: at most twice this long (a request is first checked at the
// first tick after it has waited the interval), plus the time the backend
// takes to notice its connection closed.
const clientPollInterval = 200 * time.Millisecond

// clientWatch watches one request's client connection while the request
// waits: for a backend slot, for a retry backoff, or for a non-streamed
// reply. fasthttp sees a client leave only when a write to it fails, which
// for a non-streamed request is after the whole reply was generated, so the
// watch looks at the socket itself.
//
// A client that half-closes its connection after sending the request (shuts
// down its writing side) counts as gone, as it does for nginx; HTTP clients
// keep their side open while they wait for the answer.
//
// When the client is found gone, gone is closed (for waits to select on)
// and the upstream round trip is aborted. The checks are made by the
// server's clientWatcher.
type clientWatch struct {
	conn  net.Conn
	gone  chan struct{}
	abort backends.Abort

	// started is when the watch began; the watcher looks at a request's
	// client once it has waited clientPollInterval.
	started time.Time
	// prev and next link the watch into its watcher's list, under the
	// watcher's mutex.
	prev, next *clientWatch
	watcher    *clientWatcher
}

// clientWatches recycles watches: a request that is answered quickly costs
// no allocation.
var clientWatches = sync.Pool{New: func() any { return new(clientWatch) }}

// clientWatcher checks the clients of all the requests that wait, from one
// goroutine ticking every clientPollInterval, instead of a timer per
// request: a request that is answered within the interval costs a link into
// a list and an unlink, and no timer. The goroutine runs while requests are
// watched; it exits when the list is empty at a tick, and close stops it.
type clientWatcher struct {
	mu      sync.Mutex
	head    *clientWatch
	running bool
	closed  bool
	// done is closed when the running goroutine exits.
	done chan struct{}
	stop chan struct{}
}

func newClientWatcher() *clientWatcher { return &clientWatcher{stop: make(chan struct{})} }

// watch starts watching ctx's connection for a request that began at
// started (the request's own start: a clock read per request fewer, and a
// few microseconds earlier than the watch, well inside clientPollInterval).
// The caller must call stop on the watch before the request ends.
func (cw *clientWatcher) watch(ctx *fasthttp.RequestCtx, started time.Time) *clientWatch {
	w := clientWatches.Get().(*clientWatch)
	if w.gone == nil || isClosed(w.gone) {
		w.gone = make(chan struct{})
	}
	w.conn, w.started, w.watcher = ctx.Conn(), started, cw
	cw.mu.Lock()
	w.next = cw.head
	if cw.head != nil {
		cw.head.prev = w
	}
	cw.head = w
	if !cw.running && !cw.closed {
		cw.running = true
		cw.done = make(chan struct{})
		go cw.run(cw.done)
	}
	cw.mu.Unlock()
	return w
}

// stop ends the watch; no check of it runs after it returns, and w must
// not be used after.
func (w *clientWatch) stop() {
	cw := w.watcher
	cw.mu.Lock()
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		cw.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	}
	cw.mu.Unlock()
	gone := w.gone
	*w = clientWatch{gone: gone}
	clientWatches.Put(w)
}

// run checks the watched clients at every tick until none is watched or
// the watcher is closed.
func (cw *clientWatcher) run(done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(clientPollInterval)
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			if !cw.check(now) {
				return
			}
		case <-cw.stop:
			return
		}
	}
}

// check looks at the client of every request that has waited an interval,
// and reports whether any request is still watched.
func (cw *clientWatcher) check(now time.Time) bool {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if cw.head == nil {
		cw.running = false
		return false
	}
	for w := cw.head; w != nil; w = w.next {
		if now.Sub(w.started) < clientPollInterval || isClosed(w.gone) {
			continue
		}
		if connClosed(w.conn) {
			close(w.gone)
			w.abort.Abort()
		}
	}
	return true
}

// close stops the watcher's goroutine and waits for it; requests watched
// after it are not checked. The server calls it at shutdown.
func (cw *clientWatcher) close() {
	cw.mu.Lock()
	if cw.closed {
		cw.mu.Unlock()
		return
	}
	cw.closed = true
	close(cw.stop)
	done := cw.done
	cw.mu.Unlock()
	if done != nil {
		<-done
	}
}

// left reports whether the client was found gone.
func (w *clientWatch) left() bool {
	select {
	case <-w.gone:
		return true
	default:
		return false
	}
}

// sleep waits d, or less if the client leaves or the server shuts down
// (shutdown is ctx.Done()). It reports whether the whole wait passed.
func (w *clientWatch) sleep(d time.Duration, shutdown <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.gone:
		return false
	case <-shutdown:
		return false
	}
}

// netConner is a connection wrapping another (countedConn, tls.Conn).
type netConner interface{ NetConn() net.Conn }

// connClosed reports whether the peer of c has closed or reset its side.
// It looks without consuming anything (a pipelined next request stays
// where it is); where the socket cannot be inspected it answers false.
func connClosed(c net.Conn) bool {
	for {
		u, ok := c.(netConner)
		if !ok {
			break
		}
		c = u.NetConn()
	}
	return peerClosed(c)
}

// waitError is the error a request ends with when a wait of it was cut
// short: its client left, or the server is shutting down.
func (w *clientWatch) waitError() *openai.Error {
	if w.left() {
		return &openai.Error{Status: statusClientClosed, Type: "api_error", Code: "client_closed",
			Message: "The client closed the connection while the request waited for a backend."}
	}
	return &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "shutting_down",
		Message: "The gateway is shutting down; retry shortly.", RetryAfter: time.Second}
}

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
