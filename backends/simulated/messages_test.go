package simulated

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// sdkRequest reads a Messages request as the SDKs send it.
func sdkRequest(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "anthropic", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (h *harness) messageJSON(t *testing.T, body string) gjson.Result {
	t.Helper()
	r := h.do(t, "POST", "/v1/messages?beta=true", body, "anthropic-version", "2023-06-01")
	if r.status != 200 || r.contentType != "application/json" {
		t.Fatalf("status %d %q: %s", r.status, r.contentType, r.body)
	}
	return mustJSON(t, string(r.body))
}

func TestMessagesReply(t *testing.T) {
	h := start(t, Options{Tokens: 4}, false)
	tests := []struct {
		name, body    string
		text          string
		stop, seq     string
		input, output int64
	}{
		// system "You are terse." (4+3) and "Hello, Claude" (4+2); the stop sequence cuts before
		// tok3, whose token was generated and is counted, as vLLM counts it.
		{"stop sequence", sdkRequest(t, "sdk_basic.json"), "tok0 tok1 tok2 ", "stop_sequence", "tok3", 13, 4},
		{"max_tokens", `{"model":"demo","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, "tok0 tok1 ", "max_tokens", "", 5, 2},
		{"the model stops by itself", `{"model":"demo","max_tokens":1024,"messages":[{"role":"user","content":"hi"}]}`, "tok0 tok1 tok2 tok3 ", "end_turn", "", 5, 4},
		{"system turn and multi-turn", `{"model":"demo","max_tokens":1024,"messages":[{"role":"user","content":"hi there"},{"role":"assistant","content":[{"type":"text","text":"ok"}]},{"role":"system","content":"be kind"},{"role":"user","content":[{"type":"text","text":"again"}]}]}`,
			"tok0 tok1 tok2 tok3 ", "end_turn", "", 6 + 5 + 6 + 5, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := h.messageJSON(t, tt.body)
			if m.Get("type").Str != "message" || m.Get("role").Str != "assistant" || m.Get("model").Str != "demo" || !strings.HasPrefix(m.Get("id").Str, "msg_") {
				t.Errorf("envelope: %s", m.Raw)
			}
			if got := m.Get("content.#").Int(); got != 1 || m.Get("content.0.type").Str != "text" || m.Get("content.0.text").Str != tt.text {
				t.Errorf("content: %s, want the text %q", m.Get("content").Raw, tt.text)
			}
			if m.Get("stop_reason").Str != tt.stop || m.Get("stop_sequence").Str != tt.seq || (tt.seq == "" && m.Get("stop_sequence").Type != gjson.Null) {
				t.Errorf("stop: %s %s, want %s %q", m.Get("stop_reason").Raw, m.Get("stop_sequence").Raw, tt.stop, tt.seq)
			}
			u := m.Get("usage")
			if u.Get("input_tokens").Int() != tt.input || u.Get("output_tokens").Int() != tt.output ||
				!u.Get("cache_read_input_tokens").Exists() || u.Get("cache_creation_input_tokens").Int() != 0 {
				t.Errorf("usage: %s, want %d in and %d out", u.Raw, tt.input, tt.output)
			}
		})
	}
}

func TestMessagesTools(t *testing.T) {
	h := start(t, Options{Tokens: 4}, false)
	weather := `"tools":[{"name":"get_weather","description":"Get the weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},{"name":"get_time","input_schema":{"type":"object","properties":{}}}]`
	tests := []struct {
		name, body string
		tool       string // the tool called, "" for text
	}{
		{"forced tool", sdkRequest(t, "sdk_tool_forced.json"), "get_weather"},
		{"any calls the first tool", `{"model":"demo","max_tokens":500,"messages":[{"role":"user","content":"hello"}],` + weather + `,"tool_choice":{"type":"any"}}`, "get_weather"},
		{"auto calls the tool the user names", `{"model":"demo","max_tokens":500,"messages":[{"role":"user","content":"use get_time please"}],` + weather + `,"tool_choice":{"type":"auto"}}`, "get_time"},
		{"auto answers in text otherwise", `{"model":"demo","max_tokens":500,"messages":[{"role":"user","content":"hello"}],` + weather + `}`, ""},
		{"none answers in text", `{"model":"demo","max_tokens":500,"messages":[{"role":"user","content":"get_weather"}],` + weather + `,"tool_choice":{"type":"none"}}`, ""},
		{"a tool result is answered in text", `{"model":"demo","max_tokens":500,"messages":[{"role":"user","content":"get_weather in Paris"},
			{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]}]}],` + weather + `,"tool_choice":{"type":"auto"}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := h.messageJSON(t, tt.body)
			last := m.Get("content.@reverse.0")
			if tt.tool == "" {
				if last.Get("type").Str != "text" || m.Get("stop_reason").Str != "end_turn" {
					t.Fatalf("want text: %s", m.Raw)
				}
				return
			}
			if last.Get("type").Str != "tool_use" || last.Get("name").Str != tt.tool || !strings.HasPrefix(last.Get("id").Str, "chatcmpl-tool-") ||
				!last.Get("input").IsObject() || m.Get("stop_reason").Str != "tool_use" {
				t.Fatalf("want a call of %s: %s", tt.tool, m.Raw)
			}
			if tt.tool == "get_weather" && last.Get("input.city").Type != gjson.String {
				t.Errorf("input does not follow the schema: %s", last.Get("input").Raw)
			}
			if m.Get("usage.output_tokens").Int() < 1 {
				t.Errorf("no output tokens: %s", m.Get("usage").Raw)
			}
		})
	}
}

func TestMessagesStream(t *testing.T) {
	h := start(t, Options{Tokens: 3}, false)
	t.Run("text", func(t *testing.T) {
		data, names := h.events(t, "/v1/messages", `{"model":"demo","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi you"}],"stop_sequences":["tok2"]}`)
		want := "message_start ping content_block_start content_block_delta content_block_delta content_block_stop message_delta message_stop"
		if strings.Join(names, " ") != want {
			t.Fatalf("events %v, want %s", names, want)
		}
		start := mustJSON(t, data[0])
		if start.Get("message.usage.input_tokens").Int() != 6 || start.Get("message.model").Str != "demo" {
			t.Errorf("message_start: %s", data[0])
		}
		text := mustJSON(t, data[3]).Get("delta.text").Str + mustJSON(t, data[4]).Get("delta.text").Str
		if text != "tok0 tok1 " {
			t.Errorf("text %q", text)
		}
		delta := mustJSON(t, data[6])
		if delta.Get("delta.stop_reason").Str != "stop_sequence" || delta.Get("delta.stop_sequence").Str != "tok2" ||
			delta.Get("usage.input_tokens").Int() != 6 || delta.Get("usage.output_tokens").Int() != 3 {
			t.Errorf("message_delta: %s", data[6])
		}
	})
	t.Run("tool", func(t *testing.T) {
		data, names := h.events(t, "/v1/messages", sdkRequest(t, "ai_sdk_any.json"))
		if names[0] != "message_start" || names[1] != "ping" || names[2] != "content_block_start" || names[len(names)-2] != "message_delta" || names[len(names)-1] != "message_stop" {
			t.Fatalf("events %v", names)
		}
		block := mustJSON(t, data[2]).Get("content_block")
		if block.Get("type").Str != "tool_use" || block.Get("name").Str != "weather" {
			t.Fatalf("block: %s", block.Raw)
		}
		var partial strings.Builder
		for i, name := range names {
			if name == "content_block_delta" {
				d := mustJSON(t, data[i]).Get("delta")
				if d.Get("type").Str != "input_json_delta" {
					t.Fatalf("delta %s", d.Raw)
				}
				partial.WriteString(d.Get("partial_json").Str)
			}
		}
		input := mustJSON(t, partial.String())
		if input.Get("location").Type != gjson.String {
			t.Errorf("joined input %s does not follow the schema", input.Raw)
		}
		if d := mustJSON(t, data[len(data)-2]); d.Get("delta.stop_reason").Str != "tool_use" {
			t.Errorf("message_delta: %s", d.Raw)
		}
	})
	t.Run("a failure mid-stream is an error event", func(t *testing.T) {
		r := h.do(t, "POST", "/v1/messages", `{"model":"demo","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "X-Mock-Fail-After", "1")
		if !strings.HasSuffix(string(r.body), "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"simulated mid-stream failure\"}}\n\n") {
			t.Errorf("stream: %s", r.body)
		}
	})
}

func TestMessagesCountTokens(t *testing.T) {
	h := start(t, Options{Tokens: 4}, false)
	body := sdkRequest(t, "count_tokens.json")
	r := h.do(t, "POST", "/v1/messages/count_tokens", body)
	// "Be nice." (4+2) and "Hello there, how are you" (4+5).
	if r.status != 200 || string(r.body) != `{"input_tokens":15}` {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	// The same request, sent to be answered, is charged what count_tokens said.
	m := h.messageJSON(t, strings.Replace(body, `{"model":"demo",`, `{"model":"demo","max_tokens":10,`, 1))
	if m.Get("usage.input_tokens").Int() != 15 {
		t.Errorf("usage %s", m.Get("usage").Raw)
	}
}

func TestMessagesErrors(t *testing.T) {
	h := start(t, Options{Models: []string{"demo"}}, false)
	tests := []struct {
		name, path, body string
		status           int
		typ, msg         string
	}{
		{"max_tokens required", "/v1/messages", `{"model":"demo","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error", "max_tokens: Field required"},
		{"unknown model", "/v1/messages", `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error", "The model `nope` does not exist."},
		{"count_tokens needs messages", "/v1/messages/count_tokens", `{"model":"demo"}`, 400, "invalid_request_error", "messages: Field required"},
		{"a pdf cannot be generated from", "/v1/messages", `{"model":"demo","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBER"}}]}]}`, 400, "invalid_request_error", "messages.0.content.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, "POST", tt.path, tt.body)
			e := mustJSON(t, string(r.body))
			if r.status != tt.status || e.Get("type").Str != "error" || e.Get("error.type").Str != tt.typ || !strings.Contains(e.Get("error.message").Str, tt.msg) {
				t.Errorf("got %d %s, want %d %s containing %q", r.status, r.body, tt.status, tt.typ, tt.msg)
			}
		})
	}
	if r := h.do(t, "GET", "/v1/messages", ""); r.status != 405 {
		t.Errorf("GET: %d %s", r.status, r.body)
	}
}
