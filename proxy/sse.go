package proxy

import (
	"bytes"
	"errors"
	"io"
	"math"
	"sync"
)

// maxEventBytes bounds one upstream SSE event when the scanner is given no
// limit (server.max_event_bytes sets it). A chunk of a chat completion is a
// few hundred bytes; an event this large means the upstream is not
// speaking SSE, and buffering it further would let it exhaust memory.
const maxEventBytes = 1 << 20

// errEventTooLarge is returned when an upstream event exceeds the limit.
var errEventTooLarge = errors.New("upstream SSE event exceeds server.max_event_bytes")

// eventScanner splits an upstream SSE byte stream into events, each ending
// with a blank line. It returns slices of its buffer, valid until the next
// call, so scanning allocates nothing.
//
// The buffer is held only while it holds bytes: an incomplete event, or
// events not yet taken. A stream idles between events, often for seconds,
// so release gives the buffer back to a pool once it is drained, and
// nextInto waits for the next bytes in the caller's buffer rather than in
// one of its own: an idle stream holds no scanning buffer.
type eventScanner struct {
	src io.Reader
	buf []byte
	// pooled is buf's pool entry (see getBuf); nil when buf is not from
	// a pool.
	pooled *[]byte
	start  int // first byte not yet returned
	end    int // end of the bytes read from src
	// scanned is how far past start the search for the end of the
	// unfinished event has got, so each read only searches the new bytes:
	// rescanning from the event's start would be quadratic in its size.
	scanned int
	err     error
	// limit is the largest event in bytes; zero means maxEventBytes.
	limit int
	// one is what await reads into.
	one [1]byte
}

// bufClasses are the sizes of the pooled buffers that streams scan and
// process events in. The first holds several chat chunks, which are a few
// hundred bytes each; the others serve large events (a Responses API
// stream's response.completed carries the whole response), up to the
// default max_event_bytes, for as long as they are being handled.
var bufClasses = [...]int{4 << 10, 16 << 10, 64 << 10, 256 << 10, maxEventBytes}

// bufPools hold the buffers of each class, by pointer so that Put does
// not allocate.
var bufPools [len(bufClasses)]sync.Pool

// scanBufSize is the size of the buffer a scan starts with.
var scanBufSize = bufClasses[0]

// getBuf returns a buffer of at least n bytes and its pool entry for
// putBuf; past the largest class the buffer is allocated, and the entry
// is nil.
func getBuf(n int) ([]byte, *[]byte) {
	for i, size := range bufClasses {
		if n <= size {
			bp, ok := bufPools[i].Get().(*[]byte)
			if !ok {
				b := make([]byte, size)
				bp = &b
			}
			return *bp, bp
		}
	}
	return make([]byte, n), nil
}

// putBuf gives back a buffer from getBuf; nil does nothing.
func putBuf(bp *[]byte) {
	if bp == nil {
		return
	}
	for i, size := range bufClasses {
		if cap(*bp) == size {
			*bp = (*bp)[:size]
			bufPools[i].Put(bp)
			return
		}
	}
}

// minScratch is the smallest caller's buffer nextInto waits in; with a
// smaller one it reads into its own.
const minScratch = 512

func (s *eventScanner) reset(src io.Reader) {
	s.src = src
	s.start, s.end, s.scanned = 0, 0, 0
	s.err = nil
	s.release()
}

// release gives the buffer back once nothing in it is pending.
func (s *eventScanner) release() {
	if s.start != s.end || s.buf == nil {
		return
	}
	putBuf(s.pooled)
	s.buf, s.pooled = nil, nil
	s.start, s.end, s.scanned = 0, 0, 0
}

// acquire makes sure there is a buffer; one from the pool is cut to the
// limit when the limit is smaller.
func (s *eventScanner) acquire() {
	if s.buf != nil {
		return
	}
	b, bp := getBuf(scanBufSize)
	s.buf, s.pooled = b[:min(len(b), s.maxEvent())], bp
}

func (s *eventScanner) maxEvent() int {
	if s.limit > 0 {
		return s.limit
	}
	return maxEventBytes
}

// next returns the next complete event, including its terminating blank
// line. At the end of the stream it returns the error that ended it (io.EOF
// for a clean end) together with any bytes of an unfinished event.
func (s *eventScanner) next() ([]byte, error) { return s.nextInto(nil) }

// nextInto is next, waiting for the upstream's next bytes in scratch when
// nothing is pending, so that the wait holds no buffer of the scanner's;
// what arrived is then copied into the scanner's buffer, and scratch is
// free again when nextInto returns.
func (s *eventScanner) nextInto(scratch []byte) ([]byte, error) {
	for {
		if ev := s.buffered(); ev != nil {
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

// drained reports whether the scanner has read and returned everything
// so far: the next event needs the upstream's next bytes.
func (s *eventScanner) drained() bool { return s.start == s.end && s.err == nil }

// await blocks, when nothing is pending, until the upstream's next byte
// has come, or its end, holding no buffer while it waits: the byte is read
// into the scanner itself (what came with it waits in the upstream
// connection's read buffer), and a buffer is taken once it is there.
func (s *eventScanner) await() {
	if !s.drained() {
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
func (s *eventScanner) fillFrom(scratch []byte) {
	n, err := s.src.Read(scratch[:min(len(scratch), scanBufSize, s.maxEvent())])
	if n > 0 {
		s.acquire()
		s.start, s.scanned = 0, 0
		s.end = copy(s.buf, scratch[:n])
	}
	if err != nil {
		s.err = err
	}
}

// buffered returns the next complete event already in the buffer, or nil,
// without reading from src. The proxy uses it to send events that arrived
// together in one write, without waiting for more.
func (s *eventScanner) buffered() []byte { return s.bufferedUpTo(math.MaxInt) }

// bufferedUpTo is buffered for an event of at most max bytes: a longer one
// is left in the buffer, for the next call.
func (s *eventScanner) bufferedUpTo(max int) []byte {
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
func (s *eventScanner) fill() {
	s.acquire()
	if s.start > 0 && s.start == s.end {
		s.start, s.end = 0, 0
	}
	if s.end == len(s.buf) {
		switch {
		case s.start > 0:
			s.end = copy(s.buf, s.buf[s.start:s.end])
			s.start = 0
		case len(s.buf) >= s.maxEvent():
			s.err = errEventTooLarge
			return
		default:
			// The buffer never grows past the limit, so an event of
			// exactly the limit fits and one byte more is refused.
			nb, bp := getBuf(min(2*len(s.buf), s.maxEvent()))
			nb = nb[:min(len(nb), s.maxEvent())]
			s.end = copy(nb, s.buf[s.start:s.end])
			s.start = 0
			putBuf(s.pooled)
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

// eventData returns the offsets of the payload of an event with exactly one
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
