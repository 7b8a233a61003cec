package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestMessagesReasoningUpstream sends a Messages request that enables
// thinking, with a thinking block in an earlier assistant turn, to models
// translated to chat completions whose models[].reasoning differ: each
// asks its backend to think as configured, and gives the earlier thinking
// back as reasoning_content, or neither when the model does not reason.
func TestMessagesReasoningUpstream(t *testing.T) {
	h, seen := newMessagesHarnessWith(t, "translate", `  - name: plain
    backends: [sim]
  - name: effort
    backends: [sim]
    reasoning: effort
  - name: template
    backends: [sim]
    reasoning: template
  - name: none
    backends: [sim]
    reasoning: none
`, nil)
	const turns = `"messages":[{"role":"user","content":"2+2?"},` +
		`{"role":"assistant","content":[{"type":"thinking","thinking":"Add them.","signature":"sig"},{"type":"text","text":"4"}]},` +
		`{"role":"user","content":"And 3+3?"}]}`
	tests := []struct {
		model, thinking string
		// effort and enable are the reasoning_effort and
		// chat_template_kwargs.enable_thinking sent ("" when absent).
		effort, enable string
		// reasoning is the assistant turn's reasoning_content.
		reasoning string
	}{
		{"plain", `{"type":"enabled","budget_tokens":2048}`, "", "", ""},
		{"none", `{"type":"enabled","budget_tokens":2048}`, "", "", ""},
		{"effort", `{"type":"enabled","budget_tokens":2048}`, "low", "", "Add them."},
		{"effort", `{"type":"enabled","budget_tokens":20000}`, "high", "", "Add them."},
		{"effort", `{"type":"disabled"}`, "", "", "Add them."},
		{"template", `{"type":"enabled","budget_tokens":2048}`, "", "true", "Add them."},
		{"template", `{"type":"disabled"}`, "", "false", "Add them."},
	}
	for _, tt := range tests {
		t.Run(tt.model+" "+gjson.Get(tt.thinking, "type").Str, func(t *testing.T) {
			r := h.messages("", `{"model":"`+tt.model+`","max_tokens":30000,"thinking":`+tt.thinking+`,`+turns)
			if r.status != 200 || r.json("type").Str != "message" {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			up := seen.last(t)
			if up.path != "/v1/chat/completions" {
				t.Fatalf("upstream path %s", up.path)
			}
			body := gjson.Parse(up.body)
			if got := body.Get("reasoning_effort").Str; got != tt.effort {
				t.Errorf("reasoning_effort %q, want %q: %s", got, tt.effort, up.body)
			}
			if got := body.Get("chat_template_kwargs.enable_thinking").Raw; got != tt.enable {
				t.Errorf("enable_thinking %q, want %q: %s", got, tt.enable, up.body)
			}
			if got := body.Get("messages.1.reasoning_content").Str; got != tt.reasoning || body.Get("messages.1.content").Str != "4" {
				t.Errorf("assistant turn %s, want reasoning_content %q", body.Get("messages.1").Raw, tt.reasoning)
			}
		})
	}
}

// TestMessagesReasoningReply turns a chat backend's reasoning, in a reply
// and in a stream, into a thinking block before the text, as the field is
// named by vLLM since 0.10 ("reasoning") and before ("reasoning_content").
func TestMessagesReasoningReply(t *testing.T) {
	for _, field := range []string{"reasoning", "reasoning_content"} {
		t.Run(field, func(t *testing.T) {
			h, _ := newMessagesHarnessWith(t, "translate", "  - name: qwen\n    backends: [sim]\n    reasoning: template\n",
				func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					chunk := func(delta, finish string) string {
						return `data: {"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[{"index":0,"delta":` +
							delta + `,"finish_reason":` + finish + `}]}` + "\n\n"
					}
					if !gjson.GetBytes(body, "stream").Bool() {
						w.Header().Set("Content-Type", "application/json")
						_, _ = w.Write([]byte(`{"id":"chatcmpl-r1","object":"chat.completion","created":1,"model":"qwen","choices":[{"index":0,` +
							`"message":{"role":"assistant","content":"4","` + field + `":"Add them."},"finish_reason":"stop"}],` +
							`"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`))
						return
					}
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = w.Write([]byte(chunk(`{"role":"assistant","`+field+`":"Add "}`, "null") +
						chunk(`{"`+field+`":"them."}`, "null") + chunk(`{"content":"4"}`, "null") + chunk(`{}`, `"stop"`) +
						`data: {"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[],` +
						`"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}` + "\n\ndata: [DONE]\n\n"))
				})
			const ask = `{"model":"qwen","max_tokens":100,"thinking":{"type":"enabled","budget_tokens":50},"messages":[{"role":"user","content":"2+2?"}]}`
			r := h.messages("", ask)
			if r.status != 200 || r.json("content.#").Int() != 2 || r.json("content.0.type").Str != "thinking" ||
				r.json("content.0.thinking").Str != "Add them." || r.json("content.1.type").Str != "text" || r.json("content.1.text").Str != "4" {
				t.Errorf("reply %d: %s", r.status, r.body)
			}
			r = h.messages("", strings.Replace(ask, `"max_tokens":100,`, `"max_tokens":100,"stream":true,`, 1))
			var blocks []string
			var thinking, text strings.Builder
			for _, ev := range parseSSE(t, r.body) {
				switch ev.name {
				case "content_block_start":
					blocks = append(blocks, ev.data.Get("content_block.type").Str)
				case "content_block_delta":
					thinking.WriteString(ev.data.Get("delta.thinking").Str)
					text.WriteString(ev.data.Get("delta.text").Str)
				}
			}
			if strings.Join(blocks, " ") != "thinking text" || thinking.String() != "Add them." || text.String() != "4" {
				t.Errorf("stream blocks %v, thinking %q, text %q: %s", blocks, thinking.String(), text.String(), r.body)
			}
		})
	}
}
