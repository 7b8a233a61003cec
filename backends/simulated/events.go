package simulated

import (
	"io"
	"time"
)

// eventStream is the body stream of the streamed replies that are not the plain chat hot path
// (stream.go): chat with logprobs, stops, structured outputs or tool calls, text completions and
// the Responses API. An eventSource renders the events one at a time; eventStream spaces them as
// the simulated model would (the time to first token before the first event, the inter-token
// delay before each generation step), applies X-Mock-Fail-After and X-Mock-Break-After, ends the
// stream, and counts it completed or cancelled, exactly as stream does for the plain path.
type eventStream struct {
	s   *Server
	src eventSource
	buf []byte
	off int

	started    bool // the first event has been produced (the time to first token is spent)
	steps      int  // generation steps produced so far
	tokens     int  // token events produced so far, for the injections
	failAfter  int  // token events before the in-band error; -1 for never
	breakAfter int  // token events before the connection is dropped; -1 for never
	state      int
	finished   bool // counted as completed; otherwise CloseWithError counts it as cancelled
}

// Kinds of events an eventSource produces.
type eventKind int

const (
	eventHead  eventKind = iota // before the generated tokens (role chunk, response.created …)
	eventStep                   // the first token event of a generation step
	eventToken                  // another token event of the same step (another choice)
	eventTail                   // after the tokens (finish, usage, response.completed …)
)

// eventSource renders the events of one streamed reply.
type eventSource interface {
	// next appends the next event to b and says what kind it is; ok is false when there is no
	// event left, and then nothing was appended.
	next(b []byte) (out []byte, kind eventKind, ok bool)
	// fail appends the in-band error event of X-Mock-Fail-After.
	fail(b []byte) []byte
	// done appends what ends the stream after the last event ("data: [DONE]"), possibly nothing.
	done(b []byte) []byte
}

const (
	streamRunning = iota
	streamEnding  // the last event is out; the terminator comes next
	streamEOF
	streamBreak
)

func newEventStream(s *Server, src eventSource, failAfter, breakAfter int) *eventStream {
	return &eventStream{s: s, src: src, failAfter: failAfter, breakAfter: breakAfter}
}

// Read implements io.Reader, one event per call.
func (es *eventStream) Read(p []byte) (int, error) {
	if es.off == len(es.buf) {
		if err := es.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, es.buf[es.off:])
	es.off += n
	return n, nil
}

func (es *eventStream) fill() error {
	es.buf, es.off = es.buf[:0], 0
	switch es.state {
	case streamEOF:
		return io.EOF
	case streamBreak:
		es.complete()
		es.state = streamEOF
		return errBreak
	case streamEnding:
		es.complete()
		es.buf = es.src.done(es.buf)
		es.state = streamEOF
		if len(es.buf) == 0 {
			return io.EOF
		}
		return nil
	}
	opts := &es.s.opts
	if !es.started {
		es.started = true
		if opts.TimeToFirstToken > 0 {
			time.Sleep(opts.TimeToFirstToken)
		}
	}
	b, kind, ok := es.src.next(es.buf)
	if !ok {
		es.state = streamEnding
		return es.fill()
	}
	if kind != eventHead && es.tokens == es.failAfter {
		es.buf = es.src.fail(es.buf[:0])
		es.state = streamEnding
		return nil
	}
	if kind != eventHead && es.tokens == es.breakAfter {
		es.buf = es.buf[:0]
		es.state = streamBreak
		return es.fill()
	}
	if kind == eventStep {
		if es.steps > 0 && opts.InterTokenDelay > 0 {
			time.Sleep(opts.InterTokenDelay)
		}
		es.steps++
	}
	if kind == eventStep || kind == eventToken {
		es.tokens++
	}
	es.buf = b
	return nil
}

// CloseWithError is called by fasthttp once it is done with the stream; see stream.CloseWithError.
func (es *eventStream) CloseWithError(error) error {
	if !es.finished {
		es.s.cancelled.Add(1)
	}
	return nil
}

func (es *eventStream) complete() {
	if !es.finished {
		es.finished = true
		es.s.completed.Add(1)
	}
}
