package translate

import (
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tollgate-dev/tollgate/anthropic"
	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/jsonstr"
)

// Usage is what a Messages reply tells the client it used, and what the
// gateway records. InputTokens excludes the tokens read from the prefix
// cache, as Anthropic counts them: the prompt is InputTokens +
// CacheReadInputTokens + CacheCreationInputTokens. A chat backend reports no
// cache writes, so CacheCreationInputTokens is 0 in translation.
type Usage struct {
	InputTokens              int64
	OutputTokens             int64
	CacheReadInputTokens     int64
	CacheCreationInputTokens int64
}

// PromptTokens is the whole prompt: input, cache reads and cache writes.
func (u Usage) PromptTokens() int64 {
	return u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens
}

// usageOf reads a chat usage object: prompt_tokens, completion_tokens and
// prompt_tokens_details.cached_tokens.
func usageOf(u gjson.Result) Usage {
	prompt, cached := u.Get("prompt_tokens").Int(), u.Get("prompt_tokens_details.cached_tokens").Int()
	cached = min(max(cached, 0), max(prompt, 0))
	return Usage{InputTokens: max(prompt-cached, 0), CacheReadInputTokens: cached, OutputTokens: max(u.Get("completion_tokens").Int(), 0)}
}

func appendUsage(dst []byte, u Usage) []byte {
	dst = append(dst, `{"input_tokens":`...)
	dst = strconv.AppendInt(dst, u.InputTokens, 10)
	dst = append(dst, `,"cache_creation_input_tokens":`...)
	dst = strconv.AppendInt(dst, u.CacheCreationInputTokens, 10)
	dst = append(dst, `,"cache_read_input_tokens":`...)
	dst = strconv.AppendInt(dst, u.CacheReadInputTokens, 10)
	dst = append(dst, `,"output_tokens":`...)
	dst = strconv.AppendInt(dst, u.OutputTokens, 10)
	return append(dst, '}')
}

// stopReason maps a choice's finish_reason to Anthropic's stop_reason, and
// returns the stop_sequence to send as JSON: vLLM's "stop_reason" on the
// choice is the stop string that ended it (a number when a stop token did,
// null when the model ended by itself).
func stopReason(finish, vllmStop gjson.Result) (reason, sequence string) {
	switch finish.Str {
	case "length":
		return "max_tokens", "null"
	case "tool_calls", "function_call":
		return "tool_use", "null"
	case "content_filter":
		return "refusal", "null"
	case "stop":
		if vllmStop.Type == gjson.String {
			return "stop_sequence", vllmStop.Raw
		}
	}
	return "end_turn", "null"
}

// appendMessageID appends the reply's id, "msg_" and the chat completion's
// id without its "chatcmpl-" prefix, so the two can be matched in logs; only
// letters, digits, '-' and '_' of it are kept, at most 128 of them.
func appendMessageID(dst []byte, chatID string) []byte {
	if len(chatID) > 9 && chatID[:9] == "chatcmpl-" {
		chatID = chatID[9:]
	}
	dst = append(dst, `"msg_`...)
	n := 0
	for i := 0; i < len(chatID) && n < 128; i++ {
		c := chatID[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			dst = append(dst, c)
			n++
		}
	}
	if n == 0 {
		dst = append(dst, "tollgate"...)
	}
	return append(dst, '"')
}

// MessageID is the id of the Messages reply translated from the chat
// completion chatID (see appendMessageID), without quotes.
func MessageID(chatID string) string {
	id := appendMessageID(make([]byte, 0, len(chatID)+8), chatID)
	return string(id[1 : len(id)-1])
}

// reasoningOf is a message's or delta's reasoning: vLLM writes
// "reasoning_content" (and, since 0.10, "reasoning").
func reasoningOf(m gjson.Result) gjson.Result {
	if r := m.Get("reasoning_content"); r.Type == gjson.String {
		return r
	}
	return m.Get("reasoning")
}

// MessagesReply appends to dst the Messages reply for a non-streamed chat
// completion reply, answering as model (the id the client asked for):
// content blocks of thinking (from reasoning_content), text and tool_use
// (with the arguments parsed as input; arguments that are not a JSON object,
// as when max_tokens cut them, become an empty input), stop_reason and
// stop_sequence, and the usage, which it also returns. A reply that is not a
// chat completion is an api_error.
func MessagesReply(dst, chat []byte, model string) ([]byte, Usage, *anthropic.Error) {
	s := bytesconv.String(chat)
	if !gjson.Valid(s) {
		return dst, Usage{}, &anthropic.Error{Type: anthropic.APIError, Message: "The backend's reply is not valid JSON."}
	}
	root := gjson.Parse(s)
	choice := root.Get("choices.0")
	if !choice.IsObject() {
		return dst, Usage{}, &anthropic.Error{Type: anthropic.APIError, Message: "The backend's reply has no choices."}
	}
	msg := choice.Get("message")
	usage := usageOf(root.Get("usage"))
	dst = append(dst, `{"id":`...)
	dst = appendMessageID(dst, root.Get("id").Str)
	dst = append(dst, `,"type":"message","role":"assistant","model":`...)
	dst = jsonstr.Append(dst, model)
	dst = append(dst, `,"content":[`...)
	n := 0
	sep := func() {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
	}
	if r := reasoningOf(msg); r.Type == gjson.String && r.Str != "" {
		sep()
		dst = append(dst, `{"type":"thinking","thinking":`...)
		dst = append(dst, r.Raw...)
		dst = append(dst, `,"signature":""}`...)
	}
	if c := msg.Get("content"); c.Type == gjson.String && c.Str != "" {
		sep()
		dst = append(dst, `{"type":"text","text":`...)
		dst = append(dst, c.Raw...)
		dst = append(dst, '}')
	}
	k := 0
	msg.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
		sep()
		dst = appendToolUseHead(dst, tc.Get("id").Str, tc.Get("function.name").Str, k)
		k++
		dst = append(dst, `,"input":`...)
		dst = appendInput(dst, tc.Get("function.arguments").Str)
		dst = append(dst, '}')
		return true
	})
	reason, sequence := stopReason(choice.Get("finish_reason"), choice.Get("stop_reason"))
	dst = append(dst, `],"stop_reason":"`...)
	dst = append(dst, reason...)
	dst = append(dst, `","stop_sequence":`...)
	dst = append(dst, sequence...)
	dst = append(dst, `,"usage":`...)
	dst = appendUsage(dst, usage)
	return append(dst, '}'), usage, nil
}

// appendToolUseHead appends a tool_use block's opening up to its name; a call
// without an id is given one from its position.
func appendToolUseHead(dst []byte, id, name string, k int) []byte {
	dst = append(dst, `{"type":"tool_use","id":`...)
	if id == "" {
		dst = append(dst, `"toolu_`...)
		dst = strconv.AppendInt(dst, int64(k), 10)
		dst = append(dst, '"')
	} else {
		dst = jsonstr.Append(dst, id)
	}
	dst = append(dst, `,"name":`...)
	return jsonstr.Append(dst, name)
}

// appendInput appends a call's arguments as its input: the object when they
// are one, {} otherwise.
func appendInput(dst []byte, args string) []byte {
	if gjson.Valid(args) {
		if x := gjson.Parse(args); x.IsObject() {
			return append(dst, x.Raw...)
		}
	}
	return append(dst, "{}"...)
}
