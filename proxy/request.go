package proxy

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/anthropic"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/openai"
)

const (
	headerRequestID   = "X-Request-Id"
	headerProject     = "Compat-Project"
	headerTraceID     = "Compat-Trace-Id"
	headerParentID    = "Compat-Parent-Id"
	headerCallID      = "Compat-Call-Id"
	headerTraceparent = "Traceparent"
	headerServedModel = "Compat-Served-Model"
	headerAPIKey      = "X-Api-Key"
)

// The names the request path sets on headers whose normalizing is off
// (see serve), for SetCanonical: Set copies the name and looks it over
// for a space before it would normalize it, and copies and scrubs the
// value twice (once into its buffer, once from that buffer into itself):
// work on every header that SetCanonical does not do.
var (
	requestIDName   = []byte(headerRequestID)
	callIDName      = []byte(headerCallID)
	servedModelName = []byte(headerServedModel)
	traceparentName = []byte(headerTraceparent)
)

var (
	jsonContentType = []byte("application/json")
	eventStream     = []byte("text/event-stream")
)

// exchanges recycles the per-request state of the endpoints routed by model.
var exchanges = sync.Pool{New: func() any { return newExchange() }}

// bodyBufs recycles the buffers upstream request bodies are built in.
var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// exchange is one request in flight on an endpoint routed by model (chat
// completions, completions, embeddings or responses): what the client
// asked for, where it goes, and the usage record being filled.
type exchange struct {
	// req is what validation found in the request body. It is held
	// apart, so that a stream, which copies the exchange and needs none
	// of it, does not hold it (see startStream).
	req *openai.Request
	// msg is what validation found in a Messages API body (see
	// validateMessages); like req, kept with the exchange.
	msg *anthropic.Request
	// native says the backend of the current attempt serves the Messages
	// API itself (see messagesUpstream).
	native bool
	rec    accounting.Record
	res    accounting.Reservation
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
	// tenancy counts the backend slot the request holds against its
	// tenant, on a model that counts them; its Release frees the slot.
	tenancy backends.Tenancy
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
	// promptBytes is the length of the prompt's raw JSON the scheduler cut
	// into blocks, for the backend to learn its bytes per token from the
	// reply's usage; zero when the route cuts no blocks.
	promptBytes int
}

// newExchange returns an exchange with its openai.Request, for the pool.
func newExchange() *exchange { return &exchange{req: new(openai.Request), msg: new(anthropic.Request)} }

// reset clears c for its next request, keeping its requests' storage.
func (c *exchange) reset() {
	req, msg := c.req, c.msg
	*req = openai.Request{}
	*c = exchange{req: req, msg: msg}
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
	c := exchanges.Get().(*exchange)
	defer func() {
		if r := recover(); r != nil {
			// Settle what the panic left open, then let Handler's
			// recoverHandler count, log and answer it.
			s.abandon(c)
			panic(r)
		}
		c.reset()
		exchanges.Put(c)
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
	ctx.Response.Header.SetCanonical(requestIDName, bytesconv.Bytes(c.rec.RequestID))
	ctx.Response.Header.SetCanonical(callIDName, bytesconv.Bytes(callID))

	key, e := s.authenticateKey(st, hdr.authorization, hdr.apiKey)
	if e != nil {
		s.reject(ctx, c, e)
		return
	}
	c.rec.KeyName = key.Name
	team, project, err := accounting.ParseProject(hdr.project, key.DefaultTeam, st.cfg.Usage.DefaultProject)
	if err != nil {
		s.reject(ctx, c, &openai.Error{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_project",
			Message: err.Error()})
		return
	}
	if !key.AllowsTeam(team) {
		s.reject(ctx, c, &openai.Error{Status: fasthttp.StatusForbidden, Type: "permission_denied", Code: "permission_denied",
			Message: "API key " + key.Name + " may not use team " + team + "."})
		return
	}
	c.rec.Team, c.rec.Project = team, project

	tc, err := parseTraceHeaders(hdr.traceID, hdr.parentID, hdr.traceparent)
	if err != nil {
		s.reject(ctx, c, &openai.Error{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_trace_context",
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
		s.reject(ctx, c, &openai.Error{Status: fasthttp.StatusUnsupportedMediaType, Type: "invalid_request_error",
			Message: "Content-Type must be application/json."})
		return
	}
	body := ctx.PostBody()
	if ep.messages != nil {
		if e := c.validateMessages(body, &st.cfg.Server); e != nil {
			s.reject(ctx, c, e)
			return
		}
	} else if verr := ep.validate(body, c.req, bodyLimits(&st.cfg.Server)); verr != nil {
		s.reject(ctx, c, &openai.Error{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: verr.Param, Message: verr.Message})
		return
	}
	c.previousResponse, c.background = c.req.PreviousResponseID, c.req.Background
	if limit := st.cfg.Server.MaxMessages; c.req.Messages > limit {
		s.reject(ctx, c, &openai.Error{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: "messages",
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
	if ep.messages != nil {
		if e := c.checkMessagesRoute(); e != nil {
			s.finish(ctx, c, e)
			return
		}
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
	if !c.route.AcceptsPriority(c.req.Priority) {
		s.finish(ctx, c, &openai.Error{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: "priority",
			Message: "priority must be 0: model " + c.route.Name + " is not served with priority scheduling."})
		return
	}
	if e := c.req.ToolChoiceRefusal(c.route.Name, c.route.ToolCalling); e != nil {
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
			s.finish(ctx, c, &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "too_many_streams",
				Message: "The gateway is at its limit of concurrent streams; retry shortly.", RetryAfter: time.Second})
			return
		}
		c.streamSlot = true
	}
	estimate := s.estimate(st, ep, c.req)
	if e := s.admit(ctx, key, c.route.Name, estimate, &c.rec); e != nil {
		s.finish(ctx, c, e)
		return
	}
	res, err := st.limiter.Reserve(accounting.Subject{Team: team, Project: project, Key: key.Name}, estimate)
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

func modelNotFound(model []byte) *openai.Error {
	if model == nil {
		return &openai.Error{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: "model",
			Message: "model is required: the gateway serves several models. GET /v1/models lists them."}
	}
	return &openai.Error{Status: fasthttp.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
		Message: "The model `" + openai.Clip(string(model)) + "` does not exist."}
}

// estimate is the number of tokens reserved against budgets before the
// request runs: the prompt estimate plus the most the request may generate
// for each of its n choices.
func (s *Server) estimate(st *state, ep *endpoint, req *openai.Request) int64 {
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

// promptEstimate guesses a prompt's tokens before (or without) the
// backend's count: about four bytes of text per token, plus the four or so
// tokens a chat template wraps around each message.
func promptEstimate(req *openai.Request) int64 {
	return int64(req.PromptBytes+3)/4 + 4*int64(req.Messages)
}

// hasPrefixFold reports whether s starts with prefix, ignoring ASCII case.
func hasPrefixFold(s, prefix []byte) bool {
	return len(s) >= len(prefix) && equalFold(s[:len(prefix)], prefix)
}
