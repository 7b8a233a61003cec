package handover

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestTakeConnOnFasthttp hijacks a real connection from a real fasthttp
// server, as the gateway's streams do, and checks the undocumented method
// TakeConn relies on: the hijacked connection has UnsafeConn, it returns
// the very socket, and TakeConn hands back what the client pipelined. A
// fasthttp upgrade that changes any of it fails here, by name, rather than
// quietly making every stream hold fasthttp's buffers.
func TestTakeConnOnFasthttp(t *testing.T) {
	type taken struct {
		hasMethod bool
		socket    net.Conn
		conn      net.Conn
		pipelined []byte
		ok        bool
	}
	got := make(chan taken, 1)
	srv := &fasthttp.Server{
		KeepHijackedConns: true,
		Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.HijackSetNoResponse(true)
			ctx.Hijack(func(c net.Conn) {
				var tk taken
				var u unsafeConner
				u, tk.hasMethod = c.(unsafeConner)
				if tk.hasMethod {
					tk.socket = u.UnsafeConn()
				}
				tk.conn, tk.pipelined, tk.ok = TakeConn(c, make([]byte, 64))
				tk.pipelined = bytes.Clone(tk.pipelined)
				got <- tk
				if tk.ok {
					_, _ = io.WriteString(tk.conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
				}
				tk.conn.Close()
			})
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		if err := srv.Shutdown(); err != nil {
			t.Error(err)
		}
		<-served
	}()

	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const next = "GET /next HTTP/1.1\r\nHost: x\r\n\r\n"
	if _, err := io.WriteString(client, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"+next); err != nil {
		t.Fatal(err)
	}
	var tk taken
	select {
	case tk = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the hijack handler never ran")
	}
	if !tk.hasMethod {
		t.Fatal("fasthttp's hijacked connection no longer has UnsafeConn() net.Conn: internal/handover/unsafeconn.go must change with this fasthttp version")
	}
	if _, isTCP := tk.socket.(*net.TCPConn); !isTCP {
		t.Fatalf("UnsafeConn returned a %T, want the socket (*net.TCPConn)", tk.socket)
	}
	if !tk.ok || tk.conn != tk.socket {
		t.Fatalf("TakeConn = %T, ok %v; want the socket", tk.conn, tk.ok)
	}
	if string(tk.pipelined) != next {
		t.Errorf("TakeConn's pipelined bytes %q, want the next request %q", tk.pipelined, next)
	}
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	reply, _ := io.ReadAll(client)
	if !bytes.HasSuffix(reply, []byte("\r\n\r\nok")) {
		t.Errorf("the reply written on the taken socket: %q", reply)
	}
}
