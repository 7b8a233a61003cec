package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/bare"
	"github.com/tollgate-dev/tollgate/internal/servetest"
	"github.com/tollgate-dev/tollgate/proxy"
)

// discardRecorder takes records and drops them: the benchmark measures the
// request path, and the real recorder's cost (an enqueue) has its own
// benchmark in accounting.
type discardRecorder struct{}

func (discardRecorder) Record(accounting.Record) {}

// benchGateway serves the proxy on an in-memory listener in front of an
// in-process simulated backend, and returns a client dialing it.
func benchGateway(b *testing.B) *fasthttp.HostClient {
	b.Helper()
	ln := fasthttputil.NewInmemoryListener()
	serveBench(b, ln, "sk-bench-key-0001", "simulated: {tokens: 16}")
	return &fasthttp.HostClient{Addr: "gateway", Dial: func(string) (net.Conn, error) { return ln.Dial() }}
}

// serveBench serves the proxy on ln until the benchmark ends, with the
// API key key and the model demo on one backend, sim, whose YAML keys
// (simulated, or url) are backend.
func serveBench(b *testing.B, ln net.Listener, key, backend string) {
	b.Helper()
	cfg, err := config.Parse(fmt.Appendf(nil, `
auth:
  keys:
    - {name: bench, key: %q, teams: ["*"], default_team: bench}
backends:
  - name: sim
    %s
models:
  - name: demo
    backends: [sim]
`, key, backend), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	reg, err := backends.NewRegistry(cfg)
	if err != nil {
		b.Fatal(err)
	}
	keys, err := auth.NewKeyring(cfg.Auth)
	if err != nil {
		b.Fatal(err)
	}
	gw, err := proxy.New(proxy.Options{Config: cfg, Registry: reg, Keys: keys, Recorder: discardRecorder{},
		Limiter: accounting.NewLimiter(nil, time.Now)})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ln, proxy.OwnRouter(gw, nil)) }()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			b.Error(err)
		}
		<-done
		if err := reg.Close(); err != nil {
			b.Error(err)
		}
	})
}

// benchBody is a typical small chat completion: a system prompt and a
// question, about half a kilobyte.
var benchBody = []byte(`{"model":"demo","messages":[{"role":"system","content":"You are a careful assistant. Answer in one short paragraph, cite nothing, and prefer plain words over jargon."},{"role":"user","content":"Explain in two sentences why a gateway in front of inference servers should count tokens for streamed replies, and what goes wrong when it does not."}],"max_tokens":16,"temperature":0.2`)

// BenchmarkHandlerNonStream measures one non-streamed chat completion
// through the whole handler: auth, attribution, validation, routing,
// limits, the upstream round trip to the in-process simulator, usage
// extraction and the reply. Allocations per op include the client's and
// the simulator's.
func BenchmarkHandlerNonStream(b *testing.B) {
	benchHandler(b, append(append([]byte(nil), benchBody...), '}'))
}

// BenchmarkHandlerStream is the same for a 16-token stream: 19 events
// passed through, the usage chunk removed.
func BenchmarkHandlerStream(b *testing.B) {
	benchHandler(b, append(append([]byte(nil), benchBody...), `,"stream":true}`...))
}

func benchHandler(b *testing.B, body []byte) {
	runHandlerBench(b, benchGateway(b), body)
}

// runHandlerBench sends body as a chat completion through client, a
// connection to a gateway serving model demo, b.N times.
func runHandlerBench(b *testing.B, client *fasthttp.HostClient, body []byte) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://gateway/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("Authorization", "Bearer sk-bench-key-0001")
	req.SetBody(body)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := client.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode() != 200 || !bytes.Contains(resp.Body(), []byte("tok15")) {
			b.Fatalf("status %d: %s", resp.StatusCode(), resp.Body())
		}
	}
}

// BenchmarkHandlerNonStreamTCP is BenchmarkHandlerNonStream over loopback
// TCP, client to gateway and gateway to a simulator in the same process:
// connection deadlines then go through the runtime's network poller, as
// they do in production, where the in-memory pipes only reset a timer.
func BenchmarkHandlerNonStreamTCP(b *testing.B) {
	up := serveSimulatorTCP(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	serveBench(b, ln, "sk-bench-key-0001", fmt.Sprintf("url: \"http://%s/v1\"", up))
	runHandlerBench(b, tcpClient(ln.Addr().String()), append(append([]byte(nil), benchBody...), '}'))
}

// serveSimulatorTCP serves a simulated backend (16 tokens) on loopback TCP
// until the benchmark ends, and returns its address.
func serveSimulatorTCP(b *testing.B) string {
	b.Helper()
	srv := simulated.New(simulated.Options{Tokens: 16})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	b.Cleanup(func() {
		if err := srv.Shutdown(); err != nil {
			b.Error(err)
		}
		<-done
	})
	return ln.Addr().String()
}

// tcpClient is a client of addr over TCP. It dials with net.Dial, not
// fasthttp's default dialer, whose cache goroutine outlives the test.
func tcpClient(addr string) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: addr, Dial: func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }}
}

// BenchmarkBareProxyTCP is BenchmarkHandlerNonStreamTCP through the
// forwarder cmd/bareproxy runs (internal/bare) instead of the gateway:
// forward the request as it came and copy the reply back. The difference
// between the two is the gateway's own cost per request.
func BenchmarkBareProxyTCP(b *testing.B) {
	p := bare.New(serveSimulatorTCP(b), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	// The proxy shuts down and closes its idle upstream connections
	// before the simulator shuts down.
	servetest.Start(b, func(ctx context.Context) error { return p.Serve(ctx, ln) })
	runHandlerBench(b, tcpClient(ln.Addr().String()), append(append([]byte(nil), benchBody...), '}'))
}
