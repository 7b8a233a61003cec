package proxy

import (
	"net"
	"syscall"

	"github.com/tollgate-dev/tollgate/internal/sockpeek"
)

// peerClosed reports whether the peer of c has ended its side (FIN) or
// reset it, looking without consuming: pending bytes, or nothing to read,
// mean it is still there. Where sockets cannot be peeked at it answers
// false, and a client that leaves is noticed only when the reply is
// written, as fasthttp does. Control, not Read, runs the peek, because
// Read fails once the connection's read deadline (set by fasthttp for the
// request) has passed.
func peerClosed(c net.Conn) bool {
	if !sockpeek.Supported {
		return false
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var st sockpeek.State
	err = rc.Control(func(fd uintptr) { st, _ = sockpeek.Peek(fd) })
	// ECONNRESET, ENOTCONN, EBADF (Failed): nobody to answer.
	return err == nil && (st == sockpeek.Closed || st == sockpeek.Failed)
}
