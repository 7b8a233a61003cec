package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
)

// benchExporter is an exporter posting to a collector that reads and
// discards every export.
func benchExporter(b *testing.B) (*Exporter, *prometheus.Registry) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	b.Cleanup(sink.Close)
	reg := prometheus.NewRegistry()
	e, err := New(config.Telemetry{Endpoint: sink.URL},
		[]config.Backend{{Name: "vllm", URL: "http://10.0.0.7:8000/v1"}}, reg)
	if err != nil || e == nil {
		b.Fatalf("New = %v, %v", e, err)
	}
	b.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	return e, reg
}

// benchRecord is a plain chat completion's record, with a client's parent.
func benchRecord() accounting.Record {
	now := time.Now()
	rec := accounting.Record{RequestID: "req-1", CallID: "0193a4d2-7c1e-7b3a-9f00-0123456789ab",
		KeyName: "acme-key", Team: "acme", Project: "search", Model: "demo", ServedModel: "demo",
		Backend: "vllm", CompletionID: "chatcmpl-123", Endpoint: "chat.completions", Status: 200,
		PromptTokens: 57, CompletionTokens: 16, TotalTokens: 73,
		Started: now.Add(-20 * time.Millisecond), Ended: now}
	rec.Span.TraceID[0], rec.Span.SpanID[0], rec.Span.ParentSpanID[0] = 1, 2, 3
	return rec
}

// BenchmarkRecord is the usage recorder's cost per request on the request
// goroutine, with export off (the recorder itself) and on (the ring push).
// With export on, allocs/op counts every goroutine's allocations, so it
// includes the span builder's for the records it built.
func BenchmarkRecord(b *testing.B) {
	rec := benchRecord()
	b.Run("off", func(b *testing.B) {
		var e *Exporter
		r := e.Recorder(discard{})
		b.ReportAllocs()
		for b.Loop() {
			r.Record(rec)
		}
	})
	b.Run("on", func(b *testing.B) {
		e, _ := benchExporter(b)
		r := e.Recorder(discard{})
		b.ReportAllocs()
		for b.Loop() {
			r.Record(rec)
		}
		b.StopTimer()
		b.ReportMetric(testutil.ToFloat64(e.records.full)/float64(b.N), "dropped/op")
	})
}

// BenchmarkBuildSpan is the cost per record of its span, on the ring
// consumer's goroutine: building its OTLP protos into the batch, and the
// batch's export by the OTLP client every 512 spans. cpu-ns/op is the
// process's CPU time per span, the builder's and the export's (the
// encoding, the posts, the collector's reads), with every span exported
// before the clock stops.
func BenchmarkBuildSpan(b *testing.B) {
	e, _ := benchExporter(b)
	failed := prometheus.NewCounter(prometheus.CounterOpts{Name: "failed"})
	x := newBatcher(context.Background(), testSpanBuilder(b, e), e.client,
		batching{queue: defaultQueueSize, size: defaultBatchSize, delay: time.Hour, timeout: defaultExportTimeout},
		failed, failed)
	rec := benchRecord()
	b.ReportAllocs()
	cpu := processCPU(b)
	for b.Loop() {
		x.build(&rec)
	}
	x.flush()
	b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
	if n := testutil.ToFloat64(failed); n != 0 {
		b.Fatalf("%v spans failed to export", n)
	}
}

// testSpanBuilder is the span builder New makes for e, with the SDK's
// default sampler and the default resource.
func testSpanBuilder(tb testing.TB, e *Exporter) *spanBuilder {
	res, err := newResource(config.Telemetry{})
	if err != nil {
		tb.Fatal(err)
	}
	return newSpanBuilder(sdktrace.ParentBased(sdktrace.AlwaysSample()), res.Attributes(), res.SchemaURL(), e.serverMap)
}

// processCPU is the CPU time the process has used, user and system, in
// nanoseconds.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
