package proxy

import (
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/backends"
)

// clientPollInterval is how often a request that waits on a backend checks
// that its client is still connected. It bounds how long a non-streamed
// request keeps a backend generating, a queue place or a retry backoff
// after its client has gone: at most this long, plus the time the
// backend takes to notice its connection closed.
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
// It costs a timer while the request is fast: the first check runs one
// interval after the request started, on the timer's goroutine, and each
// check arms the next. When the client is found gone, gone is closed (for
// waits to select on) and the upstream round trip is aborted.
type clientWatch struct {
	conn  net.Conn
	gone  chan struct{}
	abort backends.Abort

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// watchClient starts watching ctx's connection. The caller must call stop
// before the request ends.
func watchClient(ctx *fasthttp.RequestCtx) *clientWatch {
	w := &clientWatch{conn: ctx.Conn(), gone: make(chan struct{})}
	w.mu.Lock()
	w.timer = time.AfterFunc(clientPollInterval, w.check)
	w.mu.Unlock()
	return w
}

func (w *clientWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if connClosed(w.conn) {
		close(w.gone)
		w.abort.Abort()
		return
	}
	w.timer.Reset(clientPollInterval)
}

// stop ends the watch; no check runs after it returns.
func (w *clientWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	w.timer.Stop()
	w.mu.Unlock()
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
func (w *clientWatch) waitError() *apiError {
	if w.left() {
		return &apiError{Status: statusClientClosed, Type: "api_error", Code: "client_closed",
			Message: "The client closed the connection while the request waited for a backend."}
	}
	return &apiError{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "shutting_down",
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
