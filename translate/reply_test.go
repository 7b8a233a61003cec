package translate

import (
	"testing"
)

func TestMessagesReplyFromRecordedReplies(t *testing.T) {
	tests := []struct {
		file  string
		want  string
		usage Usage
	}{
		{"vllm_reply_stop_sequence.json",
			`{"id":"msg_9f2c1b7e4a","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hello \"there\""}],
			  "stop_reason":"stop_sequence","stop_sequence":"END","usage":{"input_tokens":14,"cache_creation_input_tokens":0,"cache_read_input_tokens":16,"output_tokens":5}}`,
			Usage{InputTokens: 14, CacheReadInputTokens: 16, OutputTokens: 5}},
		{"vllm_reply_tool_reasoning.json",
			`{"id":"msg_a1b2c3","type":"message","role":"assistant","model":"claude-x","content":[
			  {"type":"thinking","thinking":"The user wants weather.","signature":""},
			  {"type":"tool_use","id":"chatcmpl-tool-0f1e2d","name":"get_weather","input":{"city":"Paris"}}],
			  "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":120,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":20}}`,
			Usage{InputTokens: 120, OutputTokens: 20}},
		{"vllm_reply_length.json",
			`{"id":"msg_len","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"tok0 tok1 "}],
			  "stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":9,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":2}}`,
			Usage{InputTokens: 9, OutputTokens: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, usage, err := MessagesReply(nil, fixture(t, tt.file), "claude-x")
			if err != nil {
				t.Fatal(err)
			}
			sameJSON(t, got, tt.want)
			if usage != tt.usage || usage.PromptTokens() != tt.usage.InputTokens+tt.usage.CacheReadInputTokens {
				t.Errorf("usage %+v, want %+v", usage, tt.usage)
			}
		})
	}
}

func TestMessagesReplyStopReasons(t *testing.T) {
	tests := []struct{ finish, stop, reason, seq string }{
		{`"stop"`, `null`, "end_turn", "null"},
		{`"stop"`, `128001`, "end_turn", "null"},
		{`"stop"`, `"\n\nHuman:"`, "stop_sequence", `"\n\nHuman:"`},
		{`"length"`, `null`, "max_tokens", "null"},
		{`"tool_calls"`, `null`, "tool_use", "null"},
		{`"content_filter"`, `null`, "refusal", "null"},
	}
	for _, tt := range tests {
		t.Run(tt.finish+tt.stop, func(t *testing.T) {
			chat := `{"id":"chatcmpl-1","choices":[{"message":{"content":"a","tool_calls":[{"function":{"name":"f","arguments":"{\"a\":"}}]},"finish_reason":` + tt.finish + `,"stop_reason":` + tt.stop + `}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`
			got, _, err := MessagesReply(nil, []byte(chat), "m")
			if err != nil {
				t.Fatal(err)
			}
			sameJSON(t, got, `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"toolu_0","name":"f","input":{}}],
				"stop_reason":"`+tt.reason+`","stop_sequence":`+tt.seq+`,"usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}`)
		})
	}
}

func TestMessagesReplyRefusesWhatIsNoChatCompletion(t *testing.T) {
	for _, body := range []string{`{"choices":[]}`, `not json`, `{"object":"error"}`} {
		if _, _, err := MessagesReply(nil, []byte(body), "m"); err == nil || err.Type.Status() != 500 {
			t.Errorf("%s: got %v", body, err)
		}
	}
}
