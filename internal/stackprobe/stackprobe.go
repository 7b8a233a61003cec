// Package stackprobe tells tests whether a goroutine's stack is copied
// (grown) while a call chain runs, for the code that grows stacks ahead of
// their deepest calls (internal/handover and its callers). It is a leaf
// for tests only.
package stackprobe

import "unsafe"

// Moved runs f and reports whether the calling goroutine's stack was
// copied while it ran: a local's address changes when its stack moves.
//
//go:noinline
func Moved(f func()) bool {
	var marker byte
	at := uintptr(unsafe.Pointer(&marker))
	f()
	return uintptr(unsafe.Pointer(&marker)) != at
}

// frameBytes is the size of Below's frame, less what the call adds.
const frameBytes = 64

// Below calls f (when not nil) under a call chain about depth bytes deep,
// in frames of frameBytes.
func Below(depth int, f func()) { below(depth/frameBytes, f) }

//go:noinline
func below(n int, f func()) byte {
	var frame [frameBytes]byte
	frame[n%frameBytes] = 1
	if n > 1 {
		return below(n-1, f) + frame[frameBytes-1]
	}
	if f != nil {
		f()
	}
	return frame[frameBytes-1]
}
