package proxy

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/backends"
)

const (
	headerRequestID   = "X-Request-Id"
	headerProject     = "Compat-Project"
	headerTraceID     = "Compat-Trace-Id"
	headerParentID    = "Compat-Parent-Id"
	headerCallID      = "Compat-Call-Id"
	headerTraceparent = "Traceparent"
	headerServedModel = "Compat-Served-Model"
)

// The names the request path sets on headers whose normalizing is off
// (see serve), for SetCanonical: Set copies the name and looks it over
// for a space before it would normalize it, and copies and scrubs the
// value twice (once into its buffer, once from that buffer into itself),
// about 250 instructions per header that SetCanonical does not spend.
var (
	requestIDName   = []byte(headerRequestID)
	callIDName      = []byte(headerCallID)
	servedModelName = []byte(headerServedModel)
	traceparentName = []byte(headerTraceparent)
)

var (
	jsonContentType     = []byte("application/json")
	eventStream         = []byte("text/event-stream")
	includeUsageOn      = []byte(`{"include_usage":true}`)
	includeContinuousOn = []byte(`{"include_usage":true,"continuous_usage_stats":true}`)
)

// completions recycles the per-request state of chat completions.
var completions = sync.Pool{New: func() any { return newCompletion() }}

// bodyBufs recycles the buffers upstream request bodies are built in.
var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// completion is one chat completion in flight: what the client asked for,
// where it goes, and the usage record being filled.
type completion struct {
	// req is what validation found in the request body. It is held
	// apart, so that a stream, which copies the completion and needs none
	// of it, does not hold it (see startStream).
	req *ChatRequest
	rec accounting.Record
	res accounting.Reservation
	// limiter made res; nil when nothing was reserved.
	limiter Limiter
	route   *backends.Route
	// payloads says whether prompts and outputs go into the record.
	payloads bool
	// streamSlot is true while the request holds one of the server's
	// max_streams slots.
	streamSlot bool
	// gen is the configuration generation the request uses; it is
	// released when the request is settled (or rejected).
	gen *state
	// watch sees the client leave while forward waits on backends.
	watch *clientWatch
	// closed is set once the completion is settled, rejected or handed
	// to a stream body: nothing is left for abandon to release.
	closed bool
	// ep is the endpoint called.
	ep *endpoint
	// previousResponse is the Responses API's previous_response_id, and
	// owner the backend that made it ("" when unknown): the request must
	// go there, where the response lives.
	previousResponse string
	owner            string
	// background is a Responses API request made with "background": true;
	// backgroundSlot is true while it holds a slot of the server's
	// background responses, and pendingResponse is the id of the response
	// its reply left running (see background.go).
	background      bool
	backgroundSlot  bool
	pendingResponse string
	// upstream is the time spent on the request's upstream round trips,
	// from sending to the last byte (the response headers for a stream),
	// summed over attempts: the rest of its time is the gateway's own.
	upstream time.Duration
}

// newCompletion returns a completion with its ChatRequest, for the pool.
func newCompletion() *completion { return &completion{req: new(ChatRequest)} }

// reset clears c for its next request, keeping its ChatRequest.
func (c *completion) reset() {
	req := c.req
	*req = ChatRequest{}
	*c = completion{req: req}
}

// serve is the path of every endpoint routed by model, chat completions
// first among them: authenticate, attribute, validate, route, reserve,
// rewrite, round trip, and copy the reply back (or hand the stream to a
// streamBody). ep says what differs between endpoints.
func (s *Server) serve(ctx *fasthttp.RequestCtx, ep *endpoint) {
	// Every header name the request path reads or sets is a constant in
	// canonical form, and the server canonicalized the client's names as
	// it parsed them, so fasthttp's normalizing of the name on every Peek
	// and Set (a copy and a table lookup per byte) changes nothing here.
	// The server's Reset turns it back on for the connection's next
	// request. TestHeaderNamesCanonical keeps the constants canonical.
	ctx.Request.Header.DisableNormalizing()
	ctx.Response.Header.DisableNormalizing()
	st := s.acquire()
	// The completion outlives no call of serve (a stream copies it), so
	// it comes from a pool rather than the heap: it escapes through the
	// interface calls it is passed to.
	c := completions.Get().(*completion)
	defer func() {
		if r := recover(); r != nil {
			// Settle what the panic left open, then let Handler's
			// recoverHandler count, log and answer it.
			s.abandon(c)
			panic(r)
		}
		c.reset()
		completions.Put(c)
	}()
	c.gen = st
	c.ep = ep
	c.rec.Endpoint = ep.name
	c.rec.Started = time.Now()
	c.payloads = st.cfg.Traces.StorePayloads

	call := s.callIDs.nextUUID(c.rec.Started)
	callID := formatUUID(&call)
	c.rec.CallID = callID
	hdr := readClientHeaders(&ctx.Request.Header)
	if rid := hdr.requestID; validID(rid) {
		c.rec.RequestID = string(rid)
	} else {
		c.rec.RequestID = callID
	}
	ctx.Response.Header.SetCanonical(requestIDName, s2b(c.rec.RequestID))
	ctx.Response.Header.SetCanonical(callIDName, s2b(callID))

	key, e := s.authenticateKey(st, hdr.authorization)
	if e != nil {
		s.reject(ctx, c, e)
		return
	}
	c.rec.KeyName = key.Name
	team, project, err := accounting.ParseProject(hdr.project, key.DefaultTeam, st.cfg.Usage.DefaultProject)
	if err != nil {
		s.reject(ctx, c, &apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_project",
			Message: err.Error()})
		return
	}
	if !key.AllowsTeam(team) {
		s.reject(ctx, c, &apiError{Status: fasthttp.StatusForbidden, Type: "permission_denied", Code: "permission_denied",
			Message: "API key " + key.Name + " may not use team " + team + "."})
		return
	}
	c.rec.Team, c.rec.Project = team, project

	tc, err := parseTraceHeaders(hdr.traceID, hdr.parentID, hdr.traceparent)
	if err != nil {
		s.reject(ctx, c, &apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_trace_context",
			Message: err.Error() + "."})
		return
	}
	c.rec.TraceID, c.rec.ParentID = tc.traceID, tc.parentID
	c.rec.Span = callSpan(&tc, &call)
	if c.rec.TraceID == "" {
		// A root call: its trace is named after it, as evaluation runs are.
		c.rec.TraceID = callID
	}

	if ct := ctx.Request.Header.ContentType(); !hasPrefixFold(ct, jsonContentType) {
		s.reject(ctx, c, &apiError{Status: fasthttp.StatusUnsupportedMediaType, Type: "invalid_request_error",
			Message: "Content-Type must be application/json."})
		return
	}
	body := ctx.PostBody()
	if verr := ep.validate(body, c, &st.cfg.Server); verr != nil {
		s.reject(ctx, c, &apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: verr.Param, Message: verr.Message})
		return
	}
	if limit := st.cfg.Server.MaxMessages; c.req.Messages > limit {
		s.reject(ctx, c, &apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: "messages",
			Message: "messages has " + strconv.Itoa(c.req.Messages) + " entries; the gateway accepts at most " + strconv.Itoa(limit) + "."})
		return
	}
	c.rec.Stream = c.req.Stream

	c.route = s.route(st, c.req.Model)
	if c.route == nil {
		s.reject(ctx, c, modelNotFound(c.req.Model))
		return
	}
	c.rec.Model, c.rec.ServedModel = c.route.Name, c.route.Name
	if !c.route.Serves(ep.upstream) {
		s.finish(ctx, c, endpointNotServed(ep, c.route.Name))
		return
	}
	if c.previousResponse != "" {
		owner, allowed := s.owners.ownerFor(c.previousResponse, key)
		if !allowed {
			s.finish(ctx, c, responseNotFound(c.previousResponse, paramPreviousResponse))
			return
		}
		c.owner = owner
	}
	if e := s.foreignRequestID(ep, body, key); e != nil {
		s.finish(ctx, c, e)
		return
	}
	if c.req.Priority != 0 && !c.route.PriorityScheduling {
		s.finish(ctx, c, &apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: "priority",
			Message: "priority must be 0: model " + c.route.Name + " is not served with priority scheduling."})
		return
	}
	if e := toolChoiceRefusal(c.req, c.route); e != nil {
		s.finish(ctx, c, e)
		return
	}
	if c.background && !c.req.Stream {
		// Its usage comes after the answer: the gateway must be able to
		// wait for it (a background stream carries it in its events).
		if e := s.background.admit(team, st.cfg.Server.BackgroundTeamShare); e != nil {
			s.finish(ctx, c, e)
			return
		}
		c.backgroundSlot = true
	}

	if c.req.Stream {
		// The slot is taken before the request goes out, not counted when
		// the stream starts, so a burst cannot overshoot the cap.
		if s.streams.Add(1) > int64(st.cfg.Server.MaxStreams) {
			s.streams.Add(-1)
			s.finish(ctx, c, &apiError{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "too_many_streams",
				Message: "The gateway is at its limit of concurrent streams; retry shortly.", RetryAfter: time.Second})
			return
		}
		c.streamSlot = true
	}
	res, err := st.limiter.Reserve(accounting.Subject{Team: team, Project: project, Key: key.Name}, s.estimate(st, ep, c.req))
	if err != nil {
		s.metrics.countRefusal(err)
		s.finish(ctx, c, limitError(err))
		return
	}
	// The reservation is settled on the limiter that made it, even if a
	// reload installs another one meanwhile.
	c.res, c.limiter = res, st.limiter

	s.forward(ctx, st, c, body)
}

// route resolves the requested model. A body without a model is served by
// the only configured model when there is exactly one, as vLLM serves its
// single model.
func (s *Server) route(st *state, model []byte) *backends.Route {
	if model == nil {
		if routes := st.reg.Routes(); len(routes) == 1 {
			return routes[0]
		}
		return nil
	}
	return st.reg.Route(model)
}

func modelNotFound(model []byte) *apiError {
	if model == nil {
		return &apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: "model",
			Message: "model is required: the gateway serves several models. GET /v1/models lists them."}
	}
	return &apiError{Status: fasthttp.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
		Message: "The model `" + clip(string(model)) + "` does not exist."}
}

// estimate is the number of tokens reserved against budgets before the
// request runs: the prompt estimate plus the most the request may generate
// for each of its n choices.
func (s *Server) estimate(st *state, ep *endpoint, req *ChatRequest) int64 {
	if !ep.generates {
		return promptEstimate(req)
	}
	maxTokens := req.MaxTokens
	if maxTokens <= 0 {
		maxTokens = st.cfg.Usage.DefaultMaxTokens
	}
	return satAdd(promptEstimate(req), satMul(maxTokens, max(req.N, 1)))
}

// satAdd and satMul add and multiply non-negative numbers, saturating at
// the largest int64: a request asking for 2^62 tokens times n must
// reserve everything, not wrap around to a small or negative estimate that
// slips past budgets.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// looksLikeJSONObject is the cheap check that a reply is a JSON object:
// its first and last non-space bytes are braces. Parsing it fully would
// cost a microsecond per kilobyte on every reply.
func looksLikeJSONObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) >= 2 && b[0] == '{' && b[len(b)-1] == '}'
}

// promptEstimate guesses a prompt's tokens before (or without) the
// backend's count: about four bytes of text per token, plus the four or so
// tokens a chat template wraps around each message.
func promptEstimate(req *ChatRequest) int64 {
	return int64(req.PromptBytes+3)/4 + 4*int64(req.Messages)
}

// maxAttempts bounds the backends one request is sent to whatever the
// configuration says, so the tried set stays on the stack.
const maxAttempts = 8

// forward sends the request to a backend of the model, or of its
// fallbacks, and answers the client. A failure before any byte reached the
// client — a connection failure, a timeout before the first response byte,
// or a 429/502/503/504 — is retried on another backend, within the retry
// attempts and the retry budget, after a jittered backoff. When every
// backend of a model failed or is out, its fallbacks are tried in order.
// When every backend is merely busy (at max_concurrency) the request waits
// in the model's bounded queue. forward owns the reservation from here on.
func (s *Server) forward(ctx *fasthttp.RequestCtx, st *state, c *completion, body []byte) {
	retries := st.cfg.Retries
	s.retryBudget.Request()
	var affinity uint64
	if c.route.Affinity {
		affinity = backends.AffinityKey(promptPrefix(body))
	}
	c.watch = s.clients.watch(ctx, c.rec.Started)
	defer c.watch.stop()
	var triedArr [maxAttempts]*backends.Backend
	tried := backends.Tried(triedArr[:0])
	attempts := min(retries.Attempts, maxAttempts)
	backoff := retries.Backoff
	var last *apiError
	route := c.route
	chain := c.route.Fallbacks
	counted := c.route // the last route counted as a fallback taken
	for route != nil && len(tried) < attempts {
		if !route.Serves(c.ep.upstream) || !toolChoiceServed(c.req, route) {
			// A fallback that does not serve the endpoint, or the
			// tool_choice asked for, is skipped.
			route = nil
			if len(chain) > 0 {
				route, chain = chain[0], chain[1:]
			}
			continue
		}
		var b *backends.Backend
		pinned := false
		if c.owner != "" && len(tried) == 0 {
			var e *apiError
			if b, e = pickOwner(route, c.owner); e != nil {
				last = e
				break
			}
			pinned = b != nil
		}
		if b == nil {
			b = route.Pick(tried, affinity)
		}
		if b == nil {
			if route.Full(tried) {
				if route.WaitForSlot(tried, c.watch.gone, ctx.Done()) {
					continue
				}
				if c.watch.left() || isClosed(ctx.Done()) {
					last = c.watch.waitError()
					break
				}
				last = &apiError{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "overloaded",
					Message: "Every backend of model " + route.Name + " is at its concurrency limit; retry shortly.", RetryAfter: time.Second}
				break
			}
			if len(chain) == 0 {
				b = route.PickEjected(tried)
			}
			if b == nil {
				if last == nil {
					last = &apiError{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "no_healthy_backend",
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

// attemptResult is how one attempt ended: answered (done), or failed in a
// way another backend may not, with the error to answer if no retry is made.
type attemptResult struct {
	done       bool
	err        *apiError
	retryAfter time.Duration
	// sent and ended time a failed attempt, for the record's Attempts.
	sent, ended time.Time
}

// attempt sends the request to b, a backend of route whose slot Pick took,
// and, unless the failure is one to retry, answers the client. It releases
// the slot, or hands it to the stream body.
func (s *Server) attempt(ctx *fasthttp.RequestCtx, c *completion, route *backends.Route, b *backends.Backend, body []byte) attemptResult {
	bufp := bodyBufs.Get().(*[]byte)
	upBody := buildUpstreamBody((*bufp)[:0], body, c.req, route, b.ContinuousUsage())

	req := fasthttp.AcquireRequest()
	// The forwarded names come canonical from the server's parse, and the
	// gateway's own are canonical constants (see serve).
	req.Header.DisableNormalizing()
	forwardHeaders(&req.Header, &ctx.Request.Header)
	req.Header.SetCanonical(requestIDName, s2b(c.rec.RequestID))
	// The gateway's span is the backend's parent, whether or not the
	// client sent a traceparent (which forwardHeaders drops).
	var traceparent [55]byte
	req.Header.SetCanonical(traceparentName, appendTraceparent(traceparent[:0], &c.rec.Span))
	req.Header.SetContentTypeBytes(jsonContentType)
	b.Prepare(req, c.ep.upstream)
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
		b.Release()
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
	ctx.Response.Header.SetCanonical(servedModelName, s2b(route.Name))
	if c.req.Stream && status == fasthttp.StatusOK && hasPrefixFold(resp.Header.ContentType(), eventStream) {
		// Ownership of resp, b's acquisition and the reservation moves to
		// the stream body, which releases them when the stream ends.
		s.startStream(ctx, c, b, resp, replyModel)
		return attemptResult{done: true}
	}

	if err := b.BufferBody(resp); err != nil {
		// A streamed request answered with no stream (an error, a JSON
		// body) has its body read within server.max_response_bytes too.
		fasthttp.ReleaseResponse(resp)
		b.Release()
		b.ReportFailure()
		s.finish(ctx, c, upstreamError(err, b.Name))
		return attemptResult{done: true}
	}
	rbody := resp.Body()
	if status < 200 || status > 299 {
		e := normalizeUpstreamError(status, rbody, b.Name)
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
		b.Release()
		if retryableStatus(status) {
			return attemptResult{err: e, retryAfter: retryAfter, sent: sent, ended: sent.Add(roundTrip)}
		}
		s.finish(ctx, c, e)
		return attemptResult{done: true}
	}
	reply, ok := scanReply(rbody, c.gen.cfg.Server.MaxJSONDepth, c.ep.responses)
	if !ok {
		// A 200 that is not a chat completion (an HTML page from a proxy
		// in front of the backend, a truncated body) must not reach a
		// client that will fail to parse it.
		fasthttp.ReleaseResponse(resp)
		b.Release()
		b.ReportFailure()
		s.finish(ctx, c, &apiError{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_error",
			Message: "Backend " + b.Name + " answered 200 with a body that is not a JSON chat completion."})
		return attemptResult{done: true}
	}
	var u usageCounts
	var uerr error
	if c.ep.responses {
		reply := gjson.Parse(b2s(rbody))
		uerr = u.setResponses(reply.Get("usage"))
		// A reply whose id another team owns is still this request's
		// reply, and charged to it, but gives it no access to that id;
		// nor is it waited on as background, which would take the
		// other's pending record.
		owned := s.owners.claim(backendID(reply.Get("id").String()), responseOwner{backend: b.Name, team: c.rec.Team, project: c.rec.Project})
		if c.backgroundSlot && owned {
			c.pendingResponse = pendingID(reply)
		}
	} else {
		uerr = u.parseValidUsage(reply.usage, &chatUsageFields)
	}
	if uerr != nil {
		fasthttp.ReleaseResponse(resp)
		b.Release()
		s.finish(ctx, c, invalidUsage(b.Name, uerr))
		return attemptResult{done: true}
	}
	c.setUsage(&u, u.completion)
	c.rec.CompletionID, c.rec.CompletionCreated = reply.id, reply.created
	if c.payloads {
		c.rec.Input = append([]byte(nil), body...)
		c.rec.Output = append([]byte(nil), rbody...)
	}

	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	if replyModel != nil {
		ctx.Response.SetBodyRaw(rewriteModel(nil, rbody, replyModel))
	} else {
		// Move the upstream body into the client response without a copy,
		// and give the client response's old buffer to resp, so both
		// pooled buffers keep their capacity for the next request.
		resp.SwapBody(ctx.Response.SwapBody(resp.SwapBody(nil)))
	}
	fasthttp.ReleaseResponse(resp)
	b.Release()
	s.finish(ctx, c, nil)
	return attemptResult{done: true}
}

// replyModel is the quoted model id replies must name when it differs from
// the id the backend of route answers with, or nil when the reply can pass
// as is. A fallback's reply names the model that served it, unless the
// requested model is configured to keep its own name.
func (c *completion) replyModel(served *backends.Route) []byte {
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

// promptPrefix is what prefix affinity keys on: the first two messages
// (typically the system prompt and the first user turn), where prompts
// that share a KV-cache prefix agree.
func promptPrefix(body []byte) []byte {
	msgs := gjson.Get(b2s(body), "messages")
	first, second := msgs.Get("0"), msgs.Get("1")
	if !first.Exists() {
		return nil
	}
	end := first.Index + len(first.Raw)
	if second.Exists() {
		end = second.Index + len(second.Raw)
	}
	if first.Index <= 0 || end > len(body) || msgs.Index <= 0 {
		return nil
	}
	return body[msgs.Index+first.Index : msgs.Index+end]
}

// buildUpstreamBody appends the body sent upstream: the client's body with
// the model id rewritten and, for streams, usage requested on the client's
// behalf: include_usage always, so that every stream reports its usage, and
// continuous_usage_stats where the backend supports it, so that a stream cut
// short is still counted exactly. It splices at the offsets validation
// found instead of re-encoding the JSON.
func buildUpstreamBody(dst, body []byte, req *ChatRequest, rt *backends.Route, continuous bool) []byte {
	type edit struct {
		start, end int
		with       []byte // nil: rewrite the stream_options value
	}
	var edits [2]edit
	n := 0
	// The model is rewritten whenever the body does not already name the
	// route's upstream id: for a route with an upstream_model, and for a
	// fallback route, whose backends serve another model than the one the
	// client asked for.
	if req.ModelEnd > req.ModelStart && !bytes.Equal(body[req.ModelStart:req.ModelEnd], rt.UpstreamJSON) {
		edits[n] = edit{req.ModelStart, req.ModelEnd, rt.UpstreamJSON}
		n++
	}
	if req.Stream && (!req.IncludeUsage || continuous && !req.ContinuousUsage) {
		if req.StreamOptionsEnd > req.StreamOptionsStart {
			edits[n] = edit{req.StreamOptionsStart, req.StreamOptionsEnd, nil}
		} else {
			// Insert the field right after the opening brace.
			open := bytes.IndexByte(body, '{') + 1
			edits[n] = edit{open, open, nil}
		}
		n++
	}
	if n == 2 && edits[1].start < edits[0].start {
		edits[0], edits[1] = edits[1], edits[0]
	}
	pos := 0
	for _, e := range edits[:n] {
		dst = append(dst, body[pos:e.start]...)
		switch {
		case e.with != nil:
			dst = append(dst, e.with...)
		case e.start == e.end:
			dst = append(dst, `"stream_options":`...)
			dst = appendStreamOptions(dst, nil, continuous)
			dst = append(dst, ',')
		default:
			dst = appendStreamOptions(dst, body[e.start:e.end], continuous)
		}
		pos = e.end
	}
	return append(dst, body[pos:]...)
}

// appendStreamOptions appends the client's stream_options object (nil or
// null when it sent none) with include_usage, and continuous_usage_stats
// when continuous, set to true, keeping its other options.
func appendStreamOptions(dst, opts []byte, continuous bool) []byte {
	if !bytes.HasPrefix(opts, []byte("{")) {
		if continuous {
			return append(dst, includeContinuousOn...)
		}
		return append(dst, includeUsageOn...)
	}
	// sjson edits the small options object; the body around it is spliced.
	out, err := sjson.SetBytes(opts, "include_usage", true)
	if err == nil && continuous {
		out, err = sjson.SetBytes(out, "continuous_usage_stats", true)
	}
	if err != nil {
		// Validation proved opts an object, which sjson always edits; keep
		// a well-formed request regardless.
		return append(dst, includeUsageOn...)
	}
	return append(dst, out...)
}

// setUsage fills the record's counts from what the backend reported.
func (c *completion) setUsage(u *usageCounts, completion int64) {
	setRecordUsage(&c.rec, u, completion)
}

// setRecordUsage fills rec's counts from what the backend reported.
func setRecordUsage(rec *accounting.Record, u *usageCounts, completion int64) {
	rec.PromptTokens = u.prompt
	rec.CompletionTokens = completion
	rec.CachedTokens = u.cached
	rec.TotalTokens = u.total
	if !u.reported || rec.TotalTokens < rec.PromptTokens+rec.CompletionTokens {
		rec.TotalTokens = rec.PromptTokens + rec.CompletionTokens
	}
}

// reject answers a request refused before it was attributed to a model:
// it is counted in metrics and logged, but makes no usage record, since it
// used no model.
func (s *Server) reject(ctx *fasthttp.RequestCtx, c *completion, e *apiError) {
	c.closed = true
	c.gen.release()
	writeError(ctx, e)
	s.metrics.requests.WithLabelValues("", "", statusLabel(e.Status), c.ep.name).Inc()
	if ce := s.log.Check(zap.InfoLevel, "request rejected"); ce != nil {
		ce.Write(zap.String("request_id", c.rec.RequestID), zap.String("key", c.rec.KeyName),
			zap.Int("status", e.Status), zap.String("error", e.Message))
	}
}

// finish ends a non-streamed completion: it answers e if non-nil, settles
// the reservation, and records usage, metrics and the log line.
func (s *Server) finish(ctx *fasthttp.RequestCtx, c *completion, e *apiError) {
	if e != nil {
		writeError(ctx, e)
		c.rec.Error = e.Message
		if e.Cause != nil {
			c.rec.Error += " (" + e.Cause.Error() + ")"
		}
		c.rec.Status = e.Status
	} else {
		c.rec.Status = ctx.Response.StatusCode()
	}
	c.rec.Ended = time.Now()
	if e == nil {
		s.metrics.observeOverhead(c.route.Name, c.rec.Ended.Sub(c.rec.Started)-c.upstream)
	}
	s.settle(c)
}

// settle releases the reservation and the stream slot, and records a
// finished completion.
func (s *Server) settle(c *completion) {
	c.closed = true
	c.gen.release()
	if c.streamSlot {
		s.streams.Add(-1)
		c.streamSlot = false
	}
	// A background response still running is recorded, and its
	// reservation settled, once it has finished.
	if !s.holdBackground(c) {
		if c.limiter != nil {
			c.limiter.Settle(c.res, c.rec.TotalTokens)
		}
		s.recorder.Record(c.rec)
	}
	s.metrics.countRequest(c.rec.Model, c.rec.Backend, c.rec.Status, c.ep.name, c.rec.Ended.Sub(c.rec.Started))
	if ce := s.log.Check(zap.InfoLevel, "request"); ce != nil {
		ce.Write(zap.Inline(requestLog{&c.rec}))
	}
}

// hasPrefixFold reports whether s starts with prefix, ignoring ASCII case.
func hasPrefixFold(s, prefix []byte) bool {
	return len(s) >= len(prefix) && equalFold(s[:len(prefix)], prefix)
}

// completionKeyOf returns the "id" of a completion reply as a new string,
// since the body is a pooled buffer, and its date: "created" (a chat or
// text completion) or, for a response, "created_at"; 0 when absent. The
// usage record keeps both, by which a Weave SDK's trace of the completion
// is joined to the gateway's call (the store reads the SDK's copy of the
// reply by the same rule). One walk of the top-level members, which stops
// once both are found: backends write them first.
func completionKeyOf(body []byte, response bool) (id string, created int64) {
	dateKey := "created"
	if response {
		dateKey = "created_at"
	}
	var haveID, haveDate bool
	gjson.Parse(b2s(body)).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "id":
			id, haveID = strings.Clone(backendID(v.String())), true
		case dateKey:
			created, haveDate = v.Int(), true
		}
		return !haveID || !haveDate
	})
	return id, created
}
