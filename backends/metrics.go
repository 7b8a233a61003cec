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
	ejections     *prometheus.CounterVec
	probeFailures *prometheus.CounterVec
	queueWait     *prometheus.HistogramVec

	current    atomic.Pointer[Registry]
	state      *prometheus.Desc
	inFlight   *prometheus.Desc
	queueDepth *prometheus.Desc
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
		state: prometheus.NewDesc("tollgate_backend_state",
			"A backend's standing: 1 for its current state (healthy, ejected after failures, or unhealthy: its probe fails), 0 for the others.",
			[]string{"backend", "state"}, nil),
		inFlight: prometheus.NewDesc("tollgate_backend_requests_in_flight",
			"Requests in flight on a backend, streams included.",
			[]string{"backend"}, nil),
		queueDepth: prometheus.NewDesc("tollgate_queue_depth",
			"Requests waiting in a model's queue for a backend slot.",
			[]string{"model"}, nil),
	}
	if reg != nil {
		reg.MustRegister(m.ejections, m.probeFailures, m.queueWait, m)
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
}

// Collect implements prometheus.Collector: the state and load of each
// backend, and the queue of each model, of the tracked registry.
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
}

// RegistryOptions are what NewRegistryWith takes beside the configuration.
type RegistryOptions struct {
	// Metrics counts the registry's ejections, probe failures and queue
	// waits. Nil means they are not counted.
	Metrics *Metrics
}

// NewRegistryWith is NewRegistry with options.
func NewRegistryWith(cfg *config.Config, opts RegistryOptions) (*Registry, error) {
	r, err := NewRegistry(cfg)
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
	}
	return r, nil
}

// observeQueueWait observes the wait of a request queued since start.
func (r *Route) observeQueueWait(start time.Time) {
	if r.queueWait != nil {
		r.queueWait.Observe(time.Since(start).Seconds())
	}
}
