package backends

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/config"
)

// Metrics are the Prometheus series of the backends. One Metrics lives as
// long as the gateway, across configuration reloads: every Registry a
// configuration builds is given it (NewRegistryWith), so that counters
// continue, and Track names the registry serving new requests, whose
// backends and models the gauges report at each scrape. Every label value
// is a backend or model name from the configuration.
type Metrics struct {
	ejections      *prometheus.CounterVec
	probeFailures  *prometheus.CounterVec
	queueWait      *prometheus.HistogramVec
	serverFailures *prometheus.CounterVec
	placements     *prometheus.CounterVec

	current    atomic.Pointer[Registry]
	state      *prometheus.Desc
	inFlight   *prometheus.Desc
	queueDepth *prometheus.Desc
	// What the scheduler reads of each backend whose metrics it polls.
	serverFresh      *prometheus.Desc
	serverRequests   *prometheus.Desc
	serverMaxRunning *prometheus.Desc
}

// queueWaitBuckets span a slot freed at once to the longest queue wait
// anyone configures.
var queueWaitBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// NewMetrics builds the backends' metrics and registers them on reg (nil
// registers nothing). It panics if they are already registered on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_backend_ejections_total",
			Help: "Times a backend was taken out of rotation for a cooldown: after consecutive failures, or again when its probe failed on return.",
		}, []string{"backend"}),
		probeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_backend_probe_failures_total",
			Help: "Active health probes of a backend that failed (no answer in time, or a non-2xx status).",
		}, []string{"backend"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tollgate_queue_wait_seconds",
			Help:    "Time requests waited in a model's queue for a backend slot, whether they got one or not, by model.",
			Buckets: queueWaitBuckets,
		}, []string{"model"}),
		serverFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_backend_server_metrics_failures_total",
			Help: "Reads of a backend's own metrics (vLLM's /metrics) that failed: no answer in time, a non-200 status, or a page without vLLM's gauges.",
		}, []string{"backend"}),
		placements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_placements_total",
			Help: "Requests the scheduler placed on a backend of a model with several backends, by why: kept (a conversation on the server holding most of it), moved (a conversation's turn off its full server, prefilling again what that one held), spread (an opening sent to a server without its instructions), score, queued (into a server's own queue), priority (past max_concurrency for the server to preempt lower priority).",
		}, []string{"model", "placement"}),
		state: prometheus.NewDesc("tollgate_backend_state",
			"A backend's standing: 1 for its current state (healthy, ejected after failures, or unhealthy: its probe fails), 0 for the others.",
			[]string{"backend", "state"}, nil),
		inFlight: prometheus.NewDesc("tollgate_backend_requests_in_flight",
			"Requests in flight on a backend, streams included.",
			[]string{"backend"}, nil),
		queueDepth: prometheus.NewDesc("tollgate_queue_depth",
			"Requests waiting in a model's queue for a backend slot.",
			[]string{"model"}, nil),
		serverFresh: prometheus.NewDesc("tollgate_backend_server_metrics_fresh",
			"For a backend whose own metrics the scheduler reads: 1 while it scores the backend on a fresh reading, 0 while it falls back to the gateway's own in-flight count (no reading yet, or the last one older than metrics.stale_after).",
			[]string{"backend"}, nil),
		serverRequests: prometheus.NewDesc("tollgate_backend_server_requests",
			"Sequences a backend's server said it runs and queues, in the fresh reading the scheduler scores it on.",
			[]string{"backend", "state"}, nil),
		serverMaxRunning: prometheus.NewDesc("tollgate_backend_server_max_running",
			"The most sequences a backend's server runs at once, as the scheduler learned it (the largest running count read while some waited), in the fresh reading; 0 until the server has queued.",
			[]string{"backend"}, nil),
	}
	if reg != nil {
		reg.MustRegister(m.ejections, m.probeFailures, m.queueWait, m.serverFailures, m.placements, m)
	}
	return m
}

// Track makes r the registry the gauges report: the backends and models of
// the configuration serving new requests.
func (m *Metrics) Track(r *Registry) { m.current.Store(r) }

// Describe implements prometheus.Collector for the gauges read at scrape
// time.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.state
	ch <- m.inFlight
	ch <- m.queueDepth
	ch <- m.serverFresh
	ch <- m.serverRequests
	ch <- m.serverMaxRunning
}

// Collect implements prometheus.Collector: the state and load of each
// backend, the queue of each model, and the server readings the scheduler
// scores on, of the tracked registry.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	r := m.current.Load()
	if r == nil {
		return
	}
	for _, b := range r.backends {
		st := b.State()
		for _, s := range [...]State{StateHealthy, StateEjected, StateUnhealthy} {
			v := 0.0
			if s == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(m.state, prometheus.GaugeValue, v, b.Name, string(s))
		}
		ch <- prometheus.MustNewConstMetric(m.inFlight, prometheus.GaugeValue, float64(b.InFlight()), b.Name)
	}
	for _, rt := range r.ordered {
		ch <- prometheus.MustNewConstMetric(m.queueDepth, prometheus.GaugeValue, float64(rt.queued.Load()), rt.Name)
	}
	for _, p := range r.pollers {
		s := p.b.server.Load()
		if s == nil {
			ch <- prometheus.MustNewConstMetric(m.serverFresh, prometheus.GaugeValue, 0, p.b.Name)
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.serverFresh, prometheus.GaugeValue, 1, p.b.Name)
		ch <- prometheus.MustNewConstMetric(m.serverRequests, prometheus.GaugeValue, float64(s.running), p.b.Name, "running")
		ch <- prometheus.MustNewConstMetric(m.serverRequests, prometheus.GaugeValue, float64(s.waiting), p.b.Name, "waiting")
		ch <- prometheus.MustNewConstMetric(m.serverMaxRunning, prometheus.GaugeValue, float64(s.maxRunning), p.b.Name)
	}
}

// RegistryOptions are what NewRegistryWith takes beside the configuration.
type RegistryOptions struct {
	// Metrics counts the registry's ejections, probe failures, queue
	// waits and failed reads of its servers' metrics. Nil means they are
	// not counted.
	Metrics *Metrics
}

// NewRegistryWith is NewRegistry with options.
func NewRegistryWith(cfg *config.Config, opts RegistryOptions) (*Registry, error) {
	r, err := newRegistry(cfg, opts.Metrics)
	if err != nil || opts.Metrics == nil {
		return r, err
	}
	// The children are resolved once per backend and model, so that an
	// event costs one Inc or Observe, not a label lookup.
	for _, b := range r.backends {
		b.health.ejections = opts.Metrics.ejections.WithLabelValues(b.Name)
		b.health.probeFailures = opts.Metrics.probeFailures.WithLabelValues(b.Name)
	}
	for _, rt := range r.ordered {
		rt.queueWait = opts.Metrics.queueWait.WithLabelValues(rt.Name)
		if len(rt.backends) > 1 {
			for why, name := range placementNames {
				rt.placements[why] = opts.Metrics.placements.WithLabelValues(rt.Name, name)
			}
		}
	}
	return r, nil
}

// observeQueueWait observes the wait of a request queued since start.
func (r *Route) observeQueueWait(start time.Time) {
	if r.queueWait != nil {
		r.queueWait.Observe(time.Since(start).Seconds())
	}
}
