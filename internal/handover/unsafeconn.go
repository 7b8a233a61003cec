package handover

// This file holds the gateway's one use of a fasthttp method that fasthttp
// does not document: hijackConn's UnsafeConn, the socket under the
// connection a Hijack handler gets. It is what lets a stream leave
// fasthttp: with the socket itself, the stream's goroutine writes and
// waits with no fasthttp reader, writer or request context held, and the
// hijack handler returns at once, giving them back to fasthttp's pools
// (BENCHMARKS.md, "What the stream hand-over buys"). Without it, TakeConn
// reports ok false and each stream keeps fasthttp's hijacked connection,
// and with it the buffers, for its life. unsafeconn_test.go fails if a
// fasthttp upgrade renames the method, changes its signature, or returns
// anything but the socket.

import (
	"errors"
	"net"
	"os"
	"time"
)

// unsafeConner is fasthttp's hijacked connection, as TakeConn uses it.
type unsafeConner interface{ UnsafeConn() net.Conn }

// aLongTimeAgo is a read deadline already past: a read with it returns at
// once what is buffered above the socket, and then a timeout.
var aLongTimeAgo = time.Unix(1, 0)

// TakeConn returns the connection under fasthttp's hijacked one, and the
// bytes the client sent after its request (pipelined), which fasthttp's
// reader holds and gives back to its pool once the hijack handler returns.
// Reading the hijacked connection with a deadline already past returns
// those bytes, then a timeout, without reading the socket; scratch is what
// they are read into. ok is false when the connection could not be taken:
// c is then returned as it is, to be closed after the stream.
func TakeConn(c net.Conn, scratch []byte) (conn net.Conn, pipelined []byte, ok bool) {
	u, ok := c.(unsafeConner)
	if !ok {
		return c, nil, false
	}
	conn = u.UnsafeConn()
	if err := conn.SetReadDeadline(aLongTimeAgo); err != nil {
		return c, nil, false
	}
	for {
		n, err := c.Read(scratch)
		pipelined = append(pipelined, scratch[:n]...)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return c, nil, false
			}
			break
		}
	}
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		return c, nil, false
	}
	return conn, pipelined, true
}
