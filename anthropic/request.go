package anthropic

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/jsonscan"
)

// Request is what validation learned about a Messages API body. Byte slices
// point into the body (or into the Request's own storage) and are valid only
// while both are.
type Request struct {
	// Model is the "model" string without its quotes. Without escapes it is a
	// slice of the body, capped so that appending to it cannot overwrite the
	// body; with escapes it holds the unescaped text in the Request's storage.
	Model []byte
	// ModelStart and ModelEnd are the offsets in the body of the model's
	// value token, quotes included, so that a gateway can splice in the
	// upstream model id when it passes the body on.
	ModelStart, ModelEnd int
	// MaxTokens is max_tokens (0 on a count_tokens body that left it out).
	MaxTokens int64
	Stream    bool
	// Messages is the number of entries of messages, system turns included.
	Messages int
	// PromptBytes is the length of the text the prompt carries (system,
	// text blocks, string contents, tool results' text) as written in the
	// body, escapes included: an estimate of the prompt's size for budget
	// reservations that errs on the safe side and costs no extra pass.
	PromptBytes int
	// MessagesStart and MessagesEnd are the offsets in the body of the
	// messages array, brackets included, and SystemStart and SystemEnd
	// those of the system prompt's value (both 0 without one): what a
	// scheduler keys a conversation's cached prefix on, the system prompt
	// first, as a backend renders it.
	MessagesStart, MessagesEnd int
	SystemStart, SystemEnd     int
	// Tools is the number of tools; CustomTools of those a chat backend can
	// be given (the rest are Anthropic's server tools, such as web_search).
	Tools, CustomTools int
	// ToolChoice is what tool_choice asks for; ToolChoiceName is the tool a
	// "tool" choice names.
	ToolChoice     ToolChoice
	ToolChoiceName []byte
	// DisableParallelToolUse is tool_choice.disable_parallel_tool_use.
	DisableParallelToolUse bool
	// Thinking is the thinking configuration; ThinkingBudget its
	// budget_tokens when enabled.
	Thinking       Thinking
	ThinkingBudget int64
	// StopSequences is the number of stop_sequences.
	StopSequences int

	modelBuf [64]byte
}

// CheckMaxTokens refuses a max_tokens above limit, the most the model may
// generate, as Anthropic refuses it; a zero limit is none.
func (r *Request) CheckMaxTokens(limit int64) *Error {
	if limit <= 0 || r.MaxTokens <= limit {
		return nil
	}
	return Invalid("max_tokens", "max_tokens: "+strconv.FormatInt(r.MaxTokens, 10)+" > "+strconv.FormatInt(limit, 10)+
		", which is the maximum allowed number of output tokens for "+string(r.Model)+".")
}

// ToolChoiceRefusal is the 400 for a request whose tool_choice needs tool
// calling from model, whose backends are not configured for it
// (toolCalling false), or nil when the request may go on: chat
// completions' rule (openai.Request.ToolChoiceRefusal) in Anthropic's
// terms. Only {"type":"none"} or no tool_choice is accepted then, as a
// vLLM started without --enable-auto-tool-choice accepts only "none"; a
// gateway applies it to the requests it translates to chat completions.
func (r *Request) ToolChoiceRefusal(model string, toolCalling bool) *Error {
	if toolCalling || r.ToolChoice == ToolChoiceAbsent || r.ToolChoice == ToolChoiceNone {
		return nil
	}
	got := `{"type":"` + r.ToolChoice.String() + `"}`
	if r.ToolChoice == ToolChoiceTool {
		got = `{"type":"tool","name":` + quote(string(r.ToolChoiceName)) + "}"
	}
	return Invalid("tool_choice", "tool_choice: model "+model+` is not configured for tool calling, so tool_choice must be {"type":"none"} or left out, got `+got+
		". To let it call tools, set `tool_calling: true` for model "+model+" in the gateway configuration; "+
		"its backends must parse tool calls (vLLM: --enable-auto-tool-choice and --tool-call-parser).")
}

// ToolChoice is the kind of tool_choice a request sends.
type ToolChoice uint8

// String is the choice's type as the wire writes it ("" when absent).
func (c ToolChoice) String() string {
	switch c {
	case ToolChoiceAuto:
		return "auto"
	case ToolChoiceAny:
		return "any"
	case ToolChoiceTool:
		return "tool"
	case ToolChoiceNone:
		return "none"
	}
	return ""
}

// The kinds of tool_choice.
const (
	ToolChoiceAbsent ToolChoice = iota // no tool_choice: "auto" when there are tools
	ToolChoiceAuto                     // {"type":"auto"}: the model decides
	ToolChoiceAny                      // {"type":"any"}: some tool must be called
	ToolChoiceTool                     // {"type":"tool","name":…}: that tool must be called
	ToolChoiceNone                     // {"type":"none"}: no tool may be called
)

// Thinking is the request's extended thinking setting.
type Thinking uint8

// The kinds of thinking.
const (
	ThinkingAbsent   Thinking = iota // no thinking field, or null
	ThinkingDisabled                 // {"type":"disabled"}
	ThinkingEnabled                  // {"type":"enabled","budget_tokens":N}
	ThinkingAdaptive                 // {"type":"adaptive"}: the model decides
)

// Limits bounds what a body may hold beyond its size. A zero field takes the
// default stated beside it, so a zero Limits is the gateway's defaults; they
// are the same bounds, with the same configuration fields, as chat's.
type Limits struct {
	MaxDepth         int // nesting levels (server.max_json_depth); zero means DefaultMaxDepth
	MaxMessages      int // entries of messages (server.max_messages); zero means DefaultMaxMessages
	MaxStopSequences int // strings in stop_sequences (server.max_stop_strings); zero means DefaultMaxStopSequences
	MaxTools         int // entries of tools; zero means DefaultMaxTools
}

// The defaults of Limits. Claude Code sends a few dozen tools; MCP-heavy
// setups a few hundred.
const (
	DefaultMaxDepth         = 64
	DefaultMaxMessages      = 2048
	DefaultMaxStopSequences = 64
	DefaultMaxTools         = 1024
	// MaxModelBytes bounds the model id, and MaxNameBytes a tool's name
	// (Anthropic's own limit is 128 characters).
	MaxModelBytes = 256
	MaxNameBytes  = 128
	// maxUserIDBytes is Anthropic's bound on metadata.user_id.
	maxUserIDBytes = 256
)

func orDefault(n, def int) int {
	if n > 0 {
		return n
	}
	return def
}

// Validate checks a POST /v1/messages body and fills req. It returns nil when
// the body is valid; req is only meaningful then. Unknown top-level fields pass
// (the API grows faster than any gateway), as do the fields the gateway accepts
// without using (output_config, context_management, metadata, container,
// mcp_servers, service_tier, cache_control, inference_geo…), whose JSON types
// alone are checked.
func Validate(body []byte, req *Request, lim Limits) *Error {
	return validate(body, req, lim, false)
}

// ValidateCountTokens checks a POST /v1/messages/count_tokens body, which is
// a Messages body without max_tokens, stream or sampling fields.
func ValidateCountTokens(body []byte, req *Request, lim Limits) *Error {
	return validate(body, req, lim, true)
}

// Top-level fields the validator reads; each may appear once, because JSON
// parsers disagree on which copy of a repeated key wins.
const (
	fModel = iota
	fMaxTokens
	fMessages
	fSystem
	fStream
	fStopSequences
	fTemperature
	fTopP
	fTopK
	fTools
	fToolChoice
	fThinking
	fMetadata
	fOutputConfig
	fContextManagement
	fContainer
	fMCPServers
	fServiceTier
	fCacheControl
	fInferenceGeo
)

var fieldNames = [...]string{
	fModel: "model", fMaxTokens: "max_tokens", fMessages: "messages", fSystem: "system",
	fStream: "stream", fStopSequences: "stop_sequences", fTemperature: "temperature",
	fTopP: "top_p", fTopK: "top_k", fTools: "tools", fToolChoice: "tool_choice",
	fThinking: "thinking", fMetadata: "metadata", fOutputConfig: "output_config",
	fContextManagement: "context_management", fContainer: "container",
	fMCPServers: "mcp_servers", fServiceTier: "service_tier", fCacheControl: "cache_control",
	fInferenceGeo: "inference_geo",
}

func fieldID(key string) int {
	for i, name := range fieldNames {
		if name == key {
			return i
		}
	}
	return -1
}

type validator struct {
	req   *Request
	lim   Limits
	count bool // a count_tokens body
	vals  [len(fieldNames)]gjson.Result
	err   *Error
}

func validate(body []byte, req *Request, lim Limits, count bool) *Error {
	*req = Request{}
	s := bytesconv.String(body)
	first := skipSpace(s, 0)
	if first == len(s) {
		return Invalid("", `The request body is empty; send a JSON object with "model", "max_tokens" and "messages".`)
	}
	if depth := orDefault(lim.MaxDepth, DefaultMaxDepth); jsonscan.TooDeep(s, depth) {
		return Invalid("", "The request body nests arrays and objects more than "+itoa(depth)+" levels deep.")
	}
	if !utf8.Valid(body) {
		return Invalid("", "The request body is not valid UTF-8.")
	}
	if !gjson.Valid(s) {
		return Invalid("", "The request body is not valid JSON.")
	}
	if s[first] != '{' {
		return Invalid("", "The request body must be a JSON object, got "+describe(gjson.Parse(s))+".")
	}
	v := validator{req: req, lim: lim, count: count}
	var seen uint32
	gjson.Parse(s).ForEach(func(key, val gjson.Result) bool {
		id := fieldID(key.Str)
		if id < 0 {
			return true
		}
		if seen&(1<<id) != 0 {
			v.err = Invalid(key.Str, "The request body repeats the key "+quote(key.Str)+"; send each field once, because JSON parsers disagree on which copy wins.")
			return false
		}
		seen |= 1 << id
		v.vals[id] = val
		return true
	})
	if v.err != nil {
		return v.err
	}
	return v.check(body)
}

func (v *validator) check(body []byte) *Error {
	req := v.req
	model := v.vals[fModel]
	switch {
	case !model.Exists():
		return Invalid("model", "model: Field required; send the id of a model the gateway serves.")
	case model.Type != gjson.String:
		return Invalid("model", "model: must be a string, got "+describe(model)+".")
	case model.Str == "":
		return Invalid("model", "model: must not be empty.")
	case len(model.Str) > MaxModelBytes:
		return Invalid("model", "model: is "+itoa(len(model.Str))+" bytes long; the gateway accepts model ids of at most "+itoa(MaxModelBytes)+" bytes.")
	}
	req.ModelStart, req.ModelEnd = model.Index, model.Index+len(model.Raw)
	if strings.IndexByte(model.Raw, '\\') < 0 {
		req.Model = body[model.Index+1 : req.ModelEnd-1 : req.ModelEnd-1]
	} else {
		req.Model = append(req.modelBuf[:0], model.Str...)
	}

	if !v.count {
		mt := v.vals[fMaxTokens]
		if !mt.Exists() {
			return Invalid("max_tokens", "max_tokens: Field required; send the largest number of tokens to generate, such as 1024.")
		}
		n, ok := integer(mt)
		if !ok || n < 1 {
			return Invalid("max_tokens", "max_tokens: must be an integer of at least 1, got "+describe(mt)+".")
		}
		req.MaxTokens = n
	} else if mt := v.vals[fMaxTokens]; mt.Exists() {
		if n, ok := integer(mt); ok && n >= 1 {
			req.MaxTokens = n
		}
	}

	ms := v.vals[fMessages]
	if err := v.messages(ms); err != nil {
		return err
	}
	req.MessagesStart, req.MessagesEnd = ms.Index, ms.Index+len(ms.Raw)
	sys := v.vals[fSystem]
	if err := v.system(sys); err != nil {
		return err
	}
	if sys.Exists() && sys.Type != gjson.Null {
		req.SystemStart, req.SystemEnd = sys.Index, sys.Index+len(sys.Raw)
	}
	if st := v.vals[fStream]; st.Exists() {
		if st.Type != gjson.True && st.Type != gjson.False {
			return Invalid("stream", "stream: must be a boolean, got "+describe(st)+".")
		}
		req.Stream = st.Type == gjson.True
	}
	if err := v.stopSequences(v.vals[fStopSequences]); err != nil {
		return err
	}
	if err := number(v.vals[fTemperature], "temperature", 0, 1); err != nil {
		return err
	}
	if err := number(v.vals[fTopP], "top_p", 0, 1); err != nil {
		return err
	}
	if tk := v.vals[fTopK]; tk.Exists() && tk.Type != gjson.Null {
		if n, ok := integer(tk); !ok || n < 0 {
			return Invalid("top_k", "top_k: must be an integer of at least 0, got "+describe(tk)+".")
		}
	}
	if err := v.tools(v.vals[fTools]); err != nil {
		return err
	}
	if err := v.toolChoice(v.vals[fToolChoice]); err != nil {
		return err
	}
	if err := v.thinking(v.vals[fThinking]); err != nil {
		return err
	}
	if err := v.metadata(v.vals[fMetadata]); err != nil {
		return err
	}
	for _, f := range [...]struct {
		id   int
		want string
		ok   func(gjson.Result) bool
	}{
		{fOutputConfig, "an object", isObject},
		{fContextManagement, "an object", isObject},
		{fCacheControl, "an object", isObject},
		{fContainer, "a string or an object", func(x gjson.Result) bool { return x.Type == gjson.String || x.IsObject() }},
		{fMCPServers, "an array", isArray},
		{fServiceTier, "a string", isString},
		{fInferenceGeo, "a string", isString},
	} {
		if x := v.vals[f.id]; x.Exists() && x.Type != gjson.Null && !f.ok(x) {
			name := fieldNames[f.id]
			return Invalid(name, name+": must be "+f.want+" or null, got "+describe(x)+".")
		}
	}
	return nil
}

func (v *validator) messages(ms gjson.Result) *Error {
	switch {
	case !ms.Exists():
		return Invalid("messages", "messages: Field required; send an array of {\"role\",\"content\"} turns.")
	case !ms.IsArray():
		return Invalid("messages", "messages: must be an array of message objects, got "+describe(ms)+".")
	}
	limit := orDefault(v.lim.MaxMessages, DefaultMaxMessages)
	i := 0
	var err *Error
	ms.ForEach(func(_, m gjson.Result) bool {
		if i == limit {
			err = Invalid("messages", "messages: has more than "+itoa(limit)+" entries; the gateway accepts at most "+itoa(limit)+".")
			return false
		}
		err = v.message(i, m)
		i++
		return err == nil
	})
	if err != nil {
		return err
	}
	if i == 0 {
		return Invalid("messages", "messages: must contain at least one message, got an empty array.")
	}
	v.req.Messages = i
	return nil
}

func (v *validator) message(i int, m gjson.Result) *Error {
	p := "messages." + itoa(i)
	if !m.IsObject() {
		return Invalid(p, p+": must be a message object with a role and content, got "+describe(m)+".")
	}
	var role, content gjson.Result
	m.ForEach(func(k, x gjson.Result) bool {
		switch k.Str {
		case "role":
			role = x
		case "content":
			content = x
		}
		return true
	})
	switch {
	case !role.Exists():
		return Invalid(p+".role", p+`.role: Field required: "user" or "assistant".`)
	case role.Type != gjson.String || (role.Str != "user" && role.Str != "assistant" && role.Str != "system"):
		return Invalid(p+".role", p+`.role: must be "user" or "assistant" (or "system"), got `+describe(role)+".")
	}
	if !content.Exists() {
		return Invalid(p+".content", p+".content: Field required: a string or an array of content blocks.")
	}
	if role.Str == "system" {
		return v.textBlocks(p+".content", content, true)
	}
	return v.content(p+".content", content, role.Str == "assistant")
}

// content is a message's content: a string or an array of content blocks.
func (v *validator) content(p string, c gjson.Result, assistant bool) *Error {
	if c.Type == gjson.String {
		v.req.PromptBytes += len(c.Raw) - 2
		return nil
	}
	if !c.IsArray() {
		return Invalid(p, p+": must be a string or an array of content blocks, got "+describe(c)+".")
	}
	j := 0
	var err *Error
	c.ForEach(func(_, b gjson.Result) bool {
		err = v.block(p+"."+itoa(j), b, assistant)
		j++
		return err == nil
	})
	return err
}

// system is the system prompt: a string or an array of text blocks.
func (v *validator) system(s gjson.Result) *Error {
	if !s.Exists() || s.Type == gjson.Null {
		return nil
	}
	return v.textBlocks("system", s, true)
}

// textBlocks is a string or an array of text blocks (a system prompt's, a
// system turn's); stringOK says a plain string is allowed.
func (v *validator) textBlocks(p string, c gjson.Result, stringOK bool) *Error {
	if c.Type == gjson.String && stringOK {
		v.req.PromptBytes += len(c.Raw) - 2
		return nil
	}
	if !c.IsArray() {
		return Invalid(p, p+": must be a string or an array of text blocks, got "+describe(c)+".")
	}
	j := 0
	var err *Error
	c.ForEach(func(_, b gjson.Result) bool {
		q := p + "." + itoa(j)
		j++
		typ := b.Get("type")
		if !b.IsObject() || typ.Str != "text" {
			err = Invalid(q, q+`: must be a text block {"type":"text","text":…}, got `+describe(b)+".")
			return false
		}
		err = v.block(q, b, false)
		return err == nil
	})
	return err
}

// Block types the validator knows the shape of. Other types pass with only a
// string "type" checked, so that blocks newer than the gateway reach a backend
// serving the Messages API natively; translation refuses what it cannot express.
func (v *validator) block(p string, b gjson.Result, assistant bool) *Error {
	if !b.IsObject() {
		return Invalid(p, p+`: must be a content block object such as {"type":"text","text":"…"}, got `+describe(b)+".")
	}
	typ := b.Get("type")
	if !typ.Exists() {
		return Invalid(p+".type", p+`.type: Field required: "text", "image", "document", "tool_use", "tool_result", "thinking"…`)
	}
	if typ.Type != gjson.String {
		return Invalid(p+".type", p+".type: must be a string, got "+describe(typ)+".")
	}
	switch typ.Str {
	case "text":
		text := b.Get("text")
		if text.Type != gjson.String {
			return required(p+".text", text, "a string")
		}
		v.req.PromptBytes += len(text.Raw) - 2
		if c := b.Get("citations"); c.Exists() && c.Type != gjson.Null && !c.IsArray() {
			return Invalid(p+".citations", p+".citations: must be an array or null, got "+describe(c)+".")
		}
	case "image":
		return source(p+".source", b.Get("source"), "base64", "url", "file")
	case "document":
		return source(p+".source", b.Get("source"), "base64", "text", "content", "url", "file")
	case "search_result":
		for _, k := range [...]string{"source", "title"} {
			if x := b.Get(k); x.Type != gjson.String {
				return required(p+"."+k, x, "a string")
			}
		}
		if x := b.Get("content"); !x.IsArray() {
			return required(p+".content", x, "an array of text blocks")
		}
	case "thinking":
		x := b.Get("thinking")
		if x.Type != gjson.String {
			return required(p+".thinking", x, "a string")
		}
		v.req.PromptBytes += len(x.Raw) - 2
		if sig := b.Get("signature"); sig.Exists() && sig.Type != gjson.String {
			return Invalid(p+".signature", p+".signature: must be a string, got "+describe(sig)+".")
		}
	case "redacted_thinking":
		if x := b.Get("data"); x.Type != gjson.String {
			return required(p+".data", x, "a string")
		}
	case "tool_use", "server_tool_use", "mcp_tool_use":
		if !assistant && typ.Str == "tool_use" {
			return Invalid(p+".type", p+`.type: a tool_use block belongs to an assistant turn; answer it with a tool_result block in the user turn that follows.`)
		}
		for _, k := range [...]string{"id", "name"} {
			if x := b.Get(k); x.Type != gjson.String || x.Str == "" {
				return required(p+"."+k, x, "a non-empty string")
			}
		}
		if x := b.Get("input"); !x.IsObject() {
			return required(p+".input", x, "an object")
		}
	case "tool_result":
		if x := b.Get("tool_use_id"); x.Type != gjson.String || x.Str == "" {
			return required(p+".tool_use_id", x, "a non-empty string")
		}
		if x := b.Get("is_error"); x.Exists() && x.Type != gjson.True && x.Type != gjson.False && x.Type != gjson.Null {
			return Invalid(p+".is_error", p+".is_error: must be a boolean, got "+describe(x)+".")
		}
		if c := b.Get("content"); c.Exists() && c.Type != gjson.Null {
			return v.content(p+".content", c, false)
		}
	case "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
		"bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
		"tool_search_tool_result", "mcp_tool_result":
		if x := b.Get("tool_use_id"); x.Type != gjson.String || x.Str == "" {
			return required(p+".tool_use_id", x, "a non-empty string")
		}
	case "container_upload":
		if x := b.Get("file_id"); x.Type != gjson.String {
			return required(p+".file_id", x, "a string")
		}
	}
	return nil
}

// source checks a block's source object, whose type is one of kinds.
func source(p string, s gjson.Result, kinds ...string) *Error {
	if !s.IsObject() {
		return required(p, s, "a source object")
	}
	typ := s.Get("type")
	want := `"` + strings.Join(kinds, `", "`) + `"`
	if typ.Type != gjson.String {
		return required(p+".type", typ, "one of "+want)
	}
	var need [2]string
	switch typ.Str {
	case "base64":
		need = [2]string{"media_type", "data"}
	case "text":
		need = [2]string{"data"}
	case "url":
		need = [2]string{"url"}
	case "file":
		need = [2]string{"file_id"}
	case "content":
		if c := s.Get("content"); c.Type != gjson.String && !c.IsArray() {
			return required(p+".content", c, "a string or an array of blocks")
		}
	}
	found := false
	for _, k := range kinds {
		found = found || k == typ.Str
	}
	if !found {
		return Invalid(p+".type", p+".type: must be one of "+want+", got "+describe(typ)+".")
	}
	for _, k := range need {
		if k == "" {
			continue
		}
		if x := s.Get(k); x.Type != gjson.String {
			return required(p+"."+k, x, "a string")
		}
	}
	return nil
}

func (v *validator) stopSequences(ss gjson.Result) *Error {
	if !ss.Exists() || ss.Type == gjson.Null {
		return nil
	}
	if !ss.IsArray() {
		return Invalid("stop_sequences", "stop_sequences: must be an array of strings, got "+describe(ss)+".")
	}
	limit := orDefault(v.lim.MaxStopSequences, DefaultMaxStopSequences)
	n := 0
	var err *Error
	ss.ForEach(func(_, x gjson.Result) bool {
		p := "stop_sequences." + itoa(n)
		switch {
		case n == limit:
			err = Invalid("stop_sequences", "stop_sequences: has more than "+itoa(limit)+" entries; the gateway accepts at most "+itoa(limit)+".")
		case x.Type != gjson.String:
			err = Invalid(p, p+": must be a string, got "+describe(x)+".")
		case x.Str == "":
			err = Invalid(p, p+": must not be empty.")
		}
		n++
		return err == nil
	})
	v.req.StopSequences = n
	return err
}

func (v *validator) tools(ts gjson.Result) *Error {
	if !ts.Exists() || ts.Type == gjson.Null {
		return nil
	}
	if !ts.IsArray() {
		return Invalid("tools", "tools: must be an array of tool definitions, got "+describe(ts)+".")
	}
	limit := orDefault(v.lim.MaxTools, DefaultMaxTools)
	n := 0
	var err *Error
	ts.ForEach(func(_, t gjson.Result) bool {
		p := "tools." + itoa(n)
		n++
		if n > limit {
			err = Invalid("tools", "tools: has more than "+itoa(limit)+" entries; the gateway accepts at most "+itoa(limit)+".")
			return false
		}
		if !t.IsObject() {
			err = Invalid(p, p+": must be a tool object, got "+describe(t)+".")
			return false
		}
		name, typ := t.Get("name"), t.Get("type")
		switch {
		case name.Type != gjson.String || name.Str == "":
			err = required(p+".name", name, "a non-empty string")
		case len(name.Str) > MaxNameBytes:
			err = Invalid(p+".name", p+".name: is "+itoa(len(name.Str))+" bytes long; tool names have at most "+itoa(MaxNameBytes)+".")
		case typ.Exists() && typ.Type != gjson.Null && typ.Type != gjson.String:
			err = Invalid(p+".type", p+".type: must be a string, got "+describe(typ)+".")
		case !typ.Exists() || typ.Type == gjson.Null || typ.Str == "custom":
			// A custom tool: the client runs it, the model needs its schema.
			if s := t.Get("input_schema"); !s.IsObject() {
				err = required(p+".input_schema", s, "a JSON schema object")
			} else if d := t.Get("description"); d.Exists() && d.Type != gjson.String && d.Type != gjson.Null {
				err = Invalid(p+".description", p+".description: must be a string, got "+describe(d)+".")
			} else {
				v.req.CustomTools++
			}
		}
		return err == nil
	})
	v.req.Tools = n
	return err
}

func (v *validator) toolChoice(tc gjson.Result) *Error {
	if !tc.Exists() || tc.Type == gjson.Null {
		return nil
	}
	if !tc.IsObject() {
		return Invalid("tool_choice", `tool_choice: must be an object such as {"type":"auto"}, got `+describe(tc)+".")
	}
	req := v.req
	typ := tc.Get("type")
	switch typ.Str {
	case "auto":
		req.ToolChoice = ToolChoiceAuto
	case "any":
		req.ToolChoice = ToolChoiceAny
	case "tool":
		req.ToolChoice = ToolChoiceTool
	case "none":
		req.ToolChoice = ToolChoiceNone
	}
	if typ.Type != gjson.String || req.ToolChoice == ToolChoiceAbsent {
		return Invalid("tool_choice.type", `tool_choice.type: must be "auto", "any", "tool" or "none", got `+describe(typ)+".")
	}
	if d := tc.Get("disable_parallel_tool_use"); d.Exists() {
		if d.Type != gjson.True && d.Type != gjson.False {
			return Invalid("tool_choice.disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use: must be a boolean, got "+describe(d)+".")
		}
		req.DisableParallelToolUse = d.Type == gjson.True
	}
	if (req.ToolChoice == ToolChoiceAny || req.ToolChoice == ToolChoiceTool) && req.Tools == 0 {
		return Invalid("tool_choice", `tool_choice: {"type":"`+typ.Str+`"} needs tools; send the tools the model may call.`)
	}
	if req.ToolChoice != ToolChoiceTool {
		return nil
	}
	name := tc.Get("name")
	if name.Type != gjson.String || name.Str == "" {
		return required("tool_choice.name", name, "the name of one of the tools")
	}
	found := false
	v.vals[fTools].ForEach(func(_, t gjson.Result) bool {
		found = t.Get("name").Str == name.Str
		return !found
	})
	if !found {
		return Invalid("tool_choice.name", "tool_choice.name: "+quote(name.Str)+" is not the name of any of the tools.")
	}
	req.ToolChoiceName = []byte(name.Str)
	return nil
}

func (v *validator) thinking(th gjson.Result) *Error {
	if !th.Exists() || th.Type == gjson.Null {
		return nil
	}
	if !th.IsObject() {
		return Invalid("thinking", `thinking: must be an object such as {"type":"enabled","budget_tokens":2048}, got `+describe(th)+".")
	}
	typ := th.Get("type")
	switch typ.Str {
	case "disabled":
		v.req.Thinking = ThinkingDisabled
	case "adaptive":
		v.req.Thinking = ThinkingAdaptive
	case "enabled":
		b := th.Get("budget_tokens")
		n, ok := integer(b)
		if !ok || n < 1 {
			return Invalid("thinking.budget_tokens", "thinking.budget_tokens: must be an integer of at least 1, got "+describe(b)+".")
		}
		if v.req.MaxTokens > 0 && n >= v.req.MaxTokens {
			return Invalid("thinking.budget_tokens", "thinking.budget_tokens: must be less than max_tokens ("+itoa(int(v.req.MaxTokens))+"), got "+itoa(int(n))+".")
		}
		v.req.Thinking, v.req.ThinkingBudget = ThinkingEnabled, n
	}
	if typ.Type != gjson.String || v.req.Thinking == ThinkingAbsent {
		return Invalid("thinking.type", `thinking.type: must be "enabled", "disabled" or "adaptive", got `+describe(typ)+".")
	}
	return nil
}

func (v *validator) metadata(md gjson.Result) *Error {
	if !md.Exists() || md.Type == gjson.Null {
		return nil
	}
	if !md.IsObject() {
		return Invalid("metadata", "metadata: must be an object, got "+describe(md)+".")
	}
	u := md.Get("user_id")
	switch {
	case !u.Exists() || u.Type == gjson.Null:
	case u.Type != gjson.String:
		return Invalid("metadata.user_id", "metadata.user_id: must be a string or null, got "+describe(u)+".")
	case len(u.Str) > maxUserIDBytes:
		return Invalid("metadata.user_id", "metadata.user_id: must be at most "+itoa(maxUserIDBytes)+" bytes long.")
	}
	return nil
}

// number checks an optional number field within [lo, hi].
func number(x gjson.Result, name string, lo, hi float64) *Error {
	if !x.Exists() || x.Type == gjson.Null {
		return nil
	}
	if x.Type != gjson.Number || x.Num < lo || x.Num > hi || math.IsNaN(x.Num) {
		return Invalid(name, name+": must be a number from "+formatNum(lo)+" to "+formatNum(hi)+", got "+describe(x)+".")
	}
	return nil
}

// integer reads a whole number (5 and 5.0 alike) within ±2^53.
func integer(x gjson.Result) (int64, bool) {
	if x.Type != gjson.Number || x.Num != math.Trunc(x.Num) || math.Abs(x.Num) > 1<<53 {
		return 0, false
	}
	return int64(x.Num), true
}

func formatNum(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func required(p string, x gjson.Result, want string) *Error {
	if !x.Exists() {
		return Invalid(p, p+": Field required: "+want+".")
	}
	return Invalid(p, p+": must be "+want+", got "+describe(x)+".")
}

func isObject(x gjson.Result) bool { return x.IsObject() }
func isArray(x gjson.Result) bool  { return x.IsArray() }
func isString(x gjson.Result) bool { return x.Type == gjson.String }

// describe names a value's JSON type for a message, with short scalars shown.
func describe(x gjson.Result) string {
	switch {
	case !x.Exists():
		return "nothing"
	case x.IsObject():
		return "an object"
	case x.IsArray():
		return "an array"
	case x.Type == gjson.Null:
		return "null"
	case x.Type == gjson.True, x.Type == gjson.False:
		return x.Raw
	case len(x.Raw) > 40:
		if x.Type == gjson.String {
			return "a string of " + itoa(len(x.Str)) + " bytes"
		}
		return "a long number"
	case x.Type == gjson.String:
		return "the string " + x.Raw
	}
	return x.Raw
}

func quote(s string) string {
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return `"` + strings.ToValidUTF8(s, "\uFFFD") + `"`
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}
