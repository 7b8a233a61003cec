// Package telemetry exports an OpenTelemetry span, in the GenAI semantic
// conventions, for every request the gateway routes by model.
//
// The span is built from the request's usage record once the request is
// over (Exporter.Recorder wraps the usage recorder), with the record's
// start and end as its timestamps, so the request path holds no span while
// it runs. Nor does it build one: the record is copied into a ring of
// preallocated slots, and one goroutine makes the spans and exports them
// in batches. The span is built as OTLP protos straight from the record,
// into a batch of messages reused from export to export, and handed to
// the official OTLP/HTTP client; the SDK's span, batch processor and
// transform, which cost several times as much, are not used. The ring is
// bounded; past its bound a span is dropped (and counted) rather than
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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
)

// The SDK batch span processor's defaults, which tollgate keeps.
const (
	defaultQueueSize     = 2048
	defaultBatchSize     = 512
	defaultScheduleDelay = 5000 * time.Millisecond
	defaultExportTimeout = 30000 * time.Millisecond
)

// Recorder takes the usage record of every request routed by model (the
// proxy's Recorder).
type Recorder interface {
	Record(accounting.Record)
}

// Exporter makes a span of every record it is handed and exports it. A nil
// *Exporter is export turned off.
type Exporter struct {
	client otlptrace.Client
	// servers maps a backend's name to its server.address and
	// server.port; a reload replaces it (see SetBackends).
	servers atomic.Pointer[map[string]server]
	// records carries the records to the goroutine that builds and
	// exports their spans, which New starts and Shutdown stops; tick
	// makes it export what is queued every OTEL_BSP_SCHEDULE_DELAY.
	records *recordRing
	tick    *time.Ticker
}

// server is a backend's address as the span names it: its host, valid
// UTF-8, and its port.
type server struct {
	address string
	port    int64
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
	batch, err := batchingOf(cfg)
	if err != nil {
		return nil, err
	}
	sampler, err := newSampler(cfg)
	if err != nil {
		return nil, err
	}
	res, err := newResource(cfg)
	if err != nil {
		return nil, err
	}
	// The client makes no connection until the first upload.
	client := otlptracehttp.NewClient(exporterOptions(cfg)...)
	if err := client.Start(context.Background()); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	dropped := newDropCounter(reg)
	shutdown := dropped.WithLabelValues("shutdown")
	// The consumer is woken when a batch's worth is queued, and by the
	// tick.
	e := &Exporter{client: client,
		records: newRecordRing(batch.queue, batch.size, dropped.WithLabelValues("queue_full"), shutdown)}
	e.SetBackends(backends)
	spans := newSpanBuilder(sampler, res.Attributes(), res.SchemaURL(), e.serverMap)
	x := newBatcher(e.records.ctx, spans, client, batch, dropped.WithLabelValues("export_failed"), shutdown)
	e.tick = time.NewTicker(batch.delay)
	go e.records.run(x.build, e.tick.C, x.flush)
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
func exporterOptions(cfg config.Telemetry) []otlptracehttp.Option {
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
	return opts
}

// batchingOf reads the batching as the SDK's batch span processor does:
// OTEL_BSP_MAX_QUEUE_SIZE (telemetry.max_queue_size wins over it),
// OTEL_BSP_MAX_EXPORT_BATCH_SIZE (no more than the queue),
// OTEL_BSP_SCHEDULE_DELAY and OTEL_BSP_EXPORT_TIMEOUT (milliseconds; a
// delay of 0 is taken as 1, a timeout of 0 as none), each with the SDK's
// default.
func batchingOf(cfg config.Telemetry) (batching, error) {
	b := batching{queue: cfg.MaxQueueSize}
	var err error
	if b.queue <= 0 {
		if b.queue, err = envInt("OTEL_BSP_MAX_QUEUE_SIZE", defaultQueueSize, 1); err != nil {
			return batching{}, err
		}
	}
	if b.size, err = envInt("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", defaultBatchSize, 1); err != nil {
		return batching{}, err
	}
	if b.size > b.queue {
		b.size = min(defaultBatchSize, b.queue)
	}
	ms, err := envInt("OTEL_BSP_SCHEDULE_DELAY", int(defaultScheduleDelay/time.Millisecond), 0)
	if err != nil {
		return batching{}, err
	}
	b.delay = time.Duration(max(ms, 1)) * time.Millisecond
	if ms, err = envInt("OTEL_BSP_EXPORT_TIMEOUT", int(defaultExportTimeout/time.Millisecond), 0); err != nil {
		return batching{}, err
	}
	b.timeout = time.Duration(ms) * time.Millisecond
	return b, nil
}

// envInt is the integer the environment variable name holds, def when it
// is unset; an error when it is not an integer of at least least.
func envInt(name string, def, least int) (int, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		return 0, fmt.Errorf("telemetry: %s: want an integer of at least %d, got %q", name, least, v)
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

// newSampler is the sampler the file names, else OTEL_TRACES_SAMPLER,
// else parentbased_always_on, with the ratio the file gives, else
// OTEL_TRACES_SAMPLER_ARG, else 1; the names and meanings are the SDK's.
func newSampler(cfg config.Telemetry) (sdktrace.Sampler, error) {
	name, arg := cfg.Sampler, cfg.SamplerArg
	if name == "" {
		name = strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	}
	if name == "" {
		name = "parentbased_always_on"
	}
	if arg == "" {
		arg = strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	}
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(f >= 0 && f <= 1) {
			return 0, fmt.Errorf("telemetry: sampler argument: want a ratio from 0 to 1, got %q", arg)
		}
		return f, nil
	}
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		f, err := ratio()
		return sdktrace.TraceIDRatioBased(f), err
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		f, err := ratio()
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(f)), err
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

// serverMap is the backends' addresses SetBackends last gave.
func (e *Exporter) serverMap() map[string]server { return *e.servers.Load() }

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
	return server{address: validUTF8(u.Hostname()), port: int64(port)}
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
// its goroutine, within ctx; records taken after it began are dropped
// (and counted). Nil-safe.
func (e *Exporter) Shutdown(ctx context.Context) error {
	if e == nil {
		return nil
	}
	// The spans not exported by the deadline are counted as dropped; the
	// client is stopped either way.
	built := e.records.close(ctx)
	e.tick.Stop()
	if err := e.client.Stop(ctx); err != nil {
		return fmt.Errorf("telemetry: shutdown: %w", err)
	}
	if built != nil {
		return fmt.Errorf("telemetry: shutdown: spans not exported: %w", built)
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
