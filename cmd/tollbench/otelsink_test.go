package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-dev/tollgate/config"
)

// The sink counts the spans of each export it can decode, across
// resources and scopes, and reports the exports it refused.
func TestOtelSinkCounts(t *testing.T) {
	s, err := startOtelSink()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.stop(); err != nil {
			t.Error(err)
		}
	}()
	req := &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
		{ScopeSpans: []*tracepb.ScopeSpans{{Spans: make([]*tracepb.Span, 2)}, {Spans: make([]*tracepb.Span, 1)}}},
		{ScopeSpans: []*tracepb.ScopeSpans{{Spans: make([]*tracepb.Span, 4)}}},
	}}
	for i := range req.ResourceSpans {
		for _, ss := range req.ResourceSpans[i].ScopeSpans {
			for j := range ss.Spans {
				ss.Spans[j] = &tracepb.Span{Name: "chat demo", TraceId: bytes.Repeat([]byte{1}, 16), SpanId: bytes.Repeat([]byte{2}, 8)}
			}
		}
	}
	body, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	post := func(path, contentType string, body []byte) int {
		t.Helper()
		resp, err := http.Post(s.endpoint()+path, contentType, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for range 2 {
		if code := post("/v1/traces", "application/x-protobuf", body); code != http.StatusOK {
			t.Fatalf("export answered %d", code)
		}
	}
	if spans, exports, err := s.take(); spans != 14 || exports != 2 || err != nil {
		t.Fatalf("take = %d spans, %d exports, %v; want 14, 2, nil", spans, exports, err)
	}
	if code := post("/v1/traces", "application/json", []byte(`{}`)); code != http.StatusUnsupportedMediaType {
		t.Errorf("JSON export answered %d", code)
	}
	if code := post("/v1/traces", "application/x-protobuf", []byte{0xff}); code != http.StatusBadRequest {
		t.Errorf("undecodable export answered %d", code)
	}
	if spans, exports, err := s.take(); spans != 0 || exports != 0 || err == nil || !strings.Contains(err.Error(), "2 exports refused") {
		t.Errorf("take = %d spans, %d exports, %v; want 0, 0 and 2 refused", spans, exports, err)
	}
}

// With -otel, both generated gateway configs export to the sink, and
// without it neither configures export.
func TestConfigsExportToSink(t *testing.T) {
	const endpoint = "http://127.0.0.1:9"
	bench := gatewayConfig{key: "sk-tollbench-x", logLevel: "info", store: "/tmp/d/t.db", fast: "127.0.0.1:1", stream: "127.0.0.1:2", slow: "127.0.0.1:3"}
	for _, tc := range []struct {
		name string
		yaml func(otel string) string
	}{
		{"bench", func(otel string) string { c := bench; c.otel = otel; return c.yaml() }},
		{"instructions", func(otel string) string {
			m := &instrMeter{dir: "/tmp/d", upstream: "127.0.0.1:1", key: "sk-tollbench-x", otel: otel}
			return m.gatewayYAML("g")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, otel := range []string{"", endpoint} {
				y := tc.yaml(otel)
				cfg, err := config.Parse([]byte(y), "bench.yaml")
				if err != nil {
					t.Fatalf("%v\n%s", err, y)
				}
				if cfg.Telemetry.Endpoint != otel {
					t.Errorf("telemetry.endpoint = %q, want %q\n%s", cfg.Telemetry.Endpoint, otel, y)
				}
			}
		})
	}
}
