//go:build linux || darwin || freebsd || netbsd || openbsd

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// peerClosed peeks at the socket without blocking or consuming: a read of
// zero bytes is the peer's FIN, ECONNRESET its reset; EAGAIN (nothing to
// read) or pending bytes mean it is still there. Control, not Read, runs
// the peek, because Read fails once the connection's read deadline (set by
// fasthttp for the request) has passed.
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var buf [1]byte
	err = rc.Control(func(fd uintptr) {
		n, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case rerr == nil:
			closed = n == 0
		case errors.Is(rerr, syscall.EAGAIN), errors.Is(rerr, syscall.EINTR):
		default:
			closed = true // ECONNRESET, ENOTCONN, EBADF: nobody to answer
		}
	})
	return err == nil && closed
}
