package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate-dev/tollgate/internal/hostile"
)

// The tests in this file put the gateway in front of internal/hostile, an
// upstream that misbehaves on request, and check for each behaviour that
// the gateway lives, its memory stays bounded, the client gets a clear
// error in the gateway's words (no internal address, no backend text
// beyond a 400's), and usage is recorded as an error carrying only the
// tokens the backend validly reported.

const upstreamSecret = "sk-upstream-secret"

// logBuffer is a concurrency-safe zap sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) Sync() error { return nil }

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// debugLogger logs everything, as JSON, into a buffer.
func debugLogger() (*zap.Logger, *logBuffer) {
	buf := &logBuffer{}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), buf, zap.DebugLevel)
	return zap.New(core), buf
}

// startHostile starts a hostile backend, closed when the test ends.
func startHostile(t *testing.T) *hostile.Server {
	t.Helper()
	hs, err := hostile.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := hs.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("hostile backend close: %v", err)
		}
	})
	return hs
}

// hostileHarness is a gateway whose model "bad" is served by a hostile
// backend, and "demo" by the simulator.
func hostileHarness(t *testing.T, hs *hostile.Server, o harnessOptions) *harness {
	t.Helper()
	o.extraBackends += fmt.Sprintf("  - name: hostile\n    url: %q\n    api_key: %q\n    timeouts: {first_byte: 30s, idle: 30s, total: 2m}\n", hs.URL(), upstreamSecret)
	if o.models == "" {
		o.models = `
  - name: demo
    backends: [sim]
  - name: bad
    backends: [hostile]
`
	}
	return newHarness(t, o)
}

const (
	badBody       = `{"model":"bad","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`
	badStreamBody = `{"model":"bad","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`
)

func TestHostileBackend(t *testing.T) {
	hs := startHostile(t)
	log, logs := debugLogger()
	h := hostileHarness(t, hs, harnessOptions{log: log, server: "max_response_bytes: 1048576"})

	type want struct {
		status  int    // non-stream answer; 0 for an in-band error
		message string // in the client's error message
		record  string // in the record's error
		// prompt and completion are the tokens recorded.
		prompt, completion int64
	}
	tests := []struct {
		behaviour string
		stream    bool
		want      want
	}{
		{"ok", false, want{200, "", "", 10, 5}},
		{"invalid-json", false, want{502, "not a JSON", "", 0, 0}},
		{"not-json", false, want{502, "not a JSON", "", 0, 0}},
		{"huge-body", false, want{502, "larger than the gateway's limit", "body size exceeds", 0, 0}},
		{"endless-body", false, want{502, "larger than the gateway's limit", "body size exceeds", 0, 0}},
		{"reset-mid-body", false, want{502, "failed before its reply was complete", "", 0, 0}},
		{"redirect", false, want{502, "answered 302", "answered 302", 0, 0}},
		{"usage-string", false, want{502, "reported token usage", "prompt_tokens is not a number", 0, 0}},
		{"usage-negative", false, want{502, "reported token usage", "prompt_tokens is negative", 0, 0}},
		{"usage-huge", false, want{502, "reported token usage", "exceeds 2^40", 0, 0}},
		{"usage-float", false, want{502, "reported token usage", "is not an integer", 0, 0}},
		{"usage-inconsistent", false, want{502, "reported token usage", "total_tokens (3) is less than", 0, 0}},
		{"usage-cached", false, want{502, "reported token usage", "cached_tokens (11) exceeds", 0, 0}},
		{"usage-not-object", false, want{502, "reported token usage", "usage is not an object", 0, 0}},
		{"error-leak", false, want{502, "Backend hostile answered 500 with an error", hostile.LeakedAddress, 0, 0}},
		{"error-leak-400", false, want{400, "max_tokens is too large for the model served at [address]", "", 0, 0}},
		// A backend echoing the gateway's upstream key: neither the
		// client, nor the record, nor the log gets it.
		{"echo-key", false, want{502, "refused the gateway's credentials", "invalid credentials: Bearer [redacted]", 0, 0}},
		{"echo-key-400", false, want{400, "invalid credentials: Bearer [redacted]", "", 0, 0}},
		{"ok", true, want{200, "", "", 10, 5}},
		// A stream broken off without any usage is charged as one the
		// client abandoned: the gateway's estimate of the prompt (5 for
		// "hi") and the content deltas that were streamed, since the
		// backend did process them.
		{"giant-event", true, want{0, "over the gateway's limit of 1048576 bytes", "exceeds server.max_event_bytes", 5, 0}},
		{"reset-mid-stream", true, want{0, "failed before its reply was complete", "reset", 5, 2}},
		{"usage-negative", true, want{0, "reported token usage", "prompt_tokens is negative", 0, 0}},
		{"usage-huge", true, want{0, "reported token usage", "exceeds 2^40", 0, 0}},
		{"usage-float", true, want{0, "reported token usage", "is not an integer", 0, 0}},
		{"usage-string", true, want{0, "reported token usage", "is not a number", 0, 0}},
		// The last valid cumulative count is what the backend reported.
		{"stream-usage-bad", true, want{0, "reported token usage", "completion_tokens is negative", 10, 2}},
		{"inband-error", true, want{0, "Backend hostile reported an error during the stream", hostile.LeakedAddress, 0, 0}},
	}
	for _, tt := range tests {
		name := tt.behaviour
		if tt.stream {
			name += " stream"
		}
		t.Run(name, func(t *testing.T) {
			n := h.recorder.count()
			body := badBody
			if tt.stream {
				body = badStreamBody
			}
			r := h.post(body, hostile.Header+": "+tt.behaviour)
			switch {
			case tt.want.status == 200:
				if r.status != 200 {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
			case tt.want.status != 0:
				assertOpenAIError(t, r, tt.want.status)
			default:
				assertInBandError(t, r)
			}
			if !strings.Contains(string(r.body), tt.want.message) {
				t.Errorf("the answer lacks %q: %.500s", tt.want.message, r.body)
			}
			for _, leak := range []string{hostile.LeakedAddress, "vllm-7.internal", "/srv/", "169.254", "127.0.0.1", upstreamSecret} {
				if strings.Contains(string(r.body), leak) {
					t.Errorf("the answer leaks %q: %.500s", leak, r.body)
				}
			}
			rec := h.recorder.wait(t, n+1)
			if strings.Contains(rec.Error, upstreamSecret) || strings.Contains(rec.Error, testKey) {
				t.Errorf("the record's error holds a key: %q", rec.Error)
			}
			if tt.want.status == 200 {
				if rec.Error != "" {
					t.Errorf("a valid reply recorded error %q", rec.Error)
				}
			} else if rec.Error == "" || !strings.Contains(rec.Error, tt.want.record) {
				t.Errorf("record error %q, want an error containing %q", rec.Error, tt.want.record)
			}
			if rec.PromptTokens != tt.want.prompt || rec.CompletionTokens != tt.want.completion ||
				rec.TotalTokens != tt.want.prompt+tt.want.completion || rec.CachedTokens != 0 {
				t.Errorf("recorded tokens %d + %d = %d (cached %d), want %d + %d", rec.PromptTokens, rec.CompletionTokens,
					rec.TotalTokens, rec.CachedTokens, tt.want.prompt, tt.want.completion)
			}
			assertStillServing(t, h)
		})
	}
	// Every line the gateway logged, at debug level, through the whole
	// suite: no client key, no upstream key.
	for _, secret := range []string{testKey, upstreamSecret} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("a log line holds the key %q", secret)
		}
	}
}

// TestHostileBackendMemory lets a backend send 200 MiB, as one body and as
// one SSE event, and a body that never ends, and samples the heap while it
// does: the gateway stops reading at its limit, so the heap stays far
// below what the backend sent, and the backend is cut off.
func TestHostileBackendMemory(t *testing.T) {
	hs := startHostile(t)
	h := hostileHarness(t, hs, harnessOptions{server: "max_response_bytes: 4194304"})
	for _, tt := range []struct {
		behaviour string
		body      string
	}{
		{"huge-body", badBody},
		{"endless-body", badBody},
		{"giant-event", badStreamBody},
		// A stream request answered with no stream is read as a body.
		{"endless-body", badStreamBody},
		{"endless-error", badStreamBody},
		{"endless-error", badBody},
	} {
		name := tt.behaviour
		if tt.body == badStreamBody {
			name += " stream"
		}
		t.Run(name, func(t *testing.T) {
			runtime.GC()
			var base runtime.MemStats
			runtime.ReadMemStats(&base)
			peak := base.HeapInuse
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				var ms runtime.MemStats
				for {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
					runtime.ReadMemStats(&ms)
					peak = max(peak, ms.HeapInuse)
				}
			}()
			before := hs.Written()
			r := h.post(tt.body, hostile.Header+": "+tt.behaviour)
			close(stop)
			<-sampled
			if r.status != 502 && r.status != 200 {
				t.Fatalf("status %d: %.300s", r.status, r.body)
			}
			const bound = 64 << 20
			if grew := int64(peak) - int64(base.HeapInuse); grew > bound {
				t.Errorf("heap in use grew by %d MiB while the backend sent its reply, want < %d MiB", grew>>20, bound>>20)
			}
			// The upstream connection is closed: the backend stops
			// writing well short of its 200 MiB (or of for ever).
			waitUntil(t, "the backend's connection to close", func() bool { return hs.Open() == 0 })
			if sent := hs.Written() - before; sent > 100<<20 {
				t.Errorf("the backend wrote %d MiB before the gateway cut it off", sent>>20)
			}
			assertStillServing(t, h)
		})
	}
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sendAndLeave sends a chat request on a raw connection, waits until the
// gateway has forwarded it (until reached reports so), and closes the
// connection without reading the answer.
func sendAndLeave(t *testing.T, h *harness, body, behaviour string, reached func() bool) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n%s: %s\r\nContent-Length: %d\r\n\r\n%s",
		testKey, hostile.Header, behaviour, len(body), body)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the request to be forwarded", reached)
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestHostileClientLeaves closes the client's connection while a
// request waits on a backend that never answers, or drips its reply: the
// gateway closes the upstream connection (so the backend stops
// generating) within its poll interval, not at the backend's timeout, and
// records the request as abandoned.
func TestHostileClientLeaves(t *testing.T) {
	hs := startHostile(t)
	h := hostileHarness(t, hs, harnessOptions{})
	for _, tt := range []struct{ name, behaviour, body string }{
		{"hang", "hang", badBody},
		{"slow-drip", "slow-drip", badBody},
		// A stream whose backend has not sent its headers yet has no
		// event to fail writing: the watch cuts it too.
		{"stream before its first byte", "hang", badStreamBody},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := h.recorder.count()
			reqs := hs.Requests()
			sendAndLeave(t, h, tt.body, tt.behaviour, func() bool { return hs.Requests() > reqs })
			// The backend's timeouts are 30 s and 2 m: 10 s can only be
			// the client watch.
			waitUntil(t, "the upstream connection to close", func() bool { return hs.Open() == 0 })
			rec := h.recorder.wait(t, n+1)
			if rec.Status != 499 || !strings.Contains(rec.Error, "client closed") || rec.TotalTokens != 0 {
				t.Errorf("record = status %d, error %q, %d tokens; want 499, the client closed, none", rec.Status, rec.Error, rec.TotalTokens)
			}
			assertStillServing(t, h)
		})
	}
}

// TestHostileWaitsEndWithTheClient queues a request behind a busy backend,
// and puts another in a 30 s retry backoff, and closes their clients: each
// ends at once (within the poll interval), not when its wait would.
func TestHostileWaitsEndWithTheClient(t *testing.T) {
	hs := startHostile(t)
	h := hostileHarness(t, hs, harnessOptions{
		extraBackends: fmt.Sprintf("  - name: hostile2\n    url: %q\n    max_concurrency: 1\n", hs.URL()),
		models: `
  - name: demo
    backends: [sim]
  - name: bad
    backends: [hostile]
  - name: queued
    backends: [hostile2]
    queue: {depth: 4, wait: 5m}
retries: {attempts: 3, backoff: 30s, max_backoff: 30s}
`,
	})
	t.Run("queue wait", func(t *testing.T) {
		n := h.recorder.count()
		reqs := hs.Requests()
		queued := strings.Replace(badBody, `"bad"`, `"queued"`, 1)
		// The first request takes the only slot and hangs.
		holder, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		fmt.Fprintf(holder, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n%s: hang\r\nContent-Length: %d\r\n\r\n%s",
			testKey, hostile.Header, len(queued), queued)
		waitUntil(t, "the first request to take the slot", func() bool { return hs.Requests() > reqs })
		// The second waits in the queue; the backend never sees it.
		sendAndLeave(t, h, queued, "ok", func() bool { time.Sleep(300 * time.Millisecond); return true })
		rec := h.recorder.wait(t, n+1)
		if rec.Status != 499 || !strings.Contains(rec.Error, "waited for a backend") {
			t.Errorf("record = status %d, error %q; want 499 for a client that left the queue", rec.Status, rec.Error)
		}
		holder.Close()
		waitUntil(t, "the hanging request to end", func() bool { return hs.Open() == 0 })
		h.recorder.wait(t, n+2)
	})
	t.Run("retry backoff", func(t *testing.T) {
		n := h.recorder.count()
		reqs := hs.Requests()
		sendAndLeave(t, h, badBody, "unavailable", func() bool { return hs.Requests() > reqs })
		rec := h.recorder.wait(t, n+1)
		if rec.Status != 499 {
			t.Errorf("record = status %d, error %q; want 499 for a client that left during the backoff", rec.Status, rec.Error)
		}
	})
}

// TestIdleConnectionsAreClosed opens server.max_connections connections
// that send nothing: each is closed after read_timeout, so the cap is free
// again for clients that do send.
func TestIdleConnectionsAreClosed(t *testing.T) {
	h := newHarness(t, harnessOptions{server: "read_timeout: 300ms, max_connections: 4"})
	var conns []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i, c := range conns {
		if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("silent connection %d: read = %v, want the gateway to close it (EOF)", i, err)
		}
	}
	assertStillServing(t, h)
}

// TestRFC9112Framing sends requests RFC 9112 says must be refused: each
// gets a 400 and a closed connection, and nothing of them, nor anything
// after them on the connection, reaches the backend.
func TestRFC9112Framing(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(helloBody), helloBody)
	smuggled := "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + testKey +
		"\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(helloBody)) + "\r\n\r\n" + helloBody
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + testKey + "\r\n"
	tests := []struct{ name, raw string }{
		{"Content-Length and Transfer-Encoding", head + "Content-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + smuggled},
		{"Transfer-Encoding then Content-Length", head + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunked + smuggled},
		{"space before a colon", head + "Content-Type : application/json\r\nContent-Length: " + fmt.Sprint(len(helloBody)) + "\r\n\r\n" + helloBody + smuggled},
		{"tab before a colon", head + "Content-Type\t: application/json\r\nContent-Length: " + fmt.Sprint(len(helloBody)) + "\r\n\r\n" + helloBody},
		{"space inside a name", head + "Content-Type: application/json\r\nX Smuggle: 1\r\nContent-Length: " + fmt.Sprint(len(helloBody)) + "\r\n\r\n" + helloBody},
		{"identity Transfer-Encoding with Content-Length", head + "Content-Type: application/json\r\nTransfer-Encoding: identity\r\nContent-Length: " + fmt.Sprint(len(helloBody)) + "\r\n\r\n" + helloBody + smuggled},
		{"lower-case names", head + "content-type: application/json\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n" + chunked + smuggled},
		{"Transfer-Encoding chunked, then identity", head + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n" + chunked + smuggled},
		{"Transfer-Encoding identity, then chunked", head + "Content-Type: application/json\r\nTransfer-Encoding: identity\r\ntransfer-encoding: chunked\r\n\r\n" + chunked + smuggled},
		{"Transfer-Encoding chunked twice", head + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + smuggled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.sim.Stats().Requests
			conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(conn, tt.raw); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assertOpenAIError(t, response{status: resp.StatusCode, header: resp.Header, body: body}, 400)
			// Nothing follows: the connection is closed after the 400.
			if extra, err := br.ReadByte(); err == nil {
				t.Fatalf("the gateway answered more after the 400 (%q...): the smuggled request ran", extra)
			}
			if h.sim.Stats().Requests != before {
				t.Errorf("a refused request reached the backend")
			}
		})
	}
	// A plain chunked request is fine.
	t.Run("chunked alone", func(t *testing.T) {
		r := exchangeRaw(t, h, head+"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked)
		if r.status != 200 {
			t.Fatalf("a chunked request got %d: %s", r.status, r.body)
		}
	})
}

// TestFasthttpLogsRedacted sends an Authorization header with a control
// byte, which fasthttp refuses and logs, quoting the value. The log line
// must reach the gateway's logger (not stderr), and no line may hold the
// key.
func TestFasthttpLogsRedacted(t *testing.T) {
	log, logs := debugLogger()
	h := newHarness(t, harnessOptions{log: log})
	raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + testKey + "\x01\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	r := exchangeRaw(t, h, raw)
	assertOpenAIError(t, r, 400)
	waitUntil(t, "fasthttp's log line", func() bool { return strings.Contains(logs.String(), `"msg":"http server"`) })
	if strings.Contains(logs.String(), testKey) || strings.Contains(logs.String(), "Bearer sk-") {
		t.Errorf("the log holds the key:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "[redacted]") {
		t.Errorf("fasthttp's line was not redacted:\n%s", logs.String())
	}
}

// TestPanicIsRecovered makes a handler panic: the request gets a 500, the
// panic is counted, and the gateway keeps serving.
func TestPanicIsRecovered(t *testing.T) {
	log, logs := debugLogger()
	h := newHarness(t, harnessOptions{log: log, next: func(*fasthttp.RequestCtx) { panic("boom from foreign bytes") }})
	resp, err := http.Get(h.base + "/anything")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assertOpenAIError(t, response{status: resp.StatusCode, header: resp.Header, body: body}, 500)
	if !strings.Contains(logs.String(), "boom from foreign bytes") {
		t.Errorf("the panic was not logged:\n%s", logs.String())
	}
	assertStillServing(t, h)
}

// TestQueueWaitEndsAtShutdown queues a request behind a busy backend and
// shuts the gateway down: the queued request is answered 503 at once,
// rather than holding shutdown for its queue wait.
func TestQueueWaitEndsAtShutdown(t *testing.T) {
	hs := startHostile(t)
	h := hostileHarness(t, hs, harnessOptions{
		extraBackends: fmt.Sprintf("  - name: hostile2\n    url: %q\n    max_concurrency: 1\n", hs.URL()),
		models: `
  - name: demo
    backends: [sim]
  - name: queued
    backends: [hostile2]
    queue: {depth: 4, wait: 5m}
`,
	})
	queued := strings.Replace(badBody, `"bad"`, `"queued"`, 1)
	dial := func(behaviour string) net.Conn {
		c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n%s: %s\r\nContent-Length: %d\r\n\r\n%s",
			testKey, hostile.Header, behaviour, len(queued), queued)
		return c
	}
	holder := dial("hang")
	defer holder.Close()
	waitUntil(t, "the first request to take the slot", func() bool { return hs.Requests() == 1 })
	waiter := dial("ok")
	defer waiter.Close()
	time.Sleep(300 * time.Millisecond) // let it reach the queue
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		shut <- h.gw.Shutdown(ctx)
	}()
	if err := waiter.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(waiter), nil)
	if err != nil {
		t.Fatalf("the queued request got no answer at shutdown: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assertOpenAIError(t, response{status: resp.StatusCode, header: resp.Header, body: body}, 503)
	if !strings.Contains(string(body), "shutting down") {
		t.Errorf("answer %s, want it to say the gateway is shutting down", body)
	}
	// The request on the hanging backend ends when its client leaves.
	holder.Close()
	if err := <-shut; err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if hs.Requests() != 1 {
		t.Errorf("the queued request reached the backend")
	}
}
