package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/config"
)

// The tests in this file send the gateway hostile or broken input, from the
// client side and from the upstream side, through real HTTP. For each input
// they check two things: the answer (its status, and the OpenAI error shape
// with a message, or for a stream already under way an in-band error event
// followed by [DONE]), and that the gateway keeps serving: a normal request
// right after succeeds.

// assertOpenAIError fails unless r is an OpenAI-shaped error with status:
// {"error":{"message":"...","type":"...","param":...,"code":...}}, with a
// non-empty message and type and param and code present (null or a string).
func assertOpenAIError(t *testing.T, r response, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d: %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("content type %q, want application/json", ct)
	}
	if !gjson.ValidBytes(r.body) {
		t.Fatalf("error body is not JSON: %q", r.body)
	}
	e := r.json("error")
	if !e.IsObject() {
		t.Fatalf("no error object: %s", r.body)
	}
	if m := e.Get("message"); m.Type != gjson.String || m.Str == "" {
		t.Errorf("error.message missing or empty: %s", r.body)
	}
	if typ := e.Get("type"); typ.Type != gjson.String || typ.Str == "" {
		t.Errorf("error.type missing or empty: %s", r.body)
	}
	for _, k := range []string{"param", "code"} {
		if v := e.Get(k); !v.Exists() || (v.Type != gjson.Null && v.Type != gjson.String) {
			t.Errorf("error.%s must be present, null or a string: %s", k, r.body)
		}
	}
}

// assertInBandError fails unless r is a 200 event stream that ends with an
// error event (OpenAI shape, non-empty message) and then [DONE].
func assertInBandError(t *testing.T, r response) {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status = %d, want 200 (the stream had started): %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q, want an event stream", ct)
	}
	events := readEvents(t, bufio.NewReader(bytes.NewReader(r.body)))
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream must end with an error event and [DONE]: %q", r.body)
	}
	errEvent := events[len(events)-2]
	if m := gjson.Get(errEvent, "error.message"); m.Type != gjson.String || m.Str == "" {
		t.Fatalf("last event before [DONE] is not an error with a message: %s", errEvent)
	}
	if typ := gjson.Get(errEvent, "error.type"); typ.Str == "" {
		t.Errorf("in-band error without a type: %s", errEvent)
	}
}

// assertStillServing sends a normal request and fails unless it succeeds:
// whatever came before did not break the gateway.
func assertStillServing(t *testing.T, h *harness) {
	t.Helper()
	r := h.post(helloBody)
	if r.status != 200 || r.json("choices.0.message.content").String() == "" {
		t.Fatalf("the gateway stopped serving: a normal request got %d %s", r.status, r.body)
	}
}

// serverDefaults returns the server limits a config without a server
// section gets, which are the harness's.
func serverDefaults(t *testing.T) config.Server {
	t.Helper()
	cfg, err := config.Parse([]byte("auth: {keys: [{name: k, key: sk-12345678}]}\nbackends: [{name: s, simulated: {}}]\nmodels: [{name: m, backends: [s]}]\n"), "defaults.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Server
}

// exchangeRaw writes raw bytes to the gateway on a fresh connection and
// reads one response, so that a test can send what an HTTP client would
// refuse to (or could not finish) sending.
func exchangeRaw(t *testing.T, h *harness, raw string) response {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// The gateway may answer and close before reading everything; a
	// failed write is then expected, and the answer is what counts.
	_, _ = io.WriteString(conn, raw)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no HTTP response: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: body}
}

// TestHostileBodies sends malformed, ambiguous and oversized-number bodies,
// and bodies under a wrong content type: each gets a 400 (415 for the
// content type) before anything reaches the backend.
func TestHostileBodies(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name    string
		body    string
		headers []string
		status  int
		param   string // the expected error.param, when the error names one
	}{
		{"truncated JSON", `{"model":"demo",` + msgs, nil, 400, ""},
		{"not JSON at all", `model=demo&messages=hi`, nil, 400, ""},
		{"trailing garbage", `{"model":"demo",` + msgs + `} x`, nil, 400, ""},
		{"trailing comma", `{"model":"demo",` + msgs + `,}`, nil, 400, ""},
		{"single quotes", `{'model':'demo'}`, nil, 400, ""},
		{"NaN", `{"model":"demo",` + msgs + `,"temperature":NaN}`, nil, 400, ""},
		{"a JSON array", `[{"model":"demo",` + msgs + `}]`, nil, 400, ""},
		{"a JSON string", `"hello"`, nil, 400, ""},
		{"null", `null`, nil, 400, ""},
		{"empty body", ``, nil, 400, ""},
		{"whitespace body", " \r\n\t ", nil, 400, ""},
		{"nested a million levels deep", strings.Repeat("[", 1<<20), nil, 400, ""},
		{"unterminated string", `{"model":"demo` + strings.Repeat("x", 10000), nil, 400, ""},
		{"NUL byte", "{\"model\":\"demo\",\x00" + msgs + "}", nil, 400, ""},
		{"invalid UTF-8 in a message content", `{"model":"demo","messages":[{"role":"user","content":"caf` + "\xc3\x28\xff" + `"}]}`, nil, 400, ""},
		{"invalid UTF-8 in a key", `{"model":"demo",` + msgs + `,"x` + "\xfe" + `":1}`, nil, 400, ""},
		{"lone surrogate escape is valid JSON", `{"model":"demo","messages":[{"role":"user","content":"\ud800"}],"max_tokens":1}`, nil, 200, ""},
		{"duplicate temperature", `{"model":"demo",` + msgs + `,"temperature":1,"temperature":1}`, nil, 400, "temperature"},
		{"duplicate messages", `{"model":"demo",` + msgs + `,` + msgs + `}`, nil, 400, "messages"},
		{"duplicate model", `{"model":"demo","model":"demo",` + msgs + `}`, nil, 400, "model"},
		{"duplicate stream spelled with an escape", `{"model":"demo",` + msgs + `,"stream":false,"str\u0065am":true}`, nil, 400, "stream"},
		{"huge float max_tokens", `{"model":"demo",` + msgs + `,"max_tokens":1e400}`, nil, 400, "max_tokens"},
		{"huge integer max_tokens", `{"model":"demo",` + msgs + `,"max_tokens":99999999999999999999999}`, nil, 400, "max_tokens"},
		{"huge integer seed", `{"model":"demo",` + msgs + `,"seed":99999999999999999999999}`, nil, 400, "seed"},
		{"huge negative seed", `{"model":"demo",` + msgs + `,"seed":-99999999999999999999999}`, nil, 400, "seed"},
		{"huge float temperature", `{"model":"demo",` + msgs + `,"temperature":1e400}`, nil, 400, "temperature"},
		{"huge n", `{"model":"demo",` + msgs + `,"n":99999999999999999999999}`, nil, 400, "n"},
		{"huge priority", `{"model":"demo",` + msgs + `,"priority":1e400}`, nil, 400, "priority"},
		{"huge top_logprobs", `{"model":"demo",` + msgs + `,"logprobs":true,"top_logprobs":99999999999999999999999}`, nil, 400, "top_logprobs"},
		{"huge stop_token_ids element", `{"model":"demo",` + msgs + `,"stop_token_ids":[99999999999999999999999]}`, nil, 400, "stop_token_ids[0]"},
		{"wrong content type", helloBody, []string{"Content-Type: text/plain"}, 415, ""},
		{"form content type", helloBody, []string{"Content-Type: application/x-www-form-urlencoded"}, 415, ""},
		{"no content type", helloBody, []string{"Content-Type:"}, 415, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.sim.Stats().Requests
			r := h.post(tt.body, tt.headers...)
			if tt.status == 200 {
				if r.status != 200 {
					t.Fatalf("status = %d, want 200: %s", r.status, r.body)
				}
			} else {
				assertOpenAIError(t, r, tt.status)
				if tt.param != "" && r.json("error.param").String() != tt.param {
					t.Errorf("error.param = %q, want %q: %s", r.json("error.param").String(), tt.param, r.body)
				}
				if h.sim.Stats().Requests != before {
					t.Errorf("a refused request reached the backend")
				}
			}
			assertStillServing(t, h)
		})
	}
}

// TestHostileFieldTypes sends, for every top-level field of the chat
// completion request in the service API spec, a value of the wrong type,
// and expects a 400 naming that field, before anything reaches a backend.
func TestHostileFieldTypes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	// Each field of the spec's chat completion request table, with a
	// value of a type it does not accept.
	wrong := []struct{ field, value string }{
		{"messages", `{"role":"user","content":"hi"}`},
		{"model", `42`},
		{"frequency_penalty", `"0"`},
		{"logit_bias", `[1,2]`},
		{"logprobs", `"true"`},
		{"top_logprobs", `"2"`},
		{"max_tokens", `"5"`},
		{"max_completion_tokens", `5.5`},
		{"n", `"1"`},
		{"presence_penalty", `{}`},
		{"response_format", `"json"`},
		{"seed", `"7"`},
		{"stop", `42`},
		{"stream", `"yes"`},
		{"stream_options", `"usage"`},
		{"temperature", `"hot"`},
		{"top_p", `[]`},
		{"tools", `"x"`},
		{"tool_choice", `{"type":"function"}`},
		{"reasoning_effort", `3`},
		{"include_reasoning", `"no"`},
		{"parallel_tool_calls", `0`},
		{"user", `{"id":1}`},
		{"use_beam_search", `null`},
		{"top_k", `"5"`},
		{"min_p", `"0"`},
		{"repetition_penalty", `true`},
		{"length_penalty", `"1"`},
		{"stop_token_ids", `"1,2"`},
		{"include_stop_str_in_output", `1`},
		{"ignore_eos", `"false"`},
		{"min_tokens", `0.5`},
		{"skip_special_tokens", `[]`},
		{"spaces_between_special_tokens", `{}`},
		{"truncate_prompt_tokens", `"10"`},
		{"prompt_logprobs", `"1"`},
		{"allowed_token_ids", `7`},
		{"bad_words", `"x"`},
		{"echo", `"true"`},
		{"add_generation_prompt", `1`},
		{"continue_final_message", `"yes"`},
		{"add_special_tokens", `null`},
		{"documents", `"doc"`},
		{"chat_template", `[]`},
		{"chat_template_kwargs", `"x"`},
		{"mm_processor_kwargs", `1`},
		{"structured_outputs", `"x"`},
		{"priority", `"1"`},
		{"request_id", `7`},
		{"return_tokens_as_token_ids", `"x"`},
		{"return_token_ids", `1`},
		{"cache_salt", `{}`},
		{"kv_transfer_params", `[]`},
		{"engine_xargs", `"x"`},
		{"repetition_detection", `0`},
	}
	for _, w := range wrong {
		t.Run(w.field, func(t *testing.T) {
			var body string
			switch w.field {
			case "messages":
				body = `{"model":"demo","messages":` + w.value + `}`
			case "model":
				body = `{"model":` + w.value + `,"messages":[{"role":"user","content":"hi"}]}`
			default:
				body = `{"model":"demo","messages":[{"role":"user","content":"hi"}],"` + w.field + `":` + w.value + `}`
			}
			before := h.sim.Stats().Requests
			r := h.post(body)
			assertOpenAIError(t, r, 400)
			if got := r.json("error.param").String(); got != w.field {
				t.Errorf("error.param = %q, want %q: %s", got, w.field, r.body)
			}
			if r.json("error.type").String() != "invalid_request_error" {
				t.Errorf("error.type = %q: %s", r.json("error.type").String(), r.body)
			}
			if h.sim.Stats().Requests != before {
				t.Errorf("a refused request reached the backend")
			}
			assertStillServing(t, h)
		})
	}
}

// TestHostileTransport sends requests that fasthttp itself refuses before
// the handler runs: headers over server.max_header_bytes (431), a body over
// server.max_body_bytes (413, announced and never sent), and requests that
// are not HTTP (400), each answered in the OpenAI error shape.
func TestHostileTransport(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	limits := serverDefaults(t)
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer " + testKey + "\r\nContent-Type: application/json\r\n"
	withBody := func(extra string) string {
		return head + extra + fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(helloBody), helloBody)
	}
	tests := []struct {
		name   string
		raw    string
		status int
	}{
		{"one header over max_header_bytes", withBody("X-Big: " + strings.Repeat("a", limits.MaxHeaderBytes+1024) + "\r\n"), 431},
		{"many headers over max_header_bytes", withBody(strings.Repeat("X-Many: "+strings.Repeat("b", 100)+"\r\n", limits.MaxHeaderBytes/100+10)), 431},
		{"request line over max_header_bytes", "POST /v1/chat/completions?" + strings.Repeat("q", limits.MaxHeaderBytes+1024) + " HTTP/1.1\r\nHost: g\r\n\r\n", 431},
		{"body over max_body_bytes", head + fmt.Sprintf("Content-Length: %d\r\n\r\n{", limits.MaxBodyBytes+1), 413},
		{"a request line that is not HTTP", "HELLO\r\n\r\n", 400},
		{"negative content length", head + "Content-Length: -5\r\n\r\n", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.sim.Stats().Requests
			assertOpenAIError(t, exchangeRaw(t, h, tt.raw), tt.status)
			if h.sim.Stats().Requests != before {
				t.Errorf("a refused request reached the backend")
			}
			assertStillServing(t, h)
		})
	}
	// A malformed request is refused without quoting it: the answer (and
	// whatever logs it on the way) must not carry the client's key.
	t.Run("refusal does not echo the request headers", func(t *testing.T) {
		r := exchangeRaw(t, h, head+"Content-Length: -5\r\n\r\n")
		assertOpenAIError(t, r, 400)
		if bytes.Contains(r.body, []byte(testKey)) {
			t.Errorf("the answer echoes the client's API key: %s", r.body)
		}
	})
	// A body just under the limit is read and validated, not refused at
	// the transport: the limit is the limit.
	t.Run("body at max_body_bytes", func(t *testing.T) {
		filler := strings.Repeat("x", limits.MaxBodyBytes-len(helloBody)-len(`,"pad":""`))
		body := strings.TrimSuffix(helloBody, "}") + `,"pad":"` + filler + `"}`
		if len(body) != limits.MaxBodyBytes {
			t.Fatalf("body is %d bytes, want %d", len(body), limits.MaxBodyBytes)
		}
		if r := h.post(body); r.status != 200 {
			t.Fatalf("a body of exactly max_body_bytes got %d: %.300s", r.status, r.body)
		}
		assertStillServing(t, h)
	})
}

// cutBackend is an upstream that answers every request with 200 and a
// Content-Length it does not honour: it closes the connection mid-body.
type cutBackend struct {
	ln net.Listener
	wg sync.WaitGroup
}

func startCutBackend(t *testing.T) *cutBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &cutBackend{ln: ln}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // closed by the cleanup
			}
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"+
					`{"id":"chatcmpl-1","object":"chat.completion","model":"demo","choices":[{"index":0,"message":{"role":"assi`)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.wg.Wait()
	})
	return b
}

// TestHostileUpstreams checks what the client gets when the backend
// misbehaves: a stream broken off, a stream of garbage, a non-streamed
// reply cut mid-body, and a backend that does not answer within its
// first-byte timeout.
func TestHostileUpstreams(t *testing.T) {
	cut := startCutBackend(t)
	h := newHarness(t, harnessOptions{
		backendExtra:  "timeouts: {first_byte: 600ms}",
		extraBackends: "  - name: cut\n    url: \"http://" + cut.ln.Addr().String() + "/v1\"\n",
		models: `
  - name: demo
    backends: [sim]
  - name: cut
    backends: [cut]
`,
	})
	const stream = `{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"stream":true}`
	tests := []struct {
		name    string
		body    string
		headers []string
		status  int  // for non-stream answers
		inBand  bool // a 200 stream ending in an error event and [DONE]
	}{
		{name: "stream broken off after two tokens", body: stream, headers: []string{"X-Mock-Break-After: 2"}, inBand: true},
		{name: "stream broken off before any token", body: stream, headers: []string{"X-Mock-Break-After: 0"}, inBand: true},
		{name: "stream of garbage", body: stream, headers: []string{"X-Mock-Garbage: 1"}, inBand: true},
		{name: "in-band error from the backend", body: stream, headers: []string{"X-Mock-Fail-After: 1"}, inBand: true},
		{name: "non-stream reply of garbage", body: helloBody, headers: []string{"X-Mock-Garbage: 1"}, status: 502},
		{name: "non-stream reply cut mid-body", body: strings.Replace(helloBody, `"demo"`, `"cut"`, 1), status: 502},
		{name: "backend never answers", body: helloBody, headers: []string{"X-Mock-Delay: 2s"}, status: 504},
		{name: "stream backend never answers", body: stream, headers: []string{"X-Mock-Delay: 2s"}, status: 504},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.post(tt.body, tt.headers...)
			if tt.inBand {
				assertInBandError(t, r)
			} else {
				assertOpenAIError(t, r, tt.status)
			}
			assertStillServing(t, h)
		})
	}
}

// TestHostileHugeEstimate sends a max_completion_tokens so large that the
// gateway's token estimate (prompt + max_tokens × n) overflows int64. The
// limiter must still refuse it against a tokens-per-minute limit, as it
// refuses any request that may use more than the limit, before it reaches
// the backend.
func TestHostileHugeEstimate(t *testing.T) {
	h := newHarness(t, harnessOptions{limits: []config.Limit{{Team: "acme", TPM: 1000}}})
	for _, extra := range []string{
		`"max_completion_tokens":5000`,
		`"max_completion_tokens":9223372036854775807`,
		`"max_tokens":4611686018427387904,"n":2`,
	} {
		t.Run(extra, func(t *testing.T) {
			before := h.sim.Stats().Requests
			r := h.post(`{"model":"demo","messages":[{"role":"user","content":"hi"}],` + extra + `}`)
			assertOpenAIError(t, r, 429)
			if h.sim.Stats().Requests != before {
				t.Errorf("a request over the TPM limit reached the backend")
			}
		})
	}
}
