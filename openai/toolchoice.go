package openai

import (
	"fmt"
	"net/http"
)

// Tool calling, in vLLM's rules: tool_choice "none" is always accepted; "auto",
// "required" and a named function need a model whose backends parse tool calls
// (models[].tool_calling, checked by the handler with Request.ToolChoiceRefusal), and tools to
// choose from ("required" and a named choice need at least one, and a named choice must
// name one of them). Assistant messages that carried tool calls, and the tool messages
// that answer them, come back in later requests and are checked for shape.

// namedChoiceShape is how errors spell the one object form tool_choice accepts.
const namedChoiceShape = `{"type": "function", "function": {"name": "..."}}`

// toolChoice checks tool_choice, which is "none", "auto", "required", a named function,
// or null (the same as leaving it out), and reports it in req.
func (v *validator) toolChoice(val value) *ValidationError {
	req := v.req
	switch {
	case val.isNull():
		return nil
	case val.isString():
		switch unquote(val.raw) {
		case "none":
			req.ToolChoice = ToolChoiceNone
		case "auto":
			req.ToolChoice = ToolChoiceAuto
		case "required":
			req.ToolChoice = ToolChoiceRequired
		default:
			return toolChoiceError(val)
		}
		return nil
	case !val.isObject():
		return toolChoiceError(val)
	}
	m := v.members(val, "type", "function")
	typ, fn := m[0], m[1]
	// The type defaults to "function" in vLLM. OpenAI's other kinds (allowed_tools,
	// custom) have no equivalent in vLLM, so they are refused here rather than there.
	if typ.exists() && unquoteIfString(typ) != "function" {
		return &ValidationError{Param: "tool_choice.type", Message: fmt.Sprintf(
			`tool_choice.type must be "function", got %s; the object form of tool_choice names one function: %s.`, describe(typ), namedChoiceShape)}
	}
	if !fn.exists() {
		return &ValidationError{Param: "tool_choice", Message: fmt.Sprintf(
			`tool_choice is an object without a function; send "none", "auto", "required" or %s.`, namedChoiceShape)}
	}
	if !fn.isObject() {
		return typeError("tool_choice.function", `an object with the function's name, such as {"name": "get_weather"}`, fn)
	}
	name := v.members(fn, "name")[0]
	switch {
	case !name.exists():
		return &ValidationError{Param: "tool_choice.function.name", Message: "tool_choice.function.name is required: the name of the tool to call."}
	case !name.isString():
		return typeError("tool_choice.function.name", "a string", name)
	case len(name.raw) == 2:
		return &ValidationError{Param: "tool_choice.function.name", Message: "tool_choice.function.name must not be empty; name one of the tools."}
	}
	req.ToolChoice = ToolChoiceNamed
	v.toolChoiceName = name
	req.ToolChoiceName = v.stringBytes(name, nil)
	return nil
}

func toolChoiceError(val value) *ValidationError {
	return &ValidationError{Param: "tool_choice", Message: fmt.Sprintf(
		`tool_choice must be "none", "auto", "required" or %s, got %s.`, namedChoiceShape, describe(val))}
}

// toolChoiceChecks relates tool_choice to tools, once both have been seen.
func (v *validator) toolChoiceChecks() *ValidationError {
	req := v.req
	switch req.ToolChoice {
	case ToolChoiceAuto:
		if !v.toolsArray.exists() {
			return &ValidationError{Param: "tool_choice", Message: `tool_choice "auto" needs tools: send the tools the model may call, or leave tool_choice out.`}
		}
	case ToolChoiceRequired:
		if v.toolCount == 0 {
			return &ValidationError{Param: "tool_choice", Message: `tool_choice "required" needs a non-empty tools array: the tools the model must choose from.`}
		}
	case ToolChoiceNamed:
		if v.toolCount == 0 {
			return &ValidationError{Param: "tool_choice", Message: fmt.Sprintf(
				"tool_choice names the function %s, which needs a non-empty tools array that declares it.", describe(v.toolChoiceName))}
		}
		if !v.toolDeclared(unquote(v.toolChoiceName.raw)) {
			return &ValidationError{Param: "tool_choice.function.name", Message: fmt.Sprintf(
				"tool_choice names the function %s, which none of the tools declares; name one of the functions in tools.", describe(v.toolChoiceName))}
		}
	}
	return nil
}

// toolDeclared reports whether one of the tools, which tools has already checked, is
// a function called name. Like tools, it reads the last copy of a repeated key.
func (v *validator) toolDeclared(name string) bool {
	it := v.iter(v.toolsArray)
	for {
		_, t, ok := it.next()
		if !ok {
			return false
		}
		fn := v.members(t, "function")[0]
		if unquoteIfString(v.members(fn, "name")[0]) == name {
			return true
		}
	}
}

// toolCalls checks messages[i].tool_calls: null, or an array of calls as a reply
// carried them, {"id": "...", "type": "function", "function": {"name": "...",
// "arguments": "..."}}, where arguments is the JSON text of the arguments. Other members
// (such as a provider's extra_content) pass through.
func (v *validator) toolCalls(i int, val value) *ValidationError {
	if val.isNull() {
		return nil
	}
	if !val.isArray() {
		return typeError(fmt.Sprintf("messages[%d].tool_calls", i), "an array of tool calls or null", val)
	}
	it := v.iter(val)
	for j := 0; ; j++ {
		_, call, ok := it.next()
		if !ok {
			return nil
		}
		if !call.isObject() {
			return typeError(callParam(i, j, ""), `a tool call object such as {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}`, call)
		}
		m := v.members(call, "id", "type", "function")
		id, typ, fn := m[0], m[1], m[2]
		switch {
		case !id.exists():
			return &ValidationError{Param: callParam(i, j, ".id"), Message: fmt.Sprintf(
				"%s is required: the id the tool's answer refers to in its tool_call_id.", callParam(i, j, ".id"))}
		case !id.isString():
			return typeError(callParam(i, j, ".id"), "a string", id)
		}
		// As in tools, the type defaults to "function", the only kind there is.
		if typ.exists() && unquoteIfString(typ) != "function" {
			return &ValidationError{Param: callParam(i, j, ".type"), Message: fmt.Sprintf(
				`%s must be "function", got %s.`, callParam(i, j, ".type"), describe(typ))}
		}
		switch {
		case !fn.exists():
			return &ValidationError{Param: callParam(i, j, ".function"), Message: fmt.Sprintf(
				"%s is required: an object with the function's name and arguments.", callParam(i, j, ".function"))}
		case !fn.isObject():
			return typeError(callParam(i, j, ".function"), "an object with the function's name and arguments", fn)
		}
		m = v.members(fn, "name", "arguments")
		name, args := m[0], m[1]
		switch {
		case !name.exists():
			return &ValidationError{Param: callParam(i, j, ".function.name"), Message: fmt.Sprintf(
				"%s is required: the name of the function called.", callParam(i, j, ".function.name"))}
		case !name.isString():
			return typeError(callParam(i, j, ".function.name"), "a string", name)
		case !args.exists():
			return &ValidationError{Param: callParam(i, j, ".function.arguments"), Message: fmt.Sprintf(
				`%s is required: the arguments as a string of JSON, such as "{}".`, callParam(i, j, ".function.arguments"))}
		case !args.isString():
			return typeError(callParam(i, j, ".function.arguments"), `a string (the arguments as JSON text, such as "{\"city\": \"Paris\"}")`, args)
		}
	}
}

// callParam names a member of messages[i].tool_calls[j] in errors.
func callParam(i, j int, member string) string {
	return fmt.Sprintf("messages[%d].tool_calls[%d]%s", i, j, member)
}

// ToolChoiceRefusal is the 400 for a request whose tool_choice needs tool calling from
// model, which is not configured for it (toolCalling false), or nil when the request may
// go on. Only "none" (or no tool_choice) is accepted then, as vLLM accepts only "none"
// from a server started without --enable-auto-tool-choice.
func (r *Request) ToolChoiceRefusal(model string, toolCalling bool) *Error {
	if r.ToolChoiceServed(toolCalling) {
		return nil
	}
	got := r.ToolChoice.String()
	if r.ToolChoice == ToolChoiceNamed {
		got = "a named function (" + Clip(string(r.ToolChoiceName)) + ")"
	}
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "tool_choice",
		Message: "Model " + model + " is not configured for tool calling, so tool_choice must be \"none\" or left out, got " + got +
			". To let it call tools, set `tool_calling: true` for model " + model + " in the gateway configuration; " +
			"its backends must parse tool calls (vLLM: --enable-auto-tool-choice and --tool-call-parser)."}
}

// ToolChoiceServed reports whether a model with or without tool calling can serve r's
// tool_choice: every model serves "none" or no choice at all, only those with tool
// calling the others. A fallback that cannot is skipped, as one that does not serve the
// endpoint is.
func (r *Request) ToolChoiceServed(toolCalling bool) bool {
	return r.ToolChoice == ToolChoiceAbsent || r.ToolChoice == ToolChoiceNone || toolCalling
}
