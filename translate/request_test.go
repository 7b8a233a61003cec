package translate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/anthropic"
)

// fixture reads a request as the SDKs send it, from the anthropic package's
// testdata, or a vLLM reply or stream from this package's.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	dir := "testdata"
	if strings.HasSuffix(name, ".json") && !strings.HasPrefix(name, "vllm_") {
		dir = filepath.Join("..", "anthropic", "testdata")
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sameJSON fails unless got and want are the same JSON value.
func sameJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad expectation: %v", err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestChatRequestFromRecordedRequests(t *testing.T) {
	tests := []struct {
		file string
		opts ChatOptions
		want string
	}{
		{"sdk_basic.json", ChatOptions{Model: "up/demo"},
			`{"model":"up/demo","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello, Claude"}],
			  "max_tokens":64,"temperature":0.5,"top_p":0.9,"top_k":40,"stop":["tok3"]}`},
		{"sdk_tool_forced.json", ChatOptions{Model: "demo"},
			`{"model":"demo","messages":[{"role":"user","content":"What is the weather in Paris?"}],
			  "tools":[{"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
			           {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}],
			  "tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false,"max_tokens":256}`},
		{"ai_sdk_any.json", ChatOptions{Model: "demo", ContinuousUsage: true},
			`{"model":"demo","messages":[{"role":"system","content":"Use tools."},{"role":"user","content":[{"type":"text","text":"weather in Oslo"}]}],
			  "tools":[{"type":"function","function":{"name":"weather","description":"Get the weather","parameters":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"}}}],
			  "tool_choice":"required","max_tokens":4096,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`},
		{"media_system_turn.json", ChatOptions{Model: "demo"},
			`{"model":"demo","messages":[{"role":"system","content":"Be brief.\n\nAnswer in French."},
			  {"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},{"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}},{"type":"text","text":"The doc text."},{"type":"text","text":"Describe these."}]},
			  {"role":"assistant","content":"They are"},{"role":"user","content":"go on"}],
			  "tools":[{"type":"function","function":{"name":"x","parameters":{"type":"object"}}}],"tool_choice":"none","max_tokens":100}`},
		{"claude_code.json", ChatOptions{Model: "demo", Reasoning: ReasoningTemplate},
			`{"model":"demo","messages":[
			  {"role":"system","content":"You are Claude Code, Anthropic's official CLI for Claude.\n\nWorking directory: /tmp/x"},
			  {"role":"user","content":[{"type":"text","text":"<system-reminder>context</system-reminder>"},{"type":"text","text":"List the files"}]},
			  {"role":"assistant","content":"Running ls.","tool_calls":[{"id":"toolu_01","type":"function","function":{"name":"Bash","arguments":"{\"command\":\"ls\",\"description\":\"List files\"}"}}],"reasoning_content":"I should run ls."},
			  {"role":"tool","content":"a.go\nb.go","tool_call_id":"toolu_01"},
			  {"role":"user","content":[{"type":"text","text":"Now read a.go"}]},
			  {"role":"assistant","content":null,"tool_calls":[{"id":"toolu_02","type":"function","function":{"name":"Read","arguments":"{\"file_path\":\"/tmp/x/a.go\"}"}}]},
			  {"role":"tool","content":"Error: permission denied","tool_call_id":"toolu_02"}],
			  "tools":[{"type":"function","function":{"name":"Bash","description":"Run a shell command","parameters":{"type":"object","properties":{"command":{"type":"string"},"description":{"type":"string"}},"required":["command"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"}}},
			           {"type":"function","function":{"name":"Read","description":"Read a file","parameters":{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}}}],
			  "max_tokens":32000,"temperature":1,"user":"user_abc_account__session_123",
			  "chat_template_kwargs":{"enable_thinking":true},"stream":true,"stream_options":{"include_usage":true}}`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			body := fixture(t, tt.file)
			var req anthropic.Request
			if err := anthropic.Validate(body, &req, anthropic.Limits{}); err != nil {
				t.Fatal(err)
			}
			got, err := ChatRequest(nil, body, &req, tt.opts)
			if err != nil {
				t.Fatalf("refused: %s", err.Message)
			}
			sameJSON(t, got, tt.want)
		})
	}
}

func TestChatRequestRefusals(t *testing.T) {
	tests := []struct {
		name, body string
		opts       ChatOptions
		param, msg string
	}{
		{"max_tokens over the model's limit", `{"model":"demo","max_tokens":9000,"messages":[{"role":"user","content":"x"}]}`,
			ChatOptions{Model: "demo", MaxOutputTokens: 8192}, "max_tokens", "max_tokens: 9000 > 8192, which is the maximum allowed number of output tokens for demo."},
		{"pdf document", `{"model":"demo","max_tokens":9,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBER"}}]}]}`,
			ChatOptions{Model: "demo"}, "messages.0.content.0", "document with a base64 source cannot be sent"},
		{"unknown block", `{"model":"demo","max_tokens":9,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"future_block"}]}]}`,
			ChatOptions{Model: "demo"}, "messages.1.content.0", "future_block block cannot be sent"},
		{"any with server tools only", `{"model":"demo","max_tokens":9,"messages":[{"role":"user","content":"a"}],"tools":[{"type":"web_search_20250305","name":"web_search"}],"tool_choice":{"type":"any"}}`,
			ChatOptions{Model: "demo"}, "tool_choice", "needs a custom tool"},
		{"named server tool", `{"model":"demo","max_tokens":9,"messages":[{"role":"user","content":"a"}],"tools":[{"type":"web_search_20250305","name":"web_search"}],"tool_choice":{"type":"tool","name":"web_search"}}`,
			ChatOptions{Model: "demo"}, "tool_choice.name", "is a server tool"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req anthropic.Request
			if err := anthropic.Validate([]byte(tt.body), &req, anthropic.Limits{}); err != nil {
				t.Fatal(err)
			}
			_, err := ChatRequest(nil, []byte(tt.body), &req, tt.opts)
			if err == nil || err.Param != tt.param || !strings.Contains(err.Message, tt.msg) || err.Type != anthropic.InvalidRequest {
				t.Fatalf("got %+v, want param %q and %q", err, tt.param, tt.msg)
			}
		})
	}
}

func TestChatRequestReasoning(t *testing.T) {
	tests := []struct {
		thinking string
		how      Reasoning
		want     string // the member added, or "" for none
	}{
		{`{"type":"enabled","budget_tokens":1024}`, ReasoningEffort, `"reasoning_effort":"low"`},
		{`{"type":"enabled","budget_tokens":8000}`, ReasoningEffort, `"reasoning_effort":"medium"`},
		{`{"type":"enabled","budget_tokens":20000}`, ReasoningEffort, `"reasoning_effort":"high"`},
		{`{"type":"adaptive"}`, ReasoningEffort, `"reasoning_effort":"medium"`},
		{`{"type":"disabled"}`, ReasoningEffort, ``},
		{`{"type":"disabled"}`, ReasoningTemplate, `"chat_template_kwargs":{"enable_thinking":false}`},
		{`{"type":"enabled","budget_tokens":1024}`, ReasoningNone, ``},
	}
	for _, tt := range tests {
		t.Run(tt.thinking, func(t *testing.T) {
			body := []byte(`{"model":"m","max_tokens":30000,"thinking":` + tt.thinking + `,"messages":[{"role":"user","content":"x"}]}`)
			var req anthropic.Request
			if err := anthropic.Validate(body, &req, anthropic.Limits{}); err != nil {
				t.Fatal(err)
			}
			got, err := ChatRequest(nil, body, &req, ChatOptions{Model: "m", Reasoning: tt.how})
			if err != nil {
				t.Fatal(err)
			}
			want := `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":30000`
			if tt.want != "" {
				want += "," + tt.want
			}
			sameJSON(t, got, want+"}")
		})
	}
}

// FuzzChatRequest checks that every body the validator accepts translates
// into valid JSON, or into a refusal naming a field.
func FuzzChatRequest(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "anthropic", "testdata", "*.json"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req anthropic.Request
		if anthropic.Validate(body, &req, anthropic.Limits{}) != nil {
			return
		}
		out, err := ChatRequest(nil, body, &req, ChatOptions{Model: "m", Reasoning: ReasoningEffort, MaxOutputTokens: 1 << 20})
		if err != nil {
			if err.Param == "" || err.Message == "" {
				t.Fatalf("refusal without a field: %+v", err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("translation is not JSON:\n%s\nfrom\n%s", out, body)
		}
	})
}
