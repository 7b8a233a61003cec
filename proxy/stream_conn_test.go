package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/internal/hostile"
)

// rawChat is a chat completion request as it goes on the wire.
func rawChat(stream bool, maxTokens int) string {
	body := fmt.Sprintf(`{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":%d,"stream":%v}`, maxTokens, stream)
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", testKey, len(body), body)
}

// readReply reads one reply from br, and its whole body.
func readReply(t *testing.T, br *bufio.Reader) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read reply: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read reply body: %v (got %q)", err, body)
	}
	return resp, body
}

// readStream reads one streamed reply from br and checks it is a complete
// event stream of n content chunks; it returns the reply.
func readStream(t *testing.T, br *bufio.Reader, n int) *http.Response {
	t.Helper()
	resp, body := readReply(t, br)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" ||
		len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" ||
		resp.Header.Get("Server") != "tollgate" || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("stream reply %d, header %v, transfer encoding %v", resp.StatusCode, resp.Header, resp.TransferEncoding)
	}
	events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
	if events[len(events)-1] != "data: [DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", body)
	}
	content := 0
	for _, ev := range events[:len(events)-1] {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || !gjson.Valid(data) {
			t.Fatalf("event %q is not a data event with JSON", ev)
		}
		if gjson.Get(data, "model").String() != "demo" {
			t.Fatalf("event %q does not name the public model", ev)
		}
		if gjson.Get(data, "choices.0.delta.content").String() != "" {
			content++
		}
	}
	if content != n {
		t.Fatalf("%d content chunks, want %d: %q", content, n, body)
	}
	return resp
}

// readChat reads one non-streamed chat reply from br and checks it.
func readChat(t *testing.T, br *bufio.Reader) {
	t.Helper()
	resp, body := readReply(t, br)
	if resp.StatusCode != 200 || gjson.GetBytes(body, "object").String() != "chat.completion" ||
		gjson.GetBytes(body, "choices.0.message.content").String() == "" {
		t.Fatalf("reply %d %s", resp.StatusCode, body)
	}
}

func dialGateway(t *testing.T, h *harness) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, bufio.NewReader(c)
}

// TestStreamKeepsConnection sends streams and plain requests one after
// another on one connection: a stream is written by a goroutine of its own
// on the connection, which goes back to the server for the next request.
func TestStreamKeepsConnection(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{Tokens: 4}})
	c, br := dialGateway(t, h)
	for i := range 3 {
		if _, err := io.WriteString(c, rawChat(true, 3)); err != nil {
			t.Fatal(err)
		}
		readStream(t, br, 3)
		if _, err := io.WriteString(c, rawChat(false, 3)); err != nil {
			t.Fatal(err)
		}
		readChat(t, br)
		for n := 2*i + 1; n <= 2*i+2; n++ {
			if rec := h.recorder.wait(t, n); rec.Status != 200 || rec.CompletionTokens != 3 || rec.Error != "" {
				t.Fatalf("record %d: status %d, %d completion tokens, error %q", n, rec.Status, rec.CompletionTokens, rec.Error)
			}
		}
	}
}

// TestStreamEndsSettled alternates streams between two connections with
// max_streams 1: a client that has read a stream to the end of its body
// finds it settled, its stream slot free for a stream on another
// connection and its record queued, as a reply that is not streamed is
// settled before it is sent.
func TestStreamEndsSettled(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{Tokens: 4}, server: "max_streams: 1"})
	conns := [2]net.Conn{}
	readers := [2]*bufio.Reader{}
	for i := range conns {
		conns[i], readers[i] = dialGateway(t, h)
	}
	for i := range 200 {
		c, br := conns[i%2], readers[i%2]
		if _, err := io.WriteString(c, rawChat(true, 2)); err != nil {
			t.Fatal(err)
		}
		resp, body := readReply(t, br)
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: status %d, %s (the previous stream's slot was not released when its body ended)", i, resp.StatusCode, body)
		}
		if n := h.recorder.count(); n != i+1 {
			t.Fatalf("stream %d: %d records queued when its body ended, want %d", i, n, i+1)
		}
	}
}

// TestStreamPipelined sends a plain request right behind a stream's, in one
// write: the second is answered after the stream, on the same connection.
func TestStreamPipelined(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{Tokens: 4}})
	c, br := dialGateway(t, h)
	if _, err := io.WriteString(c, rawChat(true, 2)+rawChat(false, 2)+rawChat(true, 1)); err != nil {
		t.Fatal(err)
	}
	readStream(t, br, 2)
	readChat(t, br)
	readStream(t, br, 1)
}

// TestStreamConnectionClose answers a stream whose request asks to close
// the connection with Connection: close, and closes it.
func TestStreamConnectionClose(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{Tokens: 4}})
	c, br := dialGateway(t, h)
	req := strings.Replace(rawChat(true, 2), "Host: gw\r\n", "Host: gw\r\nConnection: close\r\n", 1)
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	if resp := readStream(t, br, 2); !resp.Close {
		t.Fatalf("reply header %v does not close the connection", resp.Header)
	}
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the stream: read %d bytes, %v; want the connection closed", n, err)
	}
}

// TestShutdownAfterStreamKeepAlive shuts the gateway down while a
// connection waits for its next request after a stream: Shutdown closes it
// at once, as fasthttp closes its own idle keep-alive connections, rather
// than waiting for the connection to count as idle.
func TestShutdownAfterStreamKeepAlive(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{Tokens: 4}})
	c, br := dialGateway(t, h)
	if _, err := io.WriteString(c, rawChat(true, 2)); err != nil {
		t.Fatal(err)
	}
	readStream(t, br, 2)
	h.recorder.wait(t, 1)
	// fasthttp counts a connection it is given as idle after 5 s.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := h.gw.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after shutdown: read %d bytes, %v; want the connection closed", n, err)
	}
}

// TestShutdownWaitsForStream shuts the gateway down during a stream: the
// stream is written to its end and recorded before Shutdown returns, and
// the connection is closed after it.
func TestShutdownWaitsForStream(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{Tokens: 20, InterTokenDelay: 20 * time.Millisecond}})
	c, br := dialGateway(t, h)
	if _, err := io.WriteString(c, rawChat(true, 20)); err != nil {
		t.Fatal(err)
	}
	if _, err := br.Peek(1); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- h.gw.Shutdown(ctx)
	}()
	readStream(t, br, 20)
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if rec := h.recorder.wait(t, 1); rec.Status != 200 || rec.CompletionTokens != 20 || rec.Incomplete {
		t.Fatalf("record: status %d, %d completion tokens, incomplete %v", rec.Status, rec.CompletionTokens, rec.Incomplete)
	}
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the stream: read %d bytes, %v; want the connection closed", n, err)
	}
}

// TestClientWatchAfterStream leaves, on a connection that carried a
// stream, while a plain request after it waits on a backend that never
// answers: the client watch still sees the socket under the connection
// given back, and ends the request within its poll interval.
func TestClientWatchAfterStream(t *testing.T) {
	hs := startHostile(t)
	h := hostileHarness(t, hs, harnessOptions{sim: simulated.Options{Tokens: 4}})
	c, br := dialGateway(t, h)
	if _, err := io.WriteString(c, rawChat(true, 2)); err != nil {
		t.Fatal(err)
	}
	readStream(t, br, 2)
	h.recorder.wait(t, 1)
	reqs := hs.Requests()
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\n%s: hang\r\nContent-Length: %d\r\n\r\n%s",
		testKey, hostile.Header, len(badBody), badBody); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the request to be forwarded", func() bool { return hs.Requests() > reqs })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The backend's timeouts are 30 s and 2 m: a record within
	// recorder.wait's 5 s can only be the client watch's.
	if rec := h.recorder.wait(t, 2); rec.Status != 499 || !strings.Contains(rec.Error, "client closed") {
		t.Fatalf("record: status %d, error %q; want 499, the client closed", rec.Status, rec.Error)
	}
}
