package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/proxy"
)

// BenchmarkStreamFirstEvent measures a short stream through the gateway
// on a kept-alive connection, as a client sees it: ttft-p50-ns is the
// median time from the request's write to its first event, headers-p50-ns
// to the response's status line, and ns/op the whole stream. The backend is the in-process simulator, or the one at
// TOLLGATE_STREAM_MEM_UPSTREAM (mockllm in another process), which keeps
// its CPU out of the gateway's.
func BenchmarkStreamFirstEvent(b *testing.B) {
	backend := "    simulated: {tokens: 4}"
	if up := os.Getenv("TOLLGATE_STREAM_MEM_UPSTREAM"); up != "" {
		backend = "    url: \"http://" + up + "/v1\""
	}
	addr := os.Getenv("TOLLGATE_STREAM_BENCH_ADDR") // another proxy to compare with (cmd/bareproxy)
	if addr == "" {
		addr = serveBenchGateway(b, backend)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	tokens := 4
	if n, err := strconv.Atoi(os.Getenv("TOLLGATE_STREAM_BENCH_TOKENS")); err == nil && n > 0 {
		tokens = n // a longer stream, to profile the path of every event
	}
	body := fmt.Sprintf(`{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":%d,"stream":true}`, tokens)
	req := []byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", testKey, len(body), body))
	br := bufio.NewReaderSize(c, 16<<10)
	firstEvent, done := []byte("data: "), []byte("data: [DONE]")
	ttfts := make([]time.Duration, 0, b.N)
	ttfbs := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		first := false
		for n := 0; ; n++ {
			line, err := br.ReadSlice('\n')
			if err != nil {
				b.Fatalf("read: %v", err)
			}
			if n == 0 {
				ttfbs = append(ttfbs, time.Since(start))
			}
			if !first && bytes.HasPrefix(line, firstEvent) {
				first = true
				ttfts = append(ttfts, time.Since(start))
			}
			if bytes.HasPrefix(line, done) {
				break
			}
		}
		// The event's blank line, its chunk's CRLF and the last chunk:
		// "\n\r\n0\r\n\r\n".
		for range 4 {
			if _, err := br.ReadSlice('\n'); err != nil {
				b.Fatalf("read end: %v", err)
			}
		}
	}
	slices.Sort(ttfts)
	slices.Sort(ttfbs)
	if len(ttfts) > 0 {
		b.ReportMetric(float64(ttfts[len(ttfts)/2].Nanoseconds()), "ttft-p50-ns")
		b.ReportMetric(float64(ttfbs[len(ttfbs)/2].Nanoseconds()), "headers-p50-ns")
	}
}

// serveBenchGateway serves the proxy on a loopback port, with the test key
// and the model demo on one backend, whose YAML keys (url or simulated)
// are backend; it returns the gateway's address.
func serveBenchGateway(b *testing.B, backend string) string {
	b.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
auth:
  keys:
    - {name: bench, key: %q, teams: ["*"], default_team: bench}
backends:
  - name: up
%s
models:
  - name: demo
    backends: [up]
`, testKey, backend)), "bench.yaml")
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ln) }()
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
	return ln.Addr().String()
}
