//go:build linux || darwin || freebsd || netbsd || openbsd

package backends

import (
	"errors"
	"syscall"
)

// canPeek says readable can tell whether a socket has something to read.
const canPeek = true

// readable peeks at a socket, without consuming what it holds: ready is
// false only while there is nothing to read yet (EAGAIN), so that a byte,
// the peer's end (a read of 0) and an error all end a wait. err is the
// error the socket reported (ECONNRESET), which the peek takes from it.
func readable(fd uintptr) (ready bool, err error) {
	var b [1]byte
	_, _, err = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, syscall.EAGAIN):
		return false, nil
	case errors.Is(err, syscall.EINTR):
		return true, nil // the read that follows tries again
	}
	return true, err
}
