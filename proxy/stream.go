package proxy

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/internal/bufpool"
	"github.com/tollgate-dev/tollgate/openai"
)

// streamBody passes an upstream SSE stream to the client event by event.
//
// It is the client response's body stream: after the handler returns, the
// fasthttp worker serving the connection calls Read, writes each result as
// one HTTP chunk and flushes it, so every event reaches the client as soon
// as it arrives, with no extra goroutine or pipe per stream. When the
// stream ends, or a write to the client fails because the client went
// away, fasthttp calls CloseWithError, which closes the upstream
// connection (so the backend stops generating), settles the reservation and
// records usage. Nothing here touches the RequestCtx, which fasthttp may
// reuse once the handler has returned.
type streamBody struct {
	srv     *Server
	c       exchange
	backend *backends.Backend
	resp    *fasthttp.Response

	scan   openai.EventScanner
	events openai.EventProcessor
	// messages is the state of a Messages API stream (see startMessages).
	messages messagesStream
	// publicModelLen is the length of the public model id the events
	// name in place of the upstream one (see eventHeadroom).
	publicModelLen int
	// ownerNoted is set once the backend of a streamed response is
	// remembered (see noteResponseOwner).
	ownerNoted bool
	// out holds what the client gets for the last events read, when it
	// did not fit in the buffer Read was given (which is where it goes
	// otherwise); pos is how much of it was sent. outPooled is out's
	// pool entry (see bufpool.Get), nil when out is not from a pool. out is
	// given back once sent, so an idle stream holds none.
	out       []byte
	outPooled *[]byte
	pos       int

	// upstreamErr is why the upstream stream ended early; nil after a
	// clean end.
	upstreamErr error
	ended       bool // the upstream stream is over (cleanly or not)
	eof         bool // the upstream body was read to its end
	firstEvent  bool // an event has been sent to the client
	// firstNoted says the first event's time (ttft) went into the metrics
	// and the backend's health, which is done once it has been written,
	// off the path of the first token.
	firstNoted bool
	ttft       time.Duration
	// shrunk says the upstream connection reads through a small buffer
	// now that the headers are in (see backends.Backend.ShrinkStream).
	shrunk bool
	// promptEstimate is the gateway's estimate of the prompt's tokens
	// (see promptEstimate), charged when the backend counted none.
	promptEstimate int64

	// headersAt is when the upstream's response headers arrived, and
	// upstreamTTFT the upstream's time to first event: the request's
	// upstream time up to the headers, plus the wait from them to the
	// first event, once it came (upstreamFirst).
	headersAt     time.Time
	upstreamTTFT  time.Duration
	upstreamFirst bool

	// For a stream written on the connection (see writeOnConn): head is
	// the response head until it is sent (headPooled its pool entry);
	// over says the handler wrote the whole stream with its head, and
	// writeErr is the error of that write; keepAlive says the connection
	// serves the client's next request afterwards. onHijack is hijacked,
	// bound once per streamBody so that handing it to fasthttp does not
	// allocate.
	head       []byte
	headPooled *[]byte
	over       bool
	writeErr   error
	keepAlive  bool
	onHijack   func(net.Conn)
}

var streamBodies = sync.Pool{New: func() any { return new(streamBody) }}

// maxCoalesce bounds how many bytes of already-arrived events are sent in
// one chunk. Events that arrived together go out together, which adds no
// delay, and events never wait for one another.
const maxCoalesce = 16 << 10

// eventHeadroom is what processing can add to an event, beyond the public
// model id that replaces the upstream one: the gateway's own in-band error
// and [DONE], which replace or follow it. Events are processed into a
// buffer only when they fit with this much to spare.
const eventHeadroom = 512

// startStream answers 200 with an event stream fed by resp. Ownership of
// resp, of b's acquisition and of c's reservation moves to the streamBody.
// replyModel, when non-nil, is the quoted model id every chunk must name;
// served is the id a translated Messages API stream names.
func (s *Server) startStream(ctx *fasthttp.RequestCtx, c *exchange, b *backends.Backend, resp *fasthttp.Response, served string, replyModel []byte) {
	sb := streamBodies.Get().(*streamBody)
	if sb.onHijack == nil {
		sb.onHijack = sb.hijacked
	}
	sb.srv, sb.c, sb.backend, sb.resp = s, *c, b, resp
	// The stream body settles the request now, and releases the slot.
	c.closed = true
	c.tenancy = backends.Tenancy{}
	// Of the request, the stream needs only what it is charged for the
	// prompt when it ends without the backend's count; the openai.Request
	// stays with c, and its model and tool choice bytes, which point into
	// the client's request body given back below, with it.
	sb.c.req, sb.c.msg, sb.promptEstimate = nil, nil, promptEstimate(c.req)
	// Nothing reads the request body again, and it holds the prompt, often
	// many kilobytes: it goes back to fasthttp's pool now rather than when
	// the stream ends, minutes later. (With the server's
	// ReduceMemoryUsage, ResetBody releases the buffer rather than keep
	// it.)
	ctx.Request.ResetBody()
	// The client watch ends, and is recycled, when forward returns.
	sb.c.watch = nil
	sb.scan.Reset(resp.BodyStream(), c.gen.cfg.Server.MaxEventBytes)
	sb.events.Reset(openai.StreamOptions{
		StripUsage:      !c.req.IncludeUsage,
		StripContinuous: b.ContinuousUsage() && !c.req.ContinuousUsage,
		PublicModel:     replyModel,
		Backend:         b.Name,
		Responses:       c.ep.responses,
	})
	sb.publicModelLen, sb.ownerNoted = len(replyModel), false
	sb.messages.on = false
	if c.ep.messages != nil {
		sb.startMessages(c, b, served, replyModel)
	}
	sb.releaseOut()
	sb.upstreamErr, sb.ended, sb.eof, sb.firstEvent, sb.firstNoted, sb.shrunk = nil, false, false, false, false, false
	sb.headersAt, sb.upstreamTTFT, sb.upstreamFirst = time.Now(), c.upstream, false

	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Response.Header.SetContentTypeBytes(eventStream)
	ctx.Response.Header.Set(fasthttp.HeaderCacheControl, "no-cache")
	// Tell buffering reverse proxies in front of the gateway (nginx) to
	// pass events through as they come.
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	s.metrics.streamsInFlight.Inc()
	if ownConn(ctx.Conn()) && ctx.Request.Header.IsHTTP11() {
		s.writeOnConn(ctx, sb)
		return
	}
	// A connection of another listener (or HTTP/1.0, which has no
	// chunked framing): fasthttp's worker writes the stream. The headers
	// go out at once, so the client knows the request was accepted before
	// the first token is generated; unless the first event came with the
	// upstream's headers, and the client's go out with it, in one write.
	ctx.Response.ImmediateHeaderFlush = b.StreamBuffered(resp) == 0
	ctx.Response.SetBodyStream(sb, -1)
}

// Read returns the next events for the client. It blocks until at least
// one event arrived, and returns io.EOF once the stream is over.
//
// Read is where the upstream's bytes are handled after the handler has
// returned, on fasthttp's worker, where nothing else would catch a panic:
// a panic here (a bug met by hostile bytes) ends this stream with an
// in-band error, is counted and logged, and the process lives.
func (sb *streamBody) Read(p []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			n, err = sb.recovered(p, r)
		}
	}()
	if len(p) == 0 {
		return 0, nil
	}
	if sb.firstEvent && !sb.firstNoted {
		sb.noteFirstEvent()
	}
	for n == 0 {
		if sb.pos < len(sb.out) {
			n = copy(p, sb.out[sb.pos:])
			sb.pos += n
			break
		}
		sb.releaseOut()
		if sb.ended {
			return 0, io.EOF
		}
		n = sb.fill(p)
		if !sb.shrunk && !sb.ended {
			sb.shrunk = sb.backend.ShrinkStream(sb.resp)
		}
	}
	if !sb.firstEvent {
		sb.firstEvent, sb.ttft = true, time.Since(sb.c.rec.Started)
	}
	return n, nil
}

// noteFirstEvent records the time to the first event, once it was sent.
func (sb *streamBody) noteFirstEvent() {
	sb.firstNoted = true
	sb.srv.metrics.timeToFirstTok.WithLabelValues(sb.c.rec.Model).Observe(sb.ttft.Seconds())
	if sb.upstreamFirst {
		// What the gateway added to the client's wait for the first
		// token.
		sb.srv.metrics.observeOverhead(sb.c.rec.Model, sb.ttft-sb.upstreamTTFT)
	}
	// For a stream, the first event, not the headers, is what tells a
	// slow backend from a fast one.
	sb.backend.ReportSuccess(sb.ttft)
}

// fill reads one upstream event, plus any others already buffered, and
// returns the length of what the client gets for them in p; when that
// would not fit in p, it goes to out instead, and fill returns 0. The
// events are processed straight from the scanner's buffer into p, which
// is also where the wait for them took place (see nextInto): the stream
// holds no buffer of its own while it waits, and an event is copied once
// on its way through. When the upstream ends without [DONE] — broken off,
// timed out, or speaking something other than SSE — it appends an in-band
// error event and [DONE], which is how clients learn of an error after
// the 200.
func (sb *streamBody) fill(p []byte) int {
	defer sb.scan.Release()
	ev, err := sb.scan.NextInto(p)
	room := sb.publicModelLen + eventHeadroom
	if err == nil {
		// At the end, the bytes of an unfinished event are dropped.
		room += len(ev)
	}
	dst := p[:0:len(p)]
	if room > len(p) {
		sb.out, sb.outPooled = bufpool.Get(room)
		dst = sb.out[:0]
	}
	if err != nil {
		return sb.settle(p, sb.endUpstream(dst, err))
	}
	if !sb.upstreamFirst {
		sb.upstreamFirst = true
		sb.upstreamTTFT += time.Since(sb.headersAt)
	}
	dst = sb.process(dst, ev)
	for len(dst) < maxCoalesce && sb.usageErr() == nil {
		ev := sb.scan.BufferedUpTo(cap(dst) - len(dst) - sb.publicModelLen - eventHeadroom)
		if ev == nil {
			break
		}
		dst = sb.process(dst, ev)
	}
	if err := sb.usageErr(); err != nil {
		return sb.settle(p, sb.endUpstream(dst, err))
	}
	if sb.c.ep.responses {
		sb.noteResponseOwner()
	}
	return sb.settle(p, dst)
}

// settle returns the length of dst, the events fill processed, when they
// are in p; otherwise they are in out (from the pool, or grown past it by
// an append, which the headroom makes rare), to be sent from there.
func (sb *streamBody) settle(p, dst []byte) int {
	if sb.out == nil && cap(dst) == len(p) {
		return len(dst)
	}
	if sb.out == nil || cap(dst) != cap(sb.out) {
		// An append outgrew its buffer: the new one is out, unpooled.
		sb.releaseOut()
	}
	sb.out, sb.pos = dst, 0
	return 0
}

// releaseOut gives out back, once sent.
func (sb *streamBody) releaseOut() {
	bufpool.Put(sb.outPooled)
	sb.out, sb.outPooled, sb.pos = nil, nil, 0
}

// endUpstream handles the end of the upstream body, and returns dst with
// what the client gets for it appended.
func (sb *streamBody) endUpstream(dst []byte, err error) []byte {
	sb.ended = true
	if errors.Is(err, io.EOF) {
		sb.eof = true
		if sb.done() {
			return dst
		}
		err = errUpstreamTruncated
	}
	if sb.done() {
		// The stream was complete; whatever came after [DONE] is moot.
		return dst
	}
	sb.upstreamErr = err
	e := upstreamError(err, sb.backend.Name)
	var ue *openai.UsageError
	switch {
	case errors.Is(err, errUpstreamTruncated):
		e.Message = "Backend " + sb.backend.Name + " ended the stream before it was complete."
	case errors.Is(err, openai.ErrEventTooLarge):
		e.Message = "Backend " + sb.backend.Name + " sent an event over the gateway's limit of " +
			strconv.Itoa(sb.scan.MaxEvent()) + " bytes; it is not speaking SSE."
	case errors.As(err, &ue):
		e.Message = invalidUsageMessage(sb.backend.Name)
	}
	switch {
	case sb.c.ep.responses:
		return openai.AppendResponsesError(dst, e, sb.events.Events())
	case sb.messages.on:
		return appendMessagesError(dst, e)
	}
	return appendInBandError(dst, e)
}

var errUpstreamTruncated = errors.New("upstream stream ended without [DONE]")

// appendInBandError appends an error event and the closing [DONE] event.
func appendInBandError(dst []byte, e *openai.Error) []byte {
	dst = append(dst, "data: "...)
	dst = e.AppendJSON(dst)
	return append(dst, "\n\ndata: [DONE]\n\n"...)
}

// CloseWithError ends the stream. fasthttp calls it once, with the error
// that stopped writing to the client (nil when the stream was written to
// its end).
func (sb *streamBody) CloseWithError(clientErr error) error {
	s := sb.srv
	if sb.firstEvent && !sb.firstNoted {
		sb.noteFirstEvent()
	}
	// Unless the upstream body was read to its end (the client left, or
	// the upstream broke), the connection cannot be reused, and closing it
	// is what tells the backend to stop generating.
	sb.backend.CloseStream(sb.resp, !sb.eof)
	fasthttp.ReleaseResponse(sb.resp)
	sb.c.tenancy.Release(sb.backend)
	s.metrics.streamsInFlight.Dec()

	c := &sb.c
	f := sb.facts()
	usage := &f.usage
	recordUsage(&c.rec, usage, f.outputTokens)
	if usage.Reported {
		sb.backend.ObservePrompt(c.promptBytes, usage.Input)
	}
	c.rec.CacheWriteTokens = f.cacheWrite
	c.rec.CompletionID, c.rec.CompletionCreated = f.replyID, f.created
	c.rec.FinishReasons = f.finish
	c.rec.Status = fasthttp.StatusOK
	switch {
	case clientErr != nil:
		c.rec.Incomplete = true
		c.rec.Error = "client closed the stream: " + clientErr.Error()
		s.metrics.streamErrors.WithLabelValues(c.rec.Model, "abandoned").Inc()
		s.metrics.streamAborts.WithLabelValues(c.rec.Model, "client").Inc()
	case f.errMessage != "":
		c.rec.Error = "in-band stream error: " + f.errMessage
		s.metrics.streamErrors.WithLabelValues(c.rec.Model, "inband").Inc()
		if !usage.Reported {
			// An error is charged only what the backend reported.
			c.rec.ClearTokens()
		}
	case f.usageErr != nil:
		// The tokens recorded are the last valid cumulative count, if
		// any: what the backend reported before its usage went bad.
		c.rec.Error = "backend sent an invalid usage block: " + f.usageErr.Error()
		if !usage.Reported {
			c.rec.ClearTokens()
		}
		s.metrics.streamErrors.WithLabelValues(c.rec.Model, "invalid_usage").Inc()
	case sb.upstreamErr != nil:
		c.rec.Incomplete = true
		c.rec.Error = "upstream stream broken: " + sb.upstreamErr.Error()
		s.metrics.streamErrors.WithLabelValues(c.rec.Model, "broken").Inc()
		s.metrics.streamAborts.WithLabelValues(c.rec.Model, "backend").Inc()
	}
	if c.rec.Incomplete && !usage.Reported {
		// No usage arrived (the backend does not send continuous usage),
		// so the backend never counted the prompt: charge the gateway's
		// estimate of it, and the content deltas streamed as the
		// output.
		c.rec.PromptTokens = sb.promptEstimate
		c.rec.TotalTokens = c.rec.PromptTokens + c.rec.CompletionTokens
	}
	c.rec.Ended = time.Now()
	s.settle(c)

	sb.srv, sb.backend, sb.resp = nil, nil, nil
	sb.c = exchange{}
	sb.scan.Reset(nil, 0)
	sb.releaseOut()
	sb.releaseHead()
	sb.over, sb.writeErr, sb.keepAlive = false, nil, false
	streamBodies.Put(sb)
	return nil
}

// recovered ends the stream after Read panicked with r: the events not yet
// sent are dropped, the client gets an in-band error and [DONE], and the
// upstream is closed when fasthttp calls CloseWithError.
func (sb *streamBody) recovered(p []byte, r any) (int, error) {
	sb.srv.countPanic("stream", r)
	if sb.ended {
		// The panic came while the closing events were being sent.
		return 0, io.EOF
	}
	sb.ended = true
	if sb.upstreamErr == nil {
		sb.upstreamErr = errors.New("internal error while relaying the stream")
	}
	sb.releaseOut()
	e := &openai.Error{Type: "api_error", Code: "internal_error",
		Message: "The gateway failed while relaying the stream from backend " + sb.backend.Name + "."}
	if sb.messages.on {
		sb.out = appendMessagesError(nil, e)
	} else {
		sb.out = appendInBandError(nil, e)
	}
	sb.pos = copy(p, sb.out)
	return sb.pos, nil
}
