package bare

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind;
// fasthttp's own background goroutines are not ours and are ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.IgnoreFasthttp()...)
}

// TestForwards checks that a reply comes back as the upstream sent it and
// that a stream's events pass one by one: the client reads the first event
// while the upstream still holds the second.
func TestForwards(t *testing.T) {
	release := make(chan struct{})
	upstream := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/v1/echo":
			ctx.SetContentType("application/json")
			ctx.SetBody(append([]byte(`{"got":`), append(ctx.PostBody(), '}')...))
		case "/v1/stream":
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				w.WriteString("data: one\n\n")
				w.Flush()
				<-release
				w.WriteString("data: two\n\n")
				w.Flush()
			})
		}
	}}
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go upstream.Serve(uln) //nolint:errcheck // ends with Shutdown below
	defer upstream.Shutdown()

	p := New(uln.Addr().String(), nil)
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, pln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	client := &fasthttp.HostClient{Addr: pln.Addr().String()}
	defer client.CloseIdleConnections()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://" + pln.Addr().String() + "/v1/echo")
	req.Header.SetMethod("POST")
	req.SetBodyString(`[1,2,3]`)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := client.Do(req, resp); err != nil || string(resp.Body()) != `{"got":[1,2,3]}` {
		t.Fatalf("echo: %q %v", resp.Body(), err)
	}

	conn, err := net.Dial("tcp", pln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	conn.Write([]byte("GET /v1/stream HTTP/1.1\r\nHost: x\r\n\r\n"))
	r := bufio.NewReader(conn)
	var seen strings.Builder
	for !strings.Contains(seen.String(), "data: one") {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("before the first event: %v (read %q)", err, seen.String())
		}
		seen.WriteString(line)
	}
	if strings.Contains(seen.String(), "two") {
		t.Fatal("the second event arrived before the upstream sent it")
	}
	close(release)
	for !strings.Contains(seen.String(), "data: two") {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("before the second event: %v (read %q)", err, seen.String())
		}
		seen.WriteString(line)
	}
}
