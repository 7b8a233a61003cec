// Package handover holds what a stream written on its client's connection
// by a goroutine of its own needs, once fasthttp has handed the connection
// over (Hijack with KeepHijackedConns): taking the connection, framing the
// events as chunks, and growing the goroutine's stack before it writes its
// first events and before it serves the connection's next requests. The
// gateway's streams (proxy) use it, and so does the bare proxy that holds
// its streams the same way (internal/bare).
package handover

import "net"

// StopRead makes a read of conn that is waiting, or comes later, return at
// once with a timeout: how a server ends a wait for a request on a
// connection it is closing.
func StopRead(conn net.Conn) error { return conn.SetReadDeadline(aLongTimeAgo) }

// PutChunkSize writes the chunk size line for n bytes ("1a2\r\n", RFC 9112
// section 7.1) at the end of dst, and returns its length.
func PutChunkSize(dst []byte, n int) int {
	const hex = "0123456789abcdef"
	i := len(dst) - 2
	dst[i], dst[i+1] = '\r', '\n'
	for {
		i--
		dst[i] = hex[n&0xf]
		n >>= 4
		if n == 0 {
			break
		}
	}
	return len(dst) - i
}

// RequestStack is what GrowStack leaves free above its caller, the
// server's first read of a request on a connection served again after a
// stream: enough for the gateway's request path, streamed or not, with the
// first events written from the handler (half as much was not). The
// stack then holds at least 16 KiB, which the runtime takes from
// its per-processor cache. It is given back when the goroutine exits, once
// a stream's request has handed the connection on; a goroutine that goes
// on serving the connection has it halved by each collection while it
// idles, as fasthttp's workers do.
//
// A stream's goroutine begins with a small stack, and while it waits the
// stack stays as small as the wait. A request path that grows it at its
// deepest point copies every frame below it, a copy each stream would
// add to its client's time to first event.
const RequestStack = 8 << 10

// GrowStack grows the calling goroutine's stack to hold RequestStack more
// bytes than it uses now, in one copy of the frames below it: its frame
// is that large, and the runtime grows a stack to fit a frame before the
// frame runs. Writing at i and reading the far end keeps the compiler from
// doing without the frame.
//
//go:noinline
func GrowStack(i int) byte {
	var frame [RequestStack]byte
	frame[i] = 1
	return frame[len(frame)-1]
}

// EventStack is what GrowEventStack leaves free above its caller, a
// stream's goroutine about to write its first events: enough to read,
// process and write an event, whose deepest calls outgrow the stack a
// goroutine begins with. Grown from the goroutine's first frames, the
// stack is copied once with only those frames in it, and then holds
// twice what a goroutine begins with, as a stream's stack does between its
// events anyway.
const EventStack = 2 << 10

// GrowEventStack is GrowStack for EventStack.
//
//go:noinline
func GrowEventStack(i int) byte {
	var frame [EventStack]byte
	frame[i] = 1
	return frame[len(frame)-1]
}
