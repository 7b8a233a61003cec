package backends

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/hostile"
)

// guardedBackend is a backend in front of a hostile server, with replies
// bounded at maxResponse bytes.
func guardedBackend(t *testing.T, maxResponse int) (*Backend, *hostile.Server) {
	t.Helper()
	hs, err := hostile.Start()
	if err != nil {
		t.Fatal(err)
	}
	b, err := newBackend(config.Backend{Name: "h", URL: hs.URL(), MaxConns: 4,
		Timeouts: config.BackendTimeouts{Connect: time.Second, FirstByte: time.Minute, Idle: time.Minute, Total: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	b.Guard(maxResponse)
	t.Cleanup(func() {
		b.client.CloseIdleConnections()
		_ = hs.Close()
	})
	return b, hs
}

func hostileRequest(b *Backend, behaviour string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	b.PrepareChat(req)
	req.Header.Set(hostile.Header, behaviour)
	req.SetBodyString(`{"model":"m","messages":[]}`)
	return req
}

func TestDoAbortable(t *testing.T) {
	t.Run("a reply is read, and its connection kept", func(t *testing.T) {
		b, hs := guardedBackend(t, 1<<20)
		for range 3 {
			req, resp := hostileRequest(b, "ok"), fasthttp.AcquireResponse()
			var a Abort
			if err := b.DoAbortable(req, resp, &a); err != nil || resp.StatusCode() != 200 {
				t.Fatalf("err %v, status %d", err, resp.StatusCode())
			}
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
		}
		if n := hs.Open(); n != 1 {
			t.Errorf("%d connections open after three requests in turn, want the one kept alive", n)
		}
	})
	t.Run("abort closes the connection at once", func(t *testing.T) {
		b, hs := guardedBackend(t, 1<<20)
		req, resp := hostileRequest(b, "hang"), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		var a Abort
		done := make(chan error, 1)
		go func() { done <- b.DoAbortable(req, resp, &a) }()
		for hs.Requests() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		a.Abort()
		select {
		case err := <-done:
			var ae AbortedError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, want an AbortedError", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the round trip went on after Abort (the backend's timeouts are a minute and more)")
		}
		for hs.Open() != 0 {
			time.Sleep(5 * time.Millisecond)
		}
	})
	t.Run("an aborted request does not start", func(t *testing.T) {
		b, hs := guardedBackend(t, 1<<20)
		req, resp := hostileRequest(b, "ok"), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		var a Abort
		a.Abort()
		if err := b.DoAbortable(req, resp, &a); !errors.As(err, new(AbortedError)) {
			t.Fatalf("err = %v, want an AbortedError", err)
		}
		if hs.Requests() != 0 {
			t.Error("an aborted request reached the backend")
		}
	})
	t.Run("a body over the limit is a TooLargeError", func(t *testing.T) {
		b, _ := guardedBackend(t, 1<<20)
		for _, behaviour := range []string{"huge-body", "endless-body"} {
			req, resp := hostileRequest(b, behaviour), fasthttp.AcquireResponse()
			var a Abort
			err := b.DoAbortable(req, resp, &a)
			if !errors.As(err, new(TooLargeError)) {
				t.Errorf("%s: err = %v, want a TooLargeError", behaviour, err)
			}
			if n := len(resp.Body()); n > 1<<20 {
				t.Errorf("%s: %d bytes of body kept, over the limit", behaviour, n)
			}
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
		}
	})
}

// TestStreamConnectionReuse reads streamed replies through the abortable
// transport: a stream read to its end gives its connection back for the
// next request; one closed early closes it.
func TestStreamConnectionReuse(t *testing.T) {
	sim := simulated.New(simulated.Options{Tokens: 3})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sim.Serve(ln) }()
	b, err := newBackend(config.Backend{Name: "s", URL: "http://" + ln.Addr().String() + "/v1", MaxConns: 4,
		Timeouts: config.BackendTimeouts{Connect: time.Second, FirstByte: time.Minute, Idle: time.Minute, Total: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	b.Guard(1 << 20)
	t.Cleanup(func() {
		b.client.CloseIdleConnections()
		if err := sim.Shutdown(); err != nil {
			t.Error(err)
		}
		<-done
	})
	stream := func(readAll bool) {
		t.Helper()
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		b.PrepareChat(req)
		req.SetBodyString(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		resp.StreamBody = true
		var a Abort
		if err := b.DoAbortable(req, resp, &a); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("err %v, status %d", err, resp.StatusCode())
		}
		if readAll {
			body, err := io.ReadAll(resp.BodyStream())
			if err != nil || !bytes.Contains(body, []byte("[DONE]")) {
				t.Fatalf("stream body %q, %v", body, err)
			}
		}
		b.CloseStream(resp, !readAll)
	}
	for range 3 {
		stream(true)
	}
	if n := b.client.ConnsCount(); n != 1 {
		t.Errorf("%d connections after three streams read to their end, want the one reused", n)
	}
	stream(false)
	if n := b.client.ConnsCount(); n != 0 {
		t.Errorf("%d connections after a stream closed early, want its connection closed", n)
	}
}
