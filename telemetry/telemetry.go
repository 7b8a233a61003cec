// Package telemetry exports an OpenTelemetry span, in the GenAI semantic
// conventions, for every request the gateway routes by model.
//
// The span is built from the request's usage record once the request is
// over (Exporter.Recorder wraps the usage recorder), with the record's
// start and end as its timestamps, so the request path holds no span while
// it runs. Nor does it build one: the record is copied into a ring of
// preallocated slots, and one goroutine makes the spans and hands them to
// the SDK's batch processor. The ring and the processor's queue are
// bounded; past either bound a span is dropped (and counted) rather than
// make the request wait.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
)

// defaultQueueSize is the batch processor's queue when neither
// telemetry.max_queue_size nor OTEL_BSP_MAX_QUEUE_SIZE says, the SDK's own
// default.
const defaultQueueSize = 2048

// Recorder takes the usage record of every request routed by model (the
// proxy's Recorder).
type Recorder interface {
	Record(accounting.Record)
}

// Exporter makes a span of every record it is handed and exports it. A nil
// *Exporter is export turned off.
type Exporter struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	// servers maps a backend's name to its server.address and
	// server.port; a reload replaces it (see SetBackends).
	servers atomic.Pointer[map[string]server]
	// records carries the records to the goroutine that builds their
	// spans, which New starts and Shutdown stops.
	records *recordRing
}

// server is a backend's address as the span names it.
type server struct {
	address, port attribute.KeyValue
}

// New builds the exporter cfg and the standard OTEL_* environment
// variables describe, or returns nil when neither names an endpoint (or
// OTEL_SDK_DISABLED is true, or OTEL_TRACES_EXPORTER is none): no exporter
// and no goroutine then. backends are the configured backends, whose URLs
// give the spans' server.address and server.port. Spans dropped are
// counted in tollgate_otel_spans_dropped_total on reg (nil registers
// nothing).
func New(cfg config.Telemetry, backends []config.Backend, reg prometheus.Registerer) (*Exporter, error) {
	if !enabled(cfg) {
		return nil, nil
	}
	if p := protocol(); p != "" && p != "http/protobuf" {
		return nil, fmt.Errorf("telemetry: OTLP protocol %q is not supported; tollgate exports http/protobuf", p)
	}
	opts, err := exporterOptions(cfg)
	if err != nil {
		return nil, err
	}
	// New makes no connection: the first export does.
	client, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	queue, err := queueSize(cfg)
	if err != nil {
		return nil, err
	}
	res, err := newResource(cfg)
	if err != nil {
		return nil, err
	}
	dropped := newDropCounter(reg)
	records := newRecordRing(queue, dropped.WithLabelValues("queue_full"), dropped.WithLabelValues("shutdown"))
	bounded := &boundedProcessor{max: int64(queue), dropped: dropped.WithLabelValues("queue_full")}
	bounded.SpanProcessor = sdktrace.NewBatchSpanProcessor(
		&countingExporter{SpanExporter: client, queued: &bounded.queued, failed: dropped.WithLabelValues("export_failed")},
		sdktrace.WithMaxQueueSize(queue))
	popts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(bounded),
		sdktrace.WithIDGenerator(recordIDs{}),
	}
	sampler, err := newSampler(cfg)
	if err != nil {
		return nil, err
	}
	if sampler != nil {
		// Otherwise the SDK reads OTEL_TRACES_SAMPLER(_ARG) itself.
		popts = append(popts, sdktrace.WithSampler(sampler))
	}
	e := &Exporter{provider: sdktrace.NewTracerProvider(popts...), records: records}
	e.tracer = e.provider.Tracer("github.com/tollgate-dev/tollgate", trace.WithSchemaURL(semconv.SchemaURL))
	e.SetBackends(backends)
	go records.run(newSpanBuilder(e).build)
	return e, nil
}

// enabled says whether an endpoint is configured and the SDK not turned
// off, as the OpenTelemetry SDK configuration reads its environment.
func enabled(cfg config.Telemetry) bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") ||
		strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")), "none") {
		return false
	}
	return cfg.Endpoint != "" || cfg.TracesEndpoint != "" ||
		os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// protocol is the OTLP protocol the environment asks for, "" when it says
// none.
func protocol() string {
	if p := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"); p != "" {
		return strings.TrimSpace(p)
	}
	return strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
}

// exporterOptions are what the file sets; the exporter reads the rest
// (endpoints, headers, timeout, compression, certificates) from the
// environment itself, and options given here win over it.
func exporterOptions(cfg config.Telemetry) ([]otlptracehttp.Option, error) {
	var opts []otlptracehttp.Option
	switch {
	case cfg.TracesEndpoint != "":
		opts = append(opts, otlptracehttp.WithEndpointURL(cfg.TracesEndpoint))
	case cfg.Endpoint != "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "":
		// The base URL takes the signal's path, as
		// OTEL_EXPORTER_OTLP_ENDPOINT does.
		opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimRight(cfg.Endpoint, "/")+"/v1/traces"))
	}
	if len(cfg.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(cfg.Headers))
	}
	return opts, nil
}

// queueSize is telemetry.max_queue_size, else OTEL_BSP_MAX_QUEUE_SIZE,
// else the SDK's default: the bound is given to the batch processor
// explicitly, since boundedProcessor keeps it too.
func queueSize(cfg config.Telemetry) (int, error) {
	if cfg.MaxQueueSize > 0 {
		return cfg.MaxQueueSize, nil
	}
	v := strings.TrimSpace(os.Getenv("OTEL_BSP_MAX_QUEUE_SIZE"))
	if v == "" {
		return defaultQueueSize, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("telemetry: OTEL_BSP_MAX_QUEUE_SIZE: want a positive integer, got %q", v)
	}
	return n, nil
}

// newResource describes the gateway: service.name is
// telemetry.service_name, else OTEL_SERVICE_NAME, else "tollgate";
// OTEL_RESOURCE_ATTRIBUTES adds to it.
func newResource(cfg config.Telemetry) (*resource.Resource, error) {
	opts := []resource.Option{
		resource.WithAttributes(semconv.ServiceName("tollgate")),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	}
	if cfg.ServiceName != "" {
		opts = append(opts, resource.WithAttributes(semconv.ServiceName(cfg.ServiceName)))
	}
	res, err := resource.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}

// newSampler is the sampler the file names, completed from the
// environment; nil when the file names neither a sampler nor its
// argument, which leaves OTEL_TRACES_SAMPLER(_ARG) to the SDK.
func newSampler(cfg config.Telemetry) (sdktrace.Sampler, error) {
	if cfg.Sampler == "" && cfg.SamplerArg == "" {
		return nil, nil
	}
	name, arg := cfg.Sampler, cfg.SamplerArg
	if name == "" {
		name = strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER"))
	}
	if name == "" {
		name = "parentbased_always_on"
	}
	if arg == "" {
		arg = strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	}
	ratio := 1.0
	if arg != "" {
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(f >= 0 && f <= 1) {
			return nil, fmt.Errorf("telemetry: sampler argument: want a ratio from 0 to 1, got %q", arg)
		}
		ratio = f
	}
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, fmt.Errorf("telemetry: sampler: want one of %s, got %q", strings.Join(config.TelemetrySamplers(), ", "), name)
}

// SetBackends makes backends' URLs the server.address and server.port of
// the spans recorded from now on; a reload calls it. Nil-safe.
func (e *Exporter) SetBackends(backends []config.Backend) {
	if e == nil {
		return
	}
	m := make(map[string]server, len(backends))
	for _, b := range backends {
		if u, err := url.Parse(b.URL); err == nil && b.URL != "" {
			m[b.Name] = serverOf(u)
		}
	}
	e.servers.Store(&m)
}

// serverOf is u's host and port, the scheme's default port when u names
// none.
func serverOf(u *url.URL) server {
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		port = 80
		if u.Scheme == "https" {
			port = 443
		}
	}
	return server{address: semconv.ServerAddress(u.Hostname()), port: semconv.ServerPort(port)}
}

// Recorder returns next wrapped so that every record it takes is queued to
// be exported as a span, then handed on; next itself when e is nil (export
// off).
func (e *Exporter) Recorder(next Recorder) Recorder {
	if e == nil {
		return next
	}
	return &spanRecorder{e: e, next: next}
}

// Shutdown builds and exports the spans queued and stops the exporter and
// its goroutines, within ctx; records taken after it began are dropped
// (and counted). Nil-safe.
func (e *Exporter) Shutdown(ctx context.Context) error {
	if e == nil {
		return nil
	}
	// The spans not built by the deadline are counted as dropped; the
	// provider is shut down either way, so that no goroutine outlives
	// Shutdown.
	built := e.records.close(ctx)
	if err := e.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("telemetry: shutdown: %w", err)
	}
	if built != nil {
		return fmt.Errorf("telemetry: shutdown: spans not built: %w", built)
	}
	return nil
}

// spanRecorder queues each record to become a span, then hands it on.
type spanRecorder struct {
	e    *Exporter
	next Recorder
}

func (r *spanRecorder) Record(rec accounting.Record) {
	r.e.records.push(&rec)
	r.next.Record(rec)
}
