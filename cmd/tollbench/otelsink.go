package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otelSink is the OTLP/HTTP collector of -otel: it answers the gateway's
// exports as a collector does, decodes each with the official protos and
// counts its spans, so that a run can show its spans were all exported.
type otelSink struct {
	ln     net.Listener
	srv    *http.Server
	served chan error

	spans, exports, refused atomic.Int64
}

// startOtelSink listens on a free loopback port and serves until stop.
func startOtelSink() (*otelSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("otel sink: %w", err)
	}
	s := &otelSink{ln: ln, served: make(chan error, 1)}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.handle), ReadHeaderTimeout: 10 * time.Second}
	go func() { s.served <- s.srv.Serve(ln) }()
	return s, nil
}

// endpoint is the base URL the gateway's telemetry.endpoint names.
func (s *otelSink) endpoint() string { return "http://" + s.ln.Addr().String() }

// maxExport bounds an export's body.
const maxExport = 64 << 20

// handle takes one export: POST /v1/traces, protobuf, not compressed, as
// the gateway sends them by default.
func (s *otelSink) handle(w http.ResponseWriter, r *http.Request) {
	var req coltracepb.ExportTraceServiceRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxExport))
	switch {
	case r.URL.Path != "/v1/traces" || r.Method != http.MethodPost:
		w.WriteHeader(http.StatusNotFound)
	case r.Header.Get("Content-Type") != "application/x-protobuf" || r.Header.Get("Content-Encoding") != "":
		w.WriteHeader(http.StatusUnsupportedMediaType)
	case err != nil || proto.Unmarshal(body, &req) != nil:
		w.WriteHeader(http.StatusBadRequest)
	default:
		n := 0
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				n += len(ss.GetSpans())
			}
		}
		s.spans.Add(int64(n))
		s.exports.Add(1)
		w.Header().Set("Content-Type", "application/x-protobuf")
		return
	}
	s.refused.Add(1)
}

// take returns the spans and exports received since the last take, and
// an error if any export was refused.
func (s *otelSink) take() (spans, exports int64, err error) {
	spans, exports = s.spans.Swap(0), s.exports.Swap(0)
	if n := s.refused.Swap(0); n > 0 {
		err = fmt.Errorf("otel sink: %d exports refused (not protobuf to /v1/traces)", n)
	}
	return spans, exports, err
}

// stop closes the listener and the connections once idle, and waits for
// the server to return.
func (s *otelSink) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// telemetryYAML is the gateway config's telemetry section for a sink at
// endpoint, with the default batching; empty for none.
func telemetryYAML(endpoint string) string {
	if endpoint == "" {
		return ""
	}
	return fmt.Sprintf("telemetry: {endpoint: %q}\n", endpoint)
}
