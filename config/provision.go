package config

import (
	"path/filepath"
	"syscall"
	"time"
)

// The defaults Provision fills in. Each is stated again in the comment of
// its field in config.go, which is what users read; keep the two in step.
const (
	defaultListen    = "127.0.0.1:8080"
	defaultLogLevel  = "info"
	defaultLogFormat = "json"

	defaultTeam = "default"

	defaultMaxBodyBytes      = 4 << 20
	defaultMaxHeaderBytes    = 16 << 10
	defaultMaxMessages       = 2048
	defaultMaxJSONDepth      = 64
	defaultReadTimeout       = 30 * time.Second
	defaultServerIdleTimeout = 120 * time.Second
	defaultMaxConnections    = 20000
	defaultAdminConnections  = 2500
	defaultWriteTimeout      = 60 * time.Second
	defaultShutdownTimeout   = 30 * time.Second
	defaultMaxStopStrings    = 64
	defaultMaxLogitBias      = 300000
	defaultMaxResponseBytes  = 64 << 20
	defaultMaxEventBytes     = 1 << 20

	defaultBackendWeight    = 1
	defaultBackendMaxConns  = 1024
	defaultConnectTimeout   = 5 * time.Second
	defaultFirstByteTimeout = 60 * time.Second
	defaultIdleTimeout      = 60 * time.Second
	defaultTotalTimeout     = 10 * time.Minute
	defaultSimulatedTokens  = 16

	defaultStoreDriver = driverSQLite
	defaultStorePath   = "tollgate.db"

	defaultQueueSize     = 65536
	defaultBatchSize     = 512
	defaultFlushInterval = time.Second
	defaultProject       = "inference"
	defaultMaxTokens     = 1024
	defaultBudgetWindow  = windowMonth
	defaultLimitsDriver  = limitsMemory

	defaultMaxStreams = 10000
	// defaultBackgroundTeamShare leaves three quarters of the background
	// slots to other teams when one fills its share.
	defaultBackgroundTeamShare = 25
	defaultHealthPath          = "/models"
	defaultHealthInterval      = 10 * time.Second
	defaultHealthTimeout       = 3 * time.Second
	defaultFailuresToEject     = 3
	defaultCooldown            = 5 * time.Second
	defaultMaxCooldown         = 2 * time.Minute
	defaultQueueDepth          = 128
	defaultMetricsPath         = "/metrics"
	defaultMetricsInterval     = 250 * time.Millisecond
	defaultMetricsTimeout      = time.Second
	defaultStaleIntervals      = 4
	defaultQueueCostTokens     = 2048
	defaultQueueWait           = 5 * time.Second
	defaultRetryAttempts       = 3
	defaultRetryBackoff        = 25 * time.Millisecond
	defaultRetryMaxBackoff     = time.Second
	defaultRetryBudgetRatio    = 0.2
	defaultRetryBudgetMin      = 10
	defaultReloadInterval      = 2 * time.Second
	defaultRedisPrefix         = "tollgate:"
	defaultRedisTimeout        = 50 * time.Millisecond
)

// Store drivers and budget windows, as written in the file.
const (
	driverSQLite   = "sqlite"
	driverPostgres = "postgres"
	windowDay      = "day"
	windowMonth    = "month"
	limitsMemory   = "memory"
	limitsRedis    = "redis"
)

// SQLiteInMemory is the store path of a database that lasts as long as the
// store that opened it (SQLite's name for one that is no file); it is not
// resolved against the config file's directory.
const SQLiteInMemory = ":memory:"

// Provision fills every zero field that has a default with that default,
// as each field's comment states. It also resolves a relative SQLite store
// path against the directory of c.Path, when c.Path is set, so that a
// config file and its database travel together whatever the working
// directory; the result is absolute, which keeps a second Provision from
// resolving it again.
//
// Provision does not check anything; call Validate afterwards.
func (c *Config) Provision() {
	setDefault(&c.Listen, defaultListen)
	setDefault(&c.Log.Level, defaultLogLevel)
	setDefault(&c.Log.Format, defaultLogFormat)

	for i := range c.Auth.Keys {
		k := &c.Auth.Keys[i]
		setDefault(&k.DefaultTeam, defaultTeam)
		if len(k.Teams) == 0 {
			k.Teams = []string{k.DefaultTeam}
		}
	}

	s := &c.Server
	setDefault(&s.MaxBodyBytes, defaultMaxBodyBytes)
	setDefault(&s.MaxHeaderBytes, defaultMaxHeaderBytes)
	setDefault(&s.MaxMessages, defaultMaxMessages)
	setDefault(&s.MaxJSONDepth, defaultMaxJSONDepth)
	setDefault(&s.ReadTimeout, defaultReadTimeout)
	setDefault(&s.IdleTimeout, defaultServerIdleTimeout)
	setDefault(&s.WriteTimeout, defaultWriteTimeout)
	proxyConns, adminConns := connectionDefaults(OpenFileLimit())
	setDefault(&s.MaxConnections, proxyConns)
	setDefault(&s.AdminMaxConnections, adminConns)
	setDefault(&s.MaxStreams, defaultMaxStreams)
	setDefault(&s.ShutdownTimeout, defaultShutdownTimeout)
	setDefault(&s.MaxStopStrings, defaultMaxStopStrings)
	setDefault(&s.MaxLogitBias, defaultMaxLogitBias)
	setDefault(&s.MaxResponseBytes, defaultMaxResponseBytes)
	setDefault(&s.MaxEventBytes, defaultMaxEventBytes)
	setDefault(&s.BackgroundTeamShare, defaultBackgroundTeamShare)
	setDefault(&s.MetricsAuth, MetricsAuthKey)

	for i := range c.Backends {
		b := &c.Backends[i]
		setDefault(&b.Weight, defaultBackendWeight)
		setDefault(&b.MaxConns, defaultBackendMaxConns)
		setDefault(&b.Timeouts.Connect, defaultConnectTimeout)
		setDefault(&b.Timeouts.FirstByte, defaultFirstByteTimeout)
		setDefault(&b.Timeouts.Idle, defaultIdleTimeout)
		setDefault(&b.Timeouts.Total, defaultTotalTimeout)
		setDefault(&b.Health.Path, defaultHealthPath)
		setDefault(&b.Health.Interval, defaultHealthInterval)
		setDefault(&b.Health.Timeout, defaultHealthTimeout)
		setDefault(&b.Health.FailuresToEject, defaultFailuresToEject)
		setDefault(&b.Health.Cooldown, defaultCooldown)
		setDefault(&b.Health.MaxCooldown, defaultMaxCooldown)
		if b.Simulated != nil {
			setDefault(&b.Simulated.Tokens, defaultSimulatedTokens)
		}
		m := &b.Metrics
		setDefault(&m.Path, defaultMetricsPath)
		setDefault(&m.Interval, defaultMetricsInterval)
		setDefault(&m.Timeout, defaultMetricsTimeout)
		setDefault(&m.StaleAfter, defaultStaleIntervals*m.Interval)
	}

	for i := range c.Models {
		q := &c.Models[i].Queue
		setDefault(&q.Depth, defaultQueueDepth)
		setDefault(&q.Wait, defaultQueueWait)
		setDefault(&c.Models[i].Routing.QueueCostTokens, defaultQueueCostTokens)
	}

	r := &c.Retries
	setDefault(&r.Attempts, defaultRetryAttempts)
	setDefault(&r.Backoff, defaultRetryBackoff)
	setDefault(&r.MaxBackoff, defaultRetryMaxBackoff)
	setDefault(&r.BudgetRatio, defaultRetryBudgetRatio)
	setDefault(&r.BudgetMin, defaultRetryBudgetMin)
	setDefault(&c.Reload.Interval, defaultReloadInterval)

	setDefault(&c.Store.Driver, defaultStoreDriver)
	if c.Store.Driver == driverSQLite {
		setDefault(&c.Store.Path, defaultStorePath)
		c.Store.Path = resolveStorePath(c.Path, c.Store.Path)
	}

	u := &c.Usage
	setDefault(&u.QueueSize, defaultQueueSize)
	setDefault(&u.BatchSize, defaultBatchSize)
	setDefault(&u.FlushInterval, defaultFlushInterval)
	setDefault(&u.DefaultProject, defaultProject)
	setDefault(&u.DefaultMaxTokens, defaultMaxTokens)

	for i := range c.Limits {
		setDefault(&c.Limits[i].BudgetWindow, defaultBudgetWindow)
	}

	lb := &c.LimitsBackend
	setDefault(&lb.Driver, defaultLimitsDriver)
	if lb.Driver == limitsRedis {
		setDefault(&lb.Prefix, defaultRedisPrefix)
		setDefault(&lb.Timeout, defaultRedisTimeout)
	}
}

// OpenFileLimit returns the process's open-file limit: the soft
// RLIMIT_NOFILE, which the Go runtime raised to the hard limit at start.
// Zero means it could not be read.
func OpenFileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return lim.Cur
}

// connectionDefaults derives the connection caps of listen and
// admin_listen from the open-file limit nofile, so that clients alone
// never take the descriptors the gateway needs to serve them (accepting
// past the limit fails, and upstream dials and store files with it): a
// reserve of a quarter of the limit, at most 256, for the store, logs,
// trace files and the runtime; half of the rest for upstream
// connections, one per request in flight; the other half for clients,
// seven eighths to listen (at most 20000) and one eighth to admin_listen
// (at most 2500). An unknown limit (zero) gives the two maxima.
func connectionDefaults(nofile uint64) (proxy, admin int) {
	if nofile == 0 {
		return defaultMaxConnections, defaultAdminConnections
	}
	reserve := min(nofile/4, 256)
	clients := (nofile - reserve) / 2
	adminShare := max(clients/8, 1)
	proxyShare := max(clients-adminShare, 1)
	return int(min(proxyShare, defaultMaxConnections)), int(min(adminShare, defaultAdminConnections))
}

// setDefault sets *v to def when *v is the zero value.
func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// resolveStorePath returns the SQLite path p, resolved against the
// directory of the config file at configPath. An absolute p, SQLite's
// ":memory:", or an empty configPath (an embedded config, with no file to
// be beside) leave p as it is.
func resolveStorePath(configPath, p string) string {
	if configPath == "" || p == SQLiteInMemory || filepath.IsAbs(p) {
		return p
	}
	dir := filepath.Dir(configPath)
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return filepath.Join(dir, p)
}
