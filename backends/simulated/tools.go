package simulated

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// Tool calling, as a vLLM server started with --enable-auto-tool-choice answers it:
//
//   - tool_choice "none", or no tools: text.
//   - a named choice {"type":"function","function":{"name":…}}: a call of that tool.
//   - "required": a call of the first tool.
//   - "auto" (the default when tools are given): after a tool result (the last message has role
//     "tool") text; otherwise a call of the first tool whose name appears in the last user
//     message, case-insensitively, or text when none does.
//
// The call's arguments are a JSON document valid against the tool's parameters schema, and they
// are the choice's completion tokens.

// toolChoiceMode is the request's tool_choice.
type toolChoiceMode int

const (
	toolChoiceAuto toolChoiceMode = iota
	toolChoiceNone
	toolChoiceRequired
	toolChoiceNamed
)

// toolDef is one declared function tool.
type toolDef struct {
	name       string
	parameters gjson.Result
}

// toolRequest is the tool part of a request.
type toolRequest struct {
	tools []toolDef
	mode  toolChoiceMode
	named string // the function a named choice names
}

// parseTools reads tools and tool_choice, refusing what vLLM refuses. Chat nests a function's
// name and parameters under "function"; the Responses API has them flat (flat is true), and
// declares other kinds of tools too, which are left out.
func parseTools(tools, choice gjson.Result, flat bool) (toolRequest, apiError) {
	var tr toolRequest
	prefix := "function."
	if flat {
		prefix = ""
	}
	if tools.Exists() && tools.Type != gjson.Null {
		if !tools.IsArray() {
			return tr, badRequest("tools", "tools must be an array of tool objects.")
		}
		for _, t := range tools.Array() {
			if flat && t.Get("type").Str != "function" {
				continue
			}
			name := t.Get(prefix + "name")
			if !t.IsObject() || name.Type != gjson.String || name.Str == "" {
				return tr, badRequest("tools", "Each tool must be an object with a function that has a name.")
			}
			tr.tools = append(tr.tools, toolDef{name: name.Str, parameters: t.Get(prefix + "parameters")})
		}
	}
	switch {
	case !choice.Exists() || choice.Type == gjson.Null || choice.Str == "auto":
		tr.mode = toolChoiceAuto
	case choice.Str == "none":
		tr.mode = toolChoiceNone
	case choice.Str == "required":
		tr.mode = toolChoiceRequired
		if len(tr.tools) == 0 {
			return tr, badRequest("tool_choice", "When using `tool_choice`, `tools` must be set.")
		}
	case choice.IsObject():
		name := choice.Get(prefix + "name")
		if name.Type != gjson.String {
			return tr, badRequest("tool_choice", "A named tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}.")
		}
		if len(tr.tools) == 0 {
			return tr, badRequest("tool_choice", "When using `tool_choice`, `tools` must be set.")
		}
		if tr.find(name.Str) < 0 {
			return tr, badRequest("tool_choice", "The tool specified in `tool_choice` does not match any of the specified `tools`.")
		}
		tr.mode, tr.named = toolChoiceNamed, name.Str
	default:
		return tr, badRequest("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or a named function.")
	}
	return tr, apiError{}
}

// find returns the index of the tool with this function name, or -1.
func (tr *toolRequest) find(name string) int {
	for i, t := range tr.tools {
		if t.name == name {
			return i
		}
	}
	return -1
}

// choose returns the tool to call, or -1 to answer in text. afterToolResult says the
// conversation ends with a tool's result; lastUser is the text of the last user message.
func (tr *toolRequest) choose(afterToolResult bool, lastUser string) int {
	switch {
	case len(tr.tools) == 0 || tr.mode == toolChoiceNone:
		return -1
	case tr.mode == toolChoiceRequired:
		return 0
	case tr.mode == toolChoiceNamed:
		return tr.find(tr.named)
	case afterToolResult:
		return -1
	}
	text := strings.ToLower(lastUser)
	for j, t := range tr.tools {
		if strings.Contains(text, strings.ToLower(t.name)) {
			return j
		}
	}
	return -1
}

// chooseForMessages is choose for chat messages.
func (tr *toolRequest) chooseForMessages(messages gjson.Result) int {
	if len(tr.tools) == 0 {
		return -1
	}
	msgs := messages.Array()
	if len(msgs) == 0 {
		return tr.choose(false, "")
	}
	lastUser := ""
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Get("role").Str == "user" {
			lastUser = messageText(msgs[i].Get("content"))
			break
		}
	}
	return tr.choose(msgs[len(msgs)-1].Get("role").Str == "tool", lastUser)
}

// messageText is the text of a message's content: a string, or its "text" parts joined by spaces.
func messageText(c gjson.Result) string {
	if c.Type == gjson.String {
		return c.Str
	}
	var b strings.Builder
	c.ForEach(func(_, part gjson.Result) bool {
		if t := part.Get("text"); t.Type == gjson.String {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(t.Str)
		}
		return true
	})
	return b.String()
}

// toolArguments generates the arguments of a call: a JSON object valid against parameters.
func toolArguments(parameters gjson.Result, r *rng) string {
	if !parameters.IsObject() {
		return "{}"
	}
	g := schemaGen{root: parameters, r: r}
	s := g.resolve(parameters)
	if schemaType(s) == "" && !s.Get("anyOf").Exists() && !s.Get("oneOf").Exists() && !s.Get("allOf").Exists() {
		// Parameters are an object by definition; an empty schema means any object.
		return string(g.object(nil, []gjson.Result{s}, 0))
	}
	return string(g.value(nil, parameters, 0))
}

// toolCall is a call a choice makes.
type toolCall struct {
	id   string
	name string
}

// toolCallID is the call's id in vLLM's form, "chatcmpl-tool-" and 32 hex digits, unique per
// completion and choice.
func toolCallID(completion int64, choice int) string {
	r := rng{state: mix(uint64(completion), uint64(choice)+1)}
	b := make([]byte, 0, 46)
	b = append(b, "chatcmpl-tool-"...)
	for range 2 {
		v := r.next()
		for i := 60; i >= 0; i -= 4 {
			b = append(b, "0123456789abcdef"[(v>>uint(i))&0xf])
		}
	}
	return string(b)
}

// appendToolCalls appends a non-streamed message's tool_calls with the one call and its complete
// arguments.
func appendToolCalls(b []byte, c *toolCall, arguments []byte) []byte {
	b = append(b, `"tool_calls":[{"id":`...)
	b = appendJSONString(b, c.id)
	b = append(b, `,"type":"function","function":{"name":`...)
	b = appendJSONString(b, c.name)
	b = append(b, `,"arguments":`...)
	b = appendJSONString(b, bytesconv.String(arguments))
	return append(b, "}}]"...)
}

// appendToolCallHead appends the delta that opens a streamed call: id, type and name, with empty
// arguments, as vLLM sends it before the argument fragments.
func appendToolCallHead(b []byte, c *toolCall) []byte {
	b = append(b, `"delta":{"tool_calls":[{"index":0,"id":`...)
	b = appendJSONString(b, c.id)
	b = append(b, `,"type":"function","function":{"name":`...)
	b = appendJSONString(b, c.name)
	return append(b, `,"arguments":""}}]}`...)
}

// appendToolCallFragment appends a delta carrying a fragment of the arguments.
func appendToolCallFragment(b []byte, fragment []byte) []byte {
	b = append(b, `"delta":{"tool_calls":[{"index":0,"function":{"arguments":`...)
	b = appendJSONString(b, bytesconv.String(fragment))
	return append(b, `}}]}`...)
}
