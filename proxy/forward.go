package proxy

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/openai"
)

// maxAttempts bounds the backends one request is sent to whatever the
// configuration says, so the tried set stays on the stack.
const maxAttempts = 8

// promptChain appends to dst the block chain of the prompt of req, the
// request validated from body, and how many bytes it was cut from. For a
// request that opens a conversation (one message after its instructions:
// the Messages API's system prompt, chat's leading system and developer
// messages), opening is how many leading blocks are those instructions,
// which the app's other conversations share; zero for any other request.
func promptChain(dst []uint64, req *openai.Request, body []byte) (chain []uint64, opening, promptBytes int) {
	system, prompt := req.Prompt(body)
	if req.Messages-req.Instructions == 1 {
		instructions := len(system)
		if req.InstructionsEnd > req.PromptStart {
			instructions += req.InstructionsEnd - req.PromptStart
		}
		opening = backends.BlocksWithin(instructions)
	}
	return backends.AppendBlockChain(dst, system, prompt), opening, len(system) + len(prompt)
}

// forward sends the request to a backend of the model, or of its
// fallbacks, and answers the client. A failure before any byte reached the
// client — a connection failure, a timeout before the first response byte,
// or a 429/502/503/504 — is retried on another backend, within the retry
// attempts and the retry budget, after a jittered backoff. When every
// backend of a model failed or is out, its fallbacks are tried in order.
// When every backend is merely busy (at max_concurrency) the request waits
// in the model's bounded queue. forward owns the reservation from here on.
func (s *Server) forward(ctx *fasthttp.RequestCtx, st *state, c *exchange, body []byte) {
	retries := st.cfg.Retries
	s.retryBudget.Request()
	var blockArr [backends.MaxPrefixBlocks]uint64
	blocks, opening := blockArr[:0], 0
	if c.route.WantsBlocks() {
		blocks, opening, c.promptBytes = promptChain(blocks, c.req, body)
	}
	c.watch = s.clients.watch(ctx, c.rec.Started)
	defer c.watch.stop()
	var triedArr [maxAttempts]*backends.Backend
	tried := backends.Tried(triedArr[:0])
	attempts := min(retries.Attempts, maxAttempts)
	backoff := retries.Backoff
	var last *openai.Error
	route := c.route
	chain := c.route.Fallbacks
	counted := c.route       // the last route counted as a fallback taken
	var claim backends.Claim // what the queue orders the request by, once needed
	for route != nil && len(tried) < attempts {
		if !route.Serves(c.ep.upstream) || !c.req.ToolChoiceServed(route.ToolCalling) || !route.AcceptsPriority(c.req.Priority) {
			// A fallback that does not serve the endpoint, the
			// tool_choice asked for, or the priority, is skipped.
			route = nil
			if len(chain) > 0 {
				route, chain = chain[0], chain[1:]
			}
			continue
		}
		var b *backends.Backend
		pinned := false
		if c.owner != "" && len(tried) == 0 {
			var e *openai.Error
			if b, e = pickOwner(route, c.owner); e != nil {
				last = e
				break
			}
			pinned = b != nil
		}
		if b == nil {
			if route.CountsTenants() && claim.Tenant == "" {
				claim = s.claim(st, c)
			}
			b = route.PickFor(&c.tenancy, claim, tried, blocks, opening)
		}
		if b == nil {
			if route.Full(tried) || c.tenancy.HeldBack() {
				if claim.Tenant == "" {
					claim = s.claim(st, c)
				}
				var err error
				if b, err = route.WaitForSlot(tried, blocks, opening, claim, &c.tenancy, c.watch.gone, ctx.Done()); b == nil && err == nil {
					continue // nothing healthy is left to wait for: pick again
				}
				if b == nil && (c.watch.left() || isClosed(ctx.Done())) {
					last = c.watch.waitError()
					break
				}
				if b == nil {
					last = &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "overloaded",
						Message: "Every backend of model " + route.Name + " is at its concurrency limit; retry shortly.", RetryAfter: time.Second}
					break
				}
			}
			if b == nil && len(chain) == 0 {
				b = route.PickEjected(tried)
			}
			if b == nil {
				if last == nil {
					last = &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "no_healthy_backend",
						Message: "No healthy backend serves model " + route.Name + " right now; retry shortly.", RetryAfter: time.Second}
				}
				// Every backend of this model failed or is out: fall back.
				route = nil
				if len(chain) > 0 {
					route, chain = chain[0], chain[1:]
				}
				continue
			}
		}
		if route != counted {
			s.metrics.fallbacks.WithLabelValues(c.route.Name, route.Name).Inc()
			counted = route
		}
		tried = append(tried, b)
		res := s.attempt(ctx, c, route, b, body)
		if res.done {
			return
		}
		last = res.err
		// A request pinned to the backend holding its previous response
		// cannot be served elsewhere, so a failure there is final.
		if pinned || len(tried) >= attempts {
			break
		}
		if !s.retryBudget.Retry(time.Now()) {
			s.metrics.retriesRefused.WithLabelValues(route.Name).Inc()
			break
		}
		s.metrics.retries.WithLabelValues(route.Name).Inc()
		c.rec.Attempts = append(c.rec.Attempts, accounting.Attempt{Backend: b.Name, Model: route.Name,
			Status: res.err.Status, Error: res.err.Message, Started: res.sent, Ended: res.ended})
		if !c.watch.sleep(retryDelay(backoff, res.retryAfter, retries.MaxBackoff), ctx.Done()) {
			last = c.watch.waitError()
			break
		}
		backoff = min(2*backoff, retries.MaxBackoff)
	}
	s.finish(ctx, c, last)
}

// claim is what the queue orders c's request by: its priority, its tenant
// (team/project) and its estimated tokens.
func (s *Server) claim(st *state, c *exchange) backends.Claim {
	return backends.Claim{Priority: c.req.Priority, Tenant: c.rec.Team + "/" + c.rec.Project, Tokens: s.estimate(st, c.ep, c.req)}
}

// attemptResult is how one attempt ended: answered (done), or failed in a
// way another backend may not, with the error to answer if no retry is made.
type attemptResult struct {
	done       bool
	err        *openai.Error
	retryAfter time.Duration
	// sent and ended time a failed attempt, for the record's Attempts.
	sent, ended time.Time
}

// attempt sends the request to b, a backend of route whose slot Pick took,
// and, unless the failure is one to retry, answers the client. It releases
// the slot, or hands it to the stream body.
func (s *Server) attempt(ctx *fasthttp.RequestCtx, c *exchange, route *backends.Route, b *backends.Backend, body []byte) attemptResult {
	bufp := bodyBufs.Get().(*[]byte)
	var upBody []byte
	upstream := c.ep.upstream
	if c.ep.messages != nil {
		var e *openai.Error
		if upBody, upstream, e = c.messagesUpstream((*bufp)[:0], body, route, b); e != nil {
			bodyBufs.Put(bufp)
			c.tenancy.Release(b)
			s.finish(ctx, c, e)
			return attemptResult{done: true}
		}
	} else {
		upBody = openai.AppendUpstreamBody((*bufp)[:0], body, c.req, route.UpstreamJSON, b.ContinuousUsage())
	}

	req := fasthttp.AcquireRequest()
	// The forwarded names come canonical from the server's parse, and the
	// gateway's own are canonical constants (see serve).
	req.Header.DisableNormalizing()
	forwardHeaders(&req.Header, &ctx.Request.Header)
	req.Header.SetCanonical(requestIDName, bytesconv.Bytes(c.rec.RequestID))
	// The gateway's span is the backend's parent, whether or not the
	// client sent a traceparent (which forwardHeaders drops).
	var traceparent [55]byte
	req.Header.SetCanonical(traceparentName, appendTraceparent(traceparent[:0], &c.rec.Span))
	req.Header.SetContentTypeBytes(jsonContentType)
	b.Prepare(req, upstream)
	req.SetBodyRaw(upBody)

	resp := fasthttp.AcquireResponse()
	resp.StreamBody = c.req.Stream
	// One clock read on each side of the round trip serves the request's
	// upstream time and the backend's time to first byte alike.
	sent := time.Now()
	err := b.DoAbortable(req, resp, &c.watch.abort)
	roundTrip := time.Since(sent)
	c.upstream += roundTrip
	fasthttp.ReleaseRequest(req)
	*bufp = upBody[:0]
	bodyBufs.Put(bufp)

	c.rec.Backend = b.Name
	c.rec.ServedModel = route.Name
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		c.tenancy.Release(b)
		e := upstreamError(err, b.Name)
		if errors.As(err, new(backends.AbortedError)) {
			// The client left: the backend did nothing wrong, and
			// nobody waits for a retry.
			s.finish(ctx, c, e)
			return attemptResult{done: true}
		}
		b.ReportFailure()
		var te backends.TimeoutError
		if errors.As(err, &te) && !te.BeforeFirstByte {
			// The backend was already answering: retrying could make it
			// generate the reply twice.
			s.finish(ctx, c, e)
			return attemptResult{done: true}
		}
		return attemptResult{err: e, sent: sent, ended: sent.Add(roundTrip)}
	}
	status := resp.StatusCode()
	if status >= 500 {
		b.ReportFailure()
	} else {
		b.ReportSuccess(roundTrip)
	}
	replyModel := c.replyModel(route)
	ctx.Response.Header.SetCanonical(servedModelName, bytesconv.Bytes(route.Name))
	if c.req.Stream && status == fasthttp.StatusOK && hasPrefixFold(resp.Header.ContentType(), eventStream) {
		// Ownership of resp, b's acquisition and the reservation moves to
		// the stream body, which releases them when the stream ends.
		s.startStream(ctx, c, b, resp, c.shownModel(route), replyModel)
		return attemptResult{done: true}
	}

	if err := b.BufferBody(resp); err != nil {
		// A streamed request answered with no stream (an error, a JSON
		// body) has its body read within server.max_response_bytes too.
		fasthttp.ReleaseResponse(resp)
		c.tenancy.Release(b)
		b.ReportFailure()
		s.finish(ctx, c, upstreamError(err, b.Name))
		return attemptResult{done: true}
	}
	rbody := resp.Body()
	if status < 200 || status > 299 {
		e := openai.NormalizeUpstreamError(status, rbody, b.Name, c.gen.secrets.redact)
		if status == fasthttp.StatusNotFound && c.previousResponse != "" {
			// The backend holding the conversation does not know it (any
			// more): the client's id is wrong, not the configuration.
			e = responseNotFound(c.previousResponse, paramPreviousResponse)
		}
		ra := resp.Header.Peek(fasthttp.HeaderRetryAfter)
		retryAfter := parseRetryAfter(ra)
		if len(ra) > 0 {
			e.RetryAfter = max(retryAfter, time.Second)
		}
		fasthttp.ReleaseResponse(resp)
		c.tenancy.Release(b)
		if retryableStatus(status) {
			return attemptResult{err: e, retryAfter: retryAfter, sent: sent, ended: sent.Add(roundTrip)}
		}
		s.finish(ctx, c, e)
		return attemptResult{done: true}
	}
	if c.ep.messages != nil {
		s.answerMessages(ctx, c, route, b, resp, replyModel)
		return attemptResult{done: true}
	}
	reply, ok := openai.ScanReply(rbody, c.gen.cfg.Server.MaxJSONDepth, c.ep.responses)
	if !ok {
		// A 200 that is not a JSON reply (an HTML page from a proxy in
		// front of the backend, a truncated body) must not reach a
		// client that will fail to parse it.
		fasthttp.ReleaseResponse(resp)
		c.tenancy.Release(b)
		b.ReportFailure()
		s.finish(ctx, c, &openai.Error{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_error",
			Message: "Backend " + b.Name + " answered 200 with a body that is not a JSON chat completion."})
		return attemptResult{done: true}
	}
	var u openai.UsageCounts
	var uerr error
	if c.ep.responses {
		reply := gjson.Parse(bytesconv.String(rbody))
		uerr = u.SetResponses(reply.Get("usage"))
		c.rec.FinishReasons = openai.ResponseFinish(reply)
		// A reply whose id another team owns is still this request's
		// reply, and charged to it, but gives it no access to that id;
		// nor is it waited on as background, which would take the
		// other's pending record.
		owned := s.owners.claim(openai.BackendID(reply.Get("id").String()), responseOwner{backend: b.Name, team: c.rec.Team, project: c.rec.Project})
		if c.backgroundSlot && owned {
			c.pendingResponse = pendingID(reply)
		}
	} else {
		uerr = u.SetChatReply(reply.Usage)
		c.rec.FinishReasons = reply.Finish
	}
	if uerr != nil {
		fasthttp.ReleaseResponse(resp)
		c.tenancy.Release(b)
		s.finish(ctx, c, invalidUsage(b.Name, uerr))
		return attemptResult{done: true}
	}
	recordUsage(&c.rec, &u, u.Output)
	if u.Reported {
		b.ObservePrompt(c.promptBytes, u.Input)
	}
	c.rec.CompletionID, c.rec.CompletionCreated = reply.ID, reply.Created
	if c.payloads {
		c.rec.Input = append([]byte(nil), body...)
		c.rec.Output = append([]byte(nil), rbody...)
	}

	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	if replyModel != nil {
		ctx.Response.SetBodyRaw(openai.RewriteModel(nil, rbody, replyModel))
	} else {
		// Move the upstream body into the client response without a copy,
		// and give the client response's old buffer to resp, so both
		// pooled buffers keep their capacity for the next request.
		resp.SwapBody(ctx.Response.SwapBody(resp.SwapBody(nil)))
	}
	fasthttp.ReleaseResponse(resp)
	c.tenancy.Release(b)
	s.finish(ctx, c, nil)
	return attemptResult{done: true}
}

// replyModel is the quoted model id replies must name when it differs from
// the id the backend of route answers with, or nil when the reply can pass
// as is. A fallback's reply names the model that served it, unless the
// requested model is configured to keep its own name.
func (c *exchange) replyModel(served *backends.Route) []byte {
	shown := served
	if served != c.route && c.route.FallbackKeepsModel {
		shown = c.route
	}
	if shown.Name == served.Upstream {
		return nil
	}
	return shown.NameJSON
}

// retryableStatus reports the upstream statuses another backend may not
// repeat: overload and gateway failures. Other 4xx are about the request
// and 500 may be a reply to this very input, so neither is retried.
func retryableStatus(status int) bool {
	switch status {
	case fasthttp.StatusTooManyRequests, fasthttp.StatusBadGateway,
		fasthttp.StatusServiceUnavailable, fasthttp.StatusGatewayTimeout:
		return true
	}
	return false
}

// retryDelay is full jitter over the current backoff, but never less than
// what the backend asked for in Retry-After, and never more than max.
func retryDelay(backoff, retryAfter, maxDelay time.Duration) time.Duration {
	d := time.Duration(rand.Int64N(int64(backoff) + 1))
	return min(max(d, retryAfter), maxDelay)
}

// parseRetryAfter reads a Retry-After header in seconds; an HTTP date or
// garbage count as absent.
func parseRetryAfter(v []byte) time.Duration {
	n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}
