package anthropic

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidateAcceptsWhatClientsSend(t *testing.T) {
	tests := []struct {
		file  string
		count bool
		want  func(t *testing.T, r *Request)
	}{
		{"sdk_basic.json", false, func(t *testing.T, r *Request) {
			if string(r.Model) != "demo" || r.MaxTokens != 64 || r.Messages != 1 || r.StopSequences != 1 || r.Stream {
				t.Errorf("facts: %+v", r)
			}
			if r.PromptBytes != len("Hello, Claude")+len("You are terse.") {
				t.Errorf("PromptBytes = %d", r.PromptBytes)
			}
		}},
		{"claude_code.json", false, func(t *testing.T, r *Request) {
			if !r.Stream || r.MaxTokens != 32000 || r.Messages != 5 || r.Tools != 3 || r.CustomTools != 2 {
				t.Errorf("facts: %+v", r)
			}
			if r.Thinking != ThinkingEnabled || r.ThinkingBudget != 1024 || r.ToolChoice != ToolChoiceAbsent {
				t.Errorf("thinking/tool choice: %+v", r)
			}
		}},
		{"sdk_tool_forced.json", false, func(t *testing.T, r *Request) {
			if r.ToolChoice != ToolChoiceTool || string(r.ToolChoiceName) != "get_weather" || !r.DisableParallelToolUse {
				t.Errorf("tool choice: %+v", r)
			}
		}},
		{"ai_sdk_any.json", false, func(t *testing.T, r *Request) {
			if r.ToolChoice != ToolChoiceAny || !r.Stream {
				t.Errorf("tool choice: %+v", r)
			}
		}},
		{"media_system_turn.json", false, func(t *testing.T, r *Request) {
			if r.Messages != 5 || r.ToolChoice != ToolChoiceNone {
				t.Errorf("facts: %+v", r)
			}
		}},
		{"count_tokens.json", true, func(t *testing.T, r *Request) {
			if r.MaxTokens != 0 || r.Messages != 1 || r.Tools != 1 {
				t.Errorf("facts: %+v", r)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			body := readFixture(t, tt.file)
			var r Request
			validate := Validate
			if tt.count {
				validate = ValidateCountTokens
			}
			if err := validate(body, &r, Limits{}); err != nil {
				t.Fatalf("refused: %s (param %q)", err.Message, err.Param)
			}
			if got := string(body[r.ModelStart:r.ModelEnd]); got != `"demo"` {
				t.Errorf("model token at offsets = %s", got)
			}
			tt.want(t, &r)
		})
	}
}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestValidateRefusesNamingTheField(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name, body, param, msg string
		lim                    Limits
	}{
		{"max_tokens missing", `{"model":"m",` + msgs + `}`, "max_tokens", "max_tokens: Field required", Limits{}},
		{"max_tokens zero", `{"model":"m","max_tokens":0,` + msgs + `}`, "max_tokens", "at least 1, got 0", Limits{}},
		{"max_tokens fraction", `{"model":"m","max_tokens":1.5,` + msgs + `}`, "max_tokens", "integer", Limits{}},
		{"model missing", `{"max_tokens":5,` + msgs + `}`, "model", "model: Field required", Limits{}},
		{"model number", `{"model":5,"max_tokens":5,` + msgs + `}`, "model", "must be a string, got 5", Limits{}},
		{"model too long", `{"model":"` + strings.Repeat("m", 300) + `","max_tokens":5,` + msgs + `}`, "model", "at most 256 bytes", Limits{}},
		{"messages missing", `{"model":"m","max_tokens":5}`, "messages", "messages: Field required", Limits{}},
		{"messages empty", `{"model":"m","max_tokens":5,"messages":[]}`, "messages", "at least one message", Limits{}},
		{"too many messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}`, "messages", "at most 2", Limits{MaxMessages: 2}},
		{"bad role", `{"model":"m","max_tokens":5,"messages":[{"role":"tool","content":"a"}]}`, "messages.0.role", `"user" or "assistant"`, Limits{}},
		{"content missing", `{"model":"m","max_tokens":5,"messages":[{"role":"user"}]}`, "messages.0.content", "Field required", Limits{}},
		{"block type unknown shape", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"text":"a"}]}]}`, "messages.0.content.0.type", "Field required", Limits{}},
		{"text not string", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":3}]}]}`, "messages.0.content.0.text", "must be a string, got 3", Limits{}},
		{"image source type", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"ftp"}}]}]}`, "messages.0.content.0.source.type", `"base64", "url", "file"`, Limits{}},
		{"image base64 without data", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png"}}]}]}`, "messages.0.content.0.source.data", "Field required", Limits{}},
		{"tool_use in user turn", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]}`, "messages.0.content.0.type", "assistant turn", Limits{}},
		{"tool_use input", `{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":"{}"}]}]}`, "messages.0.content.0.input", "an object", Limits{}},
		{"tool_result id", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, "messages.0.content.0.tool_use_id", "Field required", Limits{}},
		{"tool_result nested block", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text"}]}]}]}`, "messages.0.content.0.content.0.text", "Field required", Limits{}},
		{"system number", `{"model":"m","max_tokens":5,"system":1,` + msgs + `}`, "system", "text blocks", Limits{}},
		{"system image", `{"model":"m","max_tokens":5,"system":[{"type":"image"}],` + msgs + `}`, "system.0", "text block", Limits{}},
		{"temperature", `{"model":"m","max_tokens":5,"temperature":1.5,` + msgs + `}`, "temperature", "from 0 to 1, got 1.5", Limits{}},
		{"top_k", `{"model":"m","max_tokens":5,"top_k":-1,` + msgs + `}`, "top_k", "at least 0", Limits{}},
		{"stop empty", `{"model":"m","max_tokens":5,"stop_sequences":[""],` + msgs + `}`, "stop_sequences.0", "not be empty", Limits{}},
		{"stop too many", `{"model":"m","max_tokens":5,"stop_sequences":["a","b","c"],` + msgs + `}`, "stop_sequences", "at most 2", Limits{MaxStopSequences: 2}},
		{"tool without schema", `{"model":"m","max_tokens":5,"tools":[{"name":"t"}],` + msgs + `}`, "tools.0.input_schema", "Field required", Limits{}},
		{"tool name", `{"model":"m","max_tokens":5,"tools":[{"input_schema":{}}],` + msgs + `}`, "tools.0.name", "Field required", Limits{}},
		{"tool_choice kind", `{"model":"m","max_tokens":5,"tool_choice":{"type":"required"},` + msgs + `}`, "tool_choice.type", `"auto", "any", "tool" or "none"`, Limits{}},
		{"tool_choice any without tools", `{"model":"m","max_tokens":5,"tool_choice":{"type":"any"},` + msgs + `}`, "tool_choice", "needs tools", Limits{}},
		{"tool_choice unknown tool", `{"model":"m","max_tokens":5,"tools":[{"name":"a","input_schema":{}}],"tool_choice":{"type":"tool","name":"b"},` + msgs + `}`, "tool_choice.name", `"b" is not the name`, Limits{}},
		{"thinking budget", `{"model":"m","max_tokens":5,"thinking":{"type":"enabled"},` + msgs + `}`, "thinking.budget_tokens", "at least 1", Limits{}},
		{"thinking over max_tokens", `{"model":"m","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":9},` + msgs + `}`, "thinking.budget_tokens", "less than max_tokens", Limits{}},
		{"metadata user", `{"model":"m","max_tokens":5,"metadata":{"user_id":3},` + msgs + `}`, "metadata.user_id", "string or null", Limits{}},
		{"mcp_servers", `{"model":"m","max_tokens":5,"mcp_servers":{},` + msgs + `}`, "mcp_servers", "an array", Limits{}},
		{"repeated key", `{"model":"m","model":"n","max_tokens":5,` + msgs + `}`, "model", "repeats the key", Limits{}},
		{"not json", `{"model":`, "", "not valid JSON", Limits{}},
		{"not object", `[1]`, "", "must be a JSON object, got an array", Limits{}},
		{"empty", `  `, "", "empty", Limits{}},
		{"too deep", `{"model":"m","max_tokens":5,` + msgs + `,"x":[[[[[]]]]]}`, "", "more than 4 levels", Limits{MaxDepth: 4}},
		{"not utf8", "{\"model\":\"\xff\"}", "", "UTF-8", Limits{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Request
			err := Validate([]byte(tt.body), &r, tt.lim)
			if err == nil {
				t.Fatal("accepted")
			}
			if err.Param != tt.param || !strings.Contains(err.Message, tt.msg) || err.Type != InvalidRequest {
				t.Errorf("got param %q message %q; want param %q and a message containing %q", err.Param, err.Message, tt.param, tt.msg)
			}
		})
	}
}

func TestValidateAcceptsAcceptedButUnusedFields(t *testing.T) {
	body := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi","citations":null,"cache_control":{"type":"ephemeral","ttl":"1h"}}]},` +
		`{"role":"assistant","content":[{"type":"redacted_thinking","data":"abc"},{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"q"}},{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[]},{"type":"some_future_block","x":1}]}],` +
		`"thinking":{"type":"adaptive"},"output_config":{"format":{"type":"json_schema","schema":{}}},"context_management":null,"metadata":{"user_id":null},"cache_control":{"type":"ephemeral"},` +
		`"service_tier":"auto","container":"c_1","mcp_servers":[{"type":"url","url":"https://x","name":"x"}],"inference_geo":"us","stop_sequences":null,"unknown_future_field":{"a":1}}`
	var r Request
	if err := Validate([]byte(body), &r, Limits{}); err != nil {
		t.Fatalf("refused: %s", err.Message)
	}
	if r.Thinking != ThinkingAdaptive || r.Messages != 2 {
		t.Errorf("facts: %+v", r)
	}
}

func TestModelWithEscapesIsUnescaped(t *testing.T) {
	var r Request
	if err := Validate([]byte(`{"model":"de\u006do","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`), &r, Limits{}); err != nil {
		t.Fatal(err)
	}
	if string(r.Model) != "demo" {
		t.Errorf("model = %q", r.Model)
	}
}

func TestErrorReplyShapeAndStatus(t *testing.T) {
	tests := []struct {
		typ    ErrorType
		status int
		name   string
	}{
		{InvalidRequest, 400, "invalid_request_error"},
		{Authentication, 401, "authentication_error"},
		{Permission, 403, "permission_error"},
		{NotFound, 404, "not_found_error"},
		{RequestTooLarge, 413, "request_too_large"},
		{RateLimit, 429, "rate_limit_error"},
		{APIError, 500, "api_error"},
		{Overloaded, 529, "overloaded_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := Reply(nil, &Error{Type: tt.typ, Message: `say "hi"`}, "req_1")
			want := `{"type":"error","error":{"type":"` + tt.name + `","message":"say \"hi\""},"request_id":"req_1"}`
			if status != tt.status || string(body) != want {
				t.Errorf("got %d %s, want %d %s", status, body, tt.status, want)
			}
			if TypeForStatus(tt.status) != tt.typ {
				t.Errorf("TypeForStatus(%d) = %s", tt.status, TypeForStatus(tt.status))
			}
		})
	}
	if _, body := Reply(nil, Invalid("x", "m"), ""); !strings.HasSuffix(string(body), `"request_id":null}`) {
		t.Errorf("no request id: %s", body)
	}
	if got := string(AppendErrorEvent(nil, &Error{Type: Overloaded, Message: "busy"})); got != "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n" {
		t.Errorf("error event: %q", got)
	}
}

// TestToolChoiceRefusal refuses, for a model without tool calling, every
// tool_choice but none or none at all, naming the choice and the setting,
// and refuses nothing for a model with it.
func TestToolChoiceRefusal(t *testing.T) {
	const tools = `"tools":[{"name":"get_weather","input_schema":{"type":"object"}}]`
	tests := []struct {
		name, choice string
		refused      string // a part of the message; "" when accepted
	}{
		{"absent", ``, ""},
		{"none", `,"tool_choice":{"type":"none"}`, ""},
		{"auto", `,"tool_choice":{"type":"auto"}`, `got {"type":"auto"}`},
		{"any", `,"tool_choice":{"type":"any"}`, `got {"type":"any"}`},
		{"tool", `,"tool_choice":{"type":"tool","name":"get_weather"}`, `got {"type":"tool","name":"get_weather"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Request
			body := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],` + tools + tt.choice + `}`
			if e := Validate([]byte(body), &r, Limits{}); e != nil {
				t.Fatalf("Validate: %v", e.Message)
			}
			if e := r.ToolChoiceRefusal("llama", true); e != nil {
				t.Errorf("refused with tool calling: %s", e.Message)
			}
			e := r.ToolChoiceRefusal("llama", false)
			if tt.refused == "" {
				if e != nil {
					t.Errorf("refused: %s", e.Message)
				}
				return
			}
			if e == nil || e.Type != InvalidRequest || e.Param != "tool_choice" || !strings.Contains(e.Message, tt.refused) ||
				!strings.Contains(e.Message, "set `tool_calling: true` for model llama") {
				t.Errorf("refusal %+v", e)
			}
		})
	}
}

// TestMessagesOffsets checks that validation gives the places in the body
// of the messages array and of the system prompt, wherever they stand.
func TestMessagesOffsets(t *testing.T) {
	msgs := `[{"role":"user","content":"hi \"there\""},{"role":"assistant","content":"yes"},{"role":"user","content":"go"}]`
	blocks := `[{"type":"text","text":"You are \"terse\"."},{"type":"text","text":"Use tools.","cache_control":{"type":"ephemeral"}}]`
	for _, tc := range []struct{ name, body, system string }{
		{"first, no system", `{"messages":` + msgs + `,"model":"m","max_tokens":5}`, ""},
		{"null system", `{"messages":` + msgs + `,"system":null,"model":"m","max_tokens":5}`, ""},
		{"system string before", `{"model":"m","system":"be brief","max_tokens":5,"messages":` + msgs + `}`, `"be brief"`},
		{"system blocks after", `{"model":"m","max_tokens":5,"messages":` + msgs + `,"system":` + blocks + `}`, blocks},
		{"spaced", "{ \"model\" : \"m\" ,\n \"max_tokens\" : 5 , \"messages\" :  " + msgs + " , \"system\" : \"x\" }", `"x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req Request
			if err := Validate([]byte(tc.body), &req, Limits{}); err != nil {
				t.Fatal(err)
			}
			if got := tc.body[req.MessagesStart:req.MessagesEnd]; got != msgs {
				t.Errorf("messages at %d:%d = %q, want %q", req.MessagesStart, req.MessagesEnd, got, msgs)
			}
			if got := tc.body[req.SystemStart:req.SystemEnd]; got != tc.system {
				t.Errorf("system at %d:%d = %q, want %q", req.SystemStart, req.SystemEnd, got, tc.system)
			}
		})
	}
}
