// Package simulated is a deterministic OpenAI-compatible backend in the style of vLLM: chat and
// text completions, embeddings, the Responses API and the model list. The gateway runs it
// in-process (config `simulated: {...}` on a backend), cmd/mockllm runs it standalone, and tests
// and benchmarks use it as their upstream. It exists so that everything the gateway does with a
// real inference server (streaming, usage accounting, cancellation, error normalisation,
// timeouts, tool calls, structured outputs) can be exercised without one, cheaply enough that it
// does not dominate a benchmark.
//
// Output is deterministic, so tests can assert exact text and usage numbers: completion token i
// (0-based) is the text "tok<i> "; prompt_tokens is, summed over the messages, 4 plus the number of
// whitespace-separated words in the message's content (a string, or the "text" parts of an array);
// completion_tokens is max_completion_tokens, else max_tokens, else Options.Tokens, times n.
// A stream carries usage on every chunk when stream_options.continuous_usage_stats is true, and a
// final usage chunk when stream_options.include_usage is true.
//
// A plain chat request takes the allocation-free path of chat.go and stream.go. Anything more
// (a seed, stop strings or token ids, logprobs, structured outputs, a tool call) takes the path of
// chat_rich.go: the choices are generated up front (generate.go, schema.go, tools.go,
// logprobs.go) and streamed by events.go, which also streams completions.go and responses.go.
//
// Failures are injected per request through headers (a gateway forwards unknown client headers
// upstream), or for every request through Options.FailStatus:
//
//	X-Mock-Status: 500            answer with this status and an error body
//	X-Mock-Error-Shape: nested    nested (vLLM >= 0.10.1, the default), flat (older vLLM),
//	                              bare ({"error":"Unauthorized"}) or plain (text/plain)
//	X-Mock-Fail-After: 3          stream: an in-band error event after 3 token events, then [DONE]
//	X-Mock-Break-After: 3         stream: drop the connection after 3 token events, no [DONE]
//	X-Mock-Delay: 2s              wait this long before answering at all
//	X-Mock-Garbage: 1             answer 200 text/event-stream with a body that is not SSE
package simulated

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

const (
	// maxModelLen is the simulated context length. Requests whose prompt plus completion exceed
	// it are refused with vLLM's message, which also bounds the memory a single reply can take.
	maxModelLen = 131072
	// maxChoices bounds n for the same reason: n choices of maxModelLen tokens are built in memory.
	maxChoices = 64
	// tokensPerMessage is the fixed per-message overhead of the prompt token formula, standing in
	// for the role and separator tokens a chat template adds.
	tokensPerMessage = 4
	// maxRequestBodySize is generous so that large prompts forwarded by the gateway are accepted,
	// as a real backend would accept them.
	maxRequestBodySize = 64 << 20
)

const (
	contentTypeJSON  = "application/json"
	contentTypeSSE   = "text/event-stream"
	contentTypePlain = "text/plain; charset=utf-8"

	failureMessage   = "simulated failure"
	midStreamFailure = `data: {"error":{"message":"simulated mid-stream failure","type":"InternalServerError","code":500}}` + "\n\n"
	doneEvent        = "data: [DONE]\n\n"
	// garbageBody is deliberately neither SSE nor JSON: no "data:" prefix, no blank-line framing,
	// an unterminated object, so a client parsing it must fail rather than see an empty stream.
	garbageBody = "this is not a server-sent event stream\n{\"choices\":[{\"delta\":\n<html>502 Bad Gateway</html>\r\nevent without data"
)

// errBreak is what the stream reader returns to make fasthttp abandon the response mid-body:
// fasthttp closes a connection whose body stream fails, without the terminating chunk.
var errBreak = errors.New("simulated: connection broken on purpose (X-Mock-Break-After)")

// errServerClosed is returned by Serve when it is called after Shutdown.
var errServerClosed = errors.New("simulated: server closed")

// Server is an OpenAI-compatible chat completion server with deterministic output.
//
// It serves each connection on its own goroutine through fasthttp.Server.ServeConn rather than
// fasthttp.Server.Serve, because fasthttp's worker pool leaves a cleaner goroutine running for up
// to MaxIdleWorkerDuration after shutdown; here every goroutine the server starts is tracked and
// Shutdown waits for all of them.
type Server struct {
	opts Options
	srv  *fasthttp.Server

	// defaultModelRaw is the JSON literal echoed as "model" when the request names none.
	defaultModelRaw string
	// modelsBody is the /v1/models reply, built once because it never changes.
	modelsBody []byte

	seq       atomic.Int64 // completion ids
	requests  atomic.Int64
	completed atomic.Int64
	cancelled atomic.Int64

	ctl    control       // run-time knobs and routing counters; see control.go
	varied atomic.Uint64 // seeds of requests without one, with Options.VariedText
	prefix *prefixCache  // nil unless Options.PrefixCache is set; see prefixcache.go
	engine *engine       // nil unless Options.Engine is set; see engine.go
	clock  clock         // what delays wait on: the wall clock, or a test's

	responses *responseStore // Responses API responses; see responses.go

	streams sync.Pool // *stream, reused so a streamed reply allocates nothing in steady state

	recMu      sync.Mutex
	recorded   bool
	lastBody   []byte
	lastHeader []byte // "key\x00value\x00" pairs, reused between requests to avoid allocating

	mu        sync.Mutex // guards listeners and conns, and orders closing against their updates
	closing   atomic.Bool
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	wg        sync.WaitGroup // Serve loops and connection goroutines
}

// Stats report what the server saw. Only generation requests (chat and text completions,
// embeddings, responses) are counted, so health checks, model listings and response lookups do
// not disturb assertions. Every request ends as exactly one of Completed or
// Cancelled; Requests - Completed - Cancelled are in flight.
type Stats struct {
	// Requests is the number of chat completion requests started.
	Requests int64
	// Completed is the number that ran to their end: a full reply, an error reply, or a stream
	// that reached [DONE] (including injected mid-stream errors and breaks).
	Completed int64
	// Cancelled is the number of streams abandoned because the client went away, detected as a
	// write error on the next event.
	Cancelled int64
}

// conn marks whether a request is being handled on a connection, so that Shutdown closes only
// connections that are idle and lets the others finish their response.
type conn struct {
	net.Conn
	busy atomic.Bool
}

// New returns a server configured by opts; see Options for the meaning of zero values.
func New(opts Options) *Server {
	s := &Server{
		opts:      opts.normalized(),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
	}
	s.streams.New = func() any { return new(stream) }
	s.ctl.failStatus.Store(int64(s.opts.FailStatus))
	s.prefix = newPrefixCache(s.opts.PrefixCache)
	s.clock = wallClock{}
	if s.opts.Engine.enabled() {
		s.engine = newEngine(s.opts.Engine)
	}
	s.responses = newResponseStore(s.opts.StoredResponses)
	if len(s.opts.Models) > 0 {
		s.defaultModelRaw = string(appendJSONString(nil, s.opts.Models[0]))
	} else {
		s.defaultModelRaw = string(appendJSONString(nil, defaultModel))
	}
	s.modelsBody = s.buildModels(time.Now().Unix())
	s.srv = &fasthttp.Server{
		Handler:               s.Handler,
		ConnState:             s.connState,
		NoDefaultServerHeader: true,
		MaxRequestBodySize:    maxRequestBodySize,
		// Gateways forward client headers; the 4 KiB default would refuse some real requests.
		ReadBufferSize: 16 << 10,
		// Connection errors are the client's business (a cancelled stream is a write error), and
		// X-Mock-Break-After produces one on purpose; logging them would only add noise.
		Logger: discardLogger{},
	}
	return s
}

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}

// ListenAndServe listens on the TCP address addr and serves on it until Shutdown.
func (s *Server) ListenAndServe(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Serve serves on ln until Shutdown, and then returns nil. It closes ln when it returns. Serve may
// be called for several listeners at once; after Shutdown it closes ln and returns an error.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		_ = ln.Close()
		return errServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
		s.wg.Done()
	}()

	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			if temporaryAcceptError(err) {
				// Like net/http: back off instead of spinning when out of descriptors.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		tc := &conn{Conn: c}
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			_ = c.Close()
			return nil
		}
		s.conns[tc] = struct{}{}
		// Adding while Shutdown waits is safe: this Serve loop's own count keeps wg above zero.
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(tc)
	}
}

func temporaryAcceptError(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED)
}

func (s *Server) serveConn(c *conn) {
	defer s.wg.Done()
	// ServeConn closes c. Its error is about this one connection (the client went away, sent a
	// malformed request, or a stream was broken on purpose) and has been answered where possible.
	_ = s.srv.ServeConn(c)
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// connState closes a connection as soon as it goes idle once Shutdown has begun, which is how
// connections that were busy when Shutdown was called get closed after their response.
func (s *Server) connState(c net.Conn, state fasthttp.ConnState) {
	if state != fasthttp.StateIdle {
		return
	}
	tc, ok := c.(*conn)
	if !ok {
		return
	}
	// Store busy before loading closing, and Shutdown stores closing before loading busy, so at
	// least one side sees the other and the connection is always closed.
	tc.busy.Store(false)
	if s.closing.Load() {
		_ = tc.Close()
	}
}

// Shutdown stops accepting connections, closes idle ones, lets in-flight requests (streams
// included) run to their end, and returns when every connection and Serve loop is done. It may be
// called more than once. Being graceful, it waits out pending delays, and a client that keeps a
// stream open without reading it holds Shutdown up until it goes away.
func (s *Server) Shutdown() error {
	var err error
	s.mu.Lock()
	s.closing.Store(true)
	for ln := range s.listeners {
		if cerr := ln.Close(); cerr != nil && err == nil && !isClosedError(cerr) {
			err = cerr
		}
	}
	for c := range s.conns {
		if !c.busy.Load() {
			_ = c.Close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// isClosedError reports whether err says the listener was already closed, which is not a failure
// of Shutdown: a test may close its in-memory listener itself.
func isClosedError(err error) bool {
	return errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "use of closed network connection")
}

// Stats returns counters of chat completion requests; see Stats.
func (s *Server) Stats() Stats {
	return Stats{
		Requests:  s.requests.Load(),
		Completed: s.completed.Load(),
		Cancelled: s.cancelled.Load(),
	}
}

// LastRequest returns copies of the body and headers of the last chat completion request
// received, or nil, nil before the first one. Header names are in fasthttp's canonical form
// ("X-Mock-Status", "Content-Type"); repeated headers are joined with ", ".
func (s *Server) LastRequest() (body []byte, header map[string]string) {
	s.recMu.Lock()
	defer s.recMu.Unlock()
	if !s.recorded {
		return nil, nil
	}
	body = append(make([]byte, 0, len(s.lastBody)), s.lastBody...)
	header = make(map[string]string)
	rest := string(s.lastHeader)
	for rest != "" {
		var k, v string
		k, rest, _ = strings.Cut(rest, "\x00")
		v, rest, _ = strings.Cut(rest, "\x00")
		if old, ok := header[k]; ok {
			v = old + ", " + v
		}
		header[k] = v
	}
	return body, header
}

// record keeps the request for LastRequest. It appends into buffers kept across requests, so it
// costs a copy but no allocation once the buffers have grown.
func (s *Server) record(ctx *fasthttp.RequestCtx) {
	s.recMu.Lock()
	s.recorded = true
	s.lastBody = append(s.lastBody[:0], ctx.PostBody()...)
	h := s.lastHeader[:0]
	for k, v := range ctx.Request.Header.All() {
		h = append(h, k...)
		h = append(h, 0)
		h = append(h, v...)
		h = append(h, 0)
	}
	s.lastHeader = h
	s.recMu.Unlock()
}

// Handler serves POST /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/responses
// (each also without the /v1 prefix, with or without a trailing slash), GET and DELETE
// /v1/responses/{id} and POST /v1/responses/{id}/cancel, GET /v1/models (and /models), GET
// /health. Unknown paths and methods get FastAPI's {"detail": ...} answers, as vLLM gives them.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	if c, ok := ctx.Conn().(*conn); ok {
		c.busy.Store(true)
	}
	if s.closing.Load() {
		// Tell the client this connection will not be reused, rather than closing it under it.
		ctx.SetConnectionClose()
	}
	switch string(ctx.Path()) {
	case "/v1/chat/completions", "/chat/completions", "/v1/chat/completions/", "/chat/completions/":
		if postOnly(ctx) {
			s.chat(ctx)
		}
	case "/v1/completions", "/completions", "/v1/completions/", "/completions/":
		if postOnly(ctx) {
			s.completions(ctx)
		}
	case "/v1/embeddings", "/embeddings", "/v1/embeddings/", "/embeddings/":
		if postOnly(ctx) {
			s.embeddings(ctx)
		}
	case "/v1/responses", "/responses", "/v1/responses/", "/responses/":
		if postOnly(ctx) {
			s.createResponse(ctx)
		}
	case "/v1/messages", "/messages", "/v1/messages/", "/messages/":
		if postOnly(ctx) {
			s.messages(ctx)
		}
	case "/v1/messages/count_tokens", "/messages/count_tokens":
		if postOnly(ctx) {
			s.countTokens(ctx)
		}
	case "/v1/models", "/models":
		if !getOnly(ctx) || s.inject(ctx) {
			return
		}
		ctx.SetContentType(contentTypeJSON)
		ctx.SetBody(s.modelsBody)
		s.ctl.listings.Add(1)
	case "/metrics":
		s.metrics(ctx)
	case "/reset_prefix_cache":
		s.resetPrefixCache(ctx)
	case "/health":
		if !getOnly(ctx) || s.inject(ctx) {
			return
		}
		// vLLM answers its health check with 200 and an empty body.
		ctx.SetStatusCode(fasthttp.StatusOK)
	default:
		path := bytesconv.String(ctx.Path())
		if rest, ok := strings.CutPrefix(path, "/v1/responses/"); ok {
			s.responseByID(ctx, rest)
			return
		}
		if rest, ok := strings.CutPrefix(path, "/responses/"); ok {
			s.responseByID(ctx, rest)
			return
		}
		writeDetail(ctx, fasthttp.StatusNotFound, "Not Found", "")
	}
}

// postOnly reports whether the request is a POST, as the generation endpoints take, and
// answers 405 when it is not.
func postOnly(ctx *fasthttp.RequestCtx) bool {
	if ctx.IsPost() {
		return true
	}
	writeDetail(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed", "POST")
	return false
}

// getOnly reports whether the request is a GET or a HEAD, as the model list and the health
// check take, and answers 405 when it is not.
func getOnly(ctx *fasthttp.RequestCtx) bool {
	if ctx.IsGet() || ctx.IsHead() {
		return true
	}
	writeDetail(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed", "GET")
	return false
}

// admit counts and records a generation request and applies the failure injections. It
// reports false when an injection has answered the request, which then counts as completed.
func (s *Server) admit(ctx *fasthttp.RequestCtx) bool {
	s.requests.Add(1)
	s.noteStart()
	s.record(ctx)
	if s.inject(ctx) {
		s.completed.Add(1)
		return false
	}
	return true
}

// waitFirstToken waits the time to first token before a reply that is not streamed, which a
// real server sends once the whole generation is done.
func (s *Server) waitFirstToken() {
	if d := s.opts.TimeToFirstToken; d > 0 {
		s.clock.Sleep(d)
	}
}

// replyBuffer returns the response's own pooled body buffer, emptied: a reply built straight
// into it and handed to setJSON costs no copy and no allocation.
func replyBuffer(ctx *fasthttp.RequestCtx) []byte { return ctx.Response.SwapBody(nil)[:0] }

// setJSON makes b, built in replyBuffer, the response's JSON body.
func setJSON(ctx *fasthttp.RequestCtx, b []byte) {
	ctx.Response.SwapBody(b)
	ctx.SetContentType(contentTypeJSON)
}

// refuse answers a generation request with the client error e, and counts it completed.
func (s *Server) refuse(ctx *fasthttp.RequestCtx, e apiError) {
	writeError(ctx, e.status, shapeNested, e)
	s.completed.Add(1)
}

// inject applies the request-independent failure injections (delay, status, garbage) and reports
// whether it has written the response.
func (s *Server) inject(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	if v := h.Peek("X-Mock-Delay"); len(v) > 0 {
		d, err := time.ParseDuration(string(v))
		if err != nil || d < 0 {
			writeError(ctx, fasthttp.StatusBadRequest, shapeNested, apiError{
				typ: "BadRequestError", msg: "X-Mock-Delay must be a duration such as 2s or 150ms",
			})
			return true
		}
		time.Sleep(d)
	}
	status := s.FailStatus()
	if v := h.Peek("X-Mock-Status"); len(v) > 0 {
		n, err := fasthttp.ParseUint(v)
		if err != nil || !validStatus(n) {
			writeError(ctx, fasthttp.StatusBadRequest, shapeNested, apiError{
				typ: "BadRequestError", msg: "X-Mock-Status must be an HTTP status from 200 to 599 that allows a body",
			})
			return true
		}
		status = n
	}
	if status != 0 {
		shape, ok := parseShape(h.Peek("X-Mock-Error-Shape"))
		if !ok {
			writeError(ctx, fasthttp.StatusBadRequest, shapeNested, apiError{
				typ: "BadRequestError", msg: "X-Mock-Error-Shape must be one of nested, flat, bare, plain",
			})
			return true
		}
		writeError(ctx, status, shape, apiError{typ: "BadRequestError", msg: failureMessage})
		return true
	}
	if v := h.Peek("X-Mock-Garbage"); len(v) > 0 && string(v) != "0" && string(v) != "false" {
		ctx.SetContentType(contentTypeSSE)
		ctx.SetBodyString(garbageBody)
		return true
	}
	return false
}

// apiError is an error answer; a zero status means no error.
type apiError struct {
	status int
	typ    string
	param  string // "" is written as null
	msg    string
}

func badRequest(param, msg string) apiError {
	return apiError{status: fasthttp.StatusBadRequest, typ: "BadRequestError", param: param, msg: msg}
}

// appendUsage appends a usage object. completion counts the tokens of all choices, as OpenAI and
// vLLM count them; cached is the part of prompt served from the prefix cache.
func appendUsage(b []byte, prompt, cached, completion int) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(cached), 10)
	return append(b, "}}"...)
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func (s *Server) buildModels(created int64) []byte {
	models := s.opts.Models
	if len(models) == 0 {
		models = []string{defaultModel}
	}
	models = append(models[:len(models):len(models)], s.opts.Engine.LoRAs...)
	b := []byte(`{"object":"list","data":[`)
	for i, m := range models {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, m)
		b = append(b, `,"object":"model","created":`...)
		b = strconv.AppendInt(b, created, 10)
		b = append(b, `,"owned_by":"tollgate-sim"}`...)
	}
	return append(b, "]}"...)
}

// Error shapes an upstream can answer in; see the package comment.
type errorShape int

const (
	shapeNested errorShape = iota
	shapeFlat
	shapeBare
	shapePlain
)

func parseShape(v []byte) (errorShape, bool) {
	switch string(v) {
	case "", "nested":
		return shapeNested, true
	case "flat":
		return shapeFlat, true
	case "bare":
		return shapeBare, true
	case "plain":
		return shapePlain, true
	}
	return 0, false
}

// writeError writes e with the given status in the given shape. The code is the integer status,
// as vLLM writes it.
func writeError(ctx *fasthttp.RequestCtx, status int, shape errorShape, e apiError) {
	ctx.SetStatusCode(status)
	if shape == shapePlain {
		ctx.SetContentType(contentTypePlain)
		ctx.SetBodyString(e.msg)
		return
	}
	ctx.SetContentType(contentTypeJSON)
	b := ctx.Response.SwapBody(nil)[:0]
	switch shape {
	case shapeBare:
		// vLLM's --api-key middleware answers exactly this, whatever the status.
		b = append(b, `{"error":"Unauthorized"}`...)
	case shapeFlat:
		b = append(b, `{"object":"error",`...)
		b = appendErrorFields(b, status, e)
		b = append(b, '}')
	default:
		b = append(b, `{"error":{`...)
		b = appendErrorFields(b, status, e)
		b = append(b, "}}"...)
	}
	ctx.Response.SwapBody(b)
}

func appendErrorFields(b []byte, status int, e apiError) []byte {
	b = append(b, `"message":`...)
	b = appendJSONString(b, e.msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, e.typ)
	b = append(b, `,"param":`...)
	if e.param == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, e.param)
	}
	b = append(b, `,"code":`...)
	return strconv.AppendInt(b, int64(status), 10)
}

// writeDetail answers like FastAPI does for unknown routes and methods, which is what vLLM sends.
func writeDetail(ctx *fasthttp.RequestCtx, status int, detail, allow string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType(contentTypeJSON)
	if allow != "" {
		ctx.Response.Header.Set("Allow", allow)
	}
	b := ctx.Response.SwapBody(nil)[:0]
	b = append(b, `{"detail":`...)
	b = appendJSONString(b, detail)
	ctx.Response.SwapBody(append(b, '}'))
}
