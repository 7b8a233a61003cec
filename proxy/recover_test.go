package proxy

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
)

// panicLimiter panics on Reserve, as a bug met by a request would, midway
// through a completion that holds a generation and a stream slot.
type panicLimiter struct{}

func (panicLimiter) Reserve(accounting.Subject, int64) (accounting.Reservation, error) {
	panic("limiter bug")
}

func (panicLimiter) Settle(accounting.Reservation, int64) {}

type records struct {
	mu   sync.Mutex
	recs []accounting.Record
}

func (r *records) Record(rec accounting.Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

// TestPanicSettlesTheCompletion makes a chat completion panic after it took
// its generation and a stream slot: the client gets a 500, and the
// completion is settled all the same (the slot and the generation are
// released, a 500 is recorded), so repeated panics cannot exhaust
// max_streams or hold a reload.
func TestPanicSettlesTheCompletion(t *testing.T) {
	cfg, err := config.Parse([]byte(`
auth: {keys: [{name: k, key: sk-panic-test-1}]}
server: {max_streams: 1}
backends: [{name: s, url: "http://127.0.0.1:9/v1"}]
models: [{name: m, backends: [s]}]
`), "panic.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reg, err := backends.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	keys, err := auth.NewKeyring(cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	rec := &records{}
	s, err := New(Options{Config: cfg, Registry: reg, Keys: keys, Recorder: rec, Limiter: panicLimiter{}, Log: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		var req fasthttp.Request
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI("/v1/chat/completions")
		req.Header.SetContentType("application/json")
		req.Header.Set(fasthttp.HeaderAuthorization, "Bearer sk-panic-test-1")
		req.SetBodyString(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{}, nil)
		s.guard(OwnRouter(s, nil))(&ctx)
		if ctx.Response.StatusCode() != fasthttp.StatusInternalServerError {
			t.Fatalf("request %d: status %d, want 500 (a stream slot leaked by an earlier panic answers 503)", i, ctx.Response.StatusCode())
		}
	}
	if n := s.streams.Load(); n != 0 {
		t.Errorf("%d stream slots still taken", n)
	}
	if n := s.state.Load().active.Load(); n != 0 {
		t.Errorf("the generation is still used by %d requests", n)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.recs) != 3 || rec.recs[0].Status != 500 || rec.recs[0].Error == "" {
		t.Errorf("records %+v, want three 500s with an error", rec.recs)
	}
}

// panicReader is an upstream body whose Read panics, as a bug met by
// hostile bytes would.
type panicReader struct{}

func (panicReader) Read([]byte) (int, error) { panic("hostile bytes") }

// TestStreamReadRecovers makes the stream body's upstream read panic: Read
// must answer an in-band error and [DONE], then EOF, count the panic, and
// not let it reach fasthttp's worker, which would end the process.
func TestStreamReadRecovers(t *testing.T) {
	s := &Server{metrics: newMetrics(nil), log: zap.NewNop()}
	sb := &streamBody{srv: s, backend: &backends.Backend{Name: "b"}}
	sb.c.rec.Started = time.Now()
	sb.scan.Reset(panicReader{}, 0)
	buf := make([]byte, 4096)
	n, err := sb.Read(buf)
	if err != nil || n == 0 {
		t.Fatalf("Read = %d, %v; want the in-band error", n, err)
	}
	got := string(buf[:n])
	if !strings.Contains(got, `"code":"internal_error"`) || !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Errorf("events after the panic: %q", got)
	}
	if n, err := sb.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("second Read = %d, %v; want EOF", n, err)
	}
	if c := testutil.ToFloat64(s.metrics.panics.WithLabelValues("stream")); c != 1 {
		t.Errorf("panics counted: %v, want 1", c)
	}
}
