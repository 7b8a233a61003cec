package accounting

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/config"
)

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
	// refused counts records the store refused (or panicked on), set
	// aside rather than written (see Store.SetAside).
	refused prometheus.Counter
	// panics counts panics the writer recovered from, its store's included.
	panics prometheus.Counter
	// normalPriorityBatches counts batches written at normal priority
	// because the queue was backlogged (writer_priority.go).
	normalPriorityBatches prometheus.Counter
	// writeLag is, for each batch written, how long its oldest record
	// waited from the end of its request: how far the store trails.
	writeLag prometheus.Histogram
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
			Help: "Prompt tokens by team, project and model; teams and projects the configuration does not name are counted as \"other\".",
		}, labels),
		completionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_completion_tokens_total",
			Help: "Completion tokens by team, project and model; teams and projects the configuration does not name are counted as \"other\".",
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
			Help: "Usage records with an impossible token count (negative, or above 2^40), written as errors with zero tokens.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_records_refused_total",
			Help: "Usage records the store refused (a value it cannot hold) or panicked on, set aside for inspection instead of written; each is also logged at error level.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_writer_panics_total",
			Help: "Panics the usage writer recovered from (its store's included); each is logged with its stack.",
		}),
		normalPriorityBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_usage_batches_backlogged_total",
			Help: "Usage batches written at normal priority because more than four batches were queued; the writer otherwise runs at a lowered priority.",
		}),
		writeLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tollgate_usage_write_lag_seconds",
			Help:    "For each batch of usage records written, time from the end of its oldest record's request to the write.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 300, 1800},
		}),
	}
	if reg != nil {
		reg.MustRegister(
			m.promptTokens, m.completionTokens,
			m.written, m.failed, m.retried, m.lost, m.backpressure, m.invalid, m.refused, m.panics, m.normalPriorityBatches, m.writeLag,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tollgate_usage_queue_depth",
				Help: "Usage records waiting in the queue to be written.",
			}, queueDepth),
		)
	}
	return m
}

// observeWriteLag observes, at now, the age of the oldest record of a
// batch just written. Records without an end time (none come from the
// proxy) are left out.
func (m *recorderMetrics) observeWriteLag(batch []Record, now time.Time) {
	var oldest time.Time
	for i := range batch {
		if e := batch[i].Ended; !e.IsZero() && (oldest.IsZero() || e.Before(oldest)) {
			oldest = e
		}
	}
	if !oldest.IsZero() {
		m.writeLag.Observe(max(now.Sub(oldest), 0).Seconds())
	}
}

// OtherLabel is the label value of every team, project or model the
// configuration does not name.
const OtherLabel = "other"

// LabelPolicy bounds the label values of metrics by what the
// configuration names. The team and project of a request come from the
// client's Compat-Project header, so labelling by them as they come would
// let any client add series without end, to the gateway's memory and to
// every Prometheus scraping it. A LabelPolicy is immutable; a reload builds
// a new one.
type LabelPolicy struct {
	teams, projects, models map[string]struct{}
}

// NewLabelPolicy returns the policy of cfg: teams named by a key (teams,
// default_team), a limit or metrics.teams; projects named by a limit,
// metrics.projects or usage.default_project; and the configured models.
// A limit's "*" names no team: it matches every one.
func NewLabelPolicy(cfg *config.Config) *LabelPolicy {
	p := &LabelPolicy{teams: map[string]struct{}{}, projects: map[string]struct{}{}, models: map[string]struct{}{}}
	add := func(set map[string]struct{}, names ...string) {
		for _, n := range names {
			if n != "" && n != "*" {
				set[n] = struct{}{}
			}
		}
	}
	for _, k := range cfg.Auth.Keys {
		add(p.teams, k.Teams...)
		add(p.teams, k.DefaultTeam)
	}
	for _, l := range cfg.Limits {
		add(p.teams, l.Team)
		add(p.projects, l.Project)
	}
	add(p.teams, cfg.Metrics.Teams...)
	add(p.projects, cfg.Metrics.Projects...)
	add(p.projects, cfg.Usage.DefaultProject)
	for _, m := range cfg.Models {
		add(p.models, m.Name)
	}
	return p
}

// Team returns the label value of team: team itself if the policy names
// it, else OtherLabel. A nil policy names nothing.
func (p *LabelPolicy) Team(team string) string {
	if p == nil {
		return OtherLabel
	}
	return bound(p.teams, team)
}

// Project returns the label value of project, as Team does.
func (p *LabelPolicy) Project(project string) string {
	if p == nil {
		return OtherLabel
	}
	return bound(p.projects, project)
}

// Model returns the label value of a model id, as Team does.
func (p *LabelPolicy) Model(model string) string {
	if p == nil {
		return OtherLabel
	}
	return bound(p.models, model)
}

func bound(named map[string]struct{}, v string) string {
	if _, ok := named[v]; ok {
		return v
	}
	return OtherLabel
}
