package backends

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/sockpeek"
)

// timeoutConn enforces the per-phase upstream timeouts that fasthttp's
// HostClient cannot express: fasthttp sets one read deadline per request,
// which would cut a long stream at ReadTimeout. Instead every Read gets a
// fresh deadline — the first-byte timeout while a response is awaited, the
// idle timeout afterwards — never later than the request's own deadline
// (the total timeout) that fasthttp sets through SetReadDeadline.
//
// The read deadline is applied by Read, not by SetReadDeadline: every
// Read sets its own anyway, and each setting costs a timer update in the
// runtime's poller, so passing the request's deadline straight through
// would be undone by the very next Read. SetReadDeadline records it, and
// Read applies whichever deadline is due, only when it is not the one
// already on the connection.
//
// fasthttp writes a request and then reads its response from one goroutine,
// so the fields need no locking.
type timeoutConn struct {
	net.Conn
	firstByte time.Duration
	idle      time.Duration
	hard      time.Time
	awaiting  bool
	// applied is the read deadline last set on Conn.
	applied time.Time
	// raw is Conn's socket, for awaitReadable; nil until first asked
	// for, and when Conn has none. readable is c.peek, bound once.
	raw      syscall.RawConn
	readable func(fd uintptr) bool
	// peekErr is the error the socket reported to peek; waitErr is why
	// awaitReadable's wait failed, for the next Read to return.
	peekErr error
	waitErr error
}

func (c *timeoutConn) Write(p []byte) (int, error) {
	// A request is going out: the next read waits for its first byte.
	c.awaiting = true
	return c.Conn.Write(p)
}

func (c *timeoutConn) SetReadDeadline(t time.Time) error {
	c.hard = t
	return nil
}

func (c *timeoutConn) SetDeadline(t time.Time) error {
	c.hard = t
	return c.Conn.SetWriteDeadline(t)
}

func (c *timeoutConn) Read(p []byte) (int, error) {
	if err := c.waitErr; err != nil {
		c.waitErr = nil
		return 0, err
	}
	if err := c.applyReadDeadline(); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaiting = false
	}
	return n, err
}

// applyReadDeadline sets the deadline of a read starting now on Conn.
func (c *timeoutConn) applyReadDeadline() error {
	d := c.idle
	if c.awaiting {
		d = c.firstByte
	}
	dl := c.hard
	if d > 0 {
		if soft := time.Now().Add(d); dl.IsZero() || soft.Before(dl) {
			dl = soft
		}
	}
	if dl.Equal(c.applied) {
		return nil
	}
	if err := c.Conn.SetReadDeadline(dl); err != nil {
		return err
	}
	c.applied = dl
	return nil
}

// canAwait reports whether awaitReadable can wait on Conn: a socket, on a
// platform where it can be peeked at.
func (c *timeoutConn) canAwait() bool {
	if c.raw != nil {
		return true
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !sockpeek.Supported || !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	c.raw, c.readable = raw, c.peek
	return true
}

// peek is the test of raw.Read that ends awaitReadable's wait: true
// unless the socket has nothing to read yet. The socket's error, which a
// peek takes from it as a read would, is kept for the next Read.
func (c *timeoutConn) peek(fd uintptr) bool {
	st, err := sockpeek.Peek(fd)
	if err != nil {
		c.peekErr = err
	}
	return st != sockpeek.Empty
}

// awaitReadable blocks, reading nothing, until Conn has bytes to read, has
// ended or failed, or the deadline a Read started now would have passes;
// the wait's own failure (the deadline, a closed connection, the error the
// socket reported) is what the next Read returns. raw.Read peeks before it
// first waits: the poller reports only what arrives once the wait has
// begun. canAwait must have reported true.
func (c *timeoutConn) awaitReadable() {
	if err := c.applyReadDeadline(); err != nil {
		c.waitErr = err
		return
	}
	err := c.raw.Read(c.readable)
	if err == nil && c.peekErr != nil {
		err, c.peekErr = os.NewSyscallError("read", c.peekErr), nil
	}
	if err != nil {
		c.waitErr = &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
}

// Abort cuts an upstream round trip short from another goroutine, until
// its reply's headers (or its whole body, unless streamed) are in: the
// proxy calls Abort when the client has gone, and the connection the round
// trip is using is closed, which unblocks its read at once and tells the
// backend to stop generating. An Abort is used by one request; its zero
// value is ready.
type Abort struct {
	mu      sync.Mutex
	conn    net.Conn
	aborted bool
	// deadline is the round trip's total deadline, for the transport
	// (fasthttp keeps the request's own timeout unexported).
	deadline time.Time
}

// Abort closes the connection of the round trip in progress, if any, and
// makes any later round trip with it fail before it sends a byte.
func (a *Abort) Abort() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.aborted = true
	if a.conn != nil {
		_ = a.conn.Close() // the round trip sees the close as its error
	}
}

// Aborted reports whether Abort was called.
func (a *Abort) Aborted() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.aborted
}

// bind makes conn the connection Abort closes; false means the request
// was already aborted and must not start.
func (a *Abort) bind(conn net.Conn) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.conn = conn
	return !a.aborted
}

func (a *Abort) unbind() {
	a.mu.Lock()
	a.conn = nil
	a.mu.Unlock()
}

// abortKey is the request user value under which DoAbortable hands its
// *Abort to the transport. *Abort must not implement io.Closer: fasthttp
// closes such user values when it resets a request.
type abortKey struct{}

// abortableTransport is the HostClient's transport. A round trip
// registered with an Abort (see DoAbortable) is run here, on a connection
// the Abort can close until the response headers (and, unless streamed,
// the body) are in; everything else (health probes, stored responses)
// takes fasthttp's own transport. It is fasthttp's transport.RoundTrip
// written against HostClient's exported connection API. A streamed body
// is fasthttp's own body stream, read from the connection; the connection
// is given back by CloseStream, since fasthttp's wrapper that does it is
// not exported.
type abortableTransport struct {
	// streams maps the *fasthttp.Response of an open streamed body to the
	// *openStream holding its connection.
	streams sync.Map
}

func (t *abortableTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (bool, error) {
	abort, ok := req.UserValue(abortKey{}).(*Abort)
	if !ok {
		return fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	}
	cc, err := hc.AcquireConn(time.Until(abort.deadline), req.ConnectionClose())
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	if !abort.bind(conn) {
		abort.unbind()
		hc.CloseConn(cc)
		return false, errAborted
	}
	defer abort.unbind()
	resp.ParseNetConn(conn)
	if err := conn.SetWriteDeadline(abort.deadline); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	bw := hc.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	hc.ReleaseWriter(bw)
	if err != nil {
		hc.CloseConn(cc)
		if abort.Aborted() {
			return false, errAborted
		}
		if isTimeout(err) {
			err = fasthttp.ErrTimeout
		}
		return true, err
	}
	if err := conn.SetReadDeadline(abort.deadline); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	br := hc.AcquireReader(conn)
	err = resp.ReadLimitBody(br, hc.MaxResponseBodySize)
	if err != nil {
		hc.ReleaseReader(br)
		// A body over MaxResponseBodySize is not read further: closing
		// the connection is what stops the backend sending it.
		hc.CloseConn(cc)
		if abort.Aborted() {
			return false, errAborted
		}
		return !errors.Is(err, fasthttp.ErrBodyTooLarge), err
	}
	if resp.StreamBody && resp.BodyStream() != nil {
		t.streams.Store(resp, &openStream{hc: hc, br: br, conn: conn, closeConn: req.ConnectionClose() || resp.ConnectionClose(),
			release: func(closeConn bool) {
				if closeConn {
					hc.CloseConn(cc)
				} else {
					hc.ReleaseConn(cc)
				}
			}})
		return false, nil
	}
	hc.ReleaseReader(br)
	if req.ConnectionClose() || resp.ConnectionClose() {
		hc.CloseConn(cc)
	} else {
		hc.ReleaseConn(cc)
	}
	return false, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Guard applies the server's bounds on upstream replies to the backend's
// client: a non-streamed body over maxResponseBytes fails with a
// TooLargeError (fasthttp stops reading and closes the connection), and a
// non-streamed request can be aborted (see DoAbortable). Streamed bodies
// are bounded per event by the proxy, which reads them.
func (b *Backend) Guard(maxResponseBytes int) {
	b.client.MaxResponseBodySize = maxResponseBytes
	b.client.Transport = &abortableTransport{}
}

// DoAbortable is Do for a request that abort can cut short: once
// abort.Abort is called, until the reply's headers (or, unless streamed,
// its whole body) are in, the upstream connection is closed and
// DoAbortable returns an AbortedError. A streamed body must be closed with
// CloseStream. Without Guard it is Do.
func (b *Backend) DoAbortable(req *fasthttp.Request, resp *fasthttp.Response, abort *Abort) error {
	if _, ok := b.client.Transport.(*abortableTransport); !ok {
		return b.Do(req, resp)
	}
	abort.deadline = time.Now().Add(b.timeouts.Total)
	// The Abort rides on the request itself, where the transport finds
	// it: a map keyed by request would cost an insert and a delete per
	// round trip. It is removed before the request can be reused.
	req.SetUserValue(abortKey{}, abort)
	err := b.client.DoDeadline(req, resp, abort.deadline)
	req.RemoveUserValue(abortKey{})
	return classify(err)
}

// BufferBody reads a streamed response's body (resp.StreamBody was set,
// but the reply is not the stream the caller wanted: an error, or a JSON
// body) into resp, within the same bound as a non-streamed body: past
// MaxResponseBodySize it stops, closes the connection and returns a
// TooLargeError. fasthttp's Response.Body would read such a body whole,
// however long it is. A response without a body stream is left as is.
func (b *Backend) BufferBody(resp *fasthttp.Response) error {
	bs := resp.BodyStream()
	if bs == nil {
		return nil
	}
	limit := b.client.MaxResponseBodySize
	var body []byte
	var err error
	if limit > 0 {
		body, err = io.ReadAll(io.LimitReader(bs, int64(limit)+1))
		if err == nil && len(body) > limit {
			err = fasthttp.ErrBodyTooLarge
		}
	} else {
		body, err = io.ReadAll(bs)
	}
	// Unless the body was read to its end, the connection cannot be
	// reused.
	b.CloseStream(resp, err != nil)
	if err != nil {
		return classify(err)
	}
	resp.SetBodyRaw(body)
	return nil
}

// CloseStream closes the body stream of a streamed response and gives its
// connection back to the pool, or closes it when broken (the body was not
// read to its end: closing is then also what tells the backend to stop).
func (b *Backend) CloseStream(resp *fasthttp.Response, broken bool) {
	if broken {
		resp.SetConnectionClose()
	}
	_ = resp.CloseBodyStream() // fasthttp's own transport gives the connection back here
	t, ok := b.client.Transport.(*abortableTransport)
	if !ok {
		return
	}
	if v, ok := t.streams.LoadAndDelete(resp); ok {
		st := v.(*openStream)
		st.releaseReader()
		st.release(broken || st.closeConn || resp.ConnectionClose())
	}
}
