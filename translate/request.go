// Package translate is the one place where one wire format becomes another:
// an Anthropic Messages API request becomes an OpenAI chat completions
// request for a backend that serves only chat, and the backend's chat reply,
// or its stream of chunks, becomes a Messages reply or event stream. It reads
// and appends bytes and knows nothing of HTTP, so the proxy and the simulated
// backend share it.
package translate

import (
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tollgate-dev/tollgate/anthropic"
	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/jsonstr"
)

// Reasoning says how a chat backend is asked to think, for a request whose
// thinking is enabled (or disabled) in Anthropic's terms.
type Reasoning uint8

const (
	// ReasoningNone leaves thinking out: the backend's model does not reason,
	// or reasons whatever it is told. Thinking blocks of earlier turns are
	// dropped.
	ReasoningNone Reasoning = iota
	// ReasoningEffort sends "reasoning_effort" (low under a budget of 4096
	// tokens, medium under 16384 or for adaptive thinking, else high), as
	// vLLM reads it for gpt-oss and OpenAI's reasoning models.
	ReasoningEffort
	// ReasoningTemplate sends "chat_template_kwargs": {"enable_thinking": …},
	// as Qwen3 and DeepSeek chat templates in vLLM read it.
	ReasoningTemplate
)

// ChatOptions is what translation needs to know of the route.
type ChatOptions struct {
	// Model is written as the chat request's "model": the backend's id.
	Model string
	// MaxOutputTokens is the model's limit on max_tokens; a request above it
	// is refused with Anthropic's 400. Zero means no limit.
	MaxOutputTokens int64
	// Reasoning is how the backend is asked to think; zero leaves it out.
	Reasoning Reasoning
	// ContinuousUsage asks a stream for usage on every chunk (vLLM's
	// stream_options.continuous_usage_stats), so that message_start carries
	// the input tokens as Anthropic's does. False leaves them 0 there; the
	// final message_delta has them either way.
	ContinuousUsage bool
}

// ChatRequest appends to dst the chat completions request for the Messages
// request body, which anthropic.Validate accepted and described in req:
//
//   - system (a string or text blocks) and every role:"system" turn are
//     folded, in order, into one leading system message, because chat
//     templates refuse a system message anywhere else;
//   - text blocks stay text parts; images become image_url parts (a data:
//     URL for base64); a document of plain text becomes a text part;
//   - tool_use blocks become the assistant message's tool_calls, and
//     tool_result blocks tool messages (their text, prefixed "Error: " when
//     is_error), placed before the rest of the user turn;
//   - thinking blocks become reasoning_content when the backend reasons
//     (opts.Reasoning); redacted thinking and Anthropic's server-tool blocks
//     (web search and the like, which ran on Anthropic's servers) are dropped;
//   - custom tools become function tools, server tools are dropped;
//     tool_choice auto, any, tool, none become "auto", "required", a named
//     function, "none"; disable_parallel_tool_use becomes
//     parallel_tool_calls false;
//   - stop_sequences become stop, max_tokens max_tokens, temperature, top_p
//     and top_k are kept, metadata.user_id becomes user, and a stream asks
//     for usage.
//
// A block translation cannot express (a PDF, a file id, a block type it does
// not know) is an invalid_request_error naming it.
func ChatRequest(dst, body []byte, req *anthropic.Request, opts ChatOptions) ([]byte, *anthropic.Error) {
	if e := req.CheckMaxTokens(opts.MaxOutputTokens); e != nil {
		return dst, e
	}
	root := gjson.Parse(bytesconv.String(body))
	dst = append(dst, `{"model":`...)
	dst = jsonstr.Append(dst, opts.Model)
	dst = append(dst, `,"messages":[`...)
	w := writer{dst: dst, opts: &opts}
	w.system(root)
	var err *anthropic.Error
	i := 0
	root.Get("messages").ForEach(func(_, m gjson.Result) bool {
		w.at = "messages." + strconv.Itoa(i) + ".content."
		i++
		err = w.message(m)
		return err == nil
	})
	if err != nil {
		return dst, err
	}
	dst = append(w.dst, ']')
	dst, err = tools(dst, root, req)
	if err != nil {
		return dst, err
	}
	if req.MaxTokens > 0 {
		dst = append(dst, `,"max_tokens":`...)
		dst = strconv.AppendInt(dst, req.MaxTokens, 10)
	}
	for _, k := range [...]string{"temperature", "top_p", "top_k"} {
		if x := root.Get(k); x.Type == gjson.Number {
			dst = append(dst, ',', '"')
			dst = append(dst, k...)
			dst = append(dst, '"', ':')
			dst = append(dst, x.Raw...)
		}
	}
	if x := root.Get("stop_sequences"); x.IsArray() && req.StopSequences > 0 {
		dst = append(dst, `,"stop":`...)
		dst = append(dst, x.Raw...)
	}
	if x := root.Get("metadata.user_id"); x.Type == gjson.String {
		dst = append(dst, `,"user":`...)
		dst = append(dst, x.Raw...)
	}
	dst = reasoning(dst, req, opts.Reasoning)
	if req.Stream {
		dst = append(dst, `,"stream":true,"stream_options":{"include_usage":true`...)
		if opts.ContinuousUsage {
			dst = append(dst, `,"continuous_usage_stats":true`...)
		}
		dst = append(dst, '}')
	}
	return append(dst, '}'), nil
}

// writer appends chat messages.
type writer struct {
	dst  []byte
	opts *ChatOptions
	n    int    // messages written
	at   string // "messages.<i>.content.", to name a block in an error
}

func (w *writer) open(role string) {
	if w.n > 0 {
		w.dst = append(w.dst, ',')
	}
	w.n++
	w.dst = append(w.dst, `{"role":"`...)
	w.dst = append(w.dst, role...)
	w.dst = append(w.dst, `","content":`...)
}

// system writes the one system message: the system field's text, then that of
// every system turn, joined by blank lines.
func (w *writer) system(root gjson.Result) {
	pieces := 0
	add := func(text string) {
		if pieces == 0 {
			w.open("system")
			w.dst = append(w.dst, '"')
		} else {
			w.dst = append(w.dst, `\n\n`...)
		}
		pieces++
		w.dst = appendEscaped(w.dst, text)
	}
	addAll := func(c gjson.Result) {
		if c.Type == gjson.String {
			add(c.Str)
			return
		}
		c.ForEach(func(_, b gjson.Result) bool {
			add(b.Get("text").Str)
			return true
		})
	}
	if s := root.Get("system"); s.Exists() && s.Type != gjson.Null {
		addAll(s)
	}
	root.Get("messages").ForEach(func(_, m gjson.Result) bool {
		if m.Get("role").Str == "system" {
			addAll(m.Get("content"))
		}
		return true
	})
	if pieces > 0 {
		w.dst = append(w.dst, `"}`...)
	}
}

func (w *writer) message(m gjson.Result) *anthropic.Error {
	role, content := m.Get("role").Str, m.Get("content")
	switch {
	case role == "system":
		return nil // folded into the system message
	case content.Type == gjson.String:
		w.open(role)
		w.dst = append(w.dst, content.Raw...)
		w.dst = append(w.dst, '}')
		return nil
	case role == "assistant":
		return w.assistant(content)
	}
	return w.user(content)
}

// user writes a user turn: its tool results as tool messages first (they
// answer the assistant's calls, which chat wants right after them), then the
// rest as a user message of parts.
func (w *writer) user(content gjson.Result) *anthropic.Error {
	var err *anthropic.Error
	parts := 0
	content.ForEach(func(_, b gjson.Result) bool {
		if typ := b.Get("type").Str; typ != "tool_result" {
			if !dropped(typ) {
				parts++
			}
			return true
		}
		w.open("tool")
		w.dst = append(w.dst, '"')
		if b.Get("is_error").Type == gjson.True {
			w.dst = append(w.dst, "Error: "...)
		}
		c := b.Get("content")
		if c.Type == gjson.String {
			w.dst = appendEscaped(w.dst, c.Str)
		} else {
			sep := false
			c.ForEach(func(_, x gjson.Result) bool {
				if text, ok := textOfBlock(x); ok {
					if sep {
						w.dst = append(w.dst, `\n`...)
					}
					sep = true
					w.dst = appendEscaped(w.dst, text)
				} else if x.Get("type").Str == "image" {
					parts++ // goes to the user message that follows
				}
				return true
			})
		}
		w.dst = append(w.dst, `","tool_call_id":`...)
		w.dst = append(w.dst, b.Get("tool_use_id").Raw...)
		w.dst = append(w.dst, '}')
		return true
	})
	if parts == 0 {
		return nil
	}
	w.open("user")
	w.dst = append(w.dst, '[')
	first := true
	part := func(b gjson.Result, p string) bool {
		if first {
			first = false
		} else {
			w.dst = append(w.dst, ',')
		}
		w.dst, err = appendPart(w.dst, b, p)
		return err == nil
	}
	j := 0
	content.ForEach(func(_, b gjson.Result) bool {
		p := w.at + strconv.Itoa(j)
		j++
		switch b.Get("type").Str {
		case "tool_result":
			b.Get("content").ForEach(func(_, x gjson.Result) bool {
				return x.Get("type").Str != "image" || part(x, p)
			})
			return err == nil
		}
		if dropped(b.Get("type").Str) {
			return true
		}
		return part(b, p)
	})
	if err != nil {
		return err
	}
	w.dst = append(w.dst, "]}"...)
	return nil
}

// appendPart appends a user content block as a chat content part.
func appendPart(dst []byte, b gjson.Result, p string) ([]byte, *anthropic.Error) {
	typ := b.Get("type").Str
	if text, ok := textOfBlock(b); ok {
		dst = append(dst, `{"type":"text","text":`...)
		dst = jsonstr.Append(dst, text)
		return append(dst, '}'), nil
	}
	if typ == "image" {
		src := b.Get("source")
		switch src.Get("type").Str {
		case "base64":
			dst = append(dst, `{"type":"image_url","image_url":{"url":"data:`...)
			dst = appendEscaped(dst, src.Get("media_type").Str)
			dst = append(dst, ";base64,"...)
			dst = appendEscaped(dst, src.Get("data").Str)
			return append(dst, `"}}`...), nil
		case "url":
			dst = append(dst, `{"type":"image_url","image_url":{"url":`...)
			dst = append(dst, src.Get("url").Raw...)
			return append(dst, "}}"...), nil
		}
	}
	what := typ + " block"
	if typ == "image" || typ == "document" {
		what = typ + " with a " + b.Get("source.type").Str + " source"
	}
	return dst, anthropic.Invalid(p, p+": an "+what+" cannot be sent to this model, whose backend serves chat completions only; send text, images as base64 or URL, or documents of plain text.")
}

// textOfBlock is the text a block carries when it is text: a text block, a
// document of plain text or of text blocks, a search result's text.
func textOfBlock(b gjson.Result) (string, bool) {
	switch b.Get("type").Str {
	case "text":
		return b.Get("text").Str, true
	case "document":
		src := b.Get("source")
		switch src.Get("type").Str {
		case "text":
			return src.Get("data").Str, true
		case "content":
			if c := src.Get("content"); c.Type == gjson.String {
				return c.Str, true
			}
			return joinTexts(src.Get("content")), true
		}
	case "search_result":
		return joinTexts(b.Get("content")), true
	}
	return "", false
}

func joinTexts(blocks gjson.Result) string {
	var out []byte
	blocks.ForEach(func(_, x gjson.Result) bool {
		if t := x.Get("text"); t.Type == gjson.String {
			if len(out) > 0 {
				out = append(out, '\n')
			}
			out = append(out, t.Str...)
		}
		return true
	})
	return string(out)
}

// dropped reports whether a block of type typ is left out of a chat request:
// thinking (which goes to reasoning_content in an assistant turn, when the
// backend reasons) and the blocks of Anthropic's server tools, which ran on
// Anthropic's servers and mean nothing to another model.
func dropped(typ string) bool {
	switch typ {
	case "thinking", "redacted_thinking", "server_tool_use", "mcp_tool_use", "mcp_tool_result",
		"web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
		"bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
		"tool_search_tool_result", "container_upload":
		return true
	}
	return false
}

// assistant writes an assistant turn: its text joined as content, its
// tool_use blocks as tool_calls, its thinking as reasoning_content.
func (w *writer) assistant(content gjson.Result) *anthropic.Error {
	var err *anthropic.Error
	j := 0
	content.ForEach(func(_, b gjson.Result) bool {
		p := w.at + strconv.Itoa(j)
		j++
		if typ := b.Get("type").Str; typ != "text" && typ != "tool_use" && !dropped(typ) {
			_, err = appendPart(nil, b, p)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	w.open("assistant")
	text, calls, thinking := 0, 0, 0
	content.ForEach(func(_, b gjson.Result) bool {
		switch b.Get("type").Str {
		case "text":
			if text == 0 {
				w.dst = append(w.dst, '"')
			}
			text++
			w.dst = appendEscaped(w.dst, b.Get("text").Str)
		case "tool_use":
			calls++
		case "thinking":
			thinking++
		}
		return true
	})
	if text > 0 {
		w.dst = append(w.dst, '"')
	} else {
		w.dst = append(w.dst, "null"...)
	}
	if calls > 0 {
		w.dst = append(w.dst, `,"tool_calls":[`...)
		k := 0
		content.ForEach(func(_, b gjson.Result) bool {
			if b.Get("type").Str != "tool_use" {
				return true
			}
			if k > 0 {
				w.dst = append(w.dst, ',')
			}
			k++
			w.dst = append(w.dst, `{"id":`...)
			w.dst = append(w.dst, b.Get("id").Raw...)
			w.dst = append(w.dst, `,"type":"function","function":{"name":`...)
			w.dst = append(w.dst, b.Get("name").Raw...)
			w.dst = append(w.dst, `,"arguments":`...)
			w.dst = jsonstr.Append(w.dst, b.Get("input").Raw)
			w.dst = append(w.dst, "}}"...)
			return true
		})
		w.dst = append(w.dst, ']')
	}
	if thinking > 0 && w.opts.Reasoning != ReasoningNone {
		w.dst = append(w.dst, `,"reasoning_content":"`...)
		content.ForEach(func(_, b gjson.Result) bool {
			if b.Get("type").Str == "thinking" {
				w.dst = appendEscaped(w.dst, b.Get("thinking").Str)
			}
			return true
		})
		w.dst = append(w.dst, '"')
	}
	w.dst = append(w.dst, '}')
	return nil
}

// tools appends the custom tools as function tools and the tool choice.
func tools(dst []byte, root gjson.Result, req *anthropic.Request) ([]byte, *anthropic.Error) {
	if req.ToolChoice == anthropic.ToolChoiceAny && req.CustomTools == 0 {
		return dst, anthropic.Invalid("tool_choice", `tool_choice: {"type":"any"} needs a custom tool (one with an input_schema); server tools run only on Anthropic's own API.`)
	}
	if req.CustomTools > 0 {
		dst = append(dst, `,"tools":[`...)
		k := 0
		root.Get("tools").ForEach(func(_, t gjson.Result) bool {
			if typ := t.Get("type"); typ.Exists() && typ.Type != gjson.Null && typ.Str != "custom" {
				return true
			}
			if k > 0 {
				dst = append(dst, ',')
			}
			k++
			dst = append(dst, `{"type":"function","function":{"name":`...)
			dst = append(dst, t.Get("name").Raw...)
			if d := t.Get("description"); d.Type == gjson.String {
				dst = append(dst, `,"description":`...)
				dst = append(dst, d.Raw...)
			}
			dst = append(dst, `,"parameters":`...)
			dst = append(dst, t.Get("input_schema").Raw...)
			dst = append(dst, "}}"...)
			return true
		})
		dst = append(dst, ']')
	}
	switch req.ToolChoice {
	case anthropic.ToolChoiceAuto:
		if req.CustomTools > 0 {
			dst = append(dst, `,"tool_choice":"auto"`...)
		}
	case anthropic.ToolChoiceAny:
		dst = append(dst, `,"tool_choice":"required"`...)
	case anthropic.ToolChoiceNone:
		if req.CustomTools > 0 {
			dst = append(dst, `,"tool_choice":"none"`...)
		}
	case anthropic.ToolChoiceTool:
		custom := false
		root.Get("tools").ForEach(func(_, t gjson.Result) bool {
			if t.Get("name").Str == string(req.ToolChoiceName) {
				typ := t.Get("type")
				custom = !typ.Exists() || typ.Type == gjson.Null || typ.Str == "custom"
				return false
			}
			return true
		})
		if !custom {
			return dst, anthropic.Invalid("tool_choice.name", "tool_choice.name: "+strconv.Quote(string(req.ToolChoiceName))+" is a server tool, which runs only on Anthropic's own API; name a custom tool.")
		}
		dst = append(dst, `,"tool_choice":{"type":"function","function":{"name":`...)
		dst = jsonstr.Append(dst, bytesconv.String(req.ToolChoiceName))
		dst = append(dst, "}}"...)
	}
	if req.DisableParallelToolUse && req.CustomTools > 0 {
		dst = append(dst, `,"parallel_tool_calls":false`...)
	}
	return dst, nil
}

// reasoning appends how the backend is asked to think.
func reasoning(dst []byte, req *anthropic.Request, how Reasoning) []byte {
	if req.Thinking == anthropic.ThinkingAbsent {
		return dst
	}
	on := req.Thinking != anthropic.ThinkingDisabled
	switch how {
	case ReasoningEffort:
		if !on {
			return dst
		}
		effort := "medium"
		switch {
		case req.Thinking == anthropic.ThinkingAdaptive:
		case req.ThinkingBudget < 4096:
			effort = "low"
		case req.ThinkingBudget >= 16384:
			effort = "high"
		}
		dst = append(dst, `,"reasoning_effort":"`...)
		dst = append(dst, effort...)
		return append(dst, '"')
	case ReasoningTemplate:
		dst = append(dst, `,"chat_template_kwargs":{"enable_thinking":`...)
		dst = strconv.AppendBool(dst, on)
		return append(dst, '}')
	}
	return dst
}

// appendEscaped appends s escaped as the inside of a JSON string, without
// the quotes, so that several pieces can make one string.
func appendEscaped(dst []byte, s string) []byte {
	start := len(dst)
	dst = jsonstr.Append(dst, s)
	n := copy(dst[start:], dst[start+1:len(dst)-1])
	return dst[:start+n]
}
