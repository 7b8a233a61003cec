package openai

import (
	"strings"
	"testing"
)

// reasons renders a set of finish reasons for comparison.
func reasonsText(rs interface{ AppendStrings([]string) []string }) string {
	return "[" + strings.Join(rs.AppendStrings(nil), ",") + "]"
}

// TestScanReplyFinishReasons: a reply's finish reasons are each choice's
// finish_reason in order, by the flat walk or, for what it leaves to
// gjson, by gjson; a response's are none (its status says, see
// ResponseFinish).
func TestScanReplyFinishReasons(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		response   bool
		want       string
	}{
		{"chat", `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{}}`, false, "[stop]"},
		{"two choices", `{"choices":[{"index":0,"message":{"content":"a"},"finish_reason":"length"},{"index":1,"message":{"tool_calls":[]},"finish_reason":"tool_calls"}]}`, false, "[length,tool_calls]"},
		{"text completion", `{"id":"cmpl-1","choices":[{"index":0,"text":" hi","logprobs":null,"finish_reason":"length","stop_reason":null}]}`, false, "[length]"},
		{"null reason", `{"choices":[{"message":{"content":"a"},"finish_reason":null}]}`, false, "[]"},
		{"unknown reason", `{"choices":[{"message":{"content":"a"},"finish_reason":"eos_token"}]}`, false, "[other]"},
		{"first member kept", `{"choices":[{"finish_reason":"stop","finish_reason":"length"}],"choices":[{"finish_reason":"length"}]}`, false, "[stop]"},
		{"escaped value", `{"choices":[{"finish_reason":"l\u0065ngth"}]}`, false, "[length]"},
		{"escaped key in a choice", `{"choices":[{"m\u0065ssage":{},"finish_reason":"stop"}]}`, false, "[stop]"},
		{"escaped top-level key", `{"\u0069d":"c","choices":[{"finish_reason":"content_filter"}]}`, false, "[content_filter]"},
		{"more than four", `{"choices":[{"finish_reason":"stop"},{"finish_reason":"stop"},{"finish_reason":"length"},{"finish_reason":"stop"},{"finish_reason":"length"}]}`, false, "[stop,stop,length,stop]"},
		{"response", `{"id":"resp_1","status":"completed","choices":[{"finish_reason":"stop"}]}`, true, "[]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := ScanReply([]byte(tt.body), 32, tt.response)
			if !ok {
				t.Fatal("reply refused")
			}
			if got := reasonsText(m.Finish); got != tt.want {
				t.Errorf("finish reasons %s, want %s", got, tt.want)
			}
		})
	}
	if _, ok := ScanReply([]byte(`{"choices":[{"finish_reason":"stop"}`), 32, false); ok {
		t.Error("a reply with unclosed choices was taken")
	}
}

// TestStreamFinishReasons: a stream's finish reasons are each choice's
// finish_reason as its last chunk gave it; the Responses API's the final
// event's status, mapped.
func TestStreamFinishReasons(t *testing.T) {
	chunk := func(s string) string { return "data: " + s + "\n\n" }
	for _, tt := range []struct {
		name      string
		responses bool
		events    []string
		want      string
	}{
		{"chat", false, []string{
			chunk(`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`),
			chunk(`{"id":"c","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}`),
			chunk(`{"id":"c","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`),
			chunk(`{"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`),
			"data: [DONE]\n\n"}, "[stop]"},
		{"two choices", false, []string{
			chunk(`{"choices":[{"index":1,"delta":{},"finish_reason":"tool_calls"}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"length"}]}`)}, "[tool_calls,length]"},
		{"gjson walk", false, []string{
			chunk(`{"choices":[{"d\u0065lta":{"content":"x"},"finish_reason":"content_filter"}]}`)}, "[content_filter]"},
		{"broken off", false, []string{
			chunk(`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`)}, "[]"},
		{"response completed", true, []string{respCreatedEvent, respDeltaEvent, respCompletedEvent}, "[stop]"},
		{"response incomplete", true, []string{respCreatedEvent, "event: response.incomplete\n" +
			`data: {"type":"response.incomplete","response":{"id":"resp_1","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":1,"output_tokens":2,"total_tokens":3}}}` + "\n\n"}, "[length]"},
		{"response failed", true, []string{"event: response.failed\n" +
			`data: {"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"message":"x"},"usage":null}}` + "\n\n"}, "[error]"},
		{"response in progress", true, []string{respCreatedEvent, respDeltaEvent}, "[]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var c EventProcessor
			c.Reset(StreamOptions{Responses: tt.responses})
			for _, ev := range tt.events {
				c.Process(nil, []byte(ev))
			}
			if got := reasonsText(c.FinishReasons()); got != tt.want {
				t.Errorf("finish reasons %s, want %s", got, tt.want)
			}
		})
	}
}
