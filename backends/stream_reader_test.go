package backends

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/scripted"
)

// startScripted starts an upstream answering every request with head,
// then then, which writes the rest of the reply on the connection.
func startScripted(t *testing.T, head string, then func(c net.Conn)) *scripted.Server {
	t.Helper()
	u, err := scripted.Start(func(c net.Conn) {
		if _, err := io.WriteString(c, head); err == nil {
			then(c)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = u.Close() })
	return u
}

// openTestStream sends a streamed request through b and returns the
// response with its body stream open.
func openTestStream(t *testing.T, b *Backend) *fasthttp.Response {
	t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	b.PrepareChat(req)
	req.SetBodyString(`{"model":"m","messages":[],"stream":true}`)
	resp := fasthttp.AcquireResponse()
	resp.StreamBody = true
	var a Abort
	if err := b.DoAbortable(req, resp, &a); err != nil || resp.StatusCode() != 200 {
		t.Fatalf("open stream: err %v, status %d", err, resp.StatusCode())
	}
	t.Cleanup(func() {
		b.CloseStream(resp, true)
		fasthttp.ReleaseResponse(resp)
	})
	return resp
}

func scriptedBackend(t *testing.T, u *scripted.Server, idle time.Duration) *Backend {
	t.Helper()
	b, err := newBackend(config.Backend{Name: "s", URL: "http://" + u.Addr() + "/v1", MaxConns: 1000,
		Timeouts: config.BackendTimeouts{Connect: time.Second, FirstByte: time.Minute, Idle: idle, Total: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	b.Guard(1 << 20)
	t.Cleanup(b.client.CloseIdleConnections)
	return b
}

const chunkedHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// TestAwaitStream waits for an open stream's next bytes as the proxy does
// (AwaitStream, then a read), for each way the wait can end: the read
// that follows must return what ended it, as a read alone would have.
func TestAwaitStream(t *testing.T) {
	const event = "data: {\"x\":1}\n\n"
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	tests := []struct {
		name string
		head string
		// then writes the rest of the reply after head, once the client
		// has read the headers.
		then func(c net.Conn)
		idle time.Duration
		// waitAfter is how long the stream is left before the wait.
		waitAfter time.Duration
		// wantBody is what the read after the wait returns in full;
		// wantErr, when set, is in the error that ends it.
		wantBody, wantErr string
		// wantWaited says the stream read through its parked buffer and
		// then an event buffer: the wait took place on the socket.
		wantWaited bool
	}{
		{
			name: "bytes arriving during the wait",
			head: chunkedHead,
			then: func(c net.Conn) {
				time.Sleep(100 * time.Millisecond)
				_, _ = io.WriteString(c, chunk(event)+"0\r\n\r\n")
			},
			wantBody: event, wantWaited: true,
		},
		{
			// The poller reports only what arrives once a wait has begun:
			// bytes already in the socket must end the wait at once.
			name: "bytes in the socket before the wait",
			head: chunkedHead,
			then: func(c net.Conn) {
				time.Sleep(20 * time.Millisecond) // after the headers
				_, _ = io.WriteString(c, chunk(event)+"0\r\n\r\n")
			},
			waitAfter: 200 * time.Millisecond,
			wantBody:  event, wantWaited: true,
		},
		{
			name: "the backend ends the connection",
			head: chunkedHead,
			then: func(c net.Conn) {
				time.Sleep(50 * time.Millisecond)
				_ = c.Close()
			},
			// fasthttp's body stream ends cleanly when the connection
			// ends between chunks (the proxy tells that end from a
			// complete one by [DONE]).
			wantBody: "", wantWaited: true,
		},
		{
			// The peek takes the socket's error, as a read would: the read
			// after the wait must still report the reset.
			name: "the backend resets the connection",
			head: chunkedHead,
			then: func(c net.Conn) {
				time.Sleep(50 * time.Millisecond)
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close()
			},
			wantErr: "connection reset", wantWaited: true,
		},
		{
			name: "the idle timeout passes",
			head: chunkedHead,
			then: func(net.Conn) {},
			idle: 150 * time.Millisecond,
			// What a read alone returns when its deadline passes.
			wantErr: "i/o timeout", wantWaited: true,
		},
		{
			// fasthttp read a body of known length whole: the socket has
			// nothing more to say, and a wait on it would never end.
			name:     "a body of known length",
			head:     "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 15\r\n\r\n" + event,
			then:     func(net.Conn) {},
			wantBody: event,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := startScripted(t, tt.head, tt.then)
			idle := tt.idle
			if idle == 0 {
				idle = time.Minute
			}
			b := scriptedBackend(t, u, idle)
			resp := openTestStream(t, b)
			st := b.openStreamOf(resp)
			if st == nil {
				t.Fatal("the stream is not the transport's")
			}
			time.Sleep(tt.waitAfter)
			done := make(chan struct{})
			go func() {
				defer close(done)
				b.AwaitStream(resp)
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("AwaitStream did not return within 5 s")
			}
			if waited := st.buf == eventBuffer; waited != tt.wantWaited {
				t.Errorf("after the wait the stream reads through buffer kind %d, waited on the socket %v, want %v", st.buf, waited, tt.wantWaited)
			}
			if tt.wantWaited && (st.br.Size() != streamReadBufferSize || st.parked == nil || st.parked.Size() != parkedBufferSize) {
				t.Errorf("after the wait the reader's buffer is %d bytes, want %d, and the parked one is kept", st.br.Size(), streamReadBufferSize)
			}
			body, err := io.ReadAll(resp.BodyStream())
			if string(body) != tt.wantBody {
				t.Errorf("read %q after the wait, want %q", body, tt.wantBody)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("read after the wait: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("read after the wait: error %v, want one with %q", err, tt.wantErr)
			}
		})
	}
}

// TestAwaitStreamHoldsNoBuffer holds streams waiting for their next
// event, once in AwaitStream and once in a read on the small buffer
// (ShrinkStream's), and compares the heap they hold: AwaitStream's must
// be smaller by most of the buffer.
func TestAwaitStreamHoldsNoBuffer(t *testing.T) {
	const n = 200
	release := make(chan struct{})
	u := startScripted(t, chunkedHead, func(c net.Conn) {
		<-release
		_, _ = io.WriteString(c, "0\r\n\r\n")
	})
	b := scriptedBackend(t, u, time.Minute)
	heapPerStream := func(wait func(resp *fasthttp.Response)) float64 {
		t.Helper()
		// Two collections empty the pools that the buffers given back
		// went to.
		runtime.GC()
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		resps := make([]*fasthttp.Response, n)
		for i := range resps {
			resps[i] = openTestStream(t, b)
		}
		var wg sync.WaitGroup
		for _, resp := range resps {
			wg.Go(func() {
				wait(resp)
				_, _ = io.ReadAll(resp.BodyStream())
			})
		}
		time.Sleep(300 * time.Millisecond) // every goroutine is waiting
		runtime.GC()
		runtime.GC()
		var waiting runtime.MemStats
		runtime.ReadMemStats(&waiting)
		for range n {
			release <- struct{}{}
		}
		wg.Wait()
		for _, resp := range resps {
			b.CloseStream(resp, false)
		}
		return (float64(waiting.HeapInuse) - float64(before.HeapInuse)) / n
	}
	// The first round dials the connections, which the next two reuse.
	heapPerStream(b.AwaitStream)
	shrunk := heapPerStream(func(resp *fasthttp.Response) {
		if !b.ShrinkStream(resp) {
			t.Error("ShrinkStream with nothing buffered reported false")
		}
	})
	awaiting := heapPerStream(b.AwaitStream)
	t.Logf("heap per waiting stream: %.0f B in a read on the small buffer, %.0f B in AwaitStream", shrunk, awaiting)
	if awaiting > shrunk-streamReadBufferSize/2 {
		t.Errorf("a stream in AwaitStream holds %.0f B of heap, one reading through its small buffer %.0f B: want at least %d B less",
			awaiting, shrunk, streamReadBufferSize/2)
	}
}
