package proxy_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/backends/simulated"
)

// upstreamSeen is what a recording front of a simulated backend saw: the
// path, body and headers of each request.
type upstreamSeen struct {
	mu   sync.Mutex
	reqs []seenRequest
}

type seenRequest struct {
	path   string
	body   string
	header http.Header
}

func (u *upstreamSeen) last(t *testing.T) seenRequest {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.reqs) == 0 {
		t.Fatal("the backend saw no request")
	}
	return u.reqs[len(u.reqs)-1]
}

// newMessagesHarness is a gateway whose one backend, "sim", serves the
// Messages API as mode says ("native" or "translate"), in front of a
// simulated backend that serves both, through a recording proxy that shows
// which path each request took.
func newMessagesHarness(t *testing.T, mode string) (*harness, *upstreamSeen) {
	t.Helper()
	return newMessagesHarnessWith(t, mode, `  - name: llama
    upstream_model: meta-llama/Llama-3.1-8B-Instruct
    backends: [sim]
    tool_calling: true
    max_output_tokens: 100
`, nil)
}

// newMessagesHarnessWith is newMessagesHarness with the models' YAML
// (their backend is "sim") and, when answer is not nil, an upstream that
// answers every request with it rather than with the simulated backend.
func newMessagesHarnessWith(t *testing.T, mode, models string, answer http.HandlerFunc) (*harness, *upstreamSeen) {
	t.Helper()
	n := newNode(t, "sim-node", simulated.Options{})
	seen := &upstreamSeen{}
	target, _ := url.Parse("http://" + n.addr)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	front := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen.mu.Lock()
		seen.reqs = append(seen.reqs, seenRequest{path: r.URL.Path, body: string(body), header: r.Header.Clone()})
		seen.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if answer != nil {
			answer(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = front.Serve(ln) }()
	t.Cleanup(func() { _ = front.Close() })
	h := newHarness(t, harnessOptions{
		backends: []backendSpec{{node: &node{name: "sim", addr: ln.Addr().String()}, yaml: "messages: " + mode}},
		models:   models,
	})
	return h, seen
}

// messages posts body to path (default /v1/messages) with the test key as
// x-api-key and Anthropic's headers, plus headers ("Name: value"; an empty
// value removes the header).
func (h *harness) messages(path, body string, headers ...string) response {
	h.t.Helper()
	if path == "" {
		path = "/v1/messages"
	}
	req, err := http.NewRequest(http.MethodPost, h.base+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", testKey)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	for _, hv := range headers {
		k, v, _ := strings.Cut(hv, ":")
		if v = strings.TrimSpace(v); v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// sseEvent is one event of a Messages API stream.
type sseEvent struct {
	name string
	data gjson.Result
}

// parseSSE splits a stream's body into its events, checking that each
// "event:" name matches its data's type.
func parseSSE(t *testing.T, body []byte) []sseEvent {
	t.Helper()
	var out []sseEvent
	var name, data string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data != "" {
				d := gjson.Parse(data)
				if !gjson.Valid(data) || d.Get("type").Str != name {
					t.Errorf("event %q carries %s", name, data)
				}
				out = append(out, sseEvent{name, d})
			}
			name, data = "", ""
		case strings.HasPrefix(line, "event: "):
			name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data = line[len("data: "):]
		}
	}
	return out
}

const (
	msgPlain  = `{"model":"llama","max_tokens":50,"system":"Be brief.","messages":[{"role":"user","content":"Hello there"}]}`
	msgTools  = `{"model":"llama","max_tokens":50,"messages":[{"role":"user","content":"weather in Paris?"}],"tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],"tool_choice":{"type":"tool","name":"get_weather"}}`
	msgStream = `{"model":"llama","max_tokens":50,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"Hello there"}]}]}`
)

// finishOf renders a record's finish reasons.
func finishOf(rec accounting.Record) string {
	return "[" + strings.Join(rec.FinishReasons.AppendStrings(nil), ",") + "]"
}

// recordedFinish is the finish reasons recorded for a Messages API reply
// that stopped for stopReason: the backend's own, a native backend's
// stop_reason or a chat backend's finish_reason, of which translation made
// stopReason.
func recordedFinish(mode, stopReason string) string {
	if mode == "translate" {
		stopReason = map[string]string{"max_tokens": "length", "end_turn": "stop", "tool_use": "tool_calls", "stop_sequence": "stop"}[stopReason]
	}
	return "[" + stopReason + "]"
}

// TestMessagesNativeAndTranslated sends the Messages API through the
// gateway to a backend serving it natively and to one served by
// translation to chat completions: each request takes its path upstream,
// answers in Anthropic's shape, and is recorded with exactly the tokens
// the client was told.
func TestMessagesNativeAndTranslated(t *testing.T) {
	for _, mode := range []string{"native", "translate"} {
		t.Run(mode, func(t *testing.T) {
			h, seen := newMessagesHarness(t, mode)
			wantPath := map[string]string{"native": "/v1/messages", "translate": "/v1/chat/completions"}[mode]

			t.Run("plain", func(t *testing.T) {
				r := h.messages("", msgPlain, "Anthropic-Beta: tools-2024-05-16")
				if r.status != 200 {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				if r.json("type").Str != "message" || r.json("model").Str != "llama" || r.json("content.0.type").Str != "text" ||
					r.json("content.0.text").Str == "" || !strings.HasPrefix(r.json("id").Str, "msg_") {
					t.Errorf("reply: %s", r.body)
				}
				// The simulated chat path generates up to max_tokens, its
				// Messages path stops by itself after 16.
				if want := map[bool]string{true: "max_tokens", false: "end_turn"}[r.json("usage.output_tokens").Int() == 50]; r.json("stop_reason").Str != want {
					t.Errorf("reply: %s", r.body)
				}
				up := seen.last(t)
				if up.path != wantPath || gjson.Get(up.body, "model").Str != "meta-llama/Llama-3.1-8B-Instruct" {
					t.Errorf("upstream got %s %s", up.path, up.body)
				}
				if mode == "native" && up.body != strings.Replace(msgPlain, `"llama"`, `"meta-llama/Llama-3.1-8B-Instruct"`, 1) {
					t.Errorf("the native body was changed beyond its model: %s", up.body)
				}
				if mode == "translate" && gjson.Get(up.body, "messages.0.role").Str != "system" {
					t.Errorf("the chat request lacks the system message: %s", up.body)
				}
				if up.header.Get("Anthropic-Version") != "2023-06-01" || up.header.Get("Anthropic-Beta") != "tools-2024-05-16" || up.header.Get("X-Api-Key") != "" {
					t.Errorf("upstream headers: %v", up.header)
				}
				rec := h.recorder.wait(t, 1)
				if rec.Endpoint != "messages" || rec.Model != "llama" || rec.Team != "acme" || rec.Status != 200 ||
					rec.PromptTokens != r.json("usage.input_tokens").Int() || rec.CompletionTokens != r.json("usage.output_tokens").Int() ||
					rec.PromptTokens == 0 || rec.CompletionTokens == 0 || rec.CompletionID != r.json("id").Str {
					t.Errorf("record %+v for reply %s", rec, r.body)
				}
				if got, want := finishOf(rec), recordedFinish(mode, r.json("stop_reason").Str); got != want {
					t.Errorf("recorded finish reasons %s, want %s for stop_reason %s", got, want, r.json("stop_reason").Str)
				}
			})

			t.Run("bearer and beta query", func(t *testing.T) {
				r := h.messages("/v1/messages?beta=true", msgPlain, "X-Api-Key:", "Authorization: Bearer "+testKey)
				if r.status != 200 || r.json("content.0.text").Str == "" {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				if up := seen.last(t); up.header.Get("Authorization") == "Bearer "+testKey {
					t.Errorf("the client's key went upstream")
				}
				h.recorder.wait(t, 2)
			})

			t.Run("max_tokens", func(t *testing.T) {
				r := h.messages("", `{"model":"llama","max_tokens":3,"messages":[{"role":"user","content":"Count"}]}`)
				if r.status != 200 || r.json("stop_reason").Str != "max_tokens" || r.json("usage.output_tokens").Int() != 3 {
					t.Errorf("status %d: %s", r.status, r.body)
				}
				rec := h.recorder.wait(t, 3)
				if rec.CompletionTokens != 3 {
					t.Errorf("recorded %d output tokens, want 3", rec.CompletionTokens)
				}
				r = h.messages("", `{"model":"llama","max_tokens":101,"messages":[{"role":"user","content":"Count"}]}`)
				if r.status != 400 || r.json("error.type").Str != "invalid_request_error" ||
					!strings.Contains(r.json("error.message").Str, "max_tokens: 101 > 100") {
					t.Errorf("above the model's limit: %d %s", r.status, r.body)
				}
				h.recorder.wait(t, 4)
			})

			t.Run("stop_sequences", func(t *testing.T) {
				r := h.messages("", `{"model":"llama","max_tokens":50,"stop_sequences":["tok3"],"messages":[{"role":"user","content":"Count"}]}`)
				if r.status != 200 || r.json("stop_reason").Str != "stop_sequence" || r.json("stop_sequence").Str != "tok3" ||
					strings.Contains(r.json("content.0.text").Str, "tok3") {
					t.Errorf("status %d: %s", r.status, r.body)
				}
				h.recorder.wait(t, 5)
			})

			t.Run("forced tool", func(t *testing.T) {
				r := h.messages("", msgTools)
				last := r.json("content.@reverse.0")
				if r.status != 200 || r.json("stop_reason").Str != "tool_use" || last.Get("type").Str != "tool_use" ||
					last.Get("name").Str != "get_weather" || !last.Get("input").IsObject() || last.Get("id").Str == "" {
					t.Errorf("status %d: %s", r.status, r.body)
				}
				h.recorder.wait(t, 6)
			})

			t.Run("stream", func(t *testing.T) {
				r := h.messages("", msgStream)
				if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				evs := parseSSE(t, r.body)
				var names []string
				var text strings.Builder
				for _, ev := range evs {
					if len(names) == 0 || names[len(names)-1] != ev.name {
						names = append(names, ev.name)
					}
					text.WriteString(ev.data.Get("delta.text").Str)
				}
				want := "message_start ping content_block_start content_block_delta content_block_stop message_delta message_stop"
				if strings.Join(names, " ") != want {
					t.Errorf("events %v, want %s", names, want)
				}
				if m := evs[0].data.Get("message"); m.Get("model").Str != "llama" || !strings.HasPrefix(m.Get("id").Str, "msg_") {
					t.Errorf("message_start: %s", evs[0].data.Raw)
				}
				final := evs[len(evs)-2].data
				rec := h.recorder.wait(t, 7)
				if rec.Endpoint != "messages" || !rec.Stream || rec.CompletionTokens != final.Get("usage.output_tokens").Int() ||
					rec.PromptTokens != final.Get("usage.input_tokens").Int() || rec.CompletionTokens == 0 || rec.Error != "" ||
					rec.CompletionID != evs[0].data.Get("message.id").Str || text.Len() == 0 {
					t.Errorf("record %+v for final %s", rec, final.Raw)
				}
				if got, want := finishOf(rec), recordedFinish(mode, final.Get("delta.stop_reason").Str); got != want {
					t.Errorf("recorded finish reasons %s, want %s for stop_reason %s", got, want, final.Get("delta.stop_reason").Str)
				}
				// A message carries no date: the record keys it undated, as a
				// Weave SDK's trace of it does, so the two fold into one call.
				if rec.CompletionCreated != 0 {
					t.Errorf("record of a streamed message dated %d, want 0", rec.CompletionCreated)
				}
			})

			t.Run("stream tool", func(t *testing.T) {
				r := h.messages("", strings.Replace(msgTools, `"max_tokens":50,`, `"max_tokens":50,"stream":true,`, 1))
				var args strings.Builder
				var tool gjson.Result
				for _, ev := range parseSSE(t, r.body) {
					if ev.name == "content_block_start" && ev.data.Get("content_block.type").Str == "tool_use" {
						tool = ev.data.Get("content_block")
					}
					if ev.data.Get("delta.type").Str == "input_json_delta" {
						args.WriteString(ev.data.Get("delta.partial_json").Str)
					}
				}
				if tool.Get("name").Str != "get_weather" || !gjson.Valid(args.String()) || !gjson.Parse(args.String()).IsObject() {
					t.Errorf("tool %s, input %q: %s", tool.Raw, args.String(), r.body)
				}
				h.recorder.wait(t, 8)
			})

			t.Run("count_tokens", func(t *testing.T) {
				plain := h.messages("", msgPlain)
				h.recorder.wait(t, 9)
				r := h.messages("/v1/messages/count_tokens", `{"model":"llama","system":"Be brief.","messages":[{"role":"user","content":"Hello there"}]}`)
				if r.status != 200 || r.json("input_tokens").Int() != plain.json("usage.input_tokens").Int() {
					t.Errorf("count %d %s, reply's usage %s", r.status, r.body, plain.json("usage").Raw)
				}
				// A native backend only tokenizes, and nothing is charged;
				// a chat backend ran the prompt and generated one token,
				// which are charged as the chat request they were.
				rec := h.recorder.wait(t, 10)
				wantPrompt, wantCompletion := int64(0), int64(0)
				if mode == "translate" {
					wantPrompt, wantCompletion = r.json("input_tokens").Int(), 1
				}
				if rec.Endpoint != "messages.count_tokens" || rec.Status != 200 || rec.PromptTokens != wantPrompt ||
					rec.CompletionTokens != wantCompletion || rec.TotalTokens != wantPrompt+wantCompletion {
					t.Errorf("count_tokens recorded %d+%d=%d tokens, want %d+%d: %+v", rec.PromptTokens, rec.CompletionTokens,
						rec.TotalTokens, wantPrompt, wantCompletion, rec)
				}
			})

			t.Run("errors before any byte", func(t *testing.T) {
				for _, tt := range []struct {
					name, body, typ string
					status          int
					headers         []string
				}{
					{"no key", msgPlain, "authentication_error", 401, []string{"X-Api-Key:"}},
					{"wrong key", msgPlain, "authentication_error", 401, []string{"X-Api-Key: sk-wrong"}},
					{"foreign team", msgPlain, "permission_error", 403, []string{"Compat-Project: other/p"}},
					{"unknown model", strings.Replace(msgStream, "llama", "nope", 1), "not_found_error", 404, nil},
					{"no max_tokens", `{"model":"llama","messages":[{"role":"user","content":"x"}]}`, "invalid_request_error", 400, nil},
					{"backend 500", msgStream, "api_error", 502, []string{"X-Mock-Status: 500"}},
					{"backend 503", msgStream, "overloaded_error", 503, []string{"X-Mock-Status: 503"}},
					{"backend 400", msgStream, "invalid_request_error", 400, []string{"X-Mock-Status: 400"}},
				} {
					t.Run(tt.name, func(t *testing.T) {
						r := h.messages("", tt.body, tt.headers...)
						if r.status != tt.status || r.json("type").Str != "error" || r.json("error.type").Str != tt.typ ||
							r.json("error.message").Str == "" || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
							t.Errorf("got %d %s %s", r.status, r.header.Get("Content-Type"), r.body)
						}
					})
				}
			})

			t.Run("in-band error", func(t *testing.T) {
				before := h.recorder.count()
				r := h.messages("", msgStream, "X-Mock-Fail-After: 2")
				evs := parseSSE(t, r.body)
				if r.status != 200 || len(evs) == 0 || evs[len(evs)-1].name != "error" || evs[len(evs)-1].data.Get("error.type").Str != "api_error" {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				if rec := h.recorder.wait(t, before+1); rec.Error == "" {
					t.Errorf("the record does not say the stream failed: %+v", rec)
				}
			})
		})
	}
}

// TestMessagesModelList answers GET /v1/models in Anthropic's list shape
// to a request carrying anthropic-version, and in OpenAI's otherwise.
func TestMessagesModelList(t *testing.T) {
	h, _ := newMessagesHarness(t, "native")
	get := func(headers ...string) gjson.Result {
		req, _ := http.NewRequest(http.MethodGet, h.base+"/v1/models", nil)
		for _, hv := range headers {
			k, v, _ := strings.Cut(hv, ":")
			req.Header.Set(k, strings.TrimSpace(v))
		}
		resp, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return gjson.ParseBytes(b)
	}
	a := get("X-Api-Key: "+testKey, "Anthropic-Version: 2023-06-01")
	if m := a.Get("data.0"); m.Get("type").Str != "model" || m.Get("id").Str != "llama" || m.Get("display_name").Str != "llama" ||
		m.Get("created_at").Str == "" || a.Get("has_more").Type != gjson.False || a.Get("first_id").Str != "llama" || a.Get("last_id").Str != "llama" {
		t.Errorf("Anthropic list: %s", a.Raw)
	}
	if o := get("Authorization: Bearer " + testKey); o.Get("object").Str != "list" || o.Get("data.0.object").Str != "model" {
		t.Errorf("OpenAI list: %s", o.Raw)
	}
	if e := get("X-Api-Key: sk-wrong", "Anthropic-Version: 2023-06-01"); e.Get("error.type").Str != "authentication_error" {
		t.Errorf("a wrong key: %s", e.Raw)
	}
}

// TestMessagesRefusalsInAnthropicShape checks that a wrong method or an
// unknown path under /v1/messages answers in Anthropic's error shape, which
// is all its SDKs parse, and that other /v1/ paths keep OpenAI's.
func TestMessagesRefusalsInAnthropicShape(t *testing.T) {
	h, _ := newMessagesHarness(t, "native")
	send := func(method, path string) (int, gjson.Result) {
		req, _ := http.NewRequest(method, h.base+path, nil)
		req.Header.Set("X-Api-Key", testKey)
		resp, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, gjson.ParseBytes(b)
	}
	tests := []struct {
		name, method, path string
		status             int
		anthropicType      string // "" for OpenAI's shape
	}{
		{"wrong method", http.MethodGet, "/v1/messages", http.StatusMethodNotAllowed, "invalid_request_error"},
		{"wrong method on count_tokens", http.MethodGet, "/v1/messages/count_tokens", http.StatusMethodNotAllowed, "invalid_request_error"},
		{"unknown path below messages", http.MethodPost, "/v1/messages/batches", http.StatusNotFound, "not_found_error"},
		{"other /v1 path", http.MethodPost, "/v1/nothing", http.StatusNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := send(tt.method, tt.path)
			if status != tt.status {
				t.Fatalf("status %d, want %d: %s", status, tt.status, body.Raw)
			}
			if tt.anthropicType != "" {
				if body.Get("type").Str != "error" || body.Get("error.type").Str != tt.anthropicType || body.Get("error.message").Str == "" {
					t.Fatalf("not Anthropic's error shape: %s", body.Raw)
				}
				return
			}
			if body.Get("error.code").Str != "unknown_url" || body.Get("type").Exists() {
				t.Fatalf("not OpenAI's error shape: %s", body.Raw)
			}
		})
	}
}
