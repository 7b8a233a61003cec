// Package sockpeek tells what a connected socket holds without reading
// it: nothing yet, bytes, the peer's end, or an error. The gateway looks
// this way at an upstream stream that waits for its next event (to give
// back its read buffer while nothing has come) and at the client of a
// request that waits for its backend (to notice a client that left),
// where a read would take bytes that belong to a later reader.
package sockpeek

// State is what a socket holds.
type State int

const (
	// Empty: nothing to read yet.
	Empty State = iota
	// Data: bytes to read.
	Data
	// Closed: the peer ended its side (a read would return zero bytes).
	Closed
	// Failed: the socket reported an error (ECONNRESET), which Peek
	// returns; like a read, the peek takes the error from the socket.
	Failed
)

func (s State) String() string {
	switch s {
	case Empty:
		return "empty"
	case Data:
		return "data"
	case Closed:
		return "closed"
	case Failed:
		return "failed"
	}
	return "unknown"
}
