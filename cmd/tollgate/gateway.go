package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/admin"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/logline"
	"github.com/tollgate-dev/tollgate/proxy"
	"github.com/tollgate-dev/tollgate/route"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/telemetry"
)

// gateway is every long-lived part of a running gateway, so that shutdown
// can stop them in order.
type gateway struct {
	cfgPath  string // the file reloads read; empty for the embedded config
	cfgStamp stamp  // the file's version at build, so a change before the watcher starts is seen
	log      *zap.Logger
	logSync  *zapcore.BufferedWriteSyncer
	store    *store.DB
	keys     *auth.Keyring
	metrics  *prometheus.Registry
	recorder *accounting.Recorder
	// spans exports a span per request; nil when export is off.
	spans *telemetry.Exporter
	proxy *proxy.Server
	admin *fasthttp.Server // nil unless admin_listen is set
	// routes is every route the binary serves (see routes.go).
	routes []route.Route

	// backendMetrics live across reloads; each generation's registry
	// counts into them.
	backendMetrics *backends.Metrics

	// gen is the generation serving new requests; reload replaces it and
	// retires the old one in the background, tracked by retiring.
	mu       sync.Mutex
	gen      *generation
	retiring sync.WaitGroup
}

// serve runs the gateway on addr until ctx ends, then shuts it down: stop
// accepting, let in-flight requests and streams finish up to the shutdown
// timeout, drain the usage queue, close the store.
func serve(ctx context.Context, cfg *config.Config, addr string, stderr io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return serveListener(ctx, cfg, ln, stderr)
}

// serveListener is serve on a listener the caller opened (tests use a
// port the system picked). It closes ln.
func serveListener(ctx context.Context, cfg *config.Config, ln net.Listener, stderr io.Writer) (err error) {
	g, err := build(ctx, cfg, stderr)
	if err != nil {
		ln.Close()
		return err
	}
	defer func() { err = errors.Join(err, g.close(cfg.Server.ShutdownTimeout)) }()

	// Reloads are watched until the servers have drained (the deferred
	// stop runs after the shutdown below), so that a generation retiring
	// meanwhile is not closed under requests still using it.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		g.watchReloads(watchCtx, cfg)
	}()
	defer func() {
		stopWatch()
		<-watchDone
	}()

	errc := make(chan error, 2)
	servers := 1
	go func() { errc <- g.proxy.Serve(ln) }()
	g.log.Info("tollgate listening", zap.String("addr", ln.Addr().String()),
		zap.Int("models", len(cfg.Models)), zap.String("store", cfg.Store.Path))
	if g.admin != nil {
		aln, err := net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			_ = g.proxy.Shutdown(context.Background())
			<-errc
			return fmt.Errorf("listen admin: %w", err)
		}
		servers++
		go func() { errc <- g.admin.Serve(aln) }()
		g.log.Info("admin listening", zap.String("addr", aln.Addr().String()))
	}

	select {
	case <-ctx.Done():
		g.log.Info("shutting down", zap.Duration("timeout", cfg.Server.ShutdownTimeout))
	case err = <-errc:
		servers--
		err = fmt.Errorf("serve: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout)
	defer cancel()
	if serr := g.proxy.Shutdown(sctx); serr != nil {
		err = errors.Join(err, fmt.Errorf("shutdown: %w", serr))
	}
	if g.admin != nil {
		if serr := g.admin.ShutdownWithContext(sctx); serr != nil {
			err = errors.Join(err, fmt.Errorf("shutdown admin: %w", serr))
		}
	}
	for ; servers > 0; servers-- {
		<-errc
	}
	return err
}

// build opens the store and wires accounting, backends, the admin module
// and the proxy.
func build(ctx context.Context, cfg *config.Config, stderr io.Writer) (*gateway, error) {
	g := &gateway{}
	var err error
	g.log, g.logSync, err = newLogger(cfg.Log, stderr)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*gateway, error) {
		return nil, errors.Join(err, g.close(cfg.Server.ShutdownTimeout))
	}
	g.store, err = store.Open(ctx, cfg.Store)
	if err != nil {
		return fail(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	g.metrics = reg
	g.cfgPath = cfg.Path
	g.cfgStamp = fileStamp(cfg.Path)
	keys, err := auth.NewKeyring(cfg.Auth)
	if err != nil {
		return fail(err)
	}
	g.keys = keys
	g.recorder = accounting.NewRecorder(g.store, accounting.RecorderOptions{
		QueueSize:     cfg.Usage.QueueSize,
		BatchSize:     cfg.Usage.BatchSize,
		FlushInterval: cfg.Usage.FlushInterval,
		Labels:        accounting.NewLabelPolicy(cfg),
	}, g.log, reg)
	g.spans, err = telemetry.New(cfg.Telemetry, cfg.Backends, reg)
	if err != nil {
		return fail(err)
	}
	g.backendMetrics = backends.NewMetrics(reg)
	g.gen, err = g.newGeneration(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	g.backendMetrics.Track(g.gen.registry)

	svc := admin.New(admin.Options{Keys: keys, Store: g.store, Log: g.log,
		CurrentPricing: func() map[string]config.Pricing {
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.gen.pricing
		},
		MaxJSONDepth: cfg.Server.MaxJSONDepth, MaxFileBytes: cfg.Traces.MaxFileBytes})
	usageAPI := admin.NewUsageAPI(g.store, keys)
	budgetAPI := admin.NewBudgetAPI(g.store, keys, func() []config.Limit {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.gen.cfg.Limits
	})
	metrics := fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	own := ownRoutes(cfg, keys, usageAPI, budgetAPI, metrics)
	adminRoutes := serveOwnAndTraces(own, svc)
	next := adminRoutes
	if cfg.AdminListen != "" {
		g.admin = &fasthttp.Server{Handler: proxy.RefuseBadFraming(adminRoutes), Name: "tollgate-admin", ReadTimeout: cfg.Server.ReadTimeout,
			IdleTimeout: cfg.Server.IdleTimeout, MaxRequestBodySize: cfg.Server.MaxBodyBytes, CloseOnShutdown: true,
			SecureErrorLogMessage: true, Logger: proxy.NewFasthttpLogger(g.log)}
		next = nil
	}
	g.proxy, err = proxy.New(proxy.Options{
		Config:   cfg,
		Registry: g.gen.registry,
		Keys:     keys,
		Recorder: g.spans.Recorder(g.recorder),
		Limiter:  g.gen.limiter,
		Log:      g.log,
		Metrics:  reg,
		Next:     next,
		// The store is shared by replicas on PostgreSQL; on SQLite it
		// keeps which backend made a response across restarts.
		ResponseOwners: g.store,
	})
	if err != nil {
		return fail(err)
	}
	g.routes = routeTable(g.proxy, own, svc)
	return g, nil
}

// close stops, in order, what build started: backends, then the spans
// queued (exported), the usage queue (drained into the store), then the
// store and the log.
func (g *gateway) close(timeout time.Duration) error {
	var errs []error
	g.retiring.Wait()
	if g.gen != nil {
		errs = append(errs, g.gen.close())
	}
	if g.spans != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		errs = append(errs, g.spans.Shutdown(ctx))
		cancel()
	}
	if g.recorder != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		errs = append(errs, g.recorder.Close(ctx))
		cancel()
	}
	if g.store != nil {
		errs = append(errs, g.store.Close())
	}
	if g.log != nil {
		g.log.Info("stopped")
	}
	if g.logSync != nil {
		errs = append(errs, g.logSync.Stop())
	}
	return errors.Join(errs...)
}

// newLogger builds the zap logger the config asks for. Lines are buffered
// and flushed every second (and on stop, and when the buffer is full), so
// that logging a line per request costs no write system call on the
// request path but one per logBufferSize bytes of lines.
func newLogger(cfg config.Log, out io.Writer) (*zap.Logger, *zapcore.BufferedWriteSyncer, error) {
	level, err := zapcore.ParseLevel(cfg.Level)
	if err != nil {
		return nil, nil, fmt.Errorf("log.level: %w", err)
	}
	// The writer is wrapped so that zap never calls its Sync: stderr is
	// usually a pipe or a terminal, where fsync fails (EINVAL), and a
	// failed sync must not turn a clean shutdown into exit status 1.
	ws := &zapcore.BufferedWriteSyncer{WS: zapcore.AddSync(writerOnly{out}), Size: logBufferSize, FlushInterval: time.Second}
	if cfg.Format == "console" {
		encCfg := logline.EncoderConfig()
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(encCfg), ws, level)), ws, nil
	}
	// JSON lines are zap's JSON encoder's on logline.EncoderConfig; the
	// per-request line is written by logline without the encoder.
	return zap.New(logline.NewJSONCore(ws, level)), ws, nil
}

// logBufferSize is the log buffer's size: about 190 request lines at info
// level, a write every 20 ms at 10,000 requests a second. The buffer stays
// in the heap for the life of the process; 256 KiB, as it was, held 192 KiB
// more for a write system call per 750 lines rather than per 190, a few
// instructions a request either way.
const logBufferSize = 64 << 10

// requireAdmin reports whether the request carries an admin key, answering
// 401 or 403 when it does not. /metrics names every team and project, so
// where clients can reach it, it can be kept for admins.
func requireAdmin(ctx *fasthttp.RequestCtx, keys *auth.Keyring) bool {
	key := keys.Lookup(auth.Secret(nil, ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)))
	switch {
	case key == nil:
		ctx.Error(`{"detail":"Not authenticated"}`, fasthttp.StatusUnauthorized)
	case !key.Admin:
		ctx.Error(`{"detail":"/metrics needs an admin key"}`, fasthttp.StatusForbidden)
	default:
		return true
	}
	ctx.SetContentType("application/json")
	return false
}

// writerOnly hides every method of a writer but Write (notably an
// *os.File's Sync).
type writerOnly struct{ io.Writer }
