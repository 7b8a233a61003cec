package proxy_test

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestMessagesToolChoiceWithoutToolCalling applies chat's tool calling rule
// to a Messages request translated for a model without tool_calling: a
// tool_choice that asks for a tool is refused before any backend sees it,
// in Anthropic's shape, and recorded as refused; none or no choice goes
// on. A backend serving the API natively is given the request as it is,
// and decides.
func TestMessagesToolChoiceWithoutToolCalling(t *testing.T) {
	const model = "  - name: notools\n    backends: [sim]\n"
	body := func(choice string) string {
		return `{"model":"notools","max_tokens":20,"messages":[{"role":"user","content":"weather in Paris?"}],` +
			`"tools":[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]` + choice + `}`
	}
	tests := []struct {
		name, choice string
		refused      bool
	}{
		{"tool", `,"tool_choice":{"type":"tool","name":"get_weather"}`, true},
		{"any", `,"tool_choice":{"type":"any"}`, true},
		{"auto", `,"tool_choice":{"type":"auto"}`, true},
		{"none", `,"tool_choice":{"type":"none"}`, false},
		{"absent", ``, false},
	}
	for _, mode := range []string{"translate", "native"} {
		t.Run(mode, func(t *testing.T) {
			h, seen := newMessagesHarnessWith(t, mode, model, nil)
			for i, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					seen.mu.Lock()
					before := len(seen.reqs)
					seen.mu.Unlock()
					r := h.messages("", body(tt.choice))
					rec := h.recorder.wait(t, i+1)
					seen.mu.Lock()
					sent := len(seen.reqs) - before
					seen.mu.Unlock()
					if !tt.refused || mode == "native" {
						if r.status != 200 || r.json("type").Str != "message" || sent != 1 {
							t.Errorf("status %d, %d upstream requests: %s", r.status, sent, r.body)
						}
						if mode == "native" && gjson.Get(seen.last(t).body, "tool_choice").Raw != gjson.Get(body(tt.choice), "tool_choice").Raw {
							t.Errorf("the native body's tool_choice changed: %s", seen.last(t).body)
						}
						return
					}
					if r.status != 400 || r.json("type").Str != "error" || r.json("error.type").Str != "invalid_request_error" ||
						!strings.Contains(r.json("error.message").Str, "model notools is not configured for tool calling") ||
						!strings.Contains(r.json("error.message").Str, `got {"type":"`+tt.name) {
						t.Errorf("status %d: %s", r.status, r.body)
					}
					if sent != 0 {
						t.Errorf("the backend was sent %d requests", sent)
					}
					if rec.Status != 400 || rec.Endpoint != "messages" || rec.PromptTokens != 0 || rec.Error == "" {
						t.Errorf("record %+v", rec)
					}
				})
			}
		})
	}
}
