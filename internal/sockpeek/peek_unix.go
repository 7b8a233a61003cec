//go:build linux || darwin || freebsd || netbsd || openbsd

package sockpeek

import (
	"errors"
	"syscall"
)

// Supported says Peek can look at sockets on this platform.
const Supported = true

// Peek looks at the socket fd without blocking and without consuming what
// it holds. It must run where fd stays open, as in syscall.RawConn's
// Control or Read.
func Peek(fd uintptr) (State, error) {
	var b [1]byte
	for {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == nil && n == 0:
			return Closed, nil
		case err == nil:
			return Data, nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			return Empty, nil
		}
		return Failed, err
	}
}
