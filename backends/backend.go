// Package backends holds the upstream side of the gateway: one Backend per
// configured OpenAI-compatible server (or in-process simulator), the routes
// from public model ids to them, selection among a model's backends, and
// their health.
package backends

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
)

// maxIdleConnDuration stays below the 5 s keep-alive timeout of uvicorn
// (vLLM's server), so the gateway closes an idle connection before the
// backend does and never writes a request into a connection being closed.
const maxIdleConnDuration = 4 * time.Second

// Backend is one upstream server.
type Backend struct {
	// Name is the backend's name from the config.
	Name string

	weight         int64
	maxConcurrency int64
	timeouts       config.BackendTimeouts
	client         *fasthttp.HostClient
	// base is the URL every endpoint's path is appended to (ending in /v1).
	base string
	// uris are the endpoints' URLs, indexed by Endpoint, parsed once:
	// copying a parsed URI into a request costs less than parsing the URL
	// for every request.
	uris      [numEndpoints]*fasthttp.URI
	healthURL []byte
	// authorization is the whole "Bearer <key>" header value, built once;
	// nil when the backend takes no key.
	authorization []byte

	// continuousUsage says the backend honours continuous_usage_stats.
	continuousUsage bool
	// routes are the routes that send to the backend: a release serves
	// the requests queued on them.
	routes []*Route
	// turn rotates which of several routes a release serves first.
	turn atomic.Uint32
	// messagesNative says the backend serves the Messages API itself,
	// for models that leave it to the backend (config.Backend.Messages).
	messagesNative bool

	inflight atomic.Int64
	health   health
	// server is the backend's load from its last fresh metrics reading;
	// nil when none is fresh (or its metrics are not read), and then the
	// scheduler counts the gateway's own requests in flight.
	server atomic.Pointer[serverLoad]
	// index is what prompt blocks the backend was sent recently; nil when
	// no route of the backend uses the prefix signal.
	index *prefixIndex
	// nextProbe is when the health checker probes next (unix ns); only
	// the checker's goroutine touches it.
	nextProbe int64

	// sim and simDone are set for an in-process simulated backend: the
	// server, and the result of its Serve goroutine.
	sim     *simulated.Server
	simDone chan error
}

func newBackend(cfg config.Backend) (*Backend, error) {
	b := &Backend{
		Name:           cfg.Name,
		weight:         int64(max(cfg.Weight, 1)),
		maxConcurrency: int64(cfg.MaxConcurrency),
		timeouts:       cfg.Timeouts,
		// The simulator implements continuous_usage_stats.
		continuousUsage: cfg.ContinuousUsage || cfg.Simulated != nil,
		// The simulator serves /v1/messages, as vLLM does.
		messagesNative: cfg.Messages == config.MessagesNative || cfg.Messages == "" && cfg.Simulated != nil,
	}
	b.health.init(cfg.Health)
	if cfg.APIKey != "" {
		b.authorization = []byte("Bearer " + cfg.APIKey)
	}
	newConn := func(c net.Conn) net.Conn {
		return &timeoutConn{Conn: c, firstByte: cfg.Timeouts.FirstByte, idle: cfg.Timeouts.Idle}
	}
	hc := &fasthttp.HostClient{
		Name:                          "tollgate",
		MaxConns:                      max(cfg.MaxConns, 1),
		MaxIdleConnDuration:           maxIdleConnDuration,
		NoDefaultUserAgentHeader:      false,
		DisableHeaderNamesNormalizing: false,
		// Upstream replies are read to extract usage and rewrite the
		// model id, so they must arrive uncompressed; the proxy never
		// forwards Accept-Encoding. The read buffer must hold a whole
		// response header block, which from an inference server is a few
		// hundred bytes; it lives as long as a stream, so it stays small.
		ReadBufferSize:  4 << 10,
		WriteBufferSize: 8 << 10,
		RetryIfErr:      retryStaleConn,
		// Parse errors must not quote response or request bytes, which
		// hold the backend's API key.
		SecureErrorLogMessage: true,
	}
	var base string
	if cfg.Simulated != nil {
		ln := fasthttputil.NewInmemoryListener()
		b.sim = simulated.New(simulated.Options{
			TimeToFirstToken: cfg.Simulated.TimeToFirstToken,
			InterTokenDelay:  cfg.Simulated.InterTokenDelay,
			Tokens:           cfg.Simulated.Tokens,
			// Zero means the simulator's default, as the config's zero does.
			EmbeddingDimensions: cfg.Simulated.EmbeddingDimensions,
			VariedText:          cfg.Simulated.VariedText,
			Engine: simulated.Engine{
				MaxNumSeqs: cfg.Simulated.MaxNumSeqs, PrefillPerToken: cfg.Simulated.PrefillPerToken,
				KVCacheBlocks: cfg.Simulated.KVCacheBlocks, BlockSize: cfg.Simulated.BlockSize,
				LoadFactor: cfg.Simulated.LoadFactor, LoRAs: cfg.Simulated.LoRAs,
				MaxLoRAs: cfg.Simulated.MaxLoRAs, LoRALoadTime: cfg.Simulated.LoRALoadTime,
				PriorityPreemption: cfg.Simulated.PriorityPreemption,
			},
		})
		b.simDone = make(chan error, 1)
		go func() { b.simDone <- b.sim.Serve(ln) }()
		hc.Addr = "simulated-" + cfg.Name
		hc.Dial = func(string) (net.Conn, error) {
			c, err := ln.Dial()
			if err != nil {
				return nil, err
			}
			return newConn(c), nil
		}
		base = "http://" + hc.Addr + "/v1"
	} else {
		u, err := url.Parse(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("backend %s: parse url: %w", cfg.Name, err)
		}
		addr := u.Host
		if u.Port() == "" {
			if u.Scheme == "https" {
				addr += ":443"
			} else {
				addr += ":80"
			}
		}
		hc.Addr = addr
		hc.IsTLS = u.Scheme == "https"
		dialer := &net.Dialer{Timeout: cfg.Timeouts.Connect, KeepAlive: 30 * time.Second}
		hc.Dial = func(addr string) (net.Conn, error) {
			c, err := dialApart(dialer, addr)
			if err != nil {
				return nil, err
			}
			return newConn(c), nil
		}
		base = strings.TrimRight(cfg.URL, "/")
	}
	b.client = hc
	b.base = base
	for e := range numEndpoints {
		u := new(fasthttp.URI)
		if err := u.Parse(nil, []byte(base+e.Path())); err != nil {
			return nil, fmt.Errorf("backend %s: parse url: %w", cfg.Name, err)
		}
		b.uris[e] = u
	}
	b.healthURL = []byte(base + cfg.Health.Path)
	return b, nil
}

// retryStaleConn retries a request once when the connection closed before
// any response byte arrived. That happens when a pooled keep-alive
// connection was closed by the backend just as it was reused; the backend
// saw no complete request, so sending it again cannot duplicate work.
func retryStaleConn(_ *fasthttp.Request, attempts int, err error) (bool, bool) {
	stale := errors.Is(err, io.EOF) || errors.Is(err, fasthttp.ErrConnectionClosed)
	return false, stale && attempts < 2
}

// Endpoint is an OpenAI endpoint a backend serves.
type Endpoint uint8

// The endpoints, in the order of config.ModelEndpoints.
const (
	EndpointChat Endpoint = iota
	EndpointCompletions
	EndpointEmbeddings
	EndpointResponses
	// EndpointMessages is Anthropic's Messages API, served natively (see
	// Route.MessagesNative); EndpointMessagesCount its count_tokens, which
	// models[].endpoints names with it, as "messages".
	EndpointMessages
	EndpointMessagesCount
	numEndpoints
)

// Path is the endpoint's path below a backend's /v1 base URL.
func (e Endpoint) Path() string {
	switch e {
	case EndpointCompletions:
		return "/completions"
	case EndpointEmbeddings:
		return "/embeddings"
	case EndpointResponses:
		return "/responses"
	case EndpointMessages:
		return "/messages"
	case EndpointMessagesCount:
		return "/messages/count_tokens"
	}
	return "/chat/completions"
}

// PrepareChat points req at the backend's chat completions endpoint and
// sets its credentials. The caller sets the body and the forwarded headers.
func (b *Backend) PrepareChat(req *fasthttp.Request) { b.Prepare(req, EndpointChat) }

// Prepare points req, a POST, at endpoint e of the backend and sets its
// credentials. The caller sets the body and the forwarded headers.
func (b *Backend) Prepare(req *fasthttp.Request, e Endpoint) {
	req.SetURI(b.uris[e])
	req.Header.SetMethod(fasthttp.MethodPost)
	b.authorize(req)
}

// PrepareResponse points req at one stored response of the backend,
// /responses/{id} followed by suffix ("" or "/cancel"), with method, and
// sets its credentials. id must already be safe in a URL path.
func (b *Backend) PrepareResponse(req *fasthttp.Request, method, id, suffix string) {
	req.SetRequestURI(b.base + "/responses/" + id + suffix)
	req.Header.SetMethod(method)
	b.authorize(req)
}

// authorize sets the backend's credentials on req, or removes any.
func (b *Backend) authorize(req *fasthttp.Request) {
	if b.authorization != nil {
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, b.authorization)
	} else {
		req.Header.Del(fasthttp.HeaderAuthorization)
	}
}

// Do sends req and reads the response headers (and, unless resp.StreamBody
// is set, the whole body) within the backend's total timeout. A streamed
// body must be closed by the caller (see fasthttp.Response.CloseBodyStream).
func (b *Backend) Do(req *fasthttp.Request, resp *fasthttp.Response) error {
	return classify(b.client.DoDeadline(req, resp, time.Now().Add(b.timeouts.Total)))
}

// ContinuousUsage reports whether the backend can put cumulative usage on
// every streamed chunk (vLLM's stream_options.continuous_usage_stats).
func (b *Backend) ContinuousUsage() bool { return b.continuousUsage }

// TryAcquire takes a slot on b itself, bypassing selection, for a request
// that must reach the backend holding its state (a stored response). The
// caller must Release it.
func (b *Backend) TryAcquire() bool { return b.tryAcquire() }

// tryAcquire takes a slot unless the backend is at max_concurrency, in one
// atomic step, so concurrent requests cannot overshoot the limit.
func (b *Backend) tryAcquire() bool {
	for {
		n := b.inflight.Load()
		if b.maxConcurrency > 0 && n >= b.maxConcurrency {
			return false
		}
		if b.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// tryAcquireUpTo takes a slot while fewer than limit requests are in
// flight, whatever max_concurrency says.
func (b *Backend) tryAcquireUpTo(limit int64) bool {
	for {
		n := b.inflight.Load()
		if n >= limit {
			return false
		}
		if b.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release frees the slot Pick took, and hands it to a request queued for
// it, if any. With nothing queued it costs an atomic load per route.
func (b *Backend) Release() {
	b.inflight.Add(-1)
	if len(b.routes) == 1 {
		if r := b.routes[0]; r.queued.Load() > 0 {
			r.dispatch()
		}
		return
	}
	b.serveRoutes()
}

// serveRoutes serves the queues of a backend shared by several routes,
// starting from a different route each time so that none always comes
// first.
func (b *Backend) serveRoutes() {
	n := len(b.routes)
	if n == 0 {
		return
	}
	start := -1
	for i := range n {
		if b.routes[i].queued.Load() > 0 {
			start = i
			break
		}
	}
	if start < 0 {
		return
	}
	start = int(b.turn.Add(1) % uint32(n))
	for i := range n {
		if r := b.routes[(start+i)%n]; r.queued.Load() > 0 {
			r.dispatch()
		}
	}
}

// InFlight is the number of requests in flight on b.
func (b *Backend) InFlight() int64 { return b.inflight.Load() }

// ObservePrompt tells the backend's prefix index that its server counted
// promptTokens tokens (usage.prompt_tokens) in a prompt whose raw JSON,
// the bytes its block chain is cut from, was promptBytes long: the index
// learns how many bytes make a token, which places its eviction horizon.
// It does nothing for a backend without an index.
func (b *Backend) ObservePrompt(promptBytes int, promptTokens int64) {
	if b.index != nil {
		b.index.observe(promptBytes, promptTokens)
	}
}

// PromptBytesPerToken is the prompt bytes per token the backend's prefix
// index has learned (ObservePrompt), the default until a reply taught it;
// zero for a backend without an index.
func (b *Backend) PromptBytesPerToken() float64 {
	if b.index == nil {
		return 0
	}
	return float64(b.index.bpt()) / bptScale
}

// PrefixCacheTokens is the size in tokens of the backend's prefix cache,
// as its server's metrics last reported it (vllm:cache_config_info); zero
// when unknown, or for a backend without an index.
func (b *Backend) PrefixCacheTokens() int64 {
	if b.index == nil {
		return 0
	}
	return b.index.kvTokens.Load()
}

// Healthy reports whether the backend takes traffic: its last probe
// succeeded and it is not ejected.
func (b *Backend) Healthy() bool { return b.health.usable() }

// State is the backend's standing: healthy, ejected or unhealthy.
func (b *Backend) State() State { return b.health.state() }

// ReportSuccess records a request the backend answered with a non-5xx
// status, and the time its first byte (or first streamed event) took.
func (b *Backend) ReportSuccess(ttft time.Duration) { b.health.success(ttft) }

// ReportFailure records a connection failure, a timeout or a 5xx; enough
// of them in a row eject the backend.
func (b *Backend) ReportFailure() { b.health.failure(time.Now()) }

// TTFT is the moving average of the backend's time to first byte; zero
// before the first request.
func (b *Backend) TTFT() time.Duration { return time.Duration(b.health.ttft.Load()) }

// full reports whether b is at its max_concurrency.
func (b *Backend) full() bool {
	return b.maxConcurrency > 0 && b.inflight.Load() >= b.maxConcurrency
}

// close stops an in-process simulated backend and waits for it.
func (b *Backend) close() error {
	b.client.CloseIdleConnections()
	if b.sim == nil {
		return nil
	}
	if err := b.sim.Shutdown(); err != nil {
		return fmt.Errorf("backend %s: %w", b.Name, err)
	}
	<-b.simDone
	return nil
}

// fnv1a is the 64-bit FNV-1a hash: fixed across processes, and fast enough
// for the short names it hashes (LoRA adapters).
func fnv1a(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// dialApart dials addr on a goroutine of its own, and waits for it. The
// request path runs in a goroutine stack of 8 KiB, and Go's dial path
// (which needs more than 4 KiB of its own) pushes it past that: dialed from
// the request's goroutine, a server worker, it doubles the worker's stack
// to 16 KiB, which stays so while the worker serves requests. A burst of
// new connections (a thousand streams opening, each on a connection of its
// own) grew a worker's stack for every request in flight. A dial costs
// far more than starting the goroutine does.
func dialApart(d *net.Dialer, addr string) (net.Conn, error) {
	type dialed struct {
		conn net.Conn
		err  error
	}
	done := make(chan dialed, 1)
	go func() {
		c, err := d.Dial("tcp", addr)
		done <- dialed{c, err}
	}()
	r := <-done
	return r.conn, r.err
}
