package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// BenchmarkStreamFirstEvent measures a short stream through the gateway
// on a kept-alive connection, as a client sees it: ttft-p50-ns is the
// median time from the request's write to its first event, headers-p50-ns
// to the response's status line, and ns/op the whole stream. The backend is the in-process simulator, or the one at
// TOLLGATE_STREAM_MEM_UPSTREAM (mockllm in another process), which keeps
// its CPU out of the gateway's.
func BenchmarkStreamFirstEvent(b *testing.B) {
	addr := os.Getenv("TOLLGATE_STREAM_BENCH_ADDR") // another proxy to compare with (cmd/bareproxy)
	if addr == "" {
		backend := "simulated: {tokens: 4}"
		if up := os.Getenv("TOLLGATE_STREAM_MEM_UPSTREAM"); up != "" {
			backend = "url: \"http://" + up + "/v1\""
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		serveBench(b, ln, testKey, backend)
		addr = ln.Addr().String()
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
