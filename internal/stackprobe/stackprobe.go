// Package stackprobe tells tests whether a goroutine's stack is copied
// (grown) while a call chain runs, for the code that grows stacks ahead of
// their deepest calls (internal/handover and its callers). It is a leaf
// for tests only.
package stackprobe

import "unsafe"

// The chain's frames: as many large ones as fit, then small ones, so that
// a depth costs few frames (each adds the call's own bytes beside the
// array) and is still resolved to smallFrame.
const (
	largeFrame = 256
	smallFrame = 64
)

// MovedBelow runs a call chain about depth bytes deep, calls f (when not
// nil) at its bottom, and reports whether the calling goroutine's stack
// was copied meanwhile: a local's address changes when its stack moves.
//
//go:noinline
func MovedBelow(depth int, f func()) bool {
	var marker byte
	at := uintptr(unsafe.Pointer(&marker))
	large(depth/largeFrame, depth%largeFrame/smallFrame, f)
	return uintptr(unsafe.Pointer(&marker)) != at
}

//go:noinline
func large(n, small int, f func()) byte {
	if n == 0 {
		return belowSmall(small, f)
	}
	var frame [largeFrame]byte
	frame[n%largeFrame] = 1
	return large(n-1, small, f) + frame[largeFrame-1]
}

//go:noinline
func belowSmall(n int, f func()) byte {
	if n == 0 {
		if f != nil {
			f()
		}
		return 0
	}
	var frame [smallFrame]byte
	frame[n%smallFrame] = 1
	return belowSmall(n-1, f) + frame[smallFrame-1]
}
