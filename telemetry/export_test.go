package telemetry_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/route"
	"github.com/tollgate-dev/tollgate/proxy"
	"github.com/tollgate-dev/tollgate/telemetry"
)

const testKey = "sk-test-key-acme"

// receiver is an in-process OTLP/HTTP collector: it decodes every
// ExportTraceServiceRequest posted to /v1/traces with the official protos.
type receiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
	res   []*commonpb.KeyValue
	paths []string
	got   chan struct{}
}

func newReceiver(t *testing.T) *receiver {
	// Batches go out every 20 ms rather than every 5 s (the exporter reads OTEL_BSP_SCHEDULE_DELAY as the SDK does).
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	r := &receiver{got: make(chan struct{}, 1024)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		var ex collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &ex); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.paths = append(r.paths, req.URL.Path+" "+req.Header.Get("X-Collector-Key"))
		for _, rs := range ex.ResourceSpans {
			r.res = rs.Resource.GetAttributes()
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		r.got <- struct{}{}
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// span waits for the span whose tollgate.call_id is callID.
func (r *receiver) span(t *testing.T, callID string) *tracepb.Span {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		for _, s := range r.spans {
			if attrs(s.Attributes)["tollgate.call_id"] == callID {
				r.mu.Unlock()
				return s
			}
		}
		r.mu.Unlock()
		select {
		case <-r.got:
		case <-deadline:
			t.Fatalf("no span of call %s exported within 10s", callID)
		}
	}
}

// attrs renders attribute values as text, for comparison.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = fmt.Sprint(v.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.Key] = fmt.Sprint(v.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.Key] = "float"
		case *commonpb.AnyValue_ArrayValue:
			var parts []string
			for _, e := range v.ArrayValue.Values {
				parts = append(parts, e.GetStringValue())
			}
			m[kv.Key] = "[" + strings.Join(parts, ",") + "]"
		}
	}
	return m
}

// memRecorder keeps the records, so a test can see they still reach the
// usage recorder.
type memRecorder struct {
	mu   sync.Mutex
	recs []accounting.Record
}

func (m *memRecorder) Record(rec accounting.Record) {
	m.mu.Lock()
	m.recs = append(m.recs, rec)
	m.mu.Unlock()
}

// byCall waits for the record of call callID: the span is exported before
// the record is handed on.
func (m *memRecorder) byCall(t *testing.T, callID string) accounting.Record {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		m.mu.Lock()
		for _, r := range m.recs {
			if r.CallID == callID {
				m.mu.Unlock()
				return r
			}
		}
		m.mu.Unlock()
	}
	t.Fatalf("no record of call %s", callID)
	return accounting.Record{}
}

func (m *memRecorder) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.recs)
}

// gateway is a proxy on a real listener in front of two simulated
// backends: "good", and "bad", which answers every request 503. Model
// demo is served by good; flaky by bad, falling back to demo.
type gateway struct {
	base      string
	good, bad *simulated.Server
	goodAddr  string
	recs      *memRecorder
	client    *http.Client
}

func startBackend(t *testing.T, opts simulated.Options) (*simulated.Server, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := simulated.New(opts)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return srv, ln.Addr().String()
}

// newGateway starts the gateway with the exporter tel builds (nil: export
// off).
func newGateway(t *testing.T, tel config.Telemetry, reg prometheus.Registerer) (*gateway, *telemetry.Exporter) {
	t.Helper()
	g := &gateway{recs: &memRecorder{}, client: &http.Client{Timeout: 30 * time.Second}}
	var badAddr string
	g.good, g.goodAddr = startBackend(t, simulated.Options{})
	g.bad, badAddr = startBackend(t, simulated.Options{FailStatus: 503})
	yaml := fmt.Sprintf(`listen: "127.0.0.1:0"
auth:
  keys:
    - name: acme-key
      key: %q
      teams: [acme]
      default_team: acme
backends:
  - name: good
    url: "http://%s/v1"
  - name: bad
    url: "http://%s/v1"
models:
  - name: demo
    backends: [good]
  - name: flaky
    backends: [bad]
    fallbacks: [demo]
retries:
  backoff: 1ms
`, testKey, g.goodAddr, badAddr)
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Telemetry = tel
	exp, err := telemetry.New(cfg.Telemetry, cfg.Backends, reg)
	if err != nil {
		t.Fatal(err)
	}
	reg2, err := backends.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.NewKeyring(cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := proxy.New(proxy.Options{Config: cfg, Registry: reg2, Keys: keys,
		Recorder: exp.Recorder(g.recs), Limiter: accounting.NewLimiter(nil, time.Now)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	router, err := route.New(gw.Routes(), proxy.NotFound, proxy.MethodNotAllowed)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ln, router.Serve) }()
	g.base = "http://" + ln.Addr().String()
	t.Cleanup(func() {
		g.client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
		<-done
		if err := exp.Shutdown(ctx); err != nil {
			t.Errorf("exporter shutdown: %v", err)
		}
		_ = reg2.Close()
	})
	return g, exp
}

// chat sends a chat completion and returns the reply's status, its body
// and the call id the gateway named.
func (g *gateway) chat(t *testing.T, model string, stream bool, header map[string]string) (int, string, string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
	req, _ := http.NewRequest(http.MethodPost, g.base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Compat-Project", "acme/search")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Compat-Call-Id")
}

// upstreamTraceparent is the traceparent the good backend last received.
func (g *gateway) upstreamTraceparent(t *testing.T) string {
	t.Helper()
	_, h := g.good.LastRequest()
	return h["Traceparent"]
}

// spanIDOfCall is the span id the gateway gives a call: its id's last 16
// hex digits.
func spanIDOfCall(callID string) string { return strings.ReplaceAll(callID, "-", "")[16:] }

const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

func TestSpansExported(t *testing.T) {
	recv := newReceiver(t)
	g, _ := newGateway(t, config.Telemetry{Endpoint: recv.srv.URL, ServiceName: "gw-test",
		Headers: map[string]string{"X-Collector-Key": "k1"}}, prometheus.NewRegistry())
	goodHost, goodPort, _ := net.SplitHostPort(g.goodAddr)

	common := map[string]string{
		"gen_ai.provider.name": "openai", "gen_ai.request.model": "demo",
		"tollgate.team": "acme", "tollgate.project": "search", "tollgate.key_name": "acme-key",
		"server.address": goodHost, "server.port": goodPort, "tollgate.backend": "good",
	}
	tests := []struct {
		name   string
		model  string
		stream bool
		header map[string]string
		// parent is the client's span the gateway's must be a child of; ""
		// for a root span.
		parent string
		want   map[string]string
		// absent are attributes the span must not have.
		absent  []string
		failed  bool
		retries int
	}{
		{name: "plain", model: "demo", header: map[string]string{"Traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"},
			parent: clientSpan, want: map[string]string{"gen_ai.operation.name": "chat", "openai.api.type": "chat_completions",
				"gen_ai.response.model": "demo", "gen_ai.usage.input_tokens": "*", "gen_ai.usage.output_tokens": "5",
				"gen_ai.response.finish_reasons": "[length]"},
			absent: []string{"error.type", "tollgate.retries", "tollgate.stream"}},
		{name: "streamed", model: "demo", stream: true,
			want: map[string]string{"gen_ai.operation.name": "chat", "gen_ai.response.model": "demo",
				"gen_ai.usage.output_tokens": "5", "gen_ai.response.finish_reasons": "[length]",
				"tollgate.stream": "true"},
			absent: []string{"error.type", "tollgate.retries"}},
		{name: "failed", model: "demo", header: map[string]string{"X-Mock-Status": "500"},
			want: map[string]string{"error.type": "502"},
			absent: []string{"gen_ai.response.model", "gen_ai.response.id", "gen_ai.usage.input_tokens",
				"gen_ai.response.finish_reasons", "tollgate.retries", "tollgate.stream"}, failed: true},
		{name: "retried", model: "flaky", header: map[string]string{"Traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"},
			parent: clientSpan, want: map[string]string{"gen_ai.request.model": "flaky", "gen_ai.response.model": "demo",
				"gen_ai.usage.output_tokens": "5", "gen_ai.response.finish_reasons": "[length]", "tollgate.retries": "1"},
			absent: []string{"error.type"}, retries: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body, callID := g.chat(t, tt.model, tt.stream, tt.header)
			if (status == 200) == tt.failed {
				t.Fatalf("status %d: %s", status, body)
			}
			s := recv.span(t, callID)
			rec := g.recs.byCall(t, callID)
			got := attrs(s.Attributes)
			want := map[string]string{}
			for k, v := range common {
				want[k] = v
			}
			for k, v := range tt.want {
				want[k] = v
			}
			if rec.CompletionID != "" {
				want["gen_ai.response.id"] = rec.CompletionID
			}
			for k, v := range want {
				if v == "*" && got[k] != "" && got[k] != "0" {
					continue
				}
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
			for _, k := range tt.absent {
				if _, ok := got[k]; ok {
					t.Errorf("%s = %q, want none", k, got[k])
				}
			}
			if wantName := "chat " + tt.model; s.Name != wantName || s.Kind != tracepb.Span_SPAN_KIND_CLIENT {
				t.Errorf("span %q of kind %v, want %q CLIENT", s.Name, s.Kind, wantName)
			}
			if tt.failed != (s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR) || tt.failed && s.Status.GetMessage() != rec.Error {
				t.Errorf("status %v %q, want error %v with the record's error %q", s.Status.GetCode(), s.Status.GetMessage(), tt.failed, rec.Error)
			}
			if s.StartTimeUnixNano != uint64(rec.Started.UnixNano()) || s.EndTimeUnixNano != uint64(rec.Ended.UnixNano()) {
				t.Errorf("span from %d to %d, record from %v to %v", s.StartTimeUnixNano, s.EndTimeUnixNano, rec.Started, rec.Ended)
			}

			// The trace: the client's continued, or the call's own.
			spanID, traceID := hex.EncodeToString(s.SpanId), hex.EncodeToString(s.TraceId)
			if spanID != spanIDOfCall(callID) {
				t.Errorf("span id %s, want the call id's tail %s", spanID, spanIDOfCall(callID))
			}
			wantTrace := strings.ReplaceAll(callID, "-", "")
			if tt.parent != "" {
				wantTrace = clientTrace
			}
			if traceID != wantTrace || hex.EncodeToString(s.ParentSpanId) != tt.parent {
				t.Errorf("trace %s parent %q, want trace %s parent %q", traceID, hex.EncodeToString(s.ParentSpanId), wantTrace, tt.parent)
			}
			// The backend was given the gateway's span as its parent.
			if tp, want := g.upstreamTraceparent(t), "00-"+traceID+"-"+spanID+"-01"; tp != want {
				t.Errorf("backend received traceparent %q, want %q", tp, want)
			}

			var events []string
			for _, ev := range s.Events {
				a := attrs(ev.Attributes)
				events = append(events, ev.Name+" "+a["tollgate.backend"]+" "+a["tollgate.model"]+" "+a["error.type"])
				if ev.TimeUnixNano < s.StartTimeUnixNano || ev.TimeUnixNano > s.EndTimeUnixNano {
					t.Errorf("event at %d outside the span", ev.TimeUnixNano)
				}
			}
			var wantEvents []string
			for range tt.retries {
				wantEvents = append(wantEvents, "tollgate.attempt_failed bad flaky 503")
			}
			if strings.Join(events, "|") != strings.Join(wantEvents, "|") {
				t.Errorf("events %q, want %q", events, wantEvents)
			}
		})
	}

	recv.mu.Lock()
	defer recv.mu.Unlock()
	if res := attrs(recv.res); res["service.name"] != "gw-test" {
		t.Errorf("service.name %q, want gw-test", res["service.name"])
	}
	for _, p := range recv.paths {
		if p != "/v1/traces k1" {
			t.Errorf("export to %q, want /v1/traces with the configured header", p)
		}
	}
}

// TestUpstreamTraceparentWithExportOff checks that the backend is named
// the gateway's span as its parent whether or not spans are exported, and
// whether or not the client sent a traceparent (which is replaced, not
// forwarded).
func TestUpstreamTraceparentWithExportOff(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(k, "")
	}
	g, exp := newGateway(t, config.Telemetry{}, nil)
	if exp != nil {
		t.Fatal("an exporter was built with nothing configured")
	}
	for _, tt := range []struct{ name, traceparent, wantTrace, wantFlags string }{
		{"no client traceparent", "", "", "01"},
		{"client traceparent", "00-" + clientTrace + "-" + clientSpan + "-01", clientTrace, "01"},
		{"client traceparent not sampled", "00-" + clientTrace + "-" + clientSpan + "-00", clientTrace, "00"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.traceparent != "" {
				h["Traceparent"] = tt.traceparent
			}
			status, body, callID := g.chat(t, "demo", false, h)
			if status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
			wantTrace := tt.wantTrace
			if wantTrace == "" {
				wantTrace = strings.ReplaceAll(callID, "-", "")
			}
			if tp, want := g.upstreamTraceparent(t), "00-"+wantTrace+"-"+spanIDOfCall(callID)+"-"+tt.wantFlags; tp != want {
				t.Errorf("backend received traceparent %q, want %q", tp, want)
			}
		})
	}
}

// TestOffWhenUnconfigured checks that nothing is built, and the usage
// recorder is handed on as it is, when neither the file nor the
// environment names an endpoint, or the environment turns the SDK off.
func TestOffWhenUnconfigured(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  map[string]string
		cfg  config.Telemetry
	}{
		{name: "nothing set"},
		{name: "sdk disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}},
		{name: "exporter none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, cfg: config.Telemetry{Endpoint: "http://127.0.0.1:1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"} {
				t.Setenv(k, tt.env[k])
			}
			reg := prometheus.NewRegistry()
			exp, err := telemetry.New(tt.cfg, nil, reg)
			if err != nil || exp != nil {
				t.Fatalf("New = %v, %v; want nil, nil", exp, err)
			}
			next := &memRecorder{}
			if r := exp.Recorder(next); r != telemetry.Recorder(next) {
				t.Errorf("Recorder wrapped the usage recorder with export off")
			}
			if n, _ := testutil.GatherAndCount(reg); n != 0 {
				t.Errorf("%d series registered with export off", n)
			}
		})
	}
}

// TestEnvironmentConfigures checks that the standard variables alone turn
// export on: OTEL_EXPORTER_OTLP_ENDPOINT (with /v1/traces appended),
// OTEL_EXPORTER_OTLP_HEADERS and OTEL_SERVICE_NAME.
func TestEnvironmentConfigures(t *testing.T) {
	recv := newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "X-Collector-Key=env-key")
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	g, _ := newGateway(t, config.Telemetry{}, nil)
	status, body, callID := g.chat(t, "demo", false, nil)
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	if s := recv.span(t, callID); s.Name != "chat demo" {
		t.Errorf("span %q", s.Name)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if res := attrs(recv.res); res["service.name"] != "from-env" {
		t.Errorf("service.name %q, want from-env", res["service.name"])
	}
	if len(recv.paths) == 0 || recv.paths[0] != "/v1/traces env-key" {
		t.Errorf("exports %q, want /v1/traces with the header of OTEL_EXPORTER_OTLP_HEADERS", recv.paths)
	}
}

// TestDropsWhenExporterStuck checks that a collector that does not answer
// makes spans be dropped and counted, never recording wait.
func TestDropsWhenExporterStuck(t *testing.T) {
	release := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer stuck.Close()
	defer close(release)
	reg := prometheus.NewRegistry()
	const queue, spans = 4, 40
	exp, err := telemetry.New(config.Telemetry{Endpoint: stuck.URL, MaxQueueSize: queue}, nil, reg)
	if err != nil || exp == nil {
		t.Fatalf("New = %v, %v", exp, err)
	}
	next := &memRecorder{}
	rec := exp.Recorder(next)
	start := time.Now()
	for i := range spans {
		now := time.Now()
		var sp accounting.SpanContext
		sp.TraceID[0], sp.SpanID[0], sp.SpanID[1] = 1, 1, byte(i)
		rec.Record(accounting.Record{CallID: fmt.Sprint(i), Model: "demo", Status: 200, Span: sp, Started: now, Ended: now})
		if i == queue-1 {
			// Let the first batch reach the stuck collector.
			time.Sleep(200 * time.Millisecond)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("recording %d spans took %v with the collector stuck", spans, took)
	}
	if next.len() != spans {
		t.Errorf("%d records reached the usage recorder, want %d", next.len(), spans)
	}
	// At most a batch in export and a full queue are kept, once the
	// records still in the ring have been built.
	var n float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if n = dropped(t, reg, "queue_full"); n >= spans-2*queue {
			break
		}
	}
	if n < spans-2*queue || n > spans-queue {
		t.Errorf("dropped %v spans, want from %d to %d", n, spans-2*queue, spans-queue)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = exp.Shutdown(ctx)
}

// TestShutdownExportsQueued checks that the records taken before Shutdown
// are all built and exported by it, that one taken after it is counted,
// and that no goroutine outlives it (the span builder's, the OTLP
// client's connections).
func TestShutdownExportsQueued(t *testing.T) {
	// Registered first, so run last: after the receiver is closed.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	recv := newReceiver(t)
	exp, reg := newUnbatchedExporter(t, recv.srv.URL)
	rec := exp.Recorder(&memRecorder{})
	const spans = 50
	recordSpans(rec, spans)
	if err := exp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec.Record(accounting.Record{CallID: "late", Model: "demo", Status: 200})
	recv.mu.Lock()
	var got []string
	for _, s := range recv.spans {
		got = append(got, attrs(s.Attributes)["tollgate.call_id"])
	}
	recv.mu.Unlock()
	if len(got) != spans || got[0] != "0" || got[spans-1] != fmt.Sprint(spans-1) {
		t.Errorf("exported by Shutdown: %d spans %v, want the %d recorded, in order", len(got), got, spans)
	}
	if n := dropped(t, reg, "shutdown"); n != 1 {
		t.Errorf("dropped at shutdown: %v, want the record taken after it", n)
	}
}

// dropped is tollgate_otel_spans_dropped_total{reason} as reg gathers it.
func dropped(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_otel_spans_dropped_total" {
			continue
		}
		for _, m := range mf.Metric {
			if len(m.Label) == 1 && m.Label[0].GetValue() == reason {
				return m.Counter.GetValue()
			}
		}
	}
	t.Fatalf("no tollgate_otel_spans_dropped_total{reason=%q}", reason)
	return 0
}

// TestExportFailedCounted checks that the spans of an export the collector
// refuses are counted as export_failed, and that Shutdown still returns.
func TestExportFailedCounted(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, "no", http.StatusBadRequest)
	}))
	defer refusing.Close()
	exp, reg := newUnbatchedExporter(t, refusing.URL)
	rec := exp.Recorder(&memRecorder{})
	const spans = 7
	recordSpans(rec, spans)
	if err := exp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := dropped(t, reg, "export_failed"); n != spans {
		t.Errorf("export_failed %v, want the %d spans of the refused export", n, spans)
	}
}

// newUnbatchedExporter is an exporter to endpoint whose spans leave only
// when Shutdown flushes them, with its metrics on the registry returned.
func newUnbatchedExporter(t *testing.T, endpoint string) (*telemetry.Exporter, *prometheus.Registry) {
	t.Helper()
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
	reg := prometheus.NewRegistry()
	exp, err := telemetry.New(config.Telemetry{Endpoint: endpoint}, nil, reg)
	if err != nil || exp == nil {
		t.Fatalf("New = %v, %v", exp, err)
	}
	return exp, reg
}

// recordSpans records n successful requests, each with a span of its own.
func recordSpans(rec telemetry.Recorder, n int) {
	for i := range n {
		now := time.Now()
		var sp accounting.SpanContext
		sp.TraceID[0], sp.SpanID[0], sp.SpanID[1] = 1, 1, byte(i)
		rec.Record(accounting.Record{CallID: fmt.Sprint(i), Model: "demo", Status: 200, Span: sp, Started: now, Ended: now})
	}
}
