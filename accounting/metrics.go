package accounting

import "github.com/prometheus/client_golang/prometheus"

// recorderMetrics are the Prometheus series of usage recording. They are
// registered on the registry the caller passes in, never on the global one,
// so that tests and several gateways in one process do not collide.
type recorderMetrics struct {
	// promptTokens and completionTokens count tokens by team, project and
	// model. They are updated by the writer goroutine when it takes records
	// off the queue, not by Record, so that the request path pays no label
	// lookup; they lag the requests by at most the flush interval.
	promptTokens     *prometheus.CounterVec
	completionTokens *prometheus.CounterVec

	written      prometheus.Counter
	failed       prometheus.Counter
	retried      prometheus.Counter
	lost         prometheus.Counter
	backpressure prometheus.Counter
	// invalid counts records whose token counts were impossible (negative
	// or above MaxRecordTokens), written as errors with zero tokens.
	invalid prometheus.Counter
	// panics counts panics the writer recovered from, its store's included.
	panics prometheus.Counter
}

// newRecorderMetrics builds the recorder's metrics and registers them, with
// the queue depth read from queueDepth at scrape time, on reg (nil registers
// nothing). It panics if the names are already registered on reg, as
// MustRegister does: two recorders on one registry is a programming error.
func newRecorderMetrics(reg prometheus.Registerer, queueDepth func() float64) *recorderMetrics {
	labels := []string{"team", "project", "model"}
	m := &recorderMetrics{
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_prompt_tokens_total",
			Help: "Prompt tokens of chat completions, by team, project and requested model.",
		}, labels),
		completionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_completion_tokens_total",
			Help: "Completion tokens of chat completions, by team, project and requested model.",
		}, labels),
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_records_written_total",
			Help: "Usage records persisted to the store.",
		}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_records_failed_total",
			Help: "Usage records in store writes that failed (counted once per failed attempt); they are retried.",
		}),
		retried: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_records_retried_total",
			Help: "Usage records written again after a failed attempt (counted once per retry).",
		}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_records_lost_total",
			Help: "Usage records never persisted: recorded after shutdown began, or still unwritten when the shutdown deadline passed. Each is also logged at error level.",
		}),
		backpressure: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_recorder_backpressure_waits_total",
			Help: "Times recording a usage record had to wait because the queue was full.",
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_records_invalid_total",
			Help: "Usage records with an impossible token count (negative, or above 2^32), written as errors with zero tokens.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_writer_panics_total",
			Help: "Panics the usage writer recovered from (its store's included); each is logged with its stack.",
		}),
	}
	if reg != nil {
		reg.MustRegister(
			m.promptTokens, m.completionTokens,
			m.written, m.failed, m.retried, m.lost, m.backpressure, m.invalid, m.panics,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tollgate_usage_queue_depth",
				Help: "Usage records waiting in the queue to be written.",
			}, queueDepth),
		)
	}
	return m
}
