package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

// splitReader hands out data in pieces whose sizes the fuzzer chooses: each
// byte c of cuts makes one read of c+1 bytes (cycled), except that 255 makes
// an empty read returning (0, nil), as io.Reader allows, unless the previous
// read was empty too, so that the reader always makes progress. When
// eofWithData is set, the last piece comes with io.EOF, as some readers
// return it.
type splitReader struct {
	data        []byte
	cuts        []byte
	i           int
	lastEmpty   bool
	eofWithData bool
}

func (r *splitReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := len(r.data)
	if len(r.cuts) > 0 {
		c := r.cuts[r.i%len(r.cuts)]
		r.i++
		if c == 255 && !r.lastEmpty {
			r.lastEmpty = true
			return 0, nil
		}
		n = min(n, int(c)+1)
	}
	r.lastEmpty = false
	n = copy(p, r.data[:n])
	r.data = r.data[n:]
	if len(r.data) == 0 && r.eofWithData {
		return n, io.EOF
	}
	return n, nil
}

// FuzzSSEScan feeds arbitrary bytes through the upstream SSE scanner, split
// into reads at points the fuzzer chooses, and every event it returns
// through the chunk processor. It checks that neither panics; that scanning
// never loses or duplicates a byte (the events and the unfinished rest put
// together are the input), whatever the read boundaries; that each event is
// exactly one event; and that the processor keeps events it does not
// understand intact, leaves its input alone, and turns an event whose data
// payload is valid JSON into one whose payload is still valid JSON.
func FuzzSSEScan(f *testing.F) {
	seeds := []struct {
		stream string
		cuts   []byte
		opts   uint8
	}{
		{chunkEvent + contEvent + usageEvent + doneEvent, nil, 0},
		{chunkEvent + contEvent + usageEvent + doneEvent, []byte{0}, 7},
		{": keepalive\n\n" + chunkEvent + "data: {\"a\":1}\r\n\r\n" + usageEvent + doneEvent, []byte{3, 255, 17}, 3},
		{"data: {\"cut", []byte{1}, 1},
		{"event: e\ndata: x\n\ndata: a\ndata: b\n\n", []byte{2, 5}, 2},
		{"\n\n\r\n\r\n\n\r\n", []byte{0, 0, 1}, 4},
		{"data:{\"model\":\"m\",\"usage\":{\"prompt_tokens\":1},\"choices\":[]}\n\n", nil, 7},
		{"data: {\"a\":1 , \"usage\" : {\"x\":1} , \"model\" : \"up\"}\n\n", []byte{9}, 6},
		{"data: {\"mod\\u0065l\":\"x\",\"model\":\"y\",\"usage\":{},\"usage\":{}}\r\n\n", nil, 6},
		{"data: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\ntrailing", []byte{40}, 5},
		{garbageUpstream, []byte{7, 1}, 0},
		{"", nil, 0},
	}
	for _, s := range seeds {
		f.Add([]byte(s.stream), s.cuts, s.opts)
	}
	f.Fuzz(func(t *testing.T, stream, cuts []byte, opts uint8) {
		if len(stream) > maxFuzzStream {
			t.Skip("input longer than maxFuzzStream")
		}
		var s EventScanner
		s.Reset(&splitReader{data: stream, cuts: cuts, eofWithData: opts&8 != 0}, 0)
		var got []byte
		var events [][]byte
		var err error
		// Every event is at least two bytes long, so a scanner that makes
		// progress returns its error within this many calls.
		for calls := 0; ; calls++ {
			if calls > len(stream)+2 {
				t.Fatalf("no end after %d calls for %d bytes of input", calls, len(stream))
			}
			var ev []byte
			ev, err = s.Next()
			if err != nil {
				if eventEnd(ev, 0) >= 0 {
					t.Fatalf("the unfinished rest %q holds a complete event", ev)
				}
				got = append(got, ev...)
				break
			}
			if len(ev) < 2 || eventEnd(ev, 0) != len(ev) {
				t.Fatalf("event %q is not exactly one event", ev)
			}
			got = append(got, ev...)
			// Events share the scanner's buffer: keep copies.
			events = append(events, bytes.Clone(ev))
		}
		switch {
		case errors.Is(err, io.EOF):
			if !bytes.Equal(got, stream) {
				t.Fatalf("scanned bytes differ from the input:\n got %q\nwant %q", got, stream)
			}
		case errors.Is(err, ErrEventTooLarge):
			if !bytes.HasPrefix(stream, got) {
				t.Fatalf("scanned bytes are not a prefix of the input:\n got %q\nwant %q", got, stream)
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
		if rest, again := s.Next(); len(rest) != 0 || !errors.Is(again, err) {
			t.Fatalf("after the end: %q, %v; want nothing and %v again", rest, again, err)
		}

		var identity, edit EventProcessor
		identity.Reset(StreamOptions{})
		var public []byte
		if opts&4 != 0 {
			public = []byte(`"pub\"lic"`)
		}
		edit.Reset(StreamOptions{StripUsage: opts&1 != 0, StripContinuous: opts&2 != 0, PublicModel: public})
		for _, ev := range events {
			orig := bytes.Clone(ev)
			// An in-band error is replaced by the gateway's, and a chunk
			// with invalid usage ends the stream: the rest is untouched.
			identity.errMessage, identity.usageErr = "", nil
			if out := identity.Process(nil, ev); !bytes.Equal(out, ev) && identity.errMessage == "" && identity.usageErr == nil {
				t.Fatalf("with nothing to rewrite, %q became %q", ev, out)
			}
			edit.usageErr = nil
			out := edit.Process(nil, ev)
			if !bytes.Equal(ev, orig) {
				t.Fatalf("process modified its input event %q", orig)
			}
			start, end, ok := eventData(ev)
			if !ok {
				if !bytes.Equal(out, ev) {
					t.Fatalf("an event without a single data line changed: %q became %q", ev, out)
				}
				continue
			}
			payload := ev[start:end]
			if bytes.Equal(payload, doneData) {
				if !bytes.Equal(out, ev) || !edit.done {
					t.Fatalf("[DONE] became %q (done %v)", out, edit.done)
				}
				continue
			}
			if !json.Valid(payload) {
				continue
			}
			if len(out) == 0 {
				// A usage chunk is dropped when the gateway strips it,
				// or when its usage is invalid: the stream then ends
				// with the gateway's in-band error instead.
				if !edit.opts.StripUsage && edit.usageErr == nil {
					t.Fatalf("event %q dropped although the usage chunk is not stripped and its usage is valid", ev)
				}
				continue
			}
			os, oe, ok := eventData(out)
			if !ok || !json.Valid(out[os:oe]) {
				t.Fatalf("valid JSON payload %q became %q, which is not a valid JSON event", payload, out)
			}
			// The event keeps its framing: the same terminator.
			if !bytes.Equal(out[oe:], ev[end:]) {
				t.Fatalf("event terminator %q became %q", ev[end:], out[oe:])
			}
		}
	})
}

// maxFuzzStream bounds the fuzzed stream. A chat stream's events are a few
// hundred bytes, so 16 KiB holds plenty of them; longer inputs would only
// slow the fuzzer down.
const maxFuzzStream = 16 << 10

// TestEventScannerTrickledLines scans one long event made of short lines
// (no blank line), delivered a byte per read, as a slow or hostile
// upstream can deliver it. Scanning must take time linear in its length:
// rescanning the unfinished event from its start after every read, as the
// scanner once did, is quadratic in the event's length, and an event of
// the 1 MiB allowed would hold a core for hours. Rather than time it, the test
// checks what makes it linear: after every read that completes no event,
// the search's resume point covers every byte read so far, so the next
// search looks only at the new bytes.
func TestEventScannerTrickledLines(t *testing.T) {
	data := bytes.Repeat([]byte("a\n"), 32<<10)
	var s EventScanner
	s.Reset(&splitReader{data: data, cuts: []byte{0}}, 0)
	reads := 0
	for s.err == nil {
		if ev := s.Buffered(); ev != nil {
			t.Fatalf("event %q found in input without a blank line", ev)
		}
		if s.end > s.start && s.scanned != s.end-s.start {
			t.Fatalf("after %d reads the search resumes at %d of %d unfinished bytes", reads, s.scanned, s.end-s.start)
		}
		s.fill()
		reads++
	}
	if reads < len(data) {
		t.Fatalf("%d reads for %d bytes delivered one per read", reads, len(data))
	}
	rest, err := s.Next()
	if !errors.Is(err, io.EOF) || !bytes.Equal(rest, data) {
		t.Fatalf("at the end: %d bytes, %v; want all %d bytes and EOF", len(rest), err, len(data))
	}
}

// garbageUpstream is what a backend that does not speak SSE might send.
const garbageUpstream = "this is not a server-sent event stream\n{\"choices\":[{\"delta\":\n<html>502 Bad Gateway</html>\r\nevent without data"
