package openai

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/tollgate-dev/tollgate/internal/bufpool"
)

// TestScannerHoldsNoBufferWhileIdle checks that a scan waiting in the
// caller's buffer returns every event whole, however the upstream splits
// its bytes, and holds no buffer of its own once the events read are
// taken: an open stream idles between events, and its memory is what the
// gateway pays per open stream.
func TestScannerHoldsNoBufferWhileIdle(t *testing.T) {
	big := "data: {\"x\":\"" + strings.Repeat("a", 3*bufpool.Small) + "\"}\n\n"
	events := []string{chunkEvent, contEvent, big, usageEvent, doneEvent}
	stream := strings.Join(events, "")
	tests := []struct {
		name string
		src  func() io.Reader
	}{
		{"whole", func() io.Reader { return strings.NewReader(stream) }},
		{"one byte at a time", func() io.Reader { return iotest.OneByteReader(strings.NewReader(stream)) }},
		{"half a kilobyte at a time", func() io.Reader { return &chunkedReader{b: []byte(stream), n: 500} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s EventScanner
			s.Reset(tt.src(), 0)
			scratch := make([]byte, 4096)
			var got []string
			for {
				ev, err := s.NextInto(scratch)
				if err != nil {
					if !errors.Is(err, io.EOF) || len(ev) != 0 {
						t.Fatalf("end: %q, %v; want io.EOF and no bytes", ev, err)
					}
					break
				}
				got = append(got, string(ev))
				if s.start == s.end {
					s.Release()
					if s.buf != nil {
						t.Fatalf("after event %d the scanner holds a %d-byte buffer with nothing pending", len(got), len(s.buf))
					}
				}
			}
			if strings.Join(got, "|") != strings.Join(events, "|") {
				t.Fatalf("events:\n%q\nwant\n%q", got, events)
			}
		})
	}
}

// chunkedReader returns b n bytes at a time.
type chunkedReader struct {
	b []byte
	n int
}

func (r *chunkedReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestScannerLimitWithPooledBuffer checks that a limit below the pooled
// buffer's size still refuses an event one byte over it, and passes one
// of exactly the limit.
func TestScannerLimitWithPooledBuffer(t *testing.T) {
	const limit = 600
	ok := "data: " + strings.Repeat("b", limit-8) + "\n\n"
	over := "data: " + strings.Repeat("c", limit-7) + "\n\n"
	var s EventScanner
	s.Reset(iotest.HalfReader(strings.NewReader(ok+over)), 0)
	s.limit = limit
	scratch := make([]byte, 4096)
	ev, err := s.NextInto(scratch)
	if err != nil || string(ev) != ok {
		t.Fatalf("event of the limit: %d bytes, %v; want it whole", len(ev), err)
	}
	s.Release()
	if _, err := s.NextInto(scratch); !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("event over the limit: %v; want ErrEventTooLarge", err)
	}
}

// TestStreamScanAllocations guards the idle-stream path: waiting in the
// caller's buffer, taking the pooled buffer for the bytes that came and
// giving it back allocates nothing.
func TestStreamScanAllocations(t *testing.T) {
	stream := []byte(chunkEvent + contEvent + usageEvent + doneEvent)
	src := bytes.NewReader(nil)
	scratch := make([]byte, 4096)
	var s EventScanner
	allocs := testing.AllocsPerRun(200, func() {
		src.Reset(stream)
		s.Reset(src, 0)
		for {
			if _, err := s.NextInto(scratch); err != nil {
				break
			}
			s.Release()
		}
	})
	if allocs != 0 {
		t.Fatalf("scanning a stream of 4 events with pooled buffers allocates %.1f times, want 0", allocs)
	}
}
