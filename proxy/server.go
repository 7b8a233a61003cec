// Package proxy is the client-facing side of the gateway over fasthttp. It
// does the orchestration, and leaves the OpenAI wire format to package
// openai: bytes in, facts out (body validation and request facts, the
// upstream body, reply, usage, SSE and event processing, the error shape).
// Its jobs:
//   - the request path of the four endpoints routed by model, read in
//     order: request.go (handler, auth, headers, validation, limits),
//     forward.go (backend choice, attempts, retries), stream.go (the SSE
//     relay) and settle.go (usage recorded, reservation and slots
//     released);
//   - the stream's hand-over to its own goroutine and connection
//     (stream_conn.go, clientwatch.go);
//   - mapping failures to the client's answer (errors.go, secrets.go);
//   - the Responses API's state (responses.go, background.go,
//     response_owners.go);
//   - observability (metrics.go, requestlog.go, recover.go).
package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/jsonstr"
	"github.com/tollgate-dev/tollgate/openai"
)

// Recorder takes the usage record of every model call, on any of the
// endpoints routed by model.
type Recorder interface {
	Record(accounting.Record)
}

// Limiter reserves an estimate against rate limits and budgets before a
// request is forwarded, and settles the real count afterwards.
type Limiter interface {
	Reserve(s accounting.Subject, estimate int64) (accounting.Reservation, error)
	Settle(r accounting.Reservation, used int64)
}

// Options configure a Server.
type Options struct {
	Config   *config.Config
	Registry *backends.Registry
	Keys     *auth.Keyring
	Recorder Recorder
	Limiter  Limiter
	// Admit checks requests against the Admin API's policies (see
	// Admission). Nil means none.
	Admit Admission
	// Log is the request logger. Nil means no logging.
	Log *zap.Logger
	// Metrics registers the proxy's series. Nil means they are kept but
	// not exported.
	Metrics prometheus.Registerer
	// ResponseOwners shares which backend made each Responses API
	// response with the other replicas. Nil means each replica remembers
	// only the responses it routed itself.
	ResponseOwners ResponseOwnerStore
}

// state is what one configuration generation needs. Requests load it once,
// so a reload never changes the state under a request in flight.
type state struct {
	cfg     *config.Config
	reg     *backends.Registry
	keys    *auth.Keyring
	limiter Limiter
	models  []byte // the /v1/models reply, built once
	// anthropicModels is the /v1/models reply in Anthropic's shape.
	anthropicModels []byte
	// secrets redacts this configuration's keys from error text.
	secrets *secretValues
	// active counts the exchanges using this generation, so that a
	// retired generation is closed only once they are all done.
	active atomic.Int64
}

// acquire returns the current generation, counted as used until release.
// The second load closes the race with Swap: a generation swapped out
// between the load and the count is let go and the new one taken, so once
// Swap has returned, a retired generation's count only goes down.
func (s *Server) acquire() *state {
	for {
		st := s.state.Load()
		st.active.Add(1)
		if s.state.Load() == st {
			return st
		}
		st.active.Add(-1)
	}
}

func (st *state) release() { st.active.Add(-1) }

// Server is the gateway's client-facing HTTP server.
type Server struct {
	state    atomic.Pointer[state]
	keys     *auth.Keyring
	recorder Recorder
	// admission is Options.Admit.
	admission Admission
	log       *zap.Logger
	metrics   *metrics
	srv       *fasthttp.Server
	started   time.Time
	// retryBudget caps retries across all requests; it lives as long as
	// the server, across reloads, which reconfigure it.
	retryBudget *backends.RetryBudget
	// boot is the configuration the server started with: its
	// restart-only settings hold in every later generation (see Swap).
	boot *config.Config
	// streams counts stream slots taken, against server.max_streams.
	streams atomic.Int64
	// handler serves every request of the proxy's listener: the binary's
	// router, guarded (see Serve).
	handler fasthttp.RequestHandler
	// owners remembers which backend made each Responses API response; it
	// lives as long as the server, across reloads.
	owners *responseOwners
	// clients checks that the clients of waiting requests are still
	// connected; Shutdown stops it.
	clients *clientWatcher
	// background holds the background responses whose usage is not known
	// yet, and runs their poller until Shutdown.
	background *backgroundResponses
	// callIDs makes the id of every call.
	callIDs callIDs
	// connStreams counts the streams written on their connections by
	// goroutines of their own (see writeOnConn), which fasthttp's
	// Shutdown does not wait for; stopping is set once Shutdown began.
	connStreams atomic.Int64
	stopping    atomic.Bool
	// idleWaits are the connections kept after a stream whose next
	// request has not begun (see keep), under idleMu.
	idleMu    sync.Mutex
	idleWaits map[net.Conn]struct{}
	// keepIdle bounds the wait for the next request on a connection kept
	// after a stream, as fasthttp bounds it on its own keep-alive
	// connections (IdleTimeout, or ReadTimeout when that is zero).
	keepIdle time.Duration
	// listenerMetrics count both listeners' refusals and failed accepts.
	listenerMetrics listenerMetrics
}

// New builds a Server. It does not listen; call Serve.
func New(opts Options) (*Server, error) {
	if opts.Config == nil || opts.Registry == nil || opts.Keys == nil || opts.Recorder == nil || opts.Limiter == nil {
		return nil, fmt.Errorf("proxy: Config, Registry, Keys, Recorder and Limiter are required")
	}
	s := &Server{
		keys:      opts.Keys,
		recorder:  opts.Recorder,
		admission: opts.Admit,
		log:       opts.Log,
		metrics:   newMetrics(opts.Metrics),
		started:   time.Now(),
		boot:      opts.Config,

		retryBudget:     backends.NewRetryBudget(opts.Config.Retries),
		listenerMetrics: newListenerMetrics(opts.Metrics),
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if err := s.callIDs.seedFromRand(); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	s.clients = newClientWatcher()
	s.owners = newResponseOwners(responseOwnerCapacity, responseOwnerTTL, opts.ResponseOwners, s.log)
	s.background = newBackgroundResponses(backgroundCapacity)
	s.Swap(Generation{Config: opts.Config, Registry: opts.Registry, Limiter: opts.Limiter})
	sc := opts.Config.Server
	s.keepIdle = sc.IdleTimeout
	if s.keepIdle == 0 {
		s.keepIdle = sc.ReadTimeout
	}
	s.srv = &fasthttp.Server{
		Name:               serverName,
		MaxRequestBodySize: sc.MaxBodyBytes,
		ReadBufferSize:     sc.MaxHeaderBytes,
		ReadTimeout:        sc.ReadTimeout,
		IdleTimeout:        sc.IdleTimeout,
		// The connection cap is the listener's (see limitListener), which
		// answers in the OpenAI shape; fasthttp's own stays above it.
		Concurrency:     sc.MaxConnections + 1,
		CloseOnShutdown: true,
		// A stream is written by a goroutine of its own on the connection
		// fasthttp hands over (see writeOnConn), which serves the client's
		// next requests on it after the stream (see keep), or closes it.
		KeepHijackedConns:     true,
		NoDefaultServerHeader: true,
		// Parse errors must not quote request bytes: they hold API keys.
		SecureErrorLogMessage: true,
		// fasthttp quotes some of them regardless; its log lines go
		// through the gateway's logger, redacted.
		Logger: fasthttpLogger{log: s.log, server: s},
		// Release a connection's buffers while it waits for its next
		// request, so idle keep-alive connections cost little memory. It
		// also makes fasthttp wait for a new connection's first byte while
		// the connection still counts as idle: without it, a client that
		// opens a connection and sends nothing holds graceful shutdown
		// for the whole read timeout.
		ReduceMemoryUsage: true,
		// A large body is read only with a valid key (see
		// headerReceived).
		HeaderReceived: s.headerReceived,
		// The response to a bad request line or an oversized body is
		// written by fasthttp itself; make it speak the OpenAI shape.
		ErrorHandler: s.serveTransportError,
		// fasthttp's write timeout bounds a whole response, a stream it
		// writes included; server.write_timeout bounds each write instead,
		// on the listener's connections (see countedConn.Write), so that
		// a long stream lives while a client that stops reading does not.
		WriteTimeout: 0,
	}
	return s, nil
}

// Generation is what one configuration needs at run time. A reload builds
// a new one and swaps it in; API keys are not part of it because the
// Keyring is replaced in place.
type Generation struct {
	Config   *config.Config
	Registry *backends.Registry
	Limiter  Limiter
}

// Swap installs a new configuration generation. It returns the previous
// one, and a wait that returns once no request uses it any more (or ctx
// ends): requests in flight finish on the generation they started with,
// and its backends may be closed after the wait. The generation's
// restart-only settings (config.RestartOnlySettings) are replaced by those
// the server started with, which fasthttp holds; the retry budget takes
// its reloaded settings.
func (s *Server) Swap(g Generation) (Generation, func(ctx context.Context) error) {
	cfg := config.Reloaded(s.boot, g.Config)
	s.retryBudget.Configure(cfg.Retries)
	st := &state{cfg: cfg, reg: g.Registry, keys: s.keys, limiter: g.Limiter, models: buildModelList(g.Registry, s.started),
		anthropicModels: buildAnthropicModelList(g.Registry, s.started),
		secrets:         newSecretValues(cfg)}
	old := s.state.Swap(st)
	if old == nil {
		return Generation{}, func(context.Context) error { return nil }
	}
	wait := func(ctx context.Context) error { return waitZero(ctx, &old.active) }
	return Generation{Config: old.cfg, Registry: old.reg, Limiter: old.limiter}, wait
}

// Serve serves handler, the binary's router, on ln until Shutdown, with
// at most server.max_connections connections open at once. Every request
// passes guard first.
func (s *Server) Serve(ln net.Listener, handler fasthttp.RequestHandler) error {
	sc := s.boot.Server
	s.handler = s.guard(handler)
	s.srv.Handler = s.handler
	return s.srv.Serve(s.newLimitListener(ln, listenerOptions{name: "proxy", max: sc.MaxConnections,
		overloaded: proxyOverloaded, firstByte: sc.ReadTimeout, writeTimeout: sc.WriteTimeout}))
}

// guard is what every request on either listener passes before its
// route: a panic is recovered as a 500 (recover.go), ambiguous framing is
// refused (rfc9112.go), and the reply gets an X-Request-Id whatever
// answered it (request_id.go).
func (s *Server) guard(handler fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		defer s.ensureRequestID(ctx) // after recoverHandler, whose 500 starts the reply afresh
		defer s.recoverHandler(ctx)
		if refuseFraming(ctx) {
			return
		}
		handler(ctx)
	}
}

// AdminServer builds the server of admin_listen, serving handler (the
// router of the admin listener's routes) with the limits and timeouts of
// the proxy's own: guard, a large body read only with a valid key, and
// its own transport errors in the trace service's shape. Serve it on
// AdminListener.
func (s *Server) AdminServer(handler fasthttp.RequestHandler) *fasthttp.Server {
	sc := s.boot.Server
	handler = s.guard(handler)
	return &fasthttp.Server{Handler: handler, Name: "tollgate-admin", ReadTimeout: sc.ReadTimeout,
		IdleTimeout: sc.IdleTimeout, MaxRequestBodySize: sc.MaxBodyBytes, CloseOnShutdown: true,
		SecureErrorLogMessage: true, Logger: fasthttpLogger{log: s.log},
		HeaderReceived: s.headerReceived,
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			if s.serveWithoutKey(ctx, err, handler) {
				return
			}
			status, msg := transportError(err)
			ctx.SetStatusCode(status)
			ctx.SetContentType("application/json")
			ctx.SetBody(append(jsonstr.Append([]byte(`{"detail":`), msg), '}'))
			s.ensureRequestID(ctx)
		},
	}
}

// AdminListener wraps ln, the listener of admin_listen, as Serve wraps
// the proxy's: at most server.admin_max_connections connections (beyond
// it a 503 in the trace service's shape), failed accepts retried, each
// write bounded by server.write_timeout.
func (s *Server) AdminListener(ln net.Listener) net.Listener {
	sc := s.boot.Server
	return s.newLimitListener(ln, listenerOptions{name: "admin", max: sc.AdminMaxConnections,
		overloaded: adminOverloaded, firstByte: sc.ReadTimeout, writeTimeout: sc.WriteTimeout})
}

// Shutdown stops accepting connections and waits for in-flight requests
// and streams to finish, or for ctx to end; then it stops the poller of
// background responses, recording those still running with no usage.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopIdleWaits()
	err := s.srv.ShutdownWithContext(ctx)
	if err == nil {
		err = waitZero(ctx, &s.connStreams)
	}
	s.clients.close()
	s.stopBackground()
	return err
}

// waitZero waits until n is zero, or ctx ends. The counts it waits on
// (requests on a retired generation, streams in flight) only go down once
// waited on, so a poll is enough.
func waitZero(ctx context.Context, n *atomic.Int64) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for n.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// serveTransportError answers requests fasthttp refused before they reached
// the handler: a request not received in time (408), an oversized body
// (413), headers too large (431) or a malformed request (400), in the
// OpenAI error shape. The error's own text is never echoed: fasthttp's
// parse errors can quote the request, Authorization header included.
func (s *Server) serveTransportError(ctx *fasthttp.RequestCtx, err error) {
	if s.serveWithoutKey(ctx, err, s.handler) {
		return
	}
	status, msg := transportError(err)
	switch status {
	case fasthttp.StatusRequestEntityTooLarge:
		msg = "The request body exceeds the gateway's limit of " + strconv.Itoa(s.srv.MaxRequestBodySize) + " bytes."
	case fasthttp.StatusRequestHeaderFieldsTooLarge:
		msg = "The request headers exceed the gateway's limit of " + strconv.Itoa(s.srv.ReadBufferSize) + " bytes."
	}
	writeErrorTo(ctx, &openai.Error{Status: status, Type: "invalid_request_error", Message: msg}, isMessagesPath(ctx.Path()))
	s.ensureRequestID(ctx)
}

// transportError is the status and message of a request fasthttp refused
// before it reached the handler.
func transportError(err error) (status int, msg string) {
	var (
		netErr net.Error
		small  *fasthttp.ErrSmallBuffer
	)
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		return fasthttp.StatusRequestTimeout, "The request was not received within the gateway's read timeout."
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return fasthttp.StatusRequestEntityTooLarge, "The request body exceeds the gateway's limit."
	case errors.As(err, &small), errors.Is(err, fasthttp.ErrSmallReadBuffer):
		return fasthttp.StatusRequestHeaderFieldsTooLarge, "The request headers exceed the gateway's limit."
	}
	return fasthttp.StatusBadRequest, "The request is not valid HTTP/1.1."
}

func (s *Server) serveModels(ctx *fasthttp.RequestCtx) {
	st := s.state.Load()
	anthropicClient := fromAnthropicClient(ctx)
	if _, e := s.authenticate(ctx, st); e != nil {
		writeErrorTo(ctx, e, anthropicClient)
		return
	}
	ctx.SetContentType("application/json")
	if anthropicClient {
		ctx.SetBody(st.anthropicModels)
		return
	}
	ctx.SetBody(st.models)
}

func (s *Server) serveReady(ctx *fasthttp.RequestCtx) {
	st := s.state.Load()
	ctx.SetContentType("application/json")
	if !st.reg.Ready() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	ctx.SetBody(appendBackendStates(nil, st.reg))
}

// authenticate resolves the request's API key.
func (s *Server) authenticate(ctx *fasthttp.RequestCtx, st *state) (*auth.Key, *openai.Error) {
	return s.authenticateKey(st, ctx.Request.Header.Peek(fasthttp.HeaderAuthorization), ctx.Request.Header.Peek(headerAPIKey))
}

// authenticateKey is authenticate for the values of the Authorization and
// X-Api-Key headers.
func (s *Server) authenticateKey(st *state, authorization, apiKey []byte) (*auth.Key, *openai.Error) {
	if len(authorization) == 0 && len(apiKey) == 0 {
		return nil, &openai.Error{Status: fasthttp.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
			Message: "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' (or 'x-api-key: <key>')."}
	}
	key := st.keys.Lookup(requestSecret(authorization, apiKey))
	if key == nil {
		return nil, &openai.Error{Status: fasthttp.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
			Message: "Incorrect API key provided."}
	}
	return key, nil
}
