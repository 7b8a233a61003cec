package telemetry

import (
	"context"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newDropCounter registers tollgate_otel_spans_dropped_total on reg (nil
// registers nothing).
func newDropCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_otel_spans_dropped_total",
		Help: "OpenTelemetry spans not exported: a queue was full (queue_full), the collector refused or did not answer an export (export_failed), or the request ended as the exporter shut down (shutdown).",
	}, []string{"reason"})
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}

// boundedProcessor keeps the batch processor's queue from overflowing, and
// counts what it turns away. The batch processor drops a span its full
// queue cannot take, but tells no one; here queued counts the spans handed
// to it and not yet given to the exporter (countingExporter takes them
// off), which is never fewer than its queue holds, so a span that would
// not fit is dropped, and counted, before it reaches the queue.
type boundedProcessor struct {
	sdktrace.SpanProcessor
	queued  atomic.Int64
	max     int64
	dropped prometheus.Counter
}

func (p *boundedProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		// The batch processor exports sampled spans only.
		return
	}
	if p.queued.Add(1) > p.max {
		p.queued.Add(-1)
		p.dropped.Inc()
		return
	}
	p.SpanProcessor.OnEnd(s)
}

// countingExporter takes the spans of each batch off boundedProcessor's
// count as the batch leaves the queue, and counts the spans of a batch
// whose export failed (the batch processor does not retry; the OTLP
// exporter has retried it within its timeout).
type countingExporter struct {
	sdktrace.SpanExporter
	queued *atomic.Int64
	failed prometheus.Counter
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.queued.Add(-int64(len(spans)))
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		e.failed.Add(float64(len(spans)))
	}
	return err
}
