package backends

import (
	"net"
	"time"
)

// timeoutConn enforces the per-phase upstream timeouts that fasthttp's
// HostClient cannot express: fasthttp sets one read deadline per request,
// which would cut a long stream at ReadTimeout. Instead every Read gets a
// fresh deadline — the first-byte timeout while a response is awaited, the
// idle timeout afterwards — never later than the request's own deadline
// (the total timeout) that fasthttp sets through SetReadDeadline.
//
// fasthttp writes a request and then reads its response from one goroutine,
// so the fields need no locking.
type timeoutConn struct {
	net.Conn
	firstByte time.Duration
	idle      time.Duration
	hard      time.Time
	awaiting  bool
}

func (c *timeoutConn) Write(p []byte) (int, error) {
	// A request is going out: the next read waits for its first byte.
	c.awaiting = true
	return c.Conn.Write(p)
}

func (c *timeoutConn) SetReadDeadline(t time.Time) error {
	c.hard = t
	return c.Conn.SetReadDeadline(t)
}

func (c *timeoutConn) SetDeadline(t time.Time) error {
	c.hard = t
	return c.Conn.SetDeadline(t)
}

func (c *timeoutConn) Read(p []byte) (int, error) {
	d := c.idle
	if c.awaiting {
		d = c.firstByte
	}
	if d > 0 {
		dl := time.Now().Add(d)
		if !c.hard.IsZero() && c.hard.Before(dl) {
			dl = c.hard
		}
		if err := c.Conn.SetReadDeadline(dl); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaiting = false
	}
	return n, err
}
