package simulated

import (
	"io"
	"strconv"
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

// chunkFrame is what the chat and completion event sources share: every chunk starts with
// head and, when continuous_usage_stats asked for it, ends with the usage so far; the last
// chunk, when include_usage asked for it, carries only the usage. Both end the stream with
// "data: [DONE]". It also keeps their order of events, vLLM's: step by step, an event per
// choice that has a token at that step; then a finish event per choice; then the usage.
type chunkFrame struct {
	head         []byte // the chunk's opening, up to its choices array
	includeUsage bool
	continuous   bool
	prompt       int
	cached       int
	emitted      int // tokens produced so far, over all choices

	choiceSteps []int // the generation steps of each choice
	steps       int   // the most steps of any choice
	phase       int   // phaseRole, phaseTokens, phaseFinish, phaseUsage, then phaseEOF
	choice      int
	step        int
}

// setSteps sets the number of generation steps of each choice.
func (f *chunkFrame) setSteps(choiceSteps []int) {
	f.choiceSteps = choiceSteps
	for _, n := range choiceSteps {
		f.steps = max(f.steps, n)
	}
}

// nextToken moves to the next token event and returns its choice and whether it is the first
// event of its step. ok is false once all are out; the finish events come next.
func (f *chunkFrame) nextToken() (choice int, kind eventKind, ok bool) {
	for f.step < f.steps {
		for f.choice < len(f.choiceSteps) {
			i := f.choice
			f.choice++
			if f.step >= f.choiceSteps[i] {
				continue
			}
			kind := eventToken
			if f.firstAt(f.step) == i {
				kind = eventStep
			}
			return i, kind, true
		}
		f.choice = 0
		f.step++
	}
	f.phase, f.choice = phaseFinish, 0
	return 0, 0, false
}

// firstAt is the first choice that has an event at step.
func (f *chunkFrame) firstAt(step int) int {
	for i, n := range f.choiceSteps {
		if step < n {
			return i
		}
	}
	return -1
}

// finished moves past the finish event of the current choice: to the next choice's, and after
// the last one to the usage when include_usage asked for it, else to the end.
func (f *chunkFrame) finished() {
	if f.choice++; f.choice == len(f.choiceSteps) {
		f.phase = phaseUsage
		if !f.includeUsage {
			f.phase = phaseEOF
		}
	}
}

// start opens a chunk of the choice numbered choice.
func (f *chunkFrame) start(b []byte, choice int) []byte {
	b = append(b, f.head...)
	b = append(b, `{"index":`...)
	return strconv.AppendInt(b, int64(choice), 10)
}

// end closes a chunk, with the cumulative usage when continuous_usage_stats asked for it.
func (f *chunkFrame) end(b []byte) []byte {
	if f.continuous {
		b = append(b, `,"usage":`...)
		b = appendUsage(b, f.prompt, f.cached, f.emitted)
	}
	return append(b, "}\n\n"...)
}

// usage appends the last chunk, which has no choices and the usage of the whole reply.
func (f *chunkFrame) usage(b []byte) []byte {
	b = append(b, f.head...)
	b = append(b, `],"usage":`...)
	b = appendUsage(b, f.prompt, f.cached, f.emitted)
	return append(b, "}\n\n"...)
}

func (f *chunkFrame) fail(b []byte) []byte { return append(b, midStreamFailure...) }

func (f *chunkFrame) done(b []byte) []byte { return append(b, doneEvent...) }
