// Package bufpool holds the pooled byte buffers a stream is scanned and
// relayed in: the upstream event scanner (openai.EventScanner) and the
// stream body that writes to the client (proxy) take them from the same
// classes, so a buffer one gives back serves the other.
package bufpool

import "sync"

// Largest is the size of the largest class: the default bound on one
// upstream event (openai.MaxEventBytes), so that an event of any size the
// default allows is handled in a pooled buffer.
const Largest = 1 << 20

// Small is the size of the smallest class, what a scan starts with: it
// holds several chat chunks, which are a few hundred bytes each.
const Small = 4 << 10

// classes are the sizes of the pooled buffers. The larger ones serve large
// events (a Responses API stream's response.completed carries the whole
// response) for as long as they are being handled.
var classes = [...]int{Small, 16 << 10, 64 << 10, 256 << 10, Largest}

// pools hold the buffers of each class, by pointer so that Put does not
// allocate.
var pools [len(classes)]sync.Pool

// Get returns a buffer of at least n bytes and its pool entry for Put;
// past the largest class the buffer is allocated, and the entry is nil.
func Get(n int) ([]byte, *[]byte) {
	for i, size := range classes {
		if n <= size {
			bp, ok := pools[i].Get().(*[]byte)
			if !ok {
				b := make([]byte, size)
				bp = &b
			}
			return *bp, bp
		}
	}
	return make([]byte, n), nil
}

// Put gives back a buffer from Get; nil does nothing.
func Put(bp *[]byte) {
	if bp == nil {
		return
	}
	for i, size := range classes {
		if cap(*bp) == size {
			*bp = (*bp)[:size]
			pools[i].Put(bp)
			return
		}
	}
}
