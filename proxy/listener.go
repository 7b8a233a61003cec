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
type limitListener struct {
	net.Listener
	max    int64
	open   atomic.Int64
	refuse func(net.Conn)
}

func newLimitListener(ln net.Listener, max int) *limitListener {
	l := &limitListener{Listener: ln, max: int64(max)}
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
