package telemetry

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"

	"github.com/tollgate-dev/tollgate/accounting"
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

// batching is how spans are batched, as the SDK's batch span processor
// takes it from OTEL_BSP_*.
type batching struct {
	// queue bounds the records waiting for their span to be built.
	queue int
	// size is the most spans an export carries; a batch that reaches it
	// is exported at once, and as many records queued wake the consumer.
	size int
	// delay is how often the spans queued are exported, whether or not
	// a batch has filled.
	delay time.Duration
	// timeout bounds an export, its retries included; zero means none.
	timeout time.Duration
}

// batcher is the ring's consumer: it builds the records' spans into a
// batch and uploads the batch with the OTLP client when it is full, and
// what is queued every batching.delay, on the consumer's goroutine, so
// that one batch of messages is all it keeps. While an upload runs, the
// records wait in the ring, which drops what it cannot hold.
type batcher struct {
	spans  *spanBuilder
	client otlptrace.Client
	cfg    batching
	// ctx ends when Shutdown gives up on the records left, and with it
	// an upload under way.
	ctx              context.Context
	failed, shutdown prometheus.Counter
}

// newBatcher exports with client the spans that spans builds; ctx ends
// when the ring gives up on what is queued.
func newBatcher(ctx context.Context, spans *spanBuilder, client otlptrace.Client, cfg batching, failed, shutdown prometheus.Counter) *batcher {
	return &batcher{spans: spans, client: client, cfg: cfg, ctx: ctx, failed: failed, shutdown: shutdown}
}

// build adds rec's span to the batch, and exports the batch once full.
func (x *batcher) build(rec *accounting.Record) {
	if x.spans.build(rec) && x.spans.batch.len() >= x.cfg.size {
		x.upload()
	}
}

// flush exports what the batch holds.
func (x *batcher) flush() {
	if x.spans.batch.len() > 0 {
		x.upload()
	}
}

// upload exports the batch and empties it. A failed export is counted,
// and reported to OpenTelemetry's error handler as the SDK's batch
// processor does, and not retried: the client has retried it within the
// timeout. Once Shutdown has given up, the batch is dropped instead.
func (x *batcher) upload() {
	bt := x.spans.batch
	n := float64(bt.len())
	defer bt.reset()
	if x.ctx.Err() != nil {
		x.shutdown.Add(n)
		return
	}
	ctx, cancel := x.ctx, context.CancelFunc(func() {})
	if x.cfg.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, x.cfg.timeout)
	}
	rs, err := bt.resourceSpans()
	if err == nil {
		err = x.client.UploadTraces(ctx, rs)
	}
	cancel()
	if err != nil {
		x.failed.Add(n)
		otel.Handle(fmt.Errorf("telemetry: export of %v spans: %w", n, err))
	}
}
