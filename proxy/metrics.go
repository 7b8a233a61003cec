package proxy

import (
	"errors"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/accounting"
)

// metrics are the proxy's Prometheus series.
type metrics struct {
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	timeToFirstTok  *prometheus.HistogramVec
	streamsInFlight prometheus.Gauge
	streamErrors    *prometheus.CounterVec
	panics          *prometheus.CounterVec

	// Why traffic moved or was refused. Their model labels are configured
	// model names, so they are bounded by the configuration.
	retries        *prometheus.CounterVec
	retriesRefused *prometheus.CounterVec
	fallbacks      *prometheus.CounterVec
	streamAborts   *prometheus.CounterVec
	limitRefusals  map[string]prometheus.Counter // by LimitError.Kind

	// overhead is the gateway's own share of each request's time (see
	// observeOverhead).
	overhead *prometheus.HistogramVec

	// The children a request uses are resolved once per label set, so
	// that a request pays one map lookup instead of a vector's label
	// hashing and locking.
	overheadByModel seriesCache[string, prometheus.Observer]
	byOutcome       seriesCache[outcomeLabels, outcomeSeries]
}

// outcomeLabels are the labels of a finished request's series; outcomeSeries
// the requests counter and duration histogram they select.
type outcomeLabels struct {
	model, backend, endpoint string
	status                   int
}

type outcomeSeries struct {
	count    prometheus.Counter
	duration prometheus.Observer
}

// seriesCache maps label values to metric children, copied on write: reads
// take no lock. Its keys are bounded by the configuration (model, backend
// and endpoint names) and by HTTP statuses.
type seriesCache[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex
}

// get returns the child of k, resolving it with resolve the first time.
func (c *seriesCache[K, V]) get(k K, resolve func(K) V) V {
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[K]V
	if m := c.m.Load(); m != nil {
		old = *m
	}
	if v, ok := old[k]; ok {
		return v
	}
	next := maps.Clone(old)
	if next == nil {
		next = make(map[K]V)
	}
	v := resolve(k)
	next[k] = v
	c.m.Store(&next)
	return v
}

// overheadBuckets span the gateway's own time: tens of microseconds when
// all is well, milliseconds when it is busy, more when it waits (queue,
// retry backoff).
var overheadBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}

// latencyBuckets span a cached reply in milliseconds to a long generation.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_requests_total",
			Help: "Requests by public model, backend, status returned to the client and endpoint (chat.completions, completions, embeddings, responses).",
		}, []string{"model", "backend", "status", "endpoint"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tollgate_request_duration_seconds",
			Help:    "Time from request to the end of the reply or stream, by public model and endpoint.",
			Buckets: latencyBuckets,
		}, []string{"model", "endpoint"}),
		timeToFirstTok: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tollgate_time_to_first_token_seconds",
			Help:    "Time from request to the first streamed event sent to the client, by public model.",
			Buckets: latencyBuckets,
		}, []string{"model"}),
		streamsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_streams_in_flight",
			Help: "Streams currently open to clients.",
		}),
		streamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_stream_errors_total",
			Help: "Streams that ended in an error after their first byte, by public model and kind (inband, broken, abandoned, invalid_usage).",
		}, []string{"model", "kind"}),
	}
	m.panics = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_panics_recovered_total",
		Help: "Panics recovered at a boundary where foreign bytes are handled (handler, stream): each is a bug, logged with its stack.",
	}, []string{"where"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_retries_total",
		Help: "Requests sent again, to another backend or a fallback model, after a failure before any byte reached the client, by the model that failed.",
	}, []string{"model"})
	m.retriesRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_retry_budget_exhausted_total",
		Help: "Retries not made because the retry budget (retries.budget_ratio, retries.budget_min) was spent, by the model that failed.",
	}, []string{"model"})
	m.fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_fallbacks_total",
		Help: "Requests sent to a fallback model after every backend of the requested one failed or was out, by requested and fallback model.",
	}, []string{"from", "to"})
	m.streamAborts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_stream_aborts_total",
		Help: "Streams cut short after their first byte, by public model and side: client (it closed the connection) or backend (its stream broke off, timed out or was truncated).",
	}, []string{"model", "side"})
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_limit_refusals_total",
		Help: "Requests refused with 429 by a limit, by the cap that refused: rpm, tpm or budget.",
	}, []string{"kind"})
	m.limitRefusals = make(map[string]prometheus.Counter, 3)
	for _, kind := range []string{accounting.RefusedRPM, accounting.RefusedTPM, accounting.RefusedBudget} {
		m.limitRefusals[kind] = refusals.WithLabelValues(kind)
	}
	m.overhead = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "tollgate_gateway_overhead_seconds",
		Help: "Time the gateway itself added to a request, by public model: for a reply, its total time minus the time from sending each attempt upstream to the upstream's last byte; " +
			"for a stream, the client's time to first event minus the upstream's. It includes queue waits and retry backoffs.",
		Buckets: overheadBuckets,
	}, []string{"model"})
	if reg != nil {
		reg.MustRegister(m.panics)
		reg.MustRegister(m.requests, m.duration, m.timeToFirstTok, m.streamsInFlight, m.streamErrors)
		reg.MustRegister(m.retries, m.retriesRefused, m.fallbacks, m.streamAborts, refusals, m.overhead)
	}
	return m
}

// countRefusal counts a limiter's refusal by its kind.
func (m *metrics) countRefusal(err error) {
	var le *accounting.LimitError
	if errors.As(err, &le) {
		if c := m.limitRefusals[le.Kind]; c != nil {
			c.Inc()
		}
	}
}

// observeOverhead observes d, the gateway's own time on a request to
// model (a configured model's name).
func (m *metrics) observeOverhead(model string, d time.Duration) {
	m.overheadByModel.get(model, m.resolveOverhead).Observe(max(d, 0).Seconds())
}

func (m *metrics) resolveOverhead(model string) prometheus.Observer {
	return m.overhead.WithLabelValues(model)
}

// countRequest counts a finished request to model (a configured model's
// name, or "" before routing) served by backend, with the status returned
// to the client, and observes its duration d.
func (m *metrics) countRequest(model, backend string, status int, endpoint string, d time.Duration) {
	s := m.byOutcome.get(outcomeLabels{model: model, backend: backend, endpoint: endpoint, status: status}, m.resolveOutcome)
	s.count.Inc()
	s.duration.Observe(d.Seconds())
}

func (m *metrics) resolveOutcome(l outcomeLabels) outcomeSeries {
	return outcomeSeries{
		count:    m.requests.WithLabelValues(l.model, l.backend, statusLabel(l.status), l.endpoint),
		duration: m.duration.WithLabelValues(l.model, l.endpoint),
	}
}

// statusLabel returns the label of a status code without allocating for
// the common ones.
func statusLabel(code int) string {
	switch code {
	case 200:
		return "200"
	case 400:
		return "400"
	case 401:
		return "401"
	case 403:
		return "403"
	case 404:
		return "404"
	case 429:
		return "429"
	case 500:
		return "500"
	case 502:
		return "502"
	case 503:
		return "503"
	case 504:
		return "504"
	}
	return strconv.Itoa(code)
}
