package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/proxy"
)

// upstreamCall is one request a fake upstream received.
type upstreamCall struct {
	method, path, query string
	body                string
}

// fakeUpstream is an OpenAI-compatible backend speaking completions,
// embeddings and the Responses API with fixed usage, which records every
// request it receives. Its responses live in its own memory, as vLLM's do:
// another fakeUpstream does not know them.
type fakeUpstream struct {
	name string
	srv  *http.Server
	url  string

	mu    sync.Mutex
	calls []upstreamCall
	// responses holds each stored response's input, by id; running the
	// background responses still running (until cancelled).
	responses map[string]string
	running   map[string]bool
	next      int
}

func newFakeUpstream(t *testing.T, name string) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{name: name, responses: map[string]string{}, running: map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.url = "http://" + ln.Addr().String() + "/v1"
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.srv.Serve(ln) //nolint:errcheck // ends with ErrServerClosed
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.srv.Shutdown(ctx) //nolint:errcheck // the listener is gone either way
		<-done
	})
	return f
}

func (f *fakeUpstream) received() []upstreamCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]upstreamCall(nil), f.calls...)
}

func (f *fakeUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/metrics" {
		// The scheduler's metrics poller, not a request the gateway
		// forwarded: this upstream is no vLLM, so it has none to give.
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.calls = append(f.calls, upstreamCall{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, body: string(body)})
	f.mu.Unlock()
	req := gjson.ParseBytes(body)
	model := req.Get("model").String()
	switch {
	case r.URL.Path == "/v1/completions":
		if req.Get("stream").Bool() {
			events := []string{
				fmt.Sprintf(`{"id":"cmpl-1","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":"Hel","logprobs":null,"finish_reason":null}]}`, model),
				fmt.Sprintf(`{"id":"cmpl-1","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":"lo","logprobs":null,"finish_reason":"length"}]}`, model),
			}
			if req.Get("stream_options.include_usage").Bool() {
				events = append(events, fmt.Sprintf(`{"id":"cmpl-1","object":"text_completion","created":1,"model":%q,"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`, model))
			}
			f.stream(w, "", events, true)
			return
		}
		reply(w, 200, fmt.Sprintf(`{"id":"cmpl-1","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":"Hello","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`, model))
	case r.URL.Path == "/v1/embeddings":
		vector := `[0.25,-0.5]`
		if req.Get("encoding_format").String() == "base64" {
			vector = `"AACAPgAAAL8="` // float32 little-endian 0.25, -0.5
		}
		reply(w, 200, fmt.Sprintf(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":%s}],"model":%q,"usage":{"prompt_tokens":4,"total_tokens":4}}`, vector, model))
	case r.URL.Path == "/v1/responses" && r.Method == http.MethodPost:
		if prev := req.Get("previous_response_id").String(); prev != "" && !f.has(prev) {
			reply(w, 404, fmt.Sprintf(`{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":null,"code":404}}`, prev))
			return
		}
		id := f.create(req)
		resp := func(status, usage string) string {
			return fmt.Sprintf(`{"id":%q,"object":"response","created_at":1,"model":%q,"status":%q,"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi"}]}],"usage":%s}`, id, model, status, usage)
		}
		usage := `{"input_tokens":7,"input_tokens_details":{"cached_tokens":1},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":9}`
		if req.Get("input").String() == "bad usage" {
			usage = `{"input_tokens":-7,"output_tokens":2,"total_tokens":9}`
		}
		if req.Get("stream").Bool() {
			switch req.Get("input").String() {
			case "break": // the backend dies mid-stream
				f.stream(w, "response.", []string{
					`{"type":"response.created","sequence_number":0,"response":` + resp("in_progress", "null") + `}`,
					`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"H"}`,
				}, false)
				return
			case "fail": // an in-band error naming an internal host
				f.stream(w, "response.", []string{
					`{"type":"response.created","sequence_number":0,"response":` + resp("in_progress", "null") + `}`,
					`{"type":"error","sequence_number":1,"code":"server_error","message":"engine at 10.1.2.3:8000 died","param":null}`,
				}, false)
				return
			}
			f.stream(w, "response.", []string{
				`{"type":"response.created","sequence_number":0,"response":` + resp("in_progress", "null") + `}`,
				`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"H"}`,
				`{"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"i"}`,
				`{"type":"response.completed","sequence_number":3,"response":` + resp("completed", usage) + `}`,
			}, false)
			return
		}
		if req.Get("background").Bool() && req.Get("input").String() == "long" {
			// A background response that runs until cancelled.
			f.mu.Lock()
			f.running[id] = true
			f.mu.Unlock()
			reply(w, 200, resp("queued", "null"))
			return
		}
		reply(w, 200, resp("completed", usage))
	case strings.HasPrefix(r.URL.Path, "/v1/responses/"):
		id, sub, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/responses/"), "/")
		if !f.has(id) {
			reply(w, 404, fmt.Sprintf(`{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":null,"code":404}}`, id))
			return
		}
		switch {
		case r.Method == http.MethodDelete:
			f.mu.Lock()
			delete(f.responses, id)
			f.mu.Unlock()
			reply(w, 200, fmt.Sprintf(`{"id":%q,"object":"response","deleted":true}`, id))
		case sub == "cancel":
			f.mu.Lock()
			delete(f.running, id)
			f.mu.Unlock()
			reply(w, 200, fmt.Sprintf(`{"id":%q,"object":"response","status":"cancelled","backend":%q}`, id, f.name))
		case r.URL.Query().Get("stream") == "true": // a background response's events, replayed
			delta := fmt.Sprintf(`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"%s"}`, f.name)
			switch r.URL.Query().Get("starting_after") {
			case "huge": // an event no SSE stream has: 64 KiB in one delta
				f.stream(w, "response.", []string{delta,
					`{"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"` + strings.Repeat("x", 64<<10) + `"}`,
				}, false)
				return
			case "cut": // the replay breaks off in the middle of an event
				f.stream(w, "response.", []string{delta}, false)
				io.WriteString(w, "event: response.output_text.delta\ndata: {\"type\":") //nolint:errcheck // the client may have left
				return
			}
			f.stream(w, "response.", []string{delta,
				fmt.Sprintf(`{"type":"response.completed","sequence_number":2,"response":{"id":%q,"object":"response","model":"up/demo","status":"completed"}}`, id),
			}, false)
		default:
			status := "completed"
			f.mu.Lock()
			if f.running[id] {
				status = "in_progress"
			}
			f.mu.Unlock()
			reply(w, 200, fmt.Sprintf(`{"id":%q,"object":"response","status":%q,"model":"up/demo","backend":%q,"input":%q}`, id, status, f.name, f.input(id)))
		}
	default:
		reply(w, 404, `{"detail":"Not Found"}`)
	}
}

func (f *fakeUpstream) has(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.responses[id]
	return ok
}

func (f *fakeUpstream) input(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.responses[id]
}

// create names the response req makes and stores it, as vLLM does: after
// the request's request_id when it has one, and unless store is false (a
// response stored under an id already in use replaces it). metadata.reply_id
// stands for a backend that names its responses as it likes: the reply
// carries that id, and nothing is stored.
func (f *fakeUpstream) create(req gjson.Result) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id := req.Get("metadata.reply_id").String(); id != "" {
		return id
	}
	f.next++
	id := fmt.Sprintf("resp_%s%d", f.name, f.next)
	if rid := req.Get("request_id").String(); rid != "" {
		id = rid
	}
	if s := req.Get("store"); !s.Exists() || s.Bool() {
		f.responses[id] = req.Get("input").String()
	}
	return id
}

// stream writes events as SSE; named events get an "event:" line with
// their type (prefix says which are), and done closes with [DONE].
func (f *fakeUpstream) stream(w http.ResponseWriter, prefix string, events []string, done bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	for _, ev := range events {
		if prefix != "" {
			fmt.Fprintf(w, "event: %s\n", gjson.Get(ev, "type").String())
		}
		fmt.Fprintf(w, "data: %s\n\n", ev)
		w.(http.Flusher).Flush()
	}
	if done {
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

func reply(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body) //nolint:errcheck // the client may have left
}

// surface is a gateway in front of two fake upstreams, a and b. Model demo
// is served by both under the upstream id up/demo; model embed only serves
// embeddings, on a.
type surface struct {
	t        *testing.T
	a, b     *fakeUpstream
	base     string
	recorder *recorder
	gw       *proxy.Server
	cfg      *config.Config
	metrics  *prometheus.Registry
	// reg is the registry in use; reload replaces it.
	reg *backends.Registry
}

// newSurface starts the gateway; extra is YAML appended to its
// configuration (limits, for example).
func newSurface(t *testing.T, extra ...string) *surface {
	t.Helper()
	checkLeaks(t)
	s := &surface{t: t, a: newFakeUpstream(t, "a"), b: newFakeUpstream(t, "b"), recorder: newRecorder(), metrics: prometheus.NewRegistry()}
	yaml := fmt.Sprintf(`
listen: "127.0.0.1:0"
auth:
  keys:
    - name: acme-key
      key: %q
      teams: [acme]
      default_team: acme
    - name: rival-key
      key: %q
      teams: [rival]
      default_team: rival
    - name: ops-key
      key: %q
      teams: ["*"]
      default_team: ops
backends:
  - name: a
    url: %q
  - name: b
    url: %q
models:
  - name: demo
    upstream_model: up/demo
    backends: [a, b]
  - name: embed
    backends: [a]
    endpoints: [embeddings]
%s
`, testKey, rivalKey, opsKey, s.a.url, s.b.url, strings.Join(extra, "\n"))
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	reg, err := backends.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.NewKeyring(cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := proxy.New(proxy.Options{Config: cfg, Registry: reg, Keys: keys, Recorder: s.recorder,
		Limiter: accounting.NewLimiter(cfg.Limits, time.Now), Metrics: s.metrics})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ln, proxy.OwnRouter(gw, nil)) }()
	s.base = "http://" + ln.Addr().String()
	s.gw, s.cfg, s.reg = gw, cfg, reg
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
		<-done
		if err := s.reg.Close(); err != nil {
			t.Errorf("registry close: %v", err)
		}
	})
	return s
}

// do sends a request with the test key and reads the whole reply.
func (s *surface) do(method, path, body string) response {
	s.t.Helper()
	return s.doAs(testKey, method, path, body)
}

// Keys of the surface besides testKey (team acme): one of team rival, one
// of every team.
const (
	rivalKey = "sk-test-key-rival"
	opsKey   = "sk-test-key-ops"
)

// doAs is do with another key.
func (s *surface) doAs(key, method, path, body string) response {
	s.t.Helper()
	req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// upstreamCalls is every request both upstreams received.
func (s *surface) upstreamCalls() []upstreamCall {
	return append(s.a.received(), s.b.received()...)
}

// wantOpenAIError checks an OpenAI-shaped error with this status and code.
func wantOpenAIError(t *testing.T, r response, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	e := r.json("error")
	if !e.IsObject() || e.Get("message").String() == "" || !e.Get("type").Exists() || !e.Get("param").Exists() || !e.Get("code").Exists() {
		t.Fatalf("not the OpenAI error shape: %s", r.body)
	}
	if code != "" && e.Get("code").String() != code {
		t.Fatalf("code %q, want %q: %s", e.Get("code").String(), code, r.body)
	}
	if strings.Contains(string(r.body), `"detail"`) {
		t.Fatalf("FastAPI shape under /v1: %s", r.body)
	}
}

func TestModelRetrieve(t *testing.T) {
	s := newSurface(t)
	list := s.do(http.MethodGet, "/v1/models", "")
	one := s.do(http.MethodGet, "/v1/models/demo", "")
	if one.status != 200 {
		t.Fatalf("GET /v1/models/demo: %d %s", one.status, one.body)
	}
	var entry map[string]any
	if err := json.Unmarshal(one.body, &entry); err != nil {
		t.Fatal(err)
	}
	listed := list.json(`data.#(id=="demo")`)
	var want map[string]any
	if err := json.Unmarshal([]byte(listed.Raw), &want); err != nil {
		t.Fatalf("demo not in the list: %s", list.body)
	}
	if fmt.Sprint(entry) != fmt.Sprint(want) || entry["object"] != "model" || entry["owned_by"] != "tollgate" {
		t.Errorf("model object %v, want the list entry %v", entry, want)
	}
	wantOpenAIError(t, s.do(http.MethodGet, "/v1/models/up/demo", ""), 404, "model_not_found")
	wantOpenAIError(t, s.do(http.MethodGet, "/v1/models/nope", ""), 404, "model_not_found")
}

func TestUnknownV1PathsAnswerOpenAIShape(t *testing.T) {
	s := newSurface(t)
	for _, tt := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/v1/nope", 404, ""},
		{http.MethodPost, "/v1/audio/speech", 404, ""},
		{http.MethodGet, "/v1/", 404, ""},
		{http.MethodGet, "/v1/chat/completions", 405, "POST"},
		{http.MethodPost, "/v1/models", 405, "GET"},
		{http.MethodDelete, "/v1/models/demo", 405, "GET"},
		{http.MethodGet, "/v1/embeddings", 405, "POST"},
		{http.MethodGet, "/v1/completions", 405, "POST"},
		{http.MethodPut, "/v1/responses/resp_x", 405, "GET, DELETE"},
		{http.MethodGet, "/v1/responses/resp_x/cancel", 405, "POST"},
	} {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			r := s.do(tt.method, tt.path, "")
			wantOpenAIError(t, r, tt.status, "")
			if got := r.header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
		})
	}
	if n := len(s.upstreamCalls()); n != 0 {
		t.Errorf("upstreams received %d requests, want 0", n)
	}
}

func TestCompletionsRouting(t *testing.T) {
	s := newSurface(t)
	body := `{"model":"demo","prompt":"Say hello","max_tokens":3}`
	r := s.do(http.MethodPost, "/v1/completions", body)
	if r.status != 200 || r.json("model").String() != "demo" || r.json("choices.0.text").String() != "Hello" {
		t.Fatalf("reply %d %s, want the completion naming model demo", r.status, r.body)
	}
	calls := s.upstreamCalls()
	if len(calls) != 1 || calls[0].path != "/v1/completions" || calls[0].body != `{"model":"up/demo","prompt":"Say hello","max_tokens":3}` {
		t.Fatalf("upstream received %+v, want the body with the model rewritten", calls)
	}
	rec := s.recorder.wait(t, 1)
	if rec.Endpoint != "completions" || rec.Model != "demo" || rec.PromptTokens != 5 || rec.CompletionTokens != 3 || rec.TotalTokens != 8 || rec.Status != 200 {
		t.Errorf("record %+v, want completions demo 5+3=8", rec)
	}

	// A bad body never reaches a backend.
	bad := s.do(http.MethodPost, "/v1/completions", `{"model":"demo","prompt":"x","logprobs":50}`)
	wantOpenAIError(t, bad, 400, "")
	if bad.json("error.param").String() != "logprobs" {
		t.Errorf("param %q, want logprobs", bad.json("error.param").String())
	}
	if n := len(s.upstreamCalls()); n != 1 {
		t.Errorf("upstreams received %d requests, want still 1", n)
	}
}

func TestCompletionsStreamUsage(t *testing.T) {
	for _, tt := range []struct {
		name      string
		body      string
		wantUsage bool
	}{
		{"usage not asked", `{"model":"demo","prompt":"hi","stream":true}`, false},
		{"usage asked", `{"model":"demo","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSurface(t)
			r := s.do(http.MethodPost, "/v1/completions", tt.body)
			if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("reply %d %s", r.status, r.body)
			}
			events := readEvents(t, bufio.NewReader(strings.NewReader(string(r.body))))
			var text strings.Builder
			usage := 0
			for _, ev := range events {
				if ev == "[DONE]" {
					continue
				}
				if m := gjson.Get(ev, "model").String(); m != "demo" {
					t.Errorf("event names model %q, want demo: %s", m, ev)
				}
				text.WriteString(gjson.Get(ev, "choices.0.text").String())
				if gjson.Get(ev, "usage").IsObject() {
					usage++
				}
			}
			if text.String() != "Hello" || events[len(events)-1] != "[DONE]" {
				t.Errorf("streamed text %q, events %q", text.String(), events)
			}
			if want := map[bool]int{true: 1, false: 0}[tt.wantUsage]; usage != want {
				t.Errorf("%d usage chunks reached the client, want %d", usage, want)
			}
			calls := s.upstreamCalls()
			if len(calls) != 1 || !gjson.Get(calls[0].body, "stream_options.include_usage").Bool() || gjson.Get(calls[0].body, "model").String() != "up/demo" {
				t.Fatalf("upstream received %+v, want usage asked for and the model rewritten", calls)
			}
			rec := s.recorder.wait(t, 1)
			if rec.Endpoint != "completions" || !rec.Stream || rec.PromptTokens != 5 || rec.CompletionTokens != 2 || rec.TotalTokens != 7 || rec.Incomplete {
				t.Errorf("record %+v, want a complete completions stream of 5+2=7", rec)
			}
		})
	}
}

func TestEmbeddingsRouting(t *testing.T) {
	s := newSurface(t)
	for i, format := range []string{"float", "base64"} {
		body := `{"model":"embed","input":["hello"],"encoding_format":"` + format + `"}`
		r := s.do(http.MethodPost, "/v1/embeddings", body)
		if r.status != 200 {
			t.Fatalf("%s: %d %s", format, r.status, r.body)
		}
		want := `[0.25,-0.5]`
		if format == "base64" {
			want = `"AACAPgAAAL8="`
		}
		if got := r.json("data.0.embedding").Raw; got != want {
			t.Errorf("%s: embedding %s, want %s untouched", format, got, want)
		}
		calls := s.a.received()
		if len(calls) != i+1 || calls[i].path != "/v1/embeddings" || calls[i].body != body {
			t.Fatalf("%s: upstream a received %+v, want the body as sent", format, calls)
		}
		rec := s.recorder.wait(t, i+1)
		if rec.Endpoint != "embeddings" || rec.Model != "embed" || rec.Backend != "a" || rec.PromptTokens != 4 || rec.CompletionTokens != 0 || rec.TotalTokens != 4 {
			t.Errorf("%s: record %+v, want embeddings on a with 4 prompt tokens", format, rec)
		}
	}
	bad := s.do(http.MethodPost, "/v1/embeddings", `{"model":"embed","input":[]}`)
	wantOpenAIError(t, bad, 400, "")
	if bad.json("error.param").String() != "input" {
		t.Errorf("param %q, want input", bad.json("error.param").String())
	}
}

func TestEndpointRestriction(t *testing.T) {
	s := newSurface(t)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/v1/responses"} {
		body := `{"model":"embed","prompt":"x","input":"x","messages":[{"role":"user","content":"x"}]}`
		r := s.do(http.MethodPost, path, body)
		wantOpenAIError(t, r, 400, "unsupported_endpoint")
		if msg := r.json("error.message").String(); !strings.Contains(msg, "embed") || !strings.Contains(msg, path) {
			t.Errorf("%s: message %q does not name the model and the endpoint", path, msg)
		}
	}
	if n := len(s.upstreamCalls()); n != 0 {
		t.Errorf("upstreams received %d requests, want 0", n)
	}
}

func TestResponsesRouting(t *testing.T) {
	s := newSurface(t)
	r := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"Say hi"}`)
	if r.status != 200 || r.json("model").String() != "demo" || r.json("usage.input_tokens").Int() != 7 {
		t.Fatalf("reply %d %s", r.status, r.body)
	}
	id := r.json("id").String()
	rec := s.recorder.wait(t, 1)
	if rec.Endpoint != "responses" || rec.PromptTokens != 7 || rec.CompletionTokens != 2 || rec.TotalTokens != 9 || rec.CachedTokens != 1 {
		t.Errorf("record %+v, want responses 7+2=9 with 1 cached", rec)
	}
	owner := rec.Backend
	if !strings.HasPrefix(id, "resp_"+owner) {
		t.Fatalf("response %s recorded on backend %s", id, owner)
	}

	// Follow-ups reach the backend holding the previous response, every
	// time: the other one would answer 404.
	prev := id
	for i := range 6 {
		r := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"more","previous_response_id":"`+prev+`"}`)
		if r.status != 200 {
			t.Fatalf("follow-up %d: %d %s", i, r.status, r.body)
		}
		if rec := s.recorder.wait(t, 2+i); rec.Backend != owner {
			t.Fatalf("follow-up %d went to %s, want %s", i, rec.Backend, owner)
		}
		prev = r.json("id").String()
	}
	for _, tt := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/" + id},
		{http.MethodPost, "/v1/responses/" + id + "/cancel"},
		{http.MethodDelete, "/v1/responses/" + id},
	} {
		r := s.do(tt.method, tt.path, "")
		if r.status != 200 || r.json("id").String() != id {
			t.Fatalf("%s %s: %d %s", tt.method, tt.path, r.status, r.body)
		}
		if m := r.json("model"); m.Exists() && m.String() != "demo" {
			t.Errorf("%s %s names model %q, want the public demo", tt.method, tt.path, m.String())
		}
	}
	// Deleted, so now no backend has it.
	gone := s.do(http.MethodGet, "/v1/responses/"+id, "")
	wantOpenAIError(t, gone, 404, "response_not_found")
	for _, c := range s.upstreamCalls() {
		if strings.HasPrefix(c.path, "/v1/responses/") && c.method != http.MethodGet && !strings.HasPrefix(id, "resp_"+owner) {
			t.Errorf("%s %s reached a backend that does not hold it", c.method, c.path)
		}
	}
	other := map[string]*fakeUpstream{"a": s.b, "b": s.a}[owner]
	for _, c := range other.received() {
		if c.method != http.MethodGet && strings.Contains(c.path+c.body, id) {
			t.Errorf("the other backend received %s %s %s", c.method, c.path, c.body)
		}
	}
	wantOpenAIError(t, s.do(http.MethodGet, "/v1/responses/resp_unknown", ""), 404, "response_not_found")
	wantOpenAIError(t, s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"x","previous_response_id":"resp_unknown"}`), 404, "response_not_found")
}

func TestResponsesStream(t *testing.T) {
	s := newSurface(t)
	r := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"Say hi","stream":true}`)
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("reply %d %s", r.status, r.body)
	}
	var types []string
	var text, id string
	for _, block := range strings.Split(strings.TrimSpace(string(r.body)), "\n\n") {
		name, data, ok := strings.Cut(block, "\ndata: ")
		if !ok || !strings.HasPrefix(name, "event: ") {
			t.Fatalf("not a named event: %q", block)
		}
		typ := gjson.Get(data, "type").String()
		if strings.TrimPrefix(name, "event: ") != typ {
			t.Errorf("event %q carries type %q", name, typ)
		}
		types = append(types, typ)
		text += gjson.Get(data, "delta").String()
		if m := gjson.Get(data, "response.model"); m.Exists() && m.String() != "demo" {
			t.Errorf("%s names model %q, want demo", typ, m.String())
		}
		if typ == "response.created" {
			id = gjson.Get(data, "response.id").String()
		}
	}
	if strings.Join(types, ",") != "response.created,response.output_text.delta,response.output_text.delta,response.completed" || text != "Hi" {
		t.Fatalf("events %v text %q", types, text)
	}
	rec := s.recorder.wait(t, 1)
	if rec.Endpoint != "responses" || !rec.Stream || rec.Incomplete || rec.Error != "" || rec.PromptTokens != 7 || rec.CompletionTokens != 2 || rec.CachedTokens != 1 {
		t.Errorf("record %+v, want a complete responses stream of 7+2 with 1 cached", rec)
	}
	calls := s.upstreamCalls()
	if len(calls) != 1 || gjson.Get(calls[0].body, "stream_options").Exists() || gjson.Get(calls[0].body, "model").String() != "up/demo" {
		t.Fatalf("upstream received %+v, want the body with only the model rewritten", calls)
	}
	for i := range 4 {
		f := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"more","previous_response_id":"`+id+`"}`)
		if f.status != 200 {
			t.Fatalf("follow-up %d of a streamed response: %d %s", i, f.status, f.body)
		}
		if got := s.recorder.wait(t, 2+i).Backend; got != rec.Backend {
			t.Fatalf("follow-up %d went to %s, want %s", i, got, rec.Backend)
		}
	}
}

// responsesStreamEvents splits a Responses API stream into its events'
// types and data.
func responsesStreamEvents(t *testing.T, body []byte) (types, data []string) {
	t.Helper()
	for _, block := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
		name, d, ok := strings.Cut(block, "\ndata: ")
		if !ok || !strings.HasPrefix(name, "event: ") {
			t.Fatalf("not a named event: %q", block)
		}
		types = append(types, strings.TrimPrefix(name, "event: "))
		data = append(data, d)
	}
	return types, data
}

func TestResponsesStreamFailures(t *testing.T) {
	for _, tt := range []struct {
		input      string
		wantEvents string
		wantRecord string // in the record's Error
		incomplete bool
	}{
		{"break", "response.created,response.output_text.delta,error", "upstream stream broken", true},
		{"fail", "response.created,error", "in-band stream error: engine at 10.1.2.3:8000 died", false},
		{"bad usage", "response.created,response.output_text.delta,response.output_text.delta,error", "invalid usage", false},
	} {
		t.Run(tt.input, func(t *testing.T) {
			s := newSurface(t)
			r := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"`+tt.input+`","stream":true}`)
			if r.status != 200 {
				t.Fatalf("reply %d %s", r.status, r.body)
			}
			types, data := responsesStreamEvents(t, r.body)
			if strings.Join(types, ",") != tt.wantEvents {
				t.Fatalf("events %v, want %s", types, tt.wantEvents)
			}
			last := data[len(data)-1]
			if gjson.Get(last, "type").String() != "error" || gjson.Get(last, "message").String() == "" || !gjson.Get(last, "sequence_number").Exists() {
				t.Errorf("the closing error event is not the Responses API's shape: %s", last)
			}
			if strings.Contains(string(r.body), "10.1.2.3") {
				t.Errorf("the backend's internal address reached the client: %s", r.body)
			}
			rec := s.recorder.wait(t, 1)
			if rec.Endpoint != "responses" || rec.Incomplete != tt.incomplete || !strings.Contains(rec.Error, tt.wantRecord) {
				t.Errorf("record incomplete=%v error %q, want incomplete=%v and an error containing %q", rec.Incomplete, rec.Error, tt.incomplete, tt.wantRecord)
			}
		})
	}
}

func TestResponsesInvalidUsage(t *testing.T) {
	s := newSurface(t)
	r := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"bad usage"}`)
	wantOpenAIError(t, r, 502, "")
	rec := s.recorder.wait(t, 1)
	if rec.PromptTokens != 0 || rec.TotalTokens != 0 || rec.Error == "" {
		t.Errorf("record %+v, want an error with no tokens", rec)
	}
}

// reload swaps in a new generation built from the same configuration, as
// a configuration reload does, and closes the old registry.
func (s *surface) reload() {
	s.t.Helper()
	reg, err := backends.NewRegistry(s.cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	old, wait := s.gw.Swap(proxy.Generation{Config: s.cfg, Registry: reg, Limiter: accounting.NewLimiter(s.cfg.Limits, time.Now)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := wait(ctx); err != nil {
		s.t.Fatal(err)
	}
	if err := old.Registry.Close(); err != nil {
		s.t.Fatal(err)
	}
	s.reg = reg
}

func TestResponseOwnersSurviveReload(t *testing.T) {
	s := newSurface(t)
	r := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"Say hi"}`)
	if r.status != 200 {
		t.Fatalf("reply %d %s", r.status, r.body)
	}
	owner := s.recorder.wait(t, 1).Backend
	s.reload()
	for i := range 4 {
		f := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"more","previous_response_id":"`+r.json("id").String()+`"}`)
		if f.status != 200 {
			t.Fatalf("follow-up %d after the reload: %d %s", i, f.status, f.body)
		}
		if got := s.recorder.wait(t, 2+i).Backend; got != owner {
			t.Fatalf("follow-up %d after the reload went to %s, want %s", i, got, owner)
		}
	}
}

// requestsByEndpoint sums tollgate_requests_total by its endpoint label.
func (s *surface) requestsByEndpoint() map[string]float64 {
	s.t.Helper()
	families, err := s.metrics.Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "tollgate_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

func TestRequestMetricsByEndpoint(t *testing.T) {
	s := newSurface(t)
	s.do(http.MethodPost, "/v1/completions", `{"model":"demo","prompt":"hi"}`)
	s.do(http.MethodPost, "/v1/embeddings", `{"model":"embed","input":"hi"}`)
	s.do(http.MethodPost, "/v1/embeddings", `{"model":"embed","input":""}`) // refused, counted all the same
	s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"hi"}`)
	s.recorder.wait(t, 3)
	want := map[string]float64{"completions": 1, "embeddings": 2, "responses": 1}
	if got := s.requestsByEndpoint(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("tollgate_requests_total by endpoint %v, want %v", got, want)
	}
}

func TestEndpointsAreLimited(t *testing.T) {
	s := newSurface(t, "limits: [{team: acme, rpm: 1}]")
	// The only request of the minute goes through...
	if r := s.do(http.MethodPost, "/v1/embeddings", `{"model":"embed","input":"hi"}`); r.status != 200 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	// ...and every endpoint refuses the next ones before any backend sees them.
	for _, tt := range []struct{ path, body string }{
		{"/v1/embeddings", `{"model":"embed","input":"hi"}`},
		{"/v1/completions", `{"model":"demo","prompt":"hi"}`},
		{"/v1/responses", `{"model":"demo","input":"hi"}`},
	} {
		t.Run(tt.path, func(t *testing.T) {
			r := s.do(http.MethodPost, tt.path, tt.body)
			wantOpenAIError(t, r, 429, "")
			if r.header.Get("Retry-After") == "" {
				t.Errorf("a 429 without Retry-After: %s", r.body)
			}
		})
	}
	if n := len(s.upstreamCalls()); n != 1 {
		t.Errorf("backends received %d requests, want only the first", n)
	}
}

func TestStoredResponseUnknownToGateway(t *testing.T) {
	s := newSurface(t)
	// A response made on backend b without the gateway (through another
	// replica, say). Whose it is the gateway cannot tell, so a key limited
	// to some teams is answered as for an id no backend has, and no
	// backend is asked.
	direct, err := http.Post(s.b.url+"/responses", "application/json", strings.NewReader(`{"model":"up/demo","input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	direct.Body.Close()
	before := len(s.upstreamCalls())
	wantOpenAIError(t, s.do(http.MethodGet, "/v1/responses/resp_b1", ""), 404, "response_not_found")
	wantOpenAIError(t, s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"more","previous_response_id":"resp_b1"}`), 404, "response_not_found")
	if n := len(s.upstreamCalls()); n != before {
		t.Fatalf("a key of team acme had the backends asked about a response of no known team")
	}
	// A key of every team has each backend asked, and then the gateway
	// knows where the response lives.
	r := s.doAs(opsKey, http.MethodGet, "/v1/responses/resp_b1", "")
	if r.status != 200 || r.json("backend").String() != "b" {
		t.Fatalf("GET of a response the gateway did not route: %d %s", r.status, r.body)
	}
	for i := range 4 {
		f := s.doAs(opsKey, http.MethodPost, "/v1/responses", `{"model":"demo","input":"more","previous_response_id":"resp_b1"}`)
		if f.status != 200 {
			t.Fatalf("follow-up %d: %d %s", i, f.status, f.body)
		}
		if got := s.recorder.wait(t, 2+i).Backend; got != "b" {
			t.Fatalf("follow-up %d went to %s, want b", i, got)
		}
	}
	// An id with characters that could change the upstream path is never sent.
	before = len(s.upstreamCalls())
	wantOpenAIError(t, s.do(http.MethodGet, "/v1/responses/resp_a%3Fb=1", ""), 404, "response_not_found")
	if n := len(s.upstreamCalls()); n != before {
		t.Errorf("an invalid id reached a backend")
	}
}

func TestStoredResponseStreamReplay(t *testing.T) {
	s := newSurface(t)
	r := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"hi","background":true}`)
	if r.status != 200 {
		t.Fatalf("reply %d %s", r.status, r.body)
	}
	id := r.json("id").String()
	owner := s.recorder.wait(t, 1).Backend
	replay := s.do(http.MethodGet, "/v1/responses/"+id+"?stream=true&starting_after=0", "")
	if replay.status != 200 || !strings.HasPrefix(replay.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("replay %d %q %s", replay.status, replay.header.Get("Content-Type"), replay.body)
	}
	types, data := responsesStreamEvents(t, replay.body)
	if strings.Join(types, ",") != "response.output_text.delta,response.completed" || gjson.Get(data[0], "delta").String() != owner {
		t.Fatalf("replayed %v %v, want the events of backend %s", types, data, owner)
	}
	if m := gjson.Get(data[1], "response.model").String(); m != "demo" {
		t.Errorf("the replayed response names model %q, want the public demo: %s", m, data[1])
	}
	var got upstreamCall
	for _, c := range s.upstreamCalls() {
		if c.method == http.MethodGet {
			got = c
		}
	}
	if got.path != "/v1/responses/"+id || got.query != "stream=true&starting_after=0" {
		t.Errorf("upstream received GET %s?%s", got.path, got.query)
	}
	// Once over, the replay holds no backend slot.
	pollUntil(t, "the replay to release its backend slot", 5*time.Second, func() bool {
		ready := s.do(http.MethodGet, "/readyz", "")
		return ready.json("backends.#(name==\""+owner+"\").in_flight").Exists() &&
			ready.json("backends.#(name==\""+owner+"\").in_flight").Int() == 0
	})
}

// TestStoredResponsesTeamIsolation checks that a response made for team
// acme can be read, changed and continued by keys of team acme and of every
// team only: a key of another team that knows the id gets the very answer
// an unknown id gets, and no backend hears of its request. Responses made
// plainly and streamed are both remembered with their team.
func TestStoredResponsesTeamIsolation(t *testing.T) {
	s := newSurface(t)
	plain := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"Say hi"}`)
	if plain.status != 200 {
		t.Fatalf("reply %d %s", plain.status, plain.body)
	}
	streamed := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"Say hi","stream":true}`)
	_, data := responsesStreamEvents(t, streamed.body)
	ids := map[string]string{"plain": plain.json("id").String(), "streamed": gjson.Get(data[0], "response.id").String()}
	s.recorder.wait(t, 2)

	for name, id := range ids {
		t.Run(name, func(t *testing.T) {
			before := len(s.upstreamCalls())
			for _, req := range storedResponseRequests(id) {
				wantAsUnknown(t, s, rivalKey, req, id)
			}
			if calls := s.upstreamCalls()[before:]; len(calls) != 0 {
				t.Fatalf("team rival's requests reached backends: %+v", calls)
			}
			// The response is untouched: its team reads and continues it.
			for _, key := range []string{testKey, opsKey} {
				if r := s.doAs(key, http.MethodGet, "/v1/responses/"+id, ""); r.status != 200 || r.json("id").String() != id {
					t.Fatalf("GET by its own team after the refusals: %d %s", r.status, r.body)
				}
				if r := s.doAs(key, http.MethodGet, "/v1/responses/"+id+"/input_items", ""); r.status != 200 {
					t.Fatalf("input_items by its own team: %d %s", r.status, r.body)
				}
			}
			f := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"more","previous_response_id":"`+id+`"}`)
			if f.status != 200 {
				t.Fatalf("follow-up by its own team: %d %s", f.status, f.body)
			}
			// A follow-up belongs to the team that made it.
			wantAsUnknown(t, s, rivalKey, storedResponseRequest{http.MethodGet, "/v1/responses/" + f.json("id").String(), ""}, f.json("id").String())
			if r := s.do(http.MethodPost, "/v1/responses/"+id+"/cancel", ""); r.status != 200 {
				t.Fatalf("cancel by its own team: %d %s", r.status, r.body)
			}
			if r := s.do(http.MethodDelete, "/v1/responses/"+id, ""); r.status != 200 || !r.json("deleted").Bool() {
				t.Fatalf("DELETE by its own team: %d %s", r.status, r.body)
			}
		})
	}
	// A follow-up refused for another team is recorded as a 404 of that
	// team, with no tokens and no backend.
	var refused []accounting.Record
	for i := range s.recorder.count() {
		// The follow-ups about an unknown id, for comparison, aside.
		if rec := s.recorder.wait(t, i+1); rec.Team == "rival" && !strings.Contains(rec.Error, "zz9unknown") {
			refused = append(refused, rec)
		}
	}
	if len(refused) != 2 || refused[0].Status != 404 || refused[0].Backend != "" || refused[0].TotalTokens != 0 {
		t.Errorf("team rival's records %+v, want two 404s with no backend or tokens", refused)
	}
}

// TestEndpointsConfiguredBoundsServed checks that the configured bounds
// reach the validators of completions and the Responses API through the
// gateway, as they reach chat's.
func TestEndpointsConfiguredBoundsServed(t *testing.T) {
	s := newSurface(t, "server: {max_stop_strings: 2, max_logit_bias: 1, max_messages: 2}")
	for _, tt := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"x"}],"stop":["a","b","c"]}`, "stop"},
		{"/v1/completions", `{"model":"demo","prompt":"x","stop":["a","b","c"]}`, "stop"},
		{"/v1/completions", `{"model":"demo","prompt":"x","logit_bias":{"1":1,"2":1}}`, "logit_bias"},
		{"/v1/responses", `{"model":"demo","input":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}`, "input"},
	} {
		r := s.do(http.MethodPost, tt.path, tt.body)
		wantOpenAIError(t, r, 400, "")
		if got := r.json("error.param").String(); got != tt.param {
			t.Errorf("%s %s: param %q, want %q: %s", tt.path, tt.body, got, tt.param, r.body)
		}
	}
	if n := len(s.upstreamCalls()); n != 0 {
		t.Errorf("backends received %d requests over the bounds", n)
	}
	if r := s.do(http.MethodPost, "/v1/completions", `{"model":"demo","prompt":"x","stop":["a","b"],"logit_bias":{"1":1}}`); r.status != 200 {
		t.Errorf("a completion within the bounds: %d %s", r.status, r.body)
	}
}

// TestStoredResponseReplayBounded checks that a replay is held to
// server.max_event_bytes as streams are: an event over it ends the replay
// with the Responses API's error event, after the events before it, and
// is neither buffered nor passed on; a replay cut in the middle of an event
// ends the same way. Either way the backend's slot and the stream slot are
// given back.
func TestStoredResponseReplayBounded(t *testing.T) {
	s := newSurface(t, "server: {max_event_bytes: 4096}")
	r := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"hi","background":true}`)
	if r.status != 200 {
		t.Fatalf("reply %d %s", r.status, r.body)
	}
	id := r.json("id").String()
	owner := s.recorder.wait(t, 1).Backend
	for _, tt := range []struct{ startingAfter, wantMessage string }{
		{"huge", "Backend " + owner + " sent an event over the gateway's limit of 4096 bytes"},
		{"cut", "Backend " + owner + " ended the replay in the middle of an event"},
	} {
		t.Run(tt.startingAfter, func(t *testing.T) {
			replay := s.do(http.MethodGet, "/v1/responses/"+id+"?stream=true&starting_after="+tt.startingAfter, "")
			if replay.status != 200 {
				t.Fatalf("replay %d %s", replay.status, replay.body)
			}
			if len(replay.body) > 4096 {
				t.Fatalf("the replay passed %d bytes on: %.200s…", len(replay.body), replay.body)
			}
			types, data := responsesStreamEvents(t, replay.body)
			if strings.Join(types, ",") != "response.output_text.delta,error" {
				t.Fatalf("replayed %v, want the first delta and an error", types)
			}
			last := data[1]
			if !strings.Contains(gjson.Get(last, "message").String(), tt.wantMessage) || gjson.Get(last, "sequence_number").Int() != 2 {
				t.Errorf("closing event %s, want sequence 2 and a message containing %q", last, tt.wantMessage)
			}
			pollUntil(t, "the replay to release its backend slot", 5*time.Second, func() bool {
				ready := s.do(http.MethodGet, "/readyz", "")
				in := ready.json("backends.#(name==\"" + owner + "\").in_flight")
				return in.Exists() && in.Int() == 0
			})
		})
	}
	// The connection of a broken replay was not reused: the next request
	// to that backend is answered normally.
	if g := s.do(http.MethodGet, "/v1/responses/"+id, ""); g.status != 200 || g.json("id").String() != id {
		t.Fatalf("GET after the broken replays: %d %s", g.status, g.body)
	}
}
