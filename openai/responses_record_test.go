package openai

import (
	"bytes"
	"testing"
)

// A streamed response as a backend sends it: the response object whole in
// response.created, then deltas, then the response completed with its
// usage.
const (
	respCreatedEvent = "event: response.created\n" +
		`data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_0123abcd","object":"response","created_at":1764000007,"status":"in_progress","model":"up/model","output":[],"usage":null}}` + "\n\n"
	respDeltaEvent = "event: response.output_text.delta\n" +
		`data: {"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"tok1 "}` + "\n\n"
	respCompletedEvent = "event: response.completed\n" +
		`data: {"type":"response.completed","sequence_number":3,"response":{"id":"resp_0123abcd","object":"response","created_at":1764000007,"status":"completed","model":"up/model","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"tok1 tok1 "}]}],"usage":{"input_tokens":8,"output_tokens":2,"total_tokens":10,"input_tokens_details":{"cached_tokens":3}}}}` + "\n\n"
)

// TestResponseStreamKeepsReplyKey: the events of a streamed response
// leave the response's id and created_at where a chat stream leaves its
// completion's, for the usage record.
func TestResponseStreamKeepsReplyKey(t *testing.T) {
	var c EventProcessor
	c.Reset(StreamOptions{StripUsage: false, StripContinuous: false, PublicModel: []byte(`"demo"`)})
	c.opts.Responses = true
	var dst []byte
	for _, ev := range []string{respCreatedEvent, respDeltaEvent, respDeltaEvent, respCompletedEvent} {
		dst = c.Process(dst, []byte(ev))
	}
	if c.replyID != "resp_0123abcd" || c.created != 1764000007 {
		t.Errorf("completion %q created %d, want resp_0123abcd created 1764000007", c.replyID, c.created)
	}
	if !c.done || c.usage.Input != 8 || c.usage.Output != 2 || c.deltas != 2 {
		t.Errorf("done %v, usage %+v, deltas %d; want done, 8+2, 2 deltas", c.done, c.usage, c.deltas)
	}
	if n := bytes.Count(dst, []byte(`"model":"demo"`)); n != 2 {
		t.Errorf("%d response objects name the public model, want 2: %s", n, dst)
	}
}

// TestResponseStreamAllocations guards the Responses API's stream path: a
// stream's events are read in place; the one allocation is the copy of the
// response id, once per stream.
func TestResponseStreamAllocations(t *testing.T) {
	var c EventProcessor
	events := [][]byte{[]byte(respCreatedEvent), []byte(respDeltaEvent), []byte(respDeltaEvent), []byte(respCompletedEvent)}
	dst := make([]byte, 0, 4096)
	public := []byte(`"demo"`)
	allocs := testing.AllocsPerRun(200, func() {
		c.Reset(StreamOptions{StripUsage: false, StripContinuous: false, PublicModel: public})
		c.opts.Responses = true
		for _, ev := range events {
			dst = c.Process(dst[:0], ev)
		}
	})
	if allocs != 1 {
		t.Fatalf("processing a response stream of 4 events allocates %.1f times, want 1 (the id's copy)", allocs)
	}
}

// TestInBandErrorOutlivesEvent: the message of an in-band error is kept
// until the record is made, after the scanner's buffer holding the event
// has been reused; it must not point into that buffer.
func TestInBandErrorOutlivesEvent(t *testing.T) {
	for _, tc := range []struct {
		name      string
		responses bool
		event     string
	}{
		{"chat", false, `data: {"error":{"message":"model overloaded"}}` + "\n\n"},
		{"response failed", true, "event: response.failed\n" +
			`data: {"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"message":"model overloaded"},"usage":{"input_tokens":1,"output_tokens":0,"total_tokens":1}}}` + "\n\n"},
		{"response error", true, "event: error\n" + `data: {"type":"error","message":"model overloaded","sequence_number":2}` + "\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c EventProcessor
			c.Reset(StreamOptions{StripUsage: false, StripContinuous: false, PublicModel: nil})
			c.opts.Responses = tc.responses
			buf := []byte(tc.event)
			c.Process(nil, buf)
			for i := range buf {
				buf[i] = 'x'
			}
			if c.errMessage != "model overloaded" {
				t.Errorf("error message %q once the event's buffer is reused, want %q", c.errMessage, "model overloaded")
			}
		})
	}
}
