package translate

import (
	"bytes"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tollgate-dev/tollgate/anthropic"
	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/jsonstr"
)

// Stream turns a chat completion stream into a Messages API stream, one
// upstream event at a time, appending the Anthropic events to the caller's
// buffer. It holds a few fields and the stop sequence, never the stream, so
// its memory is bounded by the largest event it is given. The order is
// Anthropic's: message_start, ping, then for each content block (thinking,
// text, tool_use) content_block_start, its deltas (thinking_delta,
// text_delta, input_json_delta) and content_block_stop, then message_delta
// with stop_reason, stop_sequence and usage, and message_stop.
//
// A zero Stream is not ready: call Reset with the model the client asked for.
type Stream struct {
	model    string
	started  bool // message_start is out
	finished bool // message_stop or an error is out: nothing more is sent

	blocks   int       // content blocks started so far
	open     blockKind // the block being streamed
	toolCall int64     // the chat tool call index of the open tool_use block
	calls    int       // tool_use blocks started, for ids a call lacks

	finish  string // stop_reason, once a choice finished
	stopSeq []byte // stop_sequence as JSON
	usage   Usage
	joined  []byte // the data lines of an event sent in several
}

type blockKind uint8

const (
	kindNone blockKind = iota
	kindThinking
	kindText
	kindTool
)

// Reset readies s for a new stream answered as model.
func (s *Stream) Reset(model string) {
	*s = Stream{model: model, stopSeq: append(s.stopSeq[:0], "null"...), joined: s.joined[:0]}
}

// Usage is the usage the stream has reported so far (the last usage a chunk
// carried).
func (s *Stream) Usage() Usage { return s.usage }

// Finished reports whether the stream has ended, by message_stop or an error.
func (s *Stream) Finished() bool { return s.finished }

// Event appends the Anthropic events for one upstream SSE event (its lines,
// with or without the blank line that ends it). "data: [DONE]" finishes the
// stream; an event that is not a chat chunk, or one carrying an "error",
// ends it with an error event. Comments and events without data add nothing.
func (s *Stream) Event(dst, event []byte) []byte {
	if s.finished {
		return dst
	}
	data, ok := s.data(event)
	if !ok {
		return dst
	}
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		return s.Finish(dst)
	}
	js := bytesconv.String(data)
	if !gjson.Valid(js) {
		return s.Fail(dst, &anthropic.Error{Type: anthropic.APIError, Message: "The backend sent an event that is not JSON."})
	}
	chunk := gjson.Parse(js)
	if !chunk.IsObject() {
		return s.Fail(dst, &anthropic.Error{Type: anthropic.APIError, Message: "The backend sent an event that is not a chat completion chunk."})
	}
	if e := chunk.Get("error"); e.Exists() && e.Type != gjson.Null {
		msg := e.Get("message").Str
		if msg == "" {
			msg = "The backend failed during the stream."
		}
		return s.Fail(dst, &anthropic.Error{Type: anthropic.APIError, Message: msg})
	}
	if u := chunk.Get("usage"); u.IsObject() {
		s.usage = usageOf(u)
	}
	if !s.started {
		dst = s.start(dst, chunk.Get("id").Str)
	}
	choice := chunk.Get("choices.0")
	if !choice.IsObject() {
		return dst
	}
	delta := choice.Get("delta")
	if r := reasoningOf(delta); r.Type == gjson.String && r.Str != "" {
		dst = s.ensure(dst, kindThinking, -1, gjson.Result{})
		dst = s.delta(dst, `{"type":"thinking_delta","thinking":`, r.Raw)
	}
	if c := delta.Get("content"); c.Type == gjson.String && c.Str != "" {
		dst = s.ensure(dst, kindText, -1, gjson.Result{})
		dst = s.delta(dst, `{"type":"text_delta","text":`, c.Raw)
	}
	delta.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
		dst = s.toolDelta(dst, tc)
		return true
	})
	if f := choice.Get("finish_reason"); f.Type == gjson.String {
		reason, seq := stopReason(f, choice.Get("stop_reason"))
		s.finish = reason
		s.stopSeq = append(s.stopSeq[:0], seq...)
	}
	return dst
}

// toolDelta streams a tool call's delta: a call with an id or a name opens a
// tool_use block; its argument fragments are input_json_delta events. A
// fragment for a call whose block is already closed is dropped: Anthropic's
// blocks cannot reopen, and vLLM streams calls one after another.
func (s *Stream) toolDelta(dst []byte, tc gjson.Result) []byte {
	index := tc.Get("index").Int()
	id, name := tc.Get("id"), tc.Get("function.name")
	if s.open != kindTool || index != s.toolCall {
		if id.Str == "" && name.Str == "" {
			return dst
		}
		dst = s.ensure(dst, kindTool, index, tc)
	}
	if args := tc.Get("function.arguments"); args.Type == gjson.String && args.Str != "" {
		dst = s.delta(dst, `{"type":"input_json_delta","partial_json":`, args.Raw)
	}
	return dst
}

// ensure makes a block of kind the open one, closing the open block and
// starting a new one unless it already is (a tool_use block is always new).
func (s *Stream) ensure(dst []byte, kind blockKind, toolCall int64, tc gjson.Result) []byte {
	if s.open == kind && kind != kindTool {
		return dst
	}
	dst = s.closeBlock(dst)
	s.open = kind
	dst = append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(s.blocks), 10)
	dst = append(dst, `,"content_block":`...)
	switch kind {
	case kindThinking:
		dst = append(dst, `{"type":"thinking","thinking":"","signature":""}`...)
	case kindText:
		dst = append(dst, `{"type":"text","text":""}`...)
	case kindTool:
		s.toolCall = toolCall
		dst = appendToolUseHead(dst, tc.Get("id").Str, tc.Get("function.name").Str, s.calls)
		s.calls++
		dst = append(dst, `,"input":{}}`...)
	}
	return append(dst, "}\n\n"...)
}

// delta appends a content_block_delta of the open block: head, then the raw
// JSON string, then the closing braces.
func (s *Stream) delta(dst []byte, head, raw string) []byte {
	dst = append(dst, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(s.blocks), 10)
	dst = append(dst, `,"delta":`...)
	dst = append(dst, head...)
	dst = append(dst, raw...)
	return append(dst, "}}\n\n"...)
}

func (s *Stream) closeBlock(dst []byte) []byte {
	if s.open == kindNone {
		return dst
	}
	dst = append(dst, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":"...)
	dst = strconv.AppendInt(dst, int64(s.blocks), 10)
	s.blocks++
	s.open = kindNone
	return append(dst, "}\n\n"...)
}

// start appends message_start, with the usage known so far, and a ping.
func (s *Stream) start(dst []byte, chatID string) []byte {
	s.started = true
	dst = append(dst, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":"...)
	dst = appendMessageID(dst, chatID)
	dst = append(dst, `,"type":"message","role":"assistant","model":`...)
	dst = jsonstr.Append(dst, s.model)
	dst = append(dst, `,"content":[],"stop_reason":null,"stop_sequence":null,"usage":`...)
	dst = appendUsage(dst, Usage{InputTokens: s.usage.InputTokens, CacheReadInputTokens: s.usage.CacheReadInputTokens})
	return append(dst, "}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n"...)
}

// Finish ends the stream: the open block is closed, and message_delta (stop
// reason, stop sequence, the whole usage) and message_stop follow. A stream
// whose chunks never said why they ended ends with end_turn.
func (s *Stream) Finish(dst []byte) []byte {
	if s.finished {
		return dst
	}
	if !s.started {
		dst = s.start(dst, "")
	}
	dst = s.closeBlock(dst)
	s.finished = true
	reason := s.finish
	if reason == "" {
		reason = "end_turn"
	}
	dst = append(dst, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\""...)
	dst = append(dst, reason...)
	dst = append(dst, `","stop_sequence":`...)
	dst = append(dst, s.stopSeq...)
	dst = append(dst, `},"usage":`...)
	dst = appendUsage(dst, s.usage)
	return append(dst, "}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
}

// Fail ends the stream with an error event, as Anthropic ends a stream that
// fails after its 200: the client's SDK raises it.
func (s *Stream) Fail(dst []byte, e *anthropic.Error) []byte {
	if s.finished {
		return dst
	}
	s.finished = true
	return anthropic.AppendErrorEvent(dst, e)
}

// data returns an event's data: the value of its one "data:" line, or of
// several joined by newlines (in s.joined), as the SSE specification reads
// them. ok is false when the event has none.
func (s *Stream) data(event []byte) (data []byte, ok bool) {
	lines := 0
	for rest := event; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		v, found := bytes.CutPrefix(line, []byte("data:"))
		if !found {
			continue
		}
		v = bytes.TrimPrefix(v, []byte{' '})
		switch lines++; lines {
		case 1:
			data = v
		case 2:
			s.joined = append(append(append(s.joined[:0], data...), '\n'), v...)
			data = nil
		default:
			s.joined = append(append(s.joined, '\n'), v...)
		}
	}
	if lines > 1 {
		data = s.joined
	}
	return data, lines > 0
}
