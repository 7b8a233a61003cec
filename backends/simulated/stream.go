package simulated

import (
	"io"
	"strconv"
	"time"
)

// Stream phases, in the order a normal stream goes through them.
const (
	phaseRole   = iota // one role chunk per choice, after the time to first token
	phaseTokens        // one chunk per token per choice
	phaseFinish        // one chunk per choice with an empty delta and the finish reason
	phaseUsage         // the usage chunk, when include_usage is set
	phaseDone          // data: [DONE]
	phaseEOF           // nothing more
	phaseError         // the in-band error event of X-Mock-Fail-After, then phaseDone
	phaseBreak         // drop the connection (X-Mock-Break-After)
)

// stream generates the SSE events of one streamed reply. It is the response's body stream:
// fasthttp calls Read from the connection's goroutine and writes each result as one HTTP chunk,
// flushed at once. Read returns at most one event, sleeping first where the simulated model would
// be generating, so events are spaced and never coalesced, and no goroutine of our own is needed.
//
// When the client goes away the chunk write fails, fasthttp stops calling Read and calls
// CloseWithError with the write error: generation stops at once and the stream counts as
// cancelled. Returning an error from Read makes fasthttp drop the connection mid-body, which is
// how X-Mock-Break-After breaks a stream.
type stream struct {
	s    *Server
	seq  *seq   // the engine's sequence, nil without an engine
	head []byte // `data: {"id":...,"choices":[`, shared by every chunk of this stream
	buf  []byte // the event being read out
	off  int    // how much of buf has been read

	n, tokens, prompt int
	cached            int
	finish            string
	includeUsage      bool
	continuous        bool
	failAfter         int // token events before the in-band error; -1 for never
	breakAfter        int // token events before the connection is dropped; -1 for never

	phase    int
	choice   int  // the choice the next event of the current phase is for
	tok      int  // the token the next token event is for
	emitted  int  // token events produced so far, over all choices
	finished bool // counted as completed; otherwise CloseWithError counts it as cancelled
}

func (st *stream) start(s *Server, id, created int64, r *chatRequest, tokens int, finish string, failAfter, breakAfter int) {
	*st = stream{
		s: s, head: st.head[:0], buf: st.buf[:0],
		n: r.n, tokens: tokens, prompt: r.prompt, cached: r.cached, finish: finish,
		includeUsage: r.includeUsage, continuous: r.continuous,
		failAfter: failAfter, breakAfter: breakAfter,
	}
	h := append(st.head, `data: {"id":"chatcmpl-`...)
	h = strconv.AppendInt(h, id, 10)
	h = append(h, `","object":"chat.completion.chunk","created":`...)
	h = strconv.AppendInt(h, created, 10)
	h = append(h, `,"model":`...)
	// Copied, because the request body it points into is gone once the handler returns.
	h = append(h, r.modelRaw...)
	st.head = append(h, `,"choices":[`...)
}

// Read implements io.Reader; see stream.
func (st *stream) Read(p []byte) (int, error) {
	if st.off == len(st.buf) {
		if err := st.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, st.buf[st.off:])
	st.off += n
	return n, nil
}

// CloseWithError is called by fasthttp exactly once, when it is done with the stream: with nil
// after the end, or with the error that ended it (a write error when the client went away).
func (st *stream) CloseWithError(error) error {
	s := st.s
	st.seq.finish()
	st.seq = nil
	if !st.finished {
		s.cancelled.Add(1)
	}
	st.s = nil
	s.streams.Put(st)
	return nil
}

// next puts the next event in buf, or returns io.EOF at the end, or errBreak to drop the connection.
func (st *stream) next() error {
	st.buf, st.off = st.buf[:0], 0
	opts := &st.s.opts
	if st.phase == phaseTokens || (st.phase == phaseFinish && st.choice == 0) {
		// Injections trigger after the given number of token events, before anything else is
		// produced; a count the stream never reaches injects nothing.
		switch st.emitted {
		case st.failAfter:
			st.phase = phaseError
		case st.breakAfter:
			st.phase = phaseBreak
		}
	}
	switch st.phase {
	case phaseRole:
		if st.choice == 0 {
			st.wait(opts.TimeToFirstToken, true)
		}
		st.chunkStart()
		st.buf = append(st.buf, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
		st.chunkEnd(0)
		if st.choice++; st.choice == st.n {
			st.phase, st.choice = phaseTokens, 0
		}
	case phaseTokens:
		if st.choice == 0 && st.tok > 0 {
			st.wait(opts.InterTokenDelay, false)
		}
		st.chunkStart()
		st.buf = append(st.buf, `,"delta":{"content":"`...)
		st.buf = appendToken(st.buf, st.tok)
		st.buf = append(st.buf, `"},"logprobs":null,"finish_reason":null}]`...)
		st.emitted++
		st.chunkEnd(st.emitted)
		if st.choice++; st.choice == st.n {
			st.choice = 0
			if st.tok++; st.tok == st.tokens {
				st.phase = phaseFinish
			}
		}
	case phaseFinish:
		st.chunkStart()
		st.buf = append(st.buf, `,"delta":{},"logprobs":null,"finish_reason":"`...)
		st.buf = append(st.buf, st.finish...)
		st.buf = append(st.buf, `","stop_reason":null}]`...)
		st.chunkEnd(st.emitted)
		if st.choice++; st.choice == st.n {
			st.choice = 0
			if st.includeUsage {
				st.phase = phaseUsage
			} else {
				st.phase = phaseDone
			}
		}
	case phaseUsage:
		st.buf = append(st.buf, st.head...)
		st.buf = append(st.buf, `],"usage":`...)
		st.buf = appendUsage(st.buf, st.prompt, st.cached, st.emitted)
		st.buf = append(st.buf, "}\n\n"...)
		st.phase = phaseDone
	case phaseError:
		st.buf = append(st.buf, midStreamFailure...)
		st.phase = phaseDone
	case phaseDone:
		// Counted before the client can see [DONE], so a test that reads to the end and then
		// looks at Stats finds it completed.
		st.complete()
		st.buf = append(st.buf, doneEvent...)
		st.phase = phaseEOF
	case phaseBreak:
		st.complete()
		st.phase = phaseEOF
		return errBreak
	default:
		return io.EOF
	}
	return nil
}

// wait sleeps before the first token (first) or the next: the configured delay d, or with an
// engine the sequence's prefill and its delay at the current load.
func (st *stream) wait(d time.Duration, first bool) {
	switch {
	case st.seq != nil && first:
		d = st.seq.firstToken(d)
	case st.seq != nil:
		d = st.seq.interToken(d)
	}
	if d > 0 {
		st.s.clock.Sleep(d)
	}
}

func (st *stream) complete() {
	st.seq.finish()
	st.seq = nil
	if !st.finished {
		st.finished = true
		st.s.completed.Add(1)
	}
}

// chunkStart begins a chat.completion.chunk event with one choice and leaves it open after the
// index, so the caller appends the rest of the choice and its closing "}]".
func (st *stream) chunkStart() {
	st.buf = append(st.buf, st.head...)
	st.buf = append(st.buf, `{"index":`...)
	st.buf = strconv.AppendInt(st.buf, int64(st.choice), 10)
}

// chunkEnd closes the event, adding the cumulative usage when continuous_usage_stats asked for it.
func (st *stream) chunkEnd(completion int) {
	if st.continuous {
		st.buf = append(st.buf, `,"usage":`...)
		st.buf = appendUsage(st.buf, st.prompt, st.cached, completion)
	}
	st.buf = append(st.buf, "}\n\n"...)
}
