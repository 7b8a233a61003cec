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
	"github.com/tollgate-dev/tollgate/internal/logline"
	"github.com/tollgate-dev/tollgate/internal/route"
	"github.com/tollgate-dev/tollgate/org"
	"github.com/tollgate-dev/tollgate/proxy"
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
	// enforcer holds the Admin API's keys and limits in memory; its
	// poller runs until stopEnforcer, and enforcerDone closes when it
	// has returned.
	enforcer     *org.Enforcer
	orgLimits    *accounting.RedisLimiter // nil unless the limits live in Redis
	stopEnforcer context.CancelFunc
	enforcerDone chan struct{}
	// alerter fires the projects' spend alerts; it runs until stopAlerter,
	// and alerterDone closes when it (and its webhook posts) returned.
	stopAlerter context.CancelFunc
	alerterDone chan struct{}
	// routes is every route the binary serves (see routes.go).
	routes []route.Route
	// router serves the proxy's listener: every route, or with
	// admin_listen only the proxy's (the admin listener serves the rest).
	router *route.Router

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

	g.warnDescriptors(cfg)
	errc := make(chan error, 2)
	servers := 1
	go func() { errc <- g.proxy.Serve(ln, g.router.Serve) }()
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
		go func() { errc <- g.admin.Serve(g.proxy.AdminListener(aln)) }()
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

// warnDescriptors logs a warning when the connection caps set in the
// configuration leave the gateway fewer descriptors than the open-file
// limit needs for them: accepts then fail when clients fill the limit,
// and are retried, and dials upstream and store files fail meanwhile.
func (g *gateway) warnDescriptors(cfg *config.Config) {
	conns := cfg.Server.MaxConnections
	if cfg.AdminListen != "" {
		conns += cfg.Server.AdminMaxConnections
	}
	if limit := config.OpenFileLimit(); limit > 0 && uint64(conns) >= limit {
		g.log.Warn("the connection caps reach the open-file limit; lower server.max_connections and server.admin_max_connections, or raise the limit",
			zap.Int("connections", conns), zap.Uint64("open_file_limit", limit))
	}
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
	// The price history learns the configured prices before any usage is
	// priced, so that costs and spend count them from now on.
	if err := g.store.RecordPrices(ctx, g.gen.pricing, time.Now()); err != nil {
		return fail(err)
	}
	if err := g.startEnforcer(ctx, cfg); err != nil {
		return fail(err)
	}

	currentPricing := func() map[string]config.Pricing {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.gen.pricing
	}
	if err := g.startAlerter(currentPricing); err != nil {
		return fail(err)
	}
	svc := admin.New(admin.Options{Keys: keys, Store: g.store, Log: g.log,
		CurrentPricing: currentPricing, MaxJSONDepth: cfg.Server.MaxJSONDepth,
		MaxFileBytes: cfg.Traces.MaxFileBytes, MaxBodyBytes: cfg.Server.MaxBodyBytes})
	usageAPI := admin.NewUsageAPI(g.store, keys)
	costsAPI := admin.NewCostsAPI(g.store, keys, currentPricing)
	budgetAPI := admin.NewBudgetAPI(g.store, keys, func() []config.Limit {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.gen.cfg.Limits
	})
	metrics := fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	orgAPI := admin.NewOrgAPI(org.NewService(g.store), keys, func() []string {
		g.mu.Lock()
		defer g.mu.Unlock()
		ids := make([]string, 0, len(g.gen.cfg.Models))
		for _, m := range g.gen.cfg.Models {
			ids = append(ids, m.Name)
		}
		return ids
	})
	g.proxy, err = proxy.New(proxy.Options{
		Config:   cfg,
		Registry: g.gen.registry,
		Keys:     keys,
		Recorder: g.spans.Recorder(g.recorder),
		Limiter:  g.gen.limiter,
		Admit:    g.enforcer,
		Log:      g.log,
		Metrics:  reg,
		// The store is shared by replicas on PostgreSQL; on SQLite it
		// keeps which backend made a response across restarts.
		ResponseOwners: g.store,
	})
	if err != nil {
		return fail(err)
	}
	proxyRoutes := g.proxy.Routes()
	g.routes = routeTable(proxyRoutes, ownRoutes(cfg, keys, usageAPI, budgetAPI, orgAPI, costsAPI, metrics), svc.Routes())
	clientRoutes := g.routes
	if cfg.AdminListen != "" {
		clientRoutes = proxyRoutes
		adminRouter, err := newRouter(g.routes[len(proxyRoutes):])
		if err != nil {
			return fail(err)
		}
		g.admin = g.proxy.AdminServer(adminRouter.Serve)
	}
	if g.router, err = newRouter(clientRoutes); err != nil {
		return fail(err)
	}
	return g, nil
}

// startEnforcer builds the Admin API's enforcer, reads the organization
// once (so that runtime keys work from the first request) and starts its
// poller. Project limits count where the configured ones do: in this
// process, or in Redis under their own prefix, shared by every replica.
func (g *gateway) startEnforcer(ctx context.Context, cfg *config.Config) error {
	factory := func(ctx context.Context, prev org.Limits, limits []config.Limit, spent accounting.LimitsStore) org.Limits {
		l, ok := prev.(*accounting.Limiter)
		if ok {
			l = l.Derive(limits)
		} else {
			l = accounting.NewLimiter(limits, time.Now)
		}
		if err := l.Reseed(ctx, spent); err != nil {
			g.log.Warn("seeding project spend from the usage store failed; it counts from this process's own", zap.Error(err))
		}
		return l
	}
	if cfg.LimitsBackend.Driver == "redis" {
		rc := cfg.LimitsBackend
		rc.Prefix += "org:"
		base, err := accounting.NewRedisLimiter(nil, rc, time.Now, g.log, g.metrics)
		if err != nil {
			return err
		}
		g.orgLimits = base
		factory = func(ctx context.Context, _ org.Limits, limits []config.Limit, spent accounting.LimitsStore) org.Limits {
			base.SetStore(spent)
			return base.Derive(ctx, limits)
		}
	}
	g.enforcer = org.NewEnforcer(org.EnforcerOptions{Store: g.store, Usage: g.store, Keys: g.keys, Limits: factory, Log: g.log})
	g.enforcer.SetPricing(g.gen.pricing)
	if err := g.enforcer.Refresh(ctx); err != nil {
		return fmt.Errorf("read the Admin API's keys and limits: %w", err)
	}
	pollCtx, stop := context.WithCancel(context.Background())
	g.stopEnforcer, g.enforcerDone = stop, make(chan struct{})
	go func() {
		defer close(g.enforcerDone)
		g.enforcer.Run(pollCtx)
	}()
	return nil
}

// startAlerter starts the goroutine that fires spend alerts, off the
// request path.
func (g *gateway) startAlerter(pricing func() map[string]config.Pricing) error {
	alerter, err := org.NewAlerter(org.AlerterOptions{Store: g.store, Usage: g.store, Pricing: pricing, Metrics: g.metrics, Log: g.log})
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	g.stopAlerter, g.alerterDone = stop, make(chan struct{})
	go func() {
		defer close(g.alerterDone)
		alerter.Run(ctx)
	}()
	return nil
}

// close stops, in order, what build started: backends, then the spans
// queued (exported), the usage queue (drained into the store), then the
// store and the log.
func (g *gateway) close(timeout time.Duration) error {
	var errs []error
	if g.stopEnforcer != nil {
		g.stopEnforcer()
		<-g.enforcerDone
	}
	if g.stopAlerter != nil {
		g.stopAlerter()
		<-g.alerterDone
	}
	if g.orgLimits != nil {
		errs = append(errs, g.orgLimits.Close())
	}
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

// logBufferSize is the log buffer's size: room for some hundreds of
// request lines at info level, so that a busy gateway writes its log in
// large blocks rather than once a line. The buffer stays in the heap for
// the life of the process, and a larger one would hold more memory to
// save system calls that already cost a request next to nothing.
const logBufferSize = 64 << 10

// writerOnly hides every method of a writer but Write (notably an
// *os.File's Sync).
type writerOnly struct{ io.Writer }
