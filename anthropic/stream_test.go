package anthropic

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/usagecount"
)

func event(typ, data string) []byte { return []byte("event: " + typ + "\ndata: " + data + "\n\n") }

// TestEventProcessor feeds a native stream event by event and checks what
// each passes on and what the processor reports after it.
func TestEventProcessor(t *testing.T) {
	var p EventProcessor
	p.Reset(StreamOptions{PublicModel: []byte(`"public"`), Backend: "b1",
		Redact: func(s string) string { return strings.ReplaceAll(s, "sk-secret", "[redacted]") }})

	out := p.Process(nil, event("message_start", `{"type":"message_start","message":{"id":"msg_1","model":"internal","usage":{"input_tokens":10,"cache_read_input_tokens":3,"cache_creation_input_tokens":2,"output_tokens":1}}}`))
	if want := event("message_start", `{"type":"message_start","message":{"id":"msg_1","model":"public","usage":{"input_tokens":10,"cache_read_input_tokens":3,"cache_creation_input_tokens":2,"output_tokens":1}}}`); !bytes.Equal(out, want) {
		t.Fatalf("message_start passed as %q, want %q", out, want)
	}
	if u := p.Usage(); u != (Usage{Input: 10, CacheRead: 3, CacheCreation: 2, Output: 1, Reported: true}) || u.Prompt() != 15 {
		t.Fatalf("usage after message_start = %+v", u)
	}
	if p.ReplyID() != "msg_1" {
		t.Fatalf("reply id %q", p.ReplyID())
	}

	ping := []byte(": keep-alive\n\n")
	if out := p.Process(nil, ping); !bytes.Equal(out, ping) {
		t.Fatalf("comment passed as %q", out)
	}
	delta := event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`)
	if out := p.Process(nil, delta); !bytes.Equal(out, delta) {
		t.Fatalf("delta passed as %q", out)
	}
	if n := p.FinishReasons().Len(); n != 0 {
		t.Fatalf("%d finish reasons before message_delta", n)
	}
	p.Process(nil, event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}`))
	if u := p.Usage(); u.Input != 10 || u.CacheRead != 3 || u.Output != 7 || p.OutputTokens() != 7 {
		t.Fatalf("message_delta without input_tokens: usage %+v, output %d", u, p.OutputTokens())
	}
	if got := p.FinishReasons().AppendStrings(nil); len(got) != 1 || got[0] != "end_turn" {
		t.Fatalf("finish reasons %q after message_delta, want [end_turn]", got)
	}
	if p.Done() {
		t.Fatal("done before message_stop")
	}
	p.Process(nil, event("message_stop", `{"type":"message_stop"}`))
	if !p.Done() || p.Events() != 4 {
		t.Fatalf("done %v, events %d", p.Done(), p.Events())
	}

	out = p.Process(nil, event("error", `{"type":"error","error":{"type":"overloaded_error","message":"host 10.0.0.1 key sk-secret"}}`))
	e := gjson.GetBytes(out[bytes.IndexByte(out, '{'):], "error")
	if e.Get("type").Str != "api_error" || e.Get("message").Str != "Backend b1 reported an error during the stream." {
		t.Fatalf("error event passed as %q", out)
	}
	if p.ErrorMessage() != "host 10.0.0.1 key [redacted]" {
		t.Fatalf("error message kept %q", p.ErrorMessage())
	}
}

// TestFinishReasons: a reply's stop_reason is its one finish reason; a
// null one (or none) gives none.
func TestFinishReasons(t *testing.T) {
	for _, tt := range []struct{ reply, want string }{
		{`{"id":"msg_1","stop_reason":"max_tokens"}`, "max_tokens"},
		{`{"id":"msg_1","stop_reason":"tool_use"}`, "tool_use"},
		{`{"id":"msg_1","stop_reason":"brand_new"}`, "other"},
		{`{"id":"msg_1","stop_reason":null}`, ""},
		{`{"id":"msg_1"}`, ""},
	} {
		if got := strings.Join(FinishReasons(gjson.Parse(tt.reply)).AppendStrings(nil), ","); got != tt.want {
			t.Errorf("FinishReasons(%s) = %q, want %q", tt.reply, got, tt.want)
		}
	}
}

// TestEventProcessorCountsDeltas checks that a stream without usage is
// charged its content deltas, and that a refused usage is not passed on.
func TestEventProcessorCountsDeltas(t *testing.T) {
	var p EventProcessor
	p.Reset(StreamOptions{})
	start := event("message_start", `{"type":"message_start","message":{"id":"msg_2","model":"m"}}`)
	if out := p.Process(nil, start); !bytes.Equal(out, start) {
		t.Fatalf("message_start without a public model passed as %q", out)
	}
	for range 3 {
		p.Process(nil, event("content_block_delta", `{"type":"content_block_delta","delta":{"text":"x"}}`))
	}
	if p.Usage().Reported || p.OutputTokens() != 3 {
		t.Fatalf("reported %v, output %d, want 3 deltas", p.Usage().Reported, p.OutputTokens())
	}
	if out := p.Process(nil, event("message_delta", `{"type":"message_delta","usage":{"output_tokens":-1}}`)); len(out) != 0 {
		t.Fatalf("event with a refused usage passed as %q", out)
	}
	var ue *usagecount.Error
	if !errors.As(p.UsageErr(), &ue) || ue.Field != "usage.output_tokens" {
		t.Fatalf("usage error %v", p.UsageErr())
	}
}

func TestUsageSet(t *testing.T) {
	tests := []struct {
		name    string
		usage   string
		update  bool
		want    Usage
		wantErr string
	}{
		{"absent", ``, false, Usage{Input: 1, Output: 2, Reported: true}, ""},
		{"all", `{"input_tokens":5,"cache_read_input_tokens":4,"cache_creation_input_tokens":3,"output_tokens":2}`, false,
			Usage{Input: 5, CacheRead: 4, CacheCreation: 3, Output: 2, Reported: true}, ""},
		{"start without output", `{"input_tokens":5}`, false, Usage{Input: 5, Reported: true}, ""},
		{"update keeps input", `{"output_tokens":9}`, true, Usage{Input: 1, Output: 9, Reported: true}, ""},
		{"update repeats input", `{"input_tokens":6,"output_tokens":9}`, true, Usage{Input: 6, Output: 9, Reported: true}, ""},
		{"not an object", `[1]`, false, Usage{Input: 1, Output: 2, Reported: true}, "usage is not an object"},
		{"float", `{"input_tokens":1.5}`, false, Usage{Input: 1, Output: 2, Reported: true}, "usage.input_tokens is not an integer"},
		{"huge", `{"cache_read_input_tokens":99999999999999}`, false, Usage{Input: 1, Output: 2, Reported: true}, "usage.cache_read_input_tokens exceeds 2^40"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := Usage{Input: 1, Output: 2, Reported: true}
			err := u.Set(gjson.Parse(tt.usage), tt.update)
			if (err == nil) != (tt.wantErr == "") || err != nil && err.Error() != tt.wantErr {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if u != tt.want {
				t.Fatalf("usage = %+v, want %+v", u, tt.want)
			}
		})
	}
}

// FuzzEventProcessor checks that no event makes the processor panic, that
// an event is passed on unchanged unless it is message_start (model
// renamed), an error (replaced) or carries a refused usage (dropped), and
// that every count it keeps is in range.
func FuzzEventProcessor(f *testing.F) {
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"x\",\"usage\":{\"input_tokens\":3}}}\n\n"))
	f.Add([]byte("event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2}}\r\n\r\n"))
	f.Add([]byte("event: error\ndata: {\"type\":\"error\",\"error\":\"boom\"}\n\n"))
	f.Add([]byte(": ping\n\n"))
	f.Fuzz(func(t *testing.T, ev []byte) {
		var p EventProcessor
		p.Reset(StreamOptions{PublicModel: []byte(`"public"`), Backend: "b"})
		in := append([]byte(nil), ev...)
		out := p.Process(nil, ev)
		if !bytes.Equal(ev, in) {
			t.Fatal("Process changed its input")
		}
		start, end, ok := EventData(ev)
		typ := ""
		if ok {
			typ = gjson.Get(string(ev[start:end]), "type").Str
		}
		switch {
		case p.UsageErr() != nil:
			if len(out) != 0 {
				t.Fatalf("refused usage passed as %q", out)
			}
		case typ == "error":
			if !bytes.HasPrefix(out, []byte("event: error\n")) {
				t.Fatalf("error replaced by %q", out)
			}
		case typ != "message_start" && !bytes.Equal(out, ev):
			t.Fatalf("%q passed as %q", ev, out)
		}
		u := p.Usage()
		for _, n := range []int64{u.Input, u.CacheRead, u.CacheCreation, u.Output} {
			if n < 0 || n > usagecount.Max {
				t.Fatalf("count %d out of range", n)
			}
		}
	})
}
