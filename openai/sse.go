package openai

import (
	"bytes"
	"errors"
	"io"
	"math"

	"github.com/tollgate-dev/tollgate/internal/bufpool"
)

// MaxEventBytes bounds one upstream SSE event when the scanner is given no
// limit (server.max_event_bytes sets it). A streamed chunk is a few hundred
// bytes; an event this large means the upstream is not speaking SSE, and
// buffering it further would let it exhaust memory. It is the largest
// pooled buffer, so that every event it allows is scanned in one.
const MaxEventBytes = bufpool.Largest

// ErrEventTooLarge is returned when an upstream event exceeds the limit.
var ErrEventTooLarge = errors.New("upstream SSE event exceeds server.max_event_bytes")

// EventScanner splits an upstream SSE byte stream into events, each ending
// with a blank line. It returns slices of its buffer, valid until the next
// call, so scanning allocates nothing.
//
// The buffer is held only while it holds bytes: an incomplete event, or
// events not yet taken. A stream idles between events, often for seconds,
// so Release gives the buffer back to a pool once it is drained, and
// NextInto waits for the next bytes in the caller's buffer rather than in
// one of its own: an idle stream holds no scanning buffer.
type EventScanner struct {
	src io.Reader
	buf []byte
	// pooled is buf's pool entry (see bufpool.Get); nil when buf is not from
	// a pool.
	pooled *[]byte
	start  int // first byte not yet returned
	end    int // end of the bytes read from src
	// scanned is how far past start the search for the end of the
	// unfinished event has got, so each read only searches the new bytes:
	// rescanning from the event's start would be quadratic in its size.
	scanned int
	err     error
	// limit is the largest event in bytes; zero means MaxEventBytes.
	limit int
	// one is what Await reads into.
	one [1]byte
}

// minScratch is the smallest caller's buffer NextInto waits in; with a
// smaller one it reads into its own.
const minScratch = 512

// Reset starts a scan of src, whose events may be up to limit bytes (zero
// means MaxEventBytes); Reset(nil, 0) gives the buffer back.
func (s *EventScanner) Reset(src io.Reader, limit int) {
	s.src, s.limit = src, limit
	s.start, s.end, s.scanned = 0, 0, 0
	s.err = nil
	s.Release()
}

// Release gives the buffer back once nothing in it is pending.
func (s *EventScanner) Release() {
	if s.start != s.end || s.buf == nil {
		return
	}
	bufpool.Put(s.pooled)
	s.buf, s.pooled = nil, nil
	s.start, s.end, s.scanned = 0, 0, 0
}

// acquire makes sure there is a buffer; one from the pool is cut to the
// limit when the limit is smaller.
func (s *EventScanner) acquire() {
	if s.buf != nil {
		return
	}
	b, bp := bufpool.Get(bufpool.Small)
	s.buf, s.pooled = b[:min(len(b), s.MaxEvent())], bp
}

// MaxEvent is the largest event the scan accepts, in bytes.
func (s *EventScanner) MaxEvent() int {
	if s.limit > 0 {
		return s.limit
	}
	return MaxEventBytes
}

// Next returns the next complete event, including its terminating blank
// line. At the end of the stream it returns the error that ended it (io.EOF
// for a clean end) together with any bytes of an unfinished event.
func (s *EventScanner) Next() ([]byte, error) { return s.NextInto(nil) }

// NextInto is Next, waiting for the upstream's next bytes in scratch when
// nothing is pending, so that the wait holds no buffer of the scanner's;
// what arrived is then copied into the scanner's buffer, and scratch is
// free again when NextInto returns.
func (s *EventScanner) NextInto(scratch []byte) ([]byte, error) {
	for {
		if ev := s.Buffered(); ev != nil {
			return ev, nil
		}
		if s.err != nil {
			if s.buf == nil {
				return nil, s.err
			}
			rest := s.buf[s.start:s.end]
			s.start, s.scanned = s.end, 0
			return rest, s.err
		}
		if s.start == s.end && len(scratch) >= minScratch {
			s.fillFrom(scratch)
			continue
		}
		s.fill()
	}
}

// Drained reports whether the scanner has read and returned everything
// so far: the next event needs the upstream's next bytes.
func (s *EventScanner) Drained() bool { return s.start == s.end && s.err == nil }

// Await blocks, when nothing is pending, until the upstream's next byte
// has come, or its end, holding no buffer while it waits: the byte is read
// into the scanner itself (what came with it waits in the upstream
// connection's read buffer), and a buffer is taken once it is there.
func (s *EventScanner) Await() {
	if !s.Drained() {
		return
	}
	n, err := s.src.Read(s.one[:])
	if n > 0 {
		s.acquire()
		s.buf[0] = s.one[0]
		s.start, s.end, s.scanned = 0, 1, 0
	}
	if err != nil {
		s.err = err
	}
}

// fillFrom reads into scratch and moves what came into the (empty) buffer.
func (s *EventScanner) fillFrom(scratch []byte) {
	n, err := s.src.Read(scratch[:min(len(scratch), bufpool.Small, s.MaxEvent())])
	if n > 0 {
		s.acquire()
		s.start, s.scanned = 0, 0
		s.end = copy(s.buf, scratch[:n])
	}
	if err != nil {
		s.err = err
	}
}

// Buffered returns the next complete event already in the buffer, or nil,
// without reading from src. The proxy uses it to send events that arrived
// together in one write, without waiting for more.
func (s *EventScanner) Buffered() []byte { return s.BufferedUpTo(math.MaxInt) }

// BufferedUpTo is buffered for an event of at most max bytes: a longer one
// is left in the buffer, for the next call.
func (s *EventScanner) BufferedUpTo(max int) []byte {
	if s.start == s.end {
		return nil
	}
	n := eventEnd(s.buf[s.start:s.end], s.scanned)
	if n < 0 {
		s.scanned = s.end - s.start
		return nil
	}
	if n > max {
		return nil
	}
	ev := s.buf[s.start : s.start+n]
	s.start += n
	s.scanned = 0
	return ev
}

// fill reads more bytes from src, compacting or growing the buffer first.
func (s *EventScanner) fill() {
	s.acquire()
	if s.start > 0 && s.start == s.end {
		s.start, s.end = 0, 0
	}
	if s.end == len(s.buf) {
		switch {
		case s.start > 0:
			s.end = copy(s.buf, s.buf[s.start:s.end])
			s.start = 0
		case len(s.buf) >= s.MaxEvent():
			s.err = ErrEventTooLarge
			return
		default:
			// The buffer never grows past the limit, so an event of
			// exactly the limit fits and one byte more is refused.
			nb, bp := bufpool.Get(min(2*len(s.buf), s.MaxEvent()))
			nb = nb[:min(len(nb), s.MaxEvent())]
			s.end = copy(nb, s.buf[s.start:s.end])
			s.start = 0
			bufpool.Put(s.pooled)
			s.buf, s.pooled = nb, bp
		}
	}
	n, err := s.src.Read(s.buf[s.end:])
	s.end += n
	if err != nil {
		s.err = err
	}
}

// eventEnd returns the length of the first event in b, including the blank
// line that ends it ("\n\n", or "\n\r\n" as in "\r\n\r\n"), or -1 when b
// holds no complete event. The first from bytes are known to hold no end,
// so the search resumes just before them (an end may straddle the edge).
func eventEnd(b []byte, from int) int {
	from = max(from-2, 0)
	end := -1
	if i := bytes.Index(b[from:], lfLF); i >= 0 {
		end = from + i + len(lfLF)
	}
	// Only a CRLF end found before an LF one matters.
	limit := len(b)
	if end >= 0 {
		limit = end
	}
	if i := bytes.Index(b[from:limit], lfCRLF); i >= 0 {
		end = from + i + len(lfCRLF)
	}
	return end
}

var (
	lfLF   = []byte("\n\n")
	lfCRLF = []byte("\n\r\n")
)

var (
	dataPrefix = []byte("data:")
	doneData   = []byte("[DONE]")
)

// EventData returns the offsets of the payload of an event with exactly one
// data line, and false for events that have none (comments, keep-alives) or
// several. The payload ev[start:end] excludes the "data:" field name, one
// optional leading space and the line ending.
func eventData(ev []byte) (start, end int, ok bool) {
	if !bytes.HasPrefix(ev, dataPrefix) {
		return 0, 0, false
	}
	start = len(dataPrefix)
	nl := bytes.IndexByte(ev[start:], '\n')
	if nl < 0 {
		return 0, 0, false
	}
	end = start + nl
	// Everything after the data line must be the blank line ending the event.
	if rest := ev[end+1:]; len(rest) > 2 || (len(rest) > 0 && rest[0] != '\n' && rest[0] != '\r') {
		return 0, 0, false
	}
	if end > start && ev[end-1] == '\r' {
		end--
	}
	if end > start && ev[start] == ' ' {
		start++
	}
	return start, end, true
}
