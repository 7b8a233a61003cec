package proxy

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// overloadedReply is what a connection past server.max_connections gets:
// a complete HTTP response in the OpenAI error shape, with Retry-After so
// that SDKs back off, after which the connection is closed.
var overloadedReply = func() []byte {
	body := `{"error":{"message":"The gateway is at its limit of concurrent connections; retry shortly.","type":"api_error","param":null,"code":"overloaded"}}`
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// limitListener caps the connections open at once. fasthttp's own cap
// (Server.Concurrency) answers a plain-text 503 without Retry-After, which
// clients cannot parse or back off on, so the cap is enforced here and
// fasthttp's is set above it.
//
// It also gives every accepted connection a read deadline of
// server.read_timeout for its first request byte. fasthttp, with
// ReduceMemoryUsage, waits for a new connection's first byte with no
// deadline at all (it sets read_timeout only once that byte came, and
// idle_timeout only before later requests), so a client that connects and
// sends nothing would hold a place under the cap for ever.
type limitListener struct {
	net.Listener
	max       int64
	open      atomic.Int64
	refuse    func(net.Conn)
	firstByte time.Duration
	// idle is the read deadline a connection given back (see giveBack)
	// gets for its next request's first byte, as fasthttp gives any
	// keep-alive connection; zero sets none.
	idle time.Duration

	// Accept returns the connections accepted from the socket by one
	// goroutine (acceptLoop) and those given back, whichever comes first:
	// a blocking Accept cannot otherwise be woken for a given-back one.
	startAccept sync.Once
	accepted    chan acceptResult
	given       chan net.Conn
	// loopDone is closed when acceptLoop has ended, with the socket.
	loopDone chan struct{}
	closed   chan struct{}
	close    sync.Once
}

// acceptResult is what one Accept of the socket returned.
type acceptResult struct {
	c   net.Conn
	err error
}

func newLimitListener(ln net.Listener, max int, firstByte, idle time.Duration) *limitListener {
	l := &limitListener{Listener: ln, max: int64(max), firstByte: firstByte, idle: idle,
		accepted: make(chan acceptResult), given: make(chan net.Conn),
		loopDone: make(chan struct{}), closed: make(chan struct{})}
	l.refuse = func(c net.Conn) {
		// The reply fits in the socket buffer; the deadline only guards
		// against a peer that never reads.
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(overloadedReply)
		_ = c.Close()
	}
	return l
}

// Accept returns the next connection within the cap, or one given back.
// Errors of the socket are passed on as they come, for fasthttp to retry
// or stop on as it would; once the listener is closed it returns
// net.ErrClosed.
func (l *limitListener) Accept() (net.Conn, error) {
	l.startAccept.Do(func() { go l.acceptLoop() })
	select {
	case c := <-l.given:
		return c, nil
	case r := <-l.accepted:
		return r.c, r.err
	case <-l.loopDone:
		return nil, net.ErrClosed
	}
}

// acceptLoop accepts connections from the socket, answering and closing
// those beyond the cap, until the socket is closed.
func (l *limitListener) acceptLoop() {
	defer close(l.loopDone)
	for {
		c, err := l.acceptWithin()
		select {
		case l.accepted <- acceptResult{c, err}:
		case <-l.closed:
			if c != nil {
				_ = c.Close()
			}
			return
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// acceptWithin accepts the next connection within the cap.
func (l *limitListener) acceptWithin() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refuse(c)
			continue
		}
		if l.firstByte > 0 {
			if err := c.SetReadDeadline(time.Now().Add(l.firstByte)); err != nil {
				l.open.Add(-1)
				_ = c.Close()
				continue
			}
		}
		return &countedConn{Conn: c, l: l}, nil
	}
}

// giveBack hands c, a connection of this listener whose response the
// gateway wrote itself (a stream, see streamBody.run), back to the server
// as if newly accepted, so that the client's next request on it is served
// as any other. It reports false once the listener is closed: c is then
// the caller's to close.
func (l *limitListener) giveBack(c net.Conn) bool {
	if l.idle > 0 {
		if err := c.SetReadDeadline(time.Now().Add(l.idle)); err != nil {
			return false
		}
	}
	select {
	case l.given <- c:
		return true
	case <-l.closed:
		return false
	case <-l.loopDone:
		return false
	}
}

// Close closes the socket and waits for the accept loop to end.
func (l *limitListener) Close() error {
	var err error
	l.close.Do(func() {
		close(l.closed)
		err = l.Listener.Close()
		l.startAccept.Do(func() { close(l.loopDone) }) // never started: nothing to wait for
		<-l.loopDone
	})
	return err
}

// countedConn gives its place back to the listener when closed.
type countedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// NetConn returns the accepted connection, for the client watch, which
// checks the socket itself.
func (c *countedConn) NetConn() net.Conn { return c.Conn }
