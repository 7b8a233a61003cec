package proxy

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's Prometheus series.
type metrics struct {
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	timeToFirstTok  *prometheus.HistogramVec
	streamsInFlight prometheus.Gauge
	streamErrors    *prometheus.CounterVec
	panics          *prometheus.CounterVec
}

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
	if reg != nil {
		reg.MustRegister(m.panics)
		reg.MustRegister(m.requests, m.duration, m.timeToFirstTok, m.streamsInFlight, m.streamErrors)
	}
	return m
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
