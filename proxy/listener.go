package proxy

import (
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
}

func newLimitListener(ln net.Listener, max int, firstByte time.Duration) *limitListener {
	l := &limitListener{Listener: ln, max: int64(max), firstByte: firstByte}
	l.refuse = func(c net.Conn) {
		// The reply fits in the socket buffer; the deadline only guards
		// against a peer that never reads.
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(overloadedReply)
		_ = c.Close()
	}
	return l
}

// Accept returns the next connection within the cap, answering and closing
// those beyond it.
func (l *limitListener) Accept() (net.Conn, error) {
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
