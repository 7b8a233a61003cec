package bare

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/internal/leakcheck"
	"github.com/tollgate-dev/tollgate/internal/servetest"
)

// TestMain fails the package if a test leaves a goroutine behind;
// fasthttp's own background goroutines are not ours and are ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.IgnoreFasthttp()...)
}

// TestForwards checks, with streams left to fasthttp's worker and handed
// over, that a reply comes back as the upstream sent it, that a stream's
// events pass one by one (the client reads the first event while the
// upstream still holds the second) and its body ends well framed, that a
// request the client pipelined behind the stream's is answered after it
// and the connection then serves the next ones, and that Serve stops at
// once with the connection still open after a stream.
func TestForwards(t *testing.T) {
	for _, tt := range []struct {
		name     string
		handOver bool
	}{
		{"worker", false},
		{"handed over", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			uln := serveUpstream(t, release)
			p := New(uln, nil)
			if tt.handOver {
				p.HandOverStreams()
			}
			pln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			stop := servetest.Start(t, func(ctx context.Context) error { return p.Serve(ctx, pln) })

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
			const echo = "POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n"
			// The echo request is pipelined behind the stream's.
			conn.Write([]byte("GET /v1/stream HTTP/1.1\r\nHost: x\r\n\r\n" + echo + "[4]"))
			r := bufio.NewReader(conn)
			stream, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := stream.Header.Get("Content-Type"); got != "text/event-stream" {
				t.Errorf("stream content type %q", got)
			}
			first := make([]byte, len("data: one\n\n"))
			if _, err := io.ReadFull(stream.Body, first); err != nil || string(first) != "data: one\n\n" {
				t.Fatalf("first event %q: %v", first, err)
			}
			close(release)
			rest, err := io.ReadAll(stream.Body)
			if err != nil || string(rest) != "data: two\n\n" {
				t.Fatalf("rest of the stream %q: %v", rest, err)
			}
			for i, body := range []string{"[4]", "[5]"} {
				if i > 0 {
					conn.Write([]byte(echo + body))
				}
				reply, err := http.ReadResponse(r, nil)
				if err != nil {
					t.Fatalf("echo %s after the stream: %v", body, err)
				}
				got, err := io.ReadAll(reply.Body)
				if err != nil || string(got) != `{"got":`+body+`}` {
					t.Fatalf("echo %s after the stream: %q %v", body, got, err)
				}
			}
			// A second stream, whose events come at once; after it the
			// connection stays open, waiting for a request, while the
			// proxy stops.
			conn.Write([]byte("GET /v1/stream HTTP/1.1\r\nHost: x\r\n\r\n"))
			stream, err = http.ReadResponse(r, nil)
			if err != nil {
				t.Fatal(err)
			}
			if all, err := io.ReadAll(stream.Body); err != nil || string(all) != "data: one\n\ndata: two\n\n" {
				t.Fatalf("second stream %q: %v", all, err)
			}
			stop()
		})
	}
}

// serveUpstream serves an upstream until the test ends, and returns its
// address. /v1/echo answers its body inside {"got":...}; /v1/stream sends
// one event, waits for release, and sends a second.
func serveUpstream(t *testing.T, release chan struct{}) string {
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
	t.Cleanup(func() { upstream.Shutdown() })
	return uln.Addr().String()
}
