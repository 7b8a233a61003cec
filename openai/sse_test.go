package openai

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/tidwall/gjson"
)

const (
	chunkEvent = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"up/model","choices":[{"index":0,"delta":{"content":"tok1 "},"finish_reason":null}]}` + "\n\n"
	usageEvent = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"up/model","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":2,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":3}}}` + "\n\n"
	contEvent  = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"up/model","choices":[{"index":0,"delta":{"content":"tok1 "}}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}` + "\n\n"
	doneEvent  = "data: [DONE]\n\n"
)

func TestEventScanner(t *testing.T) {
	stream := ": keepalive\n\n" + chunkEvent + "data: {\"a\":1}\r\n\r\n" + usageEvent + doneEvent
	want := []string{": keepalive\n\n", chunkEvent, "data: {\"a\":1}\r\n\r\n", usageEvent, doneEvent}
	readers := map[string]func() io.Reader{
		"whole":       func() io.Reader { return strings.NewReader(stream) },
		"byte a read": func() io.Reader { return iotest.OneByteReader(strings.NewReader(stream)) },
		"half reads":  func() io.Reader { return iotest.HalfReader(strings.NewReader(stream)) },
	}
	for name, mk := range readers {
		t.Run(name, func(t *testing.T) {
			var s EventScanner
			s.Reset(mk(), 0)
			for i, w := range want {
				ev, err := s.Next()
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if string(ev) != w {
					t.Fatalf("event %d = %q, want %q", i, ev, w)
				}
			}
			if ev, err := s.Next(); !errors.Is(err, io.EOF) || len(ev) != 0 {
				t.Fatalf("after the last event: %q, %v; want io.EOF", ev, err)
			}
		})
	}
	t.Run("truncated event is returned with the error", func(t *testing.T) {
		var s EventScanner
		s.Reset(strings.NewReader(chunkEvent+"data: {\"cut"), 0)
		if _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
		rest, err := s.Next()
		if !errors.Is(err, io.EOF) || string(rest) != "data: {\"cut" {
			t.Fatalf("got %q, %v", rest, err)
		}
	})
	t.Run("oversized event", func(t *testing.T) {
		var s EventScanner
		s.Reset(strings.NewReader("data: "+strings.Repeat("x", MaxEventBytes+10)), 0)
		if _, err := s.Next(); !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("err = %v, want ErrEventTooLarge", err)
		}
	})
}

func TestEventData(t *testing.T) {
	tests := []struct {
		ev   string
		want string
		ok   bool
	}{
		{"data: x\n\n", "x", true},
		{"data:x\n\n", "x", true},
		{"data: x\r\n\r\n", "x", true},
		{"data: [DONE]\n\n", "[DONE]", true},
		{": comment\n\n", "", false},
		{"event: e\ndata: x\n\n", "", false},
		{"data: a\ndata: b\n\n", "", false},
	}
	for _, tt := range tests {
		start, end, ok := eventData([]byte(tt.ev))
		if ok != tt.ok || (ok && tt.ev[start:end] != tt.want) {
			t.Errorf("eventData(%q) = %q, %v; want %q, %v", tt.ev, tt.ev[start:end], ok, tt.want, tt.ok)
		}
	}
}

func TestChunkProcessor(t *testing.T) {
	public := []byte(`"demo"`)
	tests := []struct {
		name                        string
		stripUsage, stripContinuous bool
		publicModel                 []byte
		in                          string
		want                        string
	}{
		{"untouched", false, false, nil, chunkEvent, chunkEvent},
		{"model rewritten", false, false, public, chunkEvent, strings.Replace(chunkEvent, `"up/model"`, `"demo"`, 1)},
		{"usage chunk kept when asked", false, false, nil, usageEvent, usageEvent},
		{"usage chunk removed when not asked", true, false, public, usageEvent, ""},
		{"continuous usage kept when asked", false, false, nil, contEvent, contEvent},
		{"continuous usage cut when not asked", true, true, public, contEvent,
			strings.Replace(strings.Replace(contEvent, `,"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}`, "", 1), `"up/model"`, `"demo"`, 1)},
		{"comment passes", true, true, public, ": ping\n\n", ": ping\n\n"},
		{"done passes", true, true, public, doneEvent, doneEvent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c EventProcessor
			c.Reset(StreamOptions{StripUsage: tt.stripUsage, StripContinuous: tt.stripContinuous, PublicModel: tt.publicModel})
			got := string(c.Process(nil, []byte(tt.in)))
			if got != tt.want {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
			if start, end, ok := eventData([]byte(got)); ok && got[start:end] != "[DONE]" && !gjson.Valid(got[start:end]) {
				t.Fatalf("output is not valid JSON: %s", got)
			}
		})
	}

	t.Run("counts", func(t *testing.T) {
		var c EventProcessor
		c.Reset(StreamOptions{StripUsage: true, StripContinuous: false, PublicModel: nil})
		for _, ev := range []string{chunkEvent, chunkEvent, usageEvent, doneEvent} {
			c.Process(nil, []byte(ev))
		}
		if !c.done || c.deltas != 2 || c.usage.Input != 8 || c.usage.Output != 2 || c.usage.Total != 10 || c.usage.Cached != 3 {
			t.Fatalf("state = %+v", c)
		}
	})
	t.Run("continuous usage is not summed", func(t *testing.T) {
		var c EventProcessor
		c.Reset(StreamOptions{StripUsage: true, StripContinuous: true, PublicModel: nil})
		for i := 1; i <= 3; i++ {
			ev := strings.Replace(contEvent, `"completion_tokens":1,"total_tokens":9`,
				`"completion_tokens":`+string(rune('0'+i))+`,"total_tokens":`+string(rune('0'+8+i)), 1)
			c.Process(nil, []byte(ev))
		}
		if c.usage.Output != 3 || c.OutputTokens() != 3 {
			t.Fatalf("completion = %d, want the last cumulative count 3", c.usage.Output)
		}
	})
	t.Run("in-band error", func(t *testing.T) {
		var c EventProcessor
		c.Reset(StreamOptions{StripUsage: true, StripContinuous: false, PublicModel: nil})
		c.Process(nil, []byte(`data: {"error":{"message":"boom","type":"x","code":500}}`+"\n\n"))
		if c.errMessage != "boom" {
			t.Fatalf("errMessage = %q", c.errMessage)
		}
	})
}

func TestMemberSpan(t *testing.T) {
	tests := []struct{ in, key, want string }{
		{`{"a":1,"usage":{"x":1}}`, "usage", `{"a":1}`},
		{`{"usage":{"x":1},"a":1}`, "usage", `{"a":1}`},
		{`{"usage":{"x":1}}`, "usage", `{}`},
		{`{"a":1 , "usage" : {"x":1} , "b":2}`, "usage", `{"a":1  , "b":2}`},
	}
	for _, tt := range tests {
		r := gjson.Get(tt.in, tt.key)
		keyStart := strings.Index(tt.in, `"`+tt.key+`"`)
		from, to := memberSpan([]byte(tt.in), keyStart, r.Index+len(r.Raw))
		if got := tt.in[:from] + tt.in[to:]; got != tt.want || !gjson.Valid(got) {
			t.Errorf("remove %s from %s = %s, want %s", tt.key, tt.in, got, tt.want)
		}
	}
}

// TestAppendUpstreamBody: rewrite is a route whose backends serve the model
// as up/model, plain one that serves it under its public id, demo.
func TestAppendUpstreamBody(t *testing.T) {
	rewrite, plain := []byte(`"up/model"`), []byte(`"demo"`)
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	tests := []struct {
		name       string
		upstream   []byte
		continuous bool
		body       string
		want       string
	}{
		{"no change", plain, false, `{"model":"demo",` + msgs + `}`, `{"model":"demo",` + msgs + `}`},
		{"model rewritten", rewrite, false, `{"model":"demo",` + msgs + `}`, `{"model":"up/model",` + msgs + `}`},
		{"stream gets include_usage", plain, false, `{"model":"demo","stream":true,` + msgs + `}`,
			`{"stream_options":{"include_usage":true},"model":"demo","stream":true,` + msgs + `}`},
		{"stream and rewrite", rewrite, false, `{"stream":true,"model":"demo",` + msgs + `}`,
			`{"stream_options":{"include_usage":true},"stream":true,"model":"up/model",` + msgs + `}`},
		{"client options kept", rewrite, false, `{"model":"demo","stream":true,"stream_options":{"continuous_usage_stats":true},` + msgs + `}`,
			`{"model":"up/model","stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true},` + msgs + `}`},
		{"null options replaced", plain, false, `{"model":"demo","stream":true,"stream_options":null,` + msgs + `}`,
			`{"model":"demo","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`},
		{"already asked", plain, false, `{"model":"demo","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`,
			`{"model":"demo","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`},
		{"continuous backend", plain, true, `{"model":"demo","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`,
			`{"model":"demo","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},` + msgs + `}`},
		{"continuous backend, no options", plain, true, `{"model":"demo","stream":true,` + msgs + `}`,
			`{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"model":"demo","stream":true,` + msgs + `}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Validation finds the offsets the builder splices at.
			var req Request
			if verr := ValidateChat([]byte(tt.body), &req); verr != nil {
				t.Fatalf("test body invalid: %v", verr)
			}
			got := string(AppendUpstreamBody(nil, []byte(tt.body), &req, tt.upstream, tt.continuous))
			if got != tt.want {
				t.Fatalf("got  %s\nwant %s", got, tt.want)
			}
			if !gjson.Valid(got) {
				t.Fatalf("not valid JSON: %s", got)
			}
		})
	}
}

func TestStreamPathAllocations(t *testing.T) {
	var c EventProcessor
	c.Reset(StreamOptions{StripUsage: true, StripContinuous: true, PublicModel: []byte(`"demo"`)})
	events := [][]byte{[]byte(chunkEvent), []byte(contEvent), []byte(usageEvent), []byte(doneEvent)}
	dst := make([]byte, 0, 4096)
	src := bytes.NewReader(nil)
	var s EventScanner
	stream := []byte(chunkEvent + contEvent + usageEvent + doneEvent)
	s.Reset(src, 0)
	s.buf = make([]byte, 4096)
	allocs := testing.AllocsPerRun(200, func() {
		for _, ev := range events {
			dst = c.Process(dst[:0], ev)
		}
		src.Reset(stream)
		s.Reset(src, 0)
		for {
			if _, err := s.Next(); err != nil {
				break
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("SSE scanning and chunk processing allocate %.1f times per stream of 4 events, want 0", allocs)
	}
}

func BenchmarkChunkProcess(b *testing.B) {
	var c EventProcessor
	c.Reset(StreamOptions{StripUsage: true, StripContinuous: false, PublicModel: []byte(`"demo"`)})
	ev := []byte(chunkEvent)
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		dst = c.Process(dst[:0], ev)
	}
}

func BenchmarkEventScan(b *testing.B) {
	stream := []byte(strings.Repeat(chunkEvent, 64) + usageEvent + doneEvent)
	src := bytes.NewReader(stream)
	var s EventScanner
	s.buf = make([]byte, 8192)
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		src.Reset(stream)
		s.Reset(src, 0)
		for {
			if _, err := s.Next(); err != nil {
				break
			}
		}
	}
}
