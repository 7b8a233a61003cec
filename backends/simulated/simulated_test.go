package simulated

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/internal/leakcheck"
)

// TestMain checks that no test leaves a goroutine of the server behind: Shutdown must wait for
// everything the server started. fasthttp's own background goroutines are not ours and are
// ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.IgnoreFasthttp()...)
}

// harness is a running server and a client for it, over an in-memory listener or real TCP.
type harness struct {
	srv    *Server
	client *fasthttp.HostClient // buffers whole bodies
	stream *fasthttp.HostClient // hands out bodies as streams
	dial   func() (net.Conn, error)
}

func start(t testing.TB, opts Options, tcp bool) *harness {
	t.Helper()
	var ln net.Listener
	var dial func() (net.Conn, error)
	if tcp {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln = l
		dial = func() (net.Conn, error) { return net.Dial("tcp", l.Addr().String()) }
	} else {
		l := fasthttputil.NewInmemoryListener()
		ln, dial = l, l.Dial
	}
	h := &harness{srv: New(opts), dial: dial}
	served := make(chan error, 1)
	go func() { served <- h.srv.Serve(ln) }()
	newClient := func(stream bool) *fasthttp.HostClient {
		return &fasthttp.HostClient{
			Addr:               "sim",
			Dial:               func(string) (net.Conn, error) { return dial() },
			StreamResponseBody: stream,
			// Short so that the client's cleaner goroutine is gone soon after a test.
			MaxIdleConnDuration: 50 * time.Millisecond,
		}
	}
	h.client, h.stream = newClient(false), newClient(true)
	t.Cleanup(func() {
		h.client.CloseIdleConnections()
		h.stream.CloseIdleConnections()
		if err := h.srv.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

type reply struct {
	status      int
	contentType string
	body        []byte
}

// do sends a request and returns the buffered reply.
func (h *harness) do(t testing.TB, method, path, body string, headers ...string) reply {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI("http://sim" + path)
	if body != "" {
		req.Header.SetContentType("application/json")
		req.SetBodyString(body)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	if err := h.client.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return reply{resp.StatusCode(), string(resp.Header.ContentType()), append([]byte(nil), resp.Body()...)}
}

// sse reads a streamed reply event by event.
type sse struct {
	resp *fasthttp.Response
	r    *bufio.Reader
}

// openStream posts body and returns the streamed reply; the caller must call close.
func (h *harness) openStream(t testing.TB, body string, headers ...string) *sse {
	t.Helper()
	s, err := h.tryOpenStream(body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryOpenStream is openStream for goroutines other than the test's, which must not call t.Fatal.
func (h *harness) tryOpenStream(body string, headers ...string) (*sse, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	req.Header.SetMethod("POST")
	req.SetRequestURI("http://sim/v1/chat/completions")
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	if err := h.stream.Do(req, resp); err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, err
	}
	s := &sse{resp: resp, r: bufio.NewReader(resp.BodyStream())}
	if got := string(resp.Header.ContentType()); got != "text/event-stream" {
		s.close()
		return nil, fmt.Errorf("content type %q, want text/event-stream", got)
	}
	return s, nil
}

// next returns the data of the next event. Only "data: " lines are expected.
func (s *sse) next() (string, error) {
	line, err := s.r.ReadString('\n')
	if err != nil {
		return line, err
	}
	data, ok := strings.CutPrefix(line, "data: ")
	if !ok {
		return line, fmt.Errorf("not a data line: %q", line)
	}
	if blank, err := s.r.ReadString('\n'); err != nil || blank != "\n" {
		return data, fmt.Errorf("event not followed by a blank line: %q, %v", blank, err)
	}
	return strings.TrimSuffix(data, "\n"), nil
}

// all reads events until [DONE] (included) or an error.
func (s *sse) all() ([]string, error) {
	var events []string
	for {
		ev, err := s.next()
		if err != nil {
			return events, err
		}
		events = append(events, ev)
		if ev == "[DONE]" {
			return events, nil
		}
	}
}

// close abandons the stream. The connection is marked to close, because fasthttp's client would
// otherwise put a half-read connection back in its pool and the server would never notice.
func (s *sse) close() {
	s.resp.Header.SetConnectionClose()
	_ = s.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(s.resp)
}

func mustJSON(t testing.TB, s string) gjson.Result {
	t.Helper()
	if !gjson.Valid(s) {
		t.Fatalf("not JSON: %q", s)
	}
	return gjson.Parse(s)
}

func content(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "tok%d ", i)
	}
	return b.String()
}

func TestNonStream(t *testing.T) {
	h := start(t, Options{Tokens: 3}, false)
	tests := []struct {
		name       string
		body       string
		model      string
		choices    int
		completion int // per choice
		prompt     int
		finish     string
	}{
		{
			name:  "defaults",
			body:  `{"model":"m1","messages":[{"role":"user","content":"hello there world"}]}`,
			model: "m1", choices: 1, completion: 3, prompt: 4 + 3, finish: "stop",
		},
		{
			name:  "max_tokens",
			body:  `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
			model: "m1", choices: 1, completion: 5, prompt: 4 + 1, finish: "length",
		},
		{
			name:  "max_completion_tokens wins over max_tokens",
			body:  `{"model":"m1","max_tokens":5,"max_completion_tokens":2,"messages":[{"role":"user","content":"hi"}]}`,
			model: "m1", choices: 1, completion: 2, prompt: 5, finish: "length",
		},
		{
			name: "several messages, text parts, null content",
			body: `{"model":"m1","messages":[{"role":"system","content":"  be\tbrief\n"},` +
				`{"role":"user","content":[{"type":"text","text":"one two"},{"type":"image_url","image_url":{"url":"x y z"}},{"type":"text","text":"three"}]},` +
				`{"role":"assistant","content":null,"tool_calls":[]}]}`,
			model: "m1", choices: 1, completion: 3, prompt: (4 + 2) + (4 + 3) + 4, finish: "stop",
		},
		{
			name:  "n choices",
			body:  `{"model":"m1","n":3,"max_tokens":2,"messages":[{"role":"user","content":"x"}]}`,
			model: "m1", choices: 3, completion: 2, prompt: 5, finish: "length",
		},
		{
			name:  "no model echoes the default",
			body:  `{"messages":[{"role":"user","content":"x"}],"unknown_field":{"kept":true}}`,
			model: "sim", choices: 1, completion: 3, prompt: 5, finish: "stop",
		},
		{
			name:  "escaped model is echoed",
			body:  `{"model":"a\"b","messages":[],"stream":false}`,
			model: `a"b`, choices: 1, completion: 3, prompt: 0, finish: "stop",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, "POST", "/v1/chat/completions", tt.body)
			if r.status != 200 || r.contentType != "application/json" {
				t.Fatalf("status %d %q: %s", r.status, r.contentType, r.body)
			}
			v := mustJSON(t, string(r.body))
			checks := map[string]any{
				"object":                  "chat.completion",
				"model":                   tt.model,
				"choices.#":               int64(tt.choices),
				"usage.prompt_tokens":     int64(tt.prompt),
				"usage.completion_tokens": int64(tt.completion * tt.choices),
				"usage.total_tokens":      int64(tt.prompt + tt.completion*tt.choices),
				"usage.prompt_tokens_details.cached_tokens": int64(0),
			}
			for path, want := range checks {
				if got := v.Get(path).Value(); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s = %v, want %v", path, got, want)
				}
			}
			if !strings.HasPrefix(v.Get("id").Str, "chatcmpl-") || v.Get("created").Int() == 0 {
				t.Errorf("id %q created %d", v.Get("id").Str, v.Get("created").Int())
			}
			for i, c := range v.Get("choices").Array() {
				if c.Get("index").Int() != int64(i) || c.Get("message.role").Str != "assistant" ||
					c.Get("message.content").Str != content(tt.completion) ||
					c.Get("finish_reason").Str != tt.finish || c.Get("logprobs").Type != gjson.Null ||
					!c.Get("logprobs").Exists() {
					t.Errorf("choice %d: %s", i, c.Raw)
				}
			}
		})
	}
}

func TestPaths(t *testing.T) {
	h := start(t, Options{}, false)
	const body = `{"messages":[]}`
	tests := []struct {
		method, path string
		status       int
		want         string // a gjson path that must exist, or the exact body when it starts with "="
	}{
		{"POST", "/v1/chat/completions", 200, "choices"},
		{"POST", "/chat/completions", 200, "choices"},
		{"POST", "/v1/chat/completions/", 200, "choices"},
		{"GET", "/v1/chat/completions", 405, `={"detail":"Method Not Allowed"}`},
		{"GET", "/v1/models", 200, "data"},
		{"GET", "/models", 200, "data"},
		{"GET", "/health", 200, "="},
		{"POST", "/health", 405, `={"detail":"Method Not Allowed"}`},
		{"GET", "/v1/completions", 405, `={"detail":"Method Not Allowed"}`},
		{"GET", "/v1/audio/speech", 404, `={"detail":"Not Found"}`},
		{"PUT", "/v1/responses/resp_1", 405, `={"detail":"Method Not Allowed"}`},
		{"GET", "/v1/responses/resp_1/other", 404, `={"detail":"Not Found"}`},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			r := h.do(t, tt.method, tt.path, body)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			if exact, ok := strings.CutPrefix(tt.want, "="); ok {
				if string(r.body) != exact {
					t.Errorf("body %s, want %s", r.body, exact)
				}
			} else if !gjson.GetBytes(r.body, tt.want).Exists() {
				t.Errorf("no %s in %s", tt.want, r.body)
			}
		})
	}
	if got := h.srv.Stats().Requests; got != 3 {
		t.Errorf("Requests = %d, want 3: only chat completions count", got)
	}
}

func TestModels(t *testing.T) {
	tests := []struct {
		name   string
		models []string
		want   []string
	}{
		{"any model", nil, []string{"sim"}},
		{"listed", []string{"llama", "qwen"}, []string{"llama", "qwen"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, Options{Models: tt.models}, false)
			r := h.do(t, "GET", "/v1/models", "")
			v := mustJSON(t, string(r.body))
			if v.Get("object").Str != "list" {
				t.Errorf("object %q", v.Get("object").Str)
			}
			var ids []string
			for _, m := range v.Get("data").Array() {
				ids = append(ids, m.Get("id").Str)
				if m.Get("object").Str != "model" || m.Get("owned_by").Str != "tollgate-sim" || m.Get("created").Int() == 0 {
					t.Errorf("entry %s", m.Raw)
				}
			}
			if fmt.Sprint(ids) != fmt.Sprint(tt.want) {
				t.Errorf("ids %v, want %v", ids, tt.want)
			}
		})
	}
}

func TestValidation(t *testing.T) {
	h := start(t, Options{Models: []string{"served"}}, false)
	tests := []struct {
		name    string
		body    string
		status  int
		typ     string
		message string // substring
	}{
		{"not JSON", `{"messages":`, 400, "BadRequestError", "not valid JSON"},
		{"not an object", `[1]`, 400, "BadRequestError", "object"},
		{"no messages", `{"model":"served"}`, 400, "BadRequestError", "messages"},
		{"messages not an array", `{"messages":"hi"}`, 400, "BadRequestError", "messages"},
		{"message not an object", `{"messages":["hi"]}`, 400, "BadRequestError", "message"},
		{"max_tokens zero", `{"messages":[],"max_tokens":0}`, 400, "BadRequestError", "max_tokens"},
		{"max_tokens fractional", `{"messages":[],"max_tokens":1.5}`, 400, "BadRequestError", "max_tokens"},
		{"max_completion_tokens string", `{"messages":[],"max_completion_tokens":"3"}`, 400, "BadRequestError", "max_completion_tokens"},
		{"n zero", `{"messages":[],"n":0}`, 400, "BadRequestError", "n must"},
		{"stream not a bool", `{"messages":[],"stream":"yes"}`, 400, "BadRequestError", "stream"},
		{"stream_options without stream", `{"messages":[],"stream_options":{"include_usage":true}}`, 400, "BadRequestError", "stream=True"},
		{"context too long", `{"messages":[{"role":"user","content":"x"}],"max_tokens":131072,"model":"served"}`, 400, "BadRequestError", "maximum context length is 131072"},
		{"unknown model", `{"model":"gpt-9","messages":[]}`, 404, "NotFoundError", "The model `gpt-9` does not exist."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, "POST", "/v1/chat/completions", tt.body)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %.300s", r.status, tt.status, r.body)
			}
			v := mustJSON(t, string(r.body))
			if v.Get("error.type").Str != tt.typ || v.Get("error.code").Raw != fmt.Sprint(tt.status) ||
				!strings.Contains(v.Get("error.message").Str, tt.message) || !v.Get("error.param").Exists() {
				t.Errorf("body %s, want type %s, code %d, message containing %q", r.body, tt.typ, tt.status, tt.message)
			}
		})
	}
	s := h.srv.Stats()
	if n := int64(len(tests)); s.Requests != n || s.Completed != n || s.Cancelled != 0 {
		t.Errorf("stats %+v, want %d requests, all completed", s, n)
	}
}

func TestInjectedErrors(t *testing.T) {
	const body = `{"messages":[{"role":"user","content":"hi"}],"stream":true}`
	tests := []struct {
		name        string
		opts        Options
		headers     []string
		status      int
		contentType string
		body        string
	}{
		{
			name: "nested by default", headers: []string{"X-Mock-Status", "500"}, status: 500, contentType: "application/json",
			body: `{"error":{"message":"simulated failure","type":"BadRequestError","param":null,"code":500}}`,
		},
		{
			name: "nested", headers: []string{"X-Mock-Status", "429", "X-Mock-Error-Shape", "nested"}, status: 429, contentType: "application/json",
			body: `{"error":{"message":"simulated failure","type":"BadRequestError","param":null,"code":429}}`,
		},
		{
			name: "flat", headers: []string{"X-Mock-Status", "400", "X-Mock-Error-Shape", "flat"}, status: 400, contentType: "application/json",
			body: `{"object":"error","message":"simulated failure","type":"BadRequestError","param":null,"code":400}`,
		},
		{
			name: "bare", headers: []string{"X-Mock-Status", "401", "X-Mock-Error-Shape", "bare"}, status: 401, contentType: "application/json",
			body: `{"error":"Unauthorized"}`,
		},
		{
			name: "plain", headers: []string{"X-Mock-Status", "502", "X-Mock-Error-Shape", "plain"}, status: 502, contentType: "text/plain; charset=utf-8",
			body: `simulated failure`,
		},
		{
			name: "FailStatus option", opts: Options{FailStatus: 503}, status: 503, contentType: "application/json",
			body: `{"error":{"message":"simulated failure","type":"BadRequestError","param":null,"code":503}}`,
		},
		{
			name: "header overrides FailStatus", opts: Options{FailStatus: 503}, headers: []string{"X-Mock-Status", "504", "X-Mock-Error-Shape", "flat"},
			status: 504, contentType: "application/json",
			body: `{"object":"error","message":"simulated failure","type":"BadRequestError","param":null,"code":504}`,
		},
		{
			name: "garbage", headers: []string{"X-Mock-Garbage", "1"}, status: 200, contentType: "text/event-stream", body: garbageBody,
		},
		{
			name: "invalid status header", headers: []string{"X-Mock-Status", "abc"}, status: 400, contentType: "application/json",
			body: `{"error":{"message":"X-Mock-Status must be an HTTP status from 200 to 599 that allows a body","type":"BadRequestError","param":null,"code":400}}`,
		},
		{
			name: "invalid shape header", headers: []string{"X-Mock-Status", "500", "X-Mock-Error-Shape", "weird"}, status: 400, contentType: "application/json",
			body: `{"error":{"message":"X-Mock-Error-Shape must be one of nested, flat, bare, plain","type":"BadRequestError","param":null,"code":400}}`,
		},
		{
			name: "invalid delay header", headers: []string{"X-Mock-Delay", "soon"}, status: 400, contentType: "application/json",
			body: `{"error":{"message":"X-Mock-Delay must be a duration such as 2s or 150ms","type":"BadRequestError","param":null,"code":400}}`,
		},
		{
			name: "invalid fail-after header", headers: []string{"X-Mock-Fail-After", "-1"}, status: 400, contentType: "application/json",
			body: `{"error":{"message":"X-Mock-Fail-After and X-Mock-Break-After must be non-negative integers","type":"BadRequestError","param":null,"code":400}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, tt.opts, false)
			r := h.do(t, "POST", "/v1/chat/completions", body, tt.headers...)
			if r.status != tt.status || r.contentType != tt.contentType || string(r.body) != tt.body {
				t.Errorf("got %d %q %s\nwant %d %q %s", r.status, r.contentType, r.body, tt.status, tt.contentType, tt.body)
			}
			if s := h.srv.Stats(); s.Requests != 1 || s.Completed != 1 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

func TestFailStatusAppliesToEveryEndpoint(t *testing.T) {
	h := start(t, Options{FailStatus: 503}, false)
	for _, path := range []string{"/health", "/v1/models"} {
		if r := h.do(t, "GET", path, ""); r.status != 503 {
			t.Errorf("GET %s: status %d, want 503 so that health checks see the failure", path, r.status)
		}
	}
}

func TestDelayHeaderTimesOutClient(t *testing.T) {
	h := start(t, Options{}, false)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod("POST")
	req.SetRequestURI("http://sim/v1/chat/completions")
	req.Header.Set("X-Mock-Delay", "300ms")
	req.SetBodyString(`{"messages":[]}`)
	// The server cannot answer before its delay, so a client allowing less must time out.
	if err := h.client.DoTimeout(req, resp, 10*time.Millisecond); !errors.Is(err, fasthttp.ErrTimeout) {
		t.Fatalf("err = %v, want a timeout", err)
	}
}

// streamEvents parses chunk events; it fails the test on anything that is not a well-formed chunk
// of this stream.
func streamEvents(t *testing.T, events []string, model string) []gjson.Result {
	t.Helper()
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", events)
	}
	var chunks []gjson.Result
	for _, ev := range events[:len(events)-1] {
		c := mustJSON(t, ev)
		if c.Get("object").Str != "chat.completion.chunk" || c.Get("model").Str != model ||
			c.Get("id").Str != mustJSON(t, events[0]).Get("id").Str || !strings.HasPrefix(c.Get("id").Str, "chatcmpl-") {
			t.Fatalf("bad chunk %s", ev)
		}
		chunks = append(chunks, c)
	}
	return chunks
}

func TestStream(t *testing.T) {
	const messages = `"messages":[{"role":"user","content":"a b c"}]` // 7 prompt tokens
	tests := []struct {
		name       string
		body       string
		choices    int
		tokens     int
		finish     string
		usage      bool
		continuous bool
	}{
		{"plain", `{"model":"m","stream":true,` + messages + `}`, 1, 4, "stop", false, false},
		{"include_usage", `{"model":"m","stream":true,"max_tokens":3,"stream_options":{"include_usage":true},` + messages + `}`, 1, 3, "length", true, false},
		{"continuous_usage_stats", `{"model":"m","stream":true,"max_tokens":3,"stream_options":{"continuous_usage_stats":true},` + messages + `}`, 1, 3, "length", false, true},
		{"both", `{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},` + messages + `}`, 1, 4, "stop", true, true},
		{"n choices", `{"model":"m","stream":true,"n":2,"max_completion_tokens":2,"stream_options":{"include_usage":true},` + messages + `}`, 2, 2, "length", true, false},
	}
	for _, tcp := range []bool{false, true} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/tcp=%v", tt.name, tcp), func(t *testing.T) {
				h := start(t, Options{Tokens: 4}, tcp)
				s := h.openStream(t, tt.body)
				events, err := s.all()
				s.close()
				if err != nil {
					t.Fatalf("after %q: %v", events, err)
				}
				chunks := streamEvents(t, events, "m")

				// Expected layout: role chunks, token chunks, finish chunks, then the usage chunk.
				want := tt.choices + tt.tokens*tt.choices + tt.choices
				if tt.usage {
					want++
				}
				if len(chunks) != want {
					t.Fatalf("%d chunks, want %d: %q", len(chunks), want, events)
				}
				text := make([]string, tt.choices)
				for i, c := range chunks {
					choices := c.Get("choices").Array()
					if tt.usage && i == len(chunks)-1 {
						if len(choices) != 0 || c.Get("usage.completion_tokens").Int() != int64(tt.tokens*tt.choices) ||
							c.Get("usage.prompt_tokens").Int() != 7 || c.Get("usage.total_tokens").Int() != int64(7+tt.tokens*tt.choices) ||
							!c.Get("usage.prompt_tokens_details").Exists() {
							t.Errorf("usage chunk %s", c.Raw)
						}
						continue
					}
					if len(choices) != 1 {
						t.Fatalf("chunk %d has %d choices: %s", i, len(choices), c.Raw)
					}
					ch := choices[0]
					idx := ch.Get("index").Int()
					switch {
					case i < tt.choices:
						if ch.Get("delta").Raw != `{"role":"assistant","content":""}` || idx != int64(i) {
							t.Errorf("role chunk %s", c.Raw)
						}
					case i < tt.choices+tt.tokens*tt.choices:
						if ch.Get("finish_reason").Type != gjson.Null {
							t.Errorf("token chunk with finish_reason: %s", c.Raw)
						}
						text[idx] += ch.Get("delta.content").Str
					default:
						if ch.Get("delta").Raw != `{}` || ch.Get("finish_reason").Str != tt.finish {
							t.Errorf("finish chunk %s", c.Raw)
						}
					}
					usage := c.Get("usage")
					if usage.Exists() != tt.continuous {
						t.Errorf("chunk %d: usage present = %v, want %v", i, usage.Exists(), tt.continuous)
					}
				}
				for i, got := range text {
					if got != content(tt.tokens) {
						t.Errorf("choice %d text %q, want %q", i, got, content(tt.tokens))
					}
				}
				if tt.continuous {
					// Cumulative: the role chunk reports 0, each token chunk one more, the finish chunk all.
					for i, c := range chunks[:len(chunks)-btoi(tt.usage)] {
						wantCompletion := int64(min(max(i-tt.choices+1, 0), tt.tokens*tt.choices))
						if got := c.Get("usage.completion_tokens").Int(); got != wantCompletion ||
							c.Get("usage.total_tokens").Int() != 7+wantCompletion {
							t.Errorf("chunk %d usage %s, want completion %d", i, c.Get("usage").Raw, wantCompletion)
						}
					}
				}
				if st := h.srv.Stats(); st != (Stats{Requests: 1, Completed: 1}) {
					t.Errorf("stats %+v", st)
				}
			})
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestStreamEventsArriveOneAtATime reads the first token while the stream is still being
// generated: events are flushed as they are produced, not collected until the end.
func TestStreamEventsArriveOneAtATime(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		t.Run(fmt.Sprintf("tcp=%v", tcp), func(t *testing.T) {
			h := start(t, Options{InterTokenDelay: 200 * time.Millisecond, Tokens: 3}, tcp)
			s := h.openStream(t, `{"stream":true,"messages":[]}`)
			defer s.close()
			for i, want := range []string{`"role":"assistant"`, `"content":"tok0 "`} {
				ev, err := s.next()
				if err != nil || !strings.Contains(ev, want) {
					t.Fatalf("event %d = %q, %v; want it to contain %s", i, ev, err, want)
				}
			}
			if st := h.srv.Stats(); st.Completed != 0 {
				t.Fatalf("first token read only after the stream completed: %+v", st)
			}
			events, err := s.all()
			if err != nil || len(events) != 4 || events[3] != "[DONE]" {
				t.Fatalf("rest of stream %q, %v", events, err)
			}
		})
	}
}

// TestStreamCancelled checks that a client going away stops generation promptly and is counted.
func TestStreamCancelled(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		t.Run(fmt.Sprintf("tcp=%v", tcp), func(t *testing.T) {
			h := start(t, Options{InterTokenDelay: 20 * time.Millisecond, Tokens: 100000}, tcp)
			s := h.openStream(t, `{"stream":true,"messages":[]}`)
			for range 3 {
				if _, err := s.next(); err != nil {
					t.Fatal(err)
				}
			}
			s.close()
			deadline := time.Now().Add(time.Second)
			for h.srv.Stats().Cancelled == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if st := h.srv.Stats(); st != (Stats{Requests: 1, Cancelled: 1}) {
				t.Fatalf("stats %+v a second after the client went away, want it cancelled", st)
			}
		})
	}
}

func TestStreamFailAfter(t *testing.T) {
	tests := []struct {
		name      string
		failAfter string
		tokens    int // token events before the error; -1 for none
	}{
		{"after 3", "3", 3},
		{"after 0", "0", 0},
		{"never reached", "9", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, Options{Tokens: 5}, false)
			s := h.openStream(t, `{"model":"m","stream":true,"messages":[]}`, "X-Mock-Fail-After", tt.failAfter)
			events, err := s.all()
			s.close()
			if err != nil {
				t.Fatalf("%q: %v", events, err)
			}
			if tt.tokens < 0 {
				if len(events) != 1+5+1+1 {
					t.Fatalf("events %q, want a complete stream", events)
				}
				return
			}
			want := 1 + tt.tokens + 2 // role, tokens, error, [DONE]
			if len(events) != want {
				t.Fatalf("%d events, want %d: %q", len(events), want, events)
			}
			for _, ev := range events[1 : 1+tt.tokens] {
				if !strings.Contains(ev, `"delta":{"content":"tok`) {
					t.Errorf("not a token event: %s", ev)
				}
			}
			errEvent := mustJSON(t, events[len(events)-2])
			if errEvent.Raw != `{"error":{"message":"simulated mid-stream failure","type":"InternalServerError","code":500}}` {
				t.Errorf("error event %s", errEvent.Raw)
			}
			if st := h.srv.Stats(); st != (Stats{Requests: 1, Completed: 1}) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestStreamBreakAfter(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		t.Run(fmt.Sprintf("client/tcp=%v", tcp), func(t *testing.T) {
			h := start(t, Options{Tokens: 10}, tcp)
			s := h.openStream(t, `{"stream":true,"messages":[]}`, "X-Mock-Break-After", "3")
			events, err := s.all()
			s.close()
			// fasthttp's client reports a connection closed between chunks as a plain EOF, so the
			// only sign of truncation is the missing [DONE]; what matters is that nothing follows.
			if err == nil || len(events) != 4 {
				t.Fatalf("events %q, err %v; want role and 3 tokens, then the stream cut off", events, err)
			}
			for _, ev := range events {
				if strings.Contains(ev, "finish_reason\":\"") || ev == "[DONE]" {
					t.Errorf("unexpected %s in a broken stream", ev)
				}
			}
			if st := h.srv.Stats(); st != (Stats{Requests: 1, Completed: 1}) {
				t.Errorf("stats %+v", st)
			}
		})
	}

	// On the wire: the chunked body has no terminating chunk and the server closes the connection.
	t.Run("wire", func(t *testing.T) {
		h := start(t, Options{Tokens: 10}, true)
		c, err := h.dial()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const body = `{"stream":true,"messages":[]}`
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nX-Mock-Break-After: 2\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		raw, err := io.ReadAll(c) // returns when the server closes the connection
		if err != nil {
			t.Fatalf("read: %v after %q", err, raw)
		}
		head, chunked, _ := bytes.Cut(raw, []byte("\r\n\r\n"))
		if !bytes.Contains(head, []byte("Transfer-Encoding: chunked")) || !bytes.Contains(head, []byte("Connection: close")) {
			t.Errorf("headers %q", head)
		}
		if n := bytes.Count(chunked, []byte("data: ")); n != 3 || bytes.HasSuffix(chunked, []byte("0\r\n\r\n")) ||
			bytes.Contains(chunked, []byte("[DONE]")) {
			t.Errorf("body %q: want role and 2 tokens and no terminating chunk", chunked)
		}
	})
}

func TestLastRequest(t *testing.T) {
	h := start(t, Options{}, false)
	if body, header := h.srv.LastRequest(); body != nil || header != nil {
		t.Fatalf("LastRequest before any request = %q, %v", body, header)
	}
	const body = `{"messages":[{"role":"user","content":"remember me"}]}`
	h.do(t, "POST", "/v1/chat/completions", body, "X-Custom", "one", "Authorization", "Bearer upstream-key")
	h.do(t, "GET", "/health", "", "X-Custom", "health checks are not recorded")
	gotBody, header := h.srv.LastRequest()
	if string(gotBody) != body {
		t.Errorf("body %q", gotBody)
	}
	if header["X-Custom"] != "one" || header["Authorization"] != "Bearer upstream-key" || header["Content-Type"] != "application/json" {
		t.Errorf("header %v", header)
	}
	// The returned values are copies: the next request must not change them.
	h.do(t, "POST", "/v1/chat/completions", `{"messages":[]}`)
	if string(gotBody) != body || header["X-Custom"] != "one" {
		t.Errorf("LastRequest results changed under the caller: %q %v", gotBody, header)
	}
}

func TestShutdown(t *testing.T) {
	t.Run("waits for in-flight streams", func(t *testing.T) {
		h := start(t, Options{InterTokenDelay: 20 * time.Millisecond, Tokens: 10}, false)
		// An idle keep-alive connection must not hold Shutdown up.
		h.do(t, "GET", "/health", "")
		s := h.openStream(t, `{"stream":true,"messages":[]}`)
		defer s.close()
		if _, err := s.next(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		shutdownErr := make(chan error, 1)
		go func() {
			defer wg.Done()
			shutdownErr <- h.srv.Shutdown()
		}()
		events, err := s.all()
		if err != nil || events[len(events)-1] != "[DONE]" {
			t.Fatalf("stream cut by Shutdown: %q, %v", events, err)
		}
		wg.Wait()
		if err := <-shutdownErr; err != nil {
			t.Fatal(err)
		}
		if st := h.srv.Stats(); st != (Stats{Requests: 1, Completed: 1}) {
			t.Errorf("stats %+v", st)
		}
	})
	t.Run("Serve after Shutdown", func(t *testing.T) {
		s := New(Options{})
		if err := s.Shutdown(); err != nil {
			t.Fatal(err)
		}
		ln := fasthttputil.NewInmemoryListener()
		if err := s.Serve(ln); err == nil {
			t.Fatal("Serve after Shutdown returned nil")
		}
		if _, err := ln.Dial(); err == nil {
			t.Error("listener left open")
		}
	})
}

func TestCountWords(t *testing.T) {
	for _, s := range []string{"", " ", "a", " a b  c ", "tab\tand\nnewline", "non\u00a0breaking\u2003em space", "日本語 テキスト"} {
		if got, want := countWords(s), len(strings.Fields(s)); got != want {
			t.Errorf("countWords(%q) = %d, want %d", s, got, want)
		}
	}
}

// benchBody is a small but realistic request: a system and a user message, a model and a limit.
const benchBody = `{"model":"sim","max_tokens":16,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a haiku about gateways and tokens."}]}`

// BenchmarkNonStream measures a whole request through the in-memory listener, client included.
func BenchmarkNonStream(b *testing.B) {
	h := start(b, Options{}, false)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod("POST")
	req.SetRequestURI("http://sim/v1/chat/completions")
	req.Header.SetContentType("application/json")
	req.SetBodyString(benchBody)
	b.ReportAllocs()
	for b.Loop() {
		if err := h.client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			b.Fatal(err, resp.StatusCode())
		}
	}
}

// BenchmarkStream measures a 16-token stream with usage through the in-memory listener.
func BenchmarkStream(b *testing.B) {
	h := start(b, Options{}, false)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod("POST")
	req.SetRequestURI("http://sim/v1/chat/completions")
	req.Header.SetContentType("application/json")
	req.SetBodyString(`{"model":"sim","stream":true,"stream_options":{"include_usage":true},` + benchBody[len(`{"model":"sim",`):])
	b.ReportAllocs()
	for b.Loop() {
		if err := h.client.Do(req, resp); err != nil || !bytes.HasSuffix(resp.Body(), []byte("data: [DONE]\n\n")) {
			b.Fatal(err, string(resp.Body()))
		}
	}
}

// BenchmarkHandlerNonStream measures the server's own work, without connections or a client.
func BenchmarkHandlerNonStream(b *testing.B) {
	s := New(Options{})
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	for b.Loop() {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/v1/chat/completions")
		ctx.Request.Header.SetContentType("application/json")
		ctx.Request.SetBodyString(benchBody)
		s.Handler(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatal(string(ctx.Response.Body()))
		}
	}
}

// TestTimeToFirstToken checks where the delay goes. Non-streaming: before the reply, so a client
// allowing less time than the delay must time out. Streaming: after the headers, which the
// response is marked to flush at once, so clients measure the time to the first event.
func TestTimeToFirstToken(t *testing.T) {
	t.Run("non-stream", func(t *testing.T) {
		h := start(t, Options{TimeToFirstToken: 300 * time.Millisecond}, false)
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://sim/v1/chat/completions")
		req.SetBodyString(`{"messages":[]}`)
		if err := h.client.DoTimeout(req, resp, 10*time.Millisecond); !errors.Is(err, fasthttp.ErrTimeout) {
			t.Fatalf("err = %v, want a timeout", err)
		}
	})
	t.Run("stream", func(t *testing.T) {
		s := New(Options{TimeToFirstToken: time.Hour})
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/v1/chat/completions")
		ctx.Request.SetBodyString(`{"stream":true,"messages":[]}`)
		s.Handler(&ctx) // must not wait: the delay belongs to the first Read of the body stream
		if !ctx.Response.IsBodyStream() || !ctx.Response.ImmediateHeaderFlush {
			t.Fatalf("body stream %v, immediate header flush %v", ctx.Response.IsBodyStream(), ctx.Response.ImmediateHeaderFlush)
		}
		ctx.Response.Reset() // closes the unread stream, which counts as abandoned
		if st := s.Stats(); st != (Stats{Requests: 1, Cancelled: 1}) {
			t.Errorf("stats %+v", st)
		}
	})
}

// TestConcurrentStreams runs streams side by side, so that the race detector sees pooled stream
// state and shared counters used concurrently, and checks that no stream sees another's events.
func TestConcurrentStreams(t *testing.T) {
	h := start(t, Options{Tokens: 8, InterTokenDelay: time.Millisecond}, false)
	const workers, each = 8, 5
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				s, err := h.tryOpenStream(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`)
				if err != nil {
					t.Error(err)
					continue
				}
				events, err := s.all()
				s.close()
				if err != nil {
					t.Error(err)
					continue
				}
				id := gjson.Get(events[0], "id").Str
				var text string
				for _, ev := range events[:len(events)-1] {
					if gjson.Get(ev, "id").Str != id {
						t.Errorf("event of another stream: %s", ev)
					}
					text += gjson.Get(ev, "choices.0.delta.content").Str
				}
				if text != content(8) || len(events) != 1+8+1+1+1 {
					t.Errorf("stream %s: text %q, %d events", id, text, len(events))
				}
			}
		})
	}
	wg.Wait()
	if st := h.srv.Stats(); st != (Stats{Requests: workers * each, Completed: workers * each}) {
		t.Errorf("stats %+v", st)
	}
}
