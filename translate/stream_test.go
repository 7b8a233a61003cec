package translate

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// events splits a recorded SSE stream into its events.
func events(stream []byte) [][]byte {
	var out [][]byte
	for _, e := range bytes.Split(stream, []byte("\n\n")) {
		if len(bytes.TrimSpace(e)) > 0 {
			out = append(out, append(e, "\n\n"...))
		}
	}
	return out
}

// translateStream feeds the events one by one, each into the same buffer.
func translateStream(t testing.TB, stream []byte, model string) (out []byte, s *Stream) {
	s = new(Stream)
	s.Reset(model)
	for _, e := range events(stream) {
		out = s.Event(out, e)
	}
	return out, s
}

// sameEvents compares Anthropic events one by one: the event line exactly,
// the data as JSON.
func sameEvents(t *testing.T, got []byte, want []string) {
	t.Helper()
	gotEvents := events(got)
	for i := 0; i < max(len(gotEvents), len(want)); i++ {
		if i >= len(gotEvents) || i >= len(want) {
			t.Fatalf("got %d events, want %d:\n%s", len(gotEvents), len(want), got)
		}
		name, data, _ := strings.Cut(strings.TrimSpace(string(gotEvents[i])), "\n")
		wantName, wantData, _ := strings.Cut(want[i], "\n")
		if name != wantName {
			t.Fatalf("event %d is %q, want %q", i, name, wantName)
		}
		var g, w any
		if json.Unmarshal([]byte(strings.TrimPrefix(data, "data: ")), &g) != nil || json.Unmarshal([]byte(strings.TrimPrefix(wantData, "data: ")), &w) != nil {
			t.Fatalf("event %d data is not JSON: %q (want %q)", i, data, wantData)
		}
		gb, _ := json.Marshal(g)
		wb, _ := json.Marshal(w)
		if !bytes.Equal(gb, wb) {
			t.Errorf("event %d (%s):\n got %s\nwant %s", i, name, gb, wb)
		}
	}
}

func TestStreamTextFromRecordedVLLMStream(t *testing.T) {
	out, s := translateStream(t, fixture(t, "vllm_stream_text.sse"), "claude-x")
	sameEvents(t, out, []string{
		"event: message_start\ndata: " + `{"type":"message_start","message":{"id":"msg_s1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}`,
		"event: ping\ndata: " + `{"type":"ping"}`,
		"event: content_block_start\ndata: " + `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Think"}}`,
		"event: content_block_stop\ndata: " + `{"type":"content_block_stop","index":0}`,
		"event: content_block_start\ndata: " + `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
		"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}`,
		"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" \"you\""}}`,
		"event: content_block_stop\ndata: " + `{"type":"content_block_stop","index":1}`,
		"event: message_delta\ndata: " + `{"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":"END"},"usage":{"input_tokens":4,"cache_creation_input_tokens":0,"cache_read_input_tokens":8,"output_tokens":4}}`,
		"event: message_stop\ndata: " + `{"type":"message_stop"}`,
	})
	if !s.Finished() || s.Usage() != (Usage{InputTokens: 4, CacheReadInputTokens: 8, OutputTokens: 4}) {
		t.Errorf("finished %v usage %+v", s.Finished(), s.Usage())
	}
}

func TestStreamToolCallsFromRecordedVLLMStream(t *testing.T) {
	out, _ := translateStream(t, fixture(t, "vllm_stream_tools.sse"), "claude-x")
	sameEvents(t, out, []string{
		"event: message_start\ndata: " + `{"type":"message_start","message":{"id":"msg_s2","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}`,
		"event: ping\ndata: " + `{"type":"ping"}`,
		"event: content_block_start\ndata: " + `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me check."}}`,
		"event: content_block_stop\ndata: " + `{"type":"content_block_stop","index":0}`,
		"event: content_block_start\ndata: " + `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"chatcmpl-tool-aa","name":"get_weather","input":{}}}`,
		"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": "}}`,
		"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}`,
		"event: content_block_stop\ndata: " + `{"type":"content_block_stop","index":1}`,
		"event: content_block_start\ndata: " + `{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"chatcmpl-tool-bb","name":"get_time","input":{}}}`,
		"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{}"}}`,
		"event: content_block_stop\ndata: " + `{"type":"content_block_stop","index":2}`,
		"event: message_delta\ndata: " + `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":50,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":20}}`,
		"event: message_stop\ndata: " + `{"type":"message_stop"}`,
	})
}

func TestStreamEnds(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		want   []string
	}{
		{"continuous usage fills message_start",
			`data: {"id":"chatcmpl-c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":7,"completion_tokens":0,"prompt_tokens_details":{"cached_tokens":2}}}` + "\n\n" +
				`data: {"id":"chatcmpl-c","choices":[{"index":0,"delta":{},"finish_reason":"length"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}` + "\n\ndata: [DONE]\n\n",
			[]string{
				"event: message_start\ndata: " + `{"type":"message_start","message":{"id":"msg_c","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"cache_creation_input_tokens":0,"cache_read_input_tokens":2,"output_tokens":0}}}`,
				"event: ping\ndata: " + `{"type":"ping"}`,
				"event: message_delta\ndata: " + `{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":7,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3}}`,
				"event: message_stop\ndata: " + `{"type":"message_stop"}`,
			}},
		{"an in-band error ends the stream",
			`data: {"id":"chatcmpl-e","choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n" +
				`data: {"error":{"message":"simulated mid-stream failure","type":"InternalServerError","code":500}}` + "\n\ndata: [DONE]\n\n",
			[]string{
				"event: message_start\ndata: " + `{"type":"message_start","message":{"id":"msg_e","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}`,
				"event: ping\ndata: " + `{"type":"ping"}`,
				"event: content_block_start\ndata: " + `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}`,
				"event: error\ndata: " + `{"type":"error","error":{"type":"api_error","message":"simulated mid-stream failure"}}`,
			}},
		{"garbage ends the stream", "data: {not json\n\n", []string{
			"event: error\ndata: " + `{"type":"error","error":{"type":"api_error","message":"The backend sent an event that is not JSON."}}`,
		}},
		{"comments and multi-line data", ": keepalive\n\nid: 1\ndata: {\"id\":\"chatcmpl-m\",\ndata: \"choices\":[]}\n\ndata: [DONE]\n\n", []string{
			"event: message_start\ndata: " + `{"type":"message_start","message":{"id":"msg_m","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}`,
			"event: ping\ndata: " + `{"type":"ping"}`,
			"event: message_delta\ndata: " + `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`,
			"event: message_stop\ndata: " + `{"type":"message_stop"}`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _ := translateStream(t, []byte(tt.stream), "m")
			sameEvents(t, out, tt.want)
		})
	}
}

// FuzzStream feeds arbitrary events, seeded with the recorded streams, and
// checks that the output is always well-formed Anthropic SSE: every event an
// "event:" line and a JSON "data:" line whose type matches it, blocks opened
// and closed in order, nothing after message_stop or error, and, once
// finished, a message_stop or an error at the end.
func FuzzStream(f *testing.F) {
	for _, name := range []string{"vllm_stream_text.sse", "vllm_stream_tools.sse"} {
		f.Add(fixture(f, name))
	}
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":3,\"function\":{\"arguments\":\"x\"}}]}}]}\n\n"))
	f.Add([]byte("data: {\"error\":null,\"choices\":[{\"delta\":{\"reasoning\":\"r\",\"content\":\"c\"}}]}\n\ndata: [DONE]\n\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		var s Stream
		s.Reset("m")
		var out []byte
		for _, e := range events(stream) {
			out = s.Event(out, e)
		}
		out = s.Finish(out)
		open := -1
		next := 0
		ended := false
		for i, e := range events(out) {
			if ended {
				t.Fatalf("event %d after the end:\n%s", i, out)
			}
			name, data, ok := strings.Cut(strings.TrimSpace(string(e)), "\n")
			var ev struct {
				Type  string
				Index *int
			}
			if !ok || !strings.HasPrefix(name, "event: ") || !strings.HasPrefix(data, "data: ") || json.Unmarshal([]byte(data[6:]), &ev) != nil || ev.Type != name[7:] {
				t.Fatalf("malformed event %d %q", i, e)
			}
			switch ev.Type {
			case "content_block_start":
				if open >= 0 || *ev.Index != next {
					t.Fatalf("block %d started while %d is open or out of order", *ev.Index, open)
				}
				open = next
			case "content_block_delta":
				if *ev.Index != open {
					t.Fatalf("delta for block %d while %d is open", *ev.Index, open)
				}
			case "content_block_stop":
				if *ev.Index != open {
					t.Fatalf("stop for block %d while %d is open", *ev.Index, open)
				}
				open, next = -1, next+1
			case "message_stop", "error":
				ended = true
			}
		}
		if !ended || !s.Finished() {
			t.Fatalf("stream did not end:\n%s", out)
		}
		if s.Finish(nil) != nil || s.Event(nil, []byte("data: {}\n\n")) != nil {
			t.Fatal("a finished stream still writes")
		}
	})
}
