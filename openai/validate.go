package openai

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/jsonscan"
)

// Request is what validation learned about a body of any of the four endpoints. Byte slices point into the body
// and are valid only while the body is.
type Request struct {
	// Model is the content of the "model" string without its quotes (nil when absent or
	// null). Without escapes it is a slice of the body, capped so that appending to it
	// cannot overwrite the body; with escapes it holds the unescaped text in storage owned
	// by this Request (so it is only valid while this Request is not reused).
	Model []byte
	// ModelStart and ModelEnd are byte offsets in the body of the whole "model" value token
	// (including the quotes, or the null token), so the handler can splice in a rewritten
	// model id. Both are 0 when "model" is absent.
	ModelStart, ModelEnd int
	Stream               bool
	// StreamOptions is true when stream_options is present and not null.
	StreamOptions bool
	// StreamOptionsStart and StreamOptionsEnd are byte offsets in the body of the
	// stream_options value token (the object, or the null token) when the key is present,
	// both 0 otherwise.
	StreamOptionsStart, StreamOptionsEnd int
	IncludeUsage                         bool  // stream_options.include_usage == true
	ContinuousUsage                      bool  // stream_options.continuous_usage_stats == true
	MaxTokens                            int64 // max_completion_tokens if set, else max_tokens if set, else 0
	N                                    int64 // n, 1 when absent or null
	Priority                             int64 // priority, 0 when absent
	Messages                             int   // number of messages
	// PromptBytes is the total length of message contents (string contents and the text of
	// text parts) as they appear in the body, escapes included. It feeds an estimate of the
	// prompt's tokens; counting escapes as written over-estimates slightly, which errs on
	// the safe side for budget reservations and costs no extra pass over the text.
	PromptBytes int
	// PromptStart and PromptEnd are byte offsets in the body of the prompt's whole value:
	// chat's messages array, the completions prompt, the embeddings or Responses API input.
	// Both are 0 when the body has none. The scheduler cuts it into blocks; the walk that
	// checks it finds its end, where another parser would scan it again.
	PromptStart, PromptEnd int
	// SystemStart and SystemEnd are the offsets of a system prompt the body keeps apart from
	// the prompt's value, which a backend renders before it: the Messages API's "system",
	// set where its request is carried in this shape. Both 0 for OpenAI's bodies, whose
	// system prompt is a message.
	SystemStart, SystemEnd int
	// Instructions is how many of chat's messages lead as system or developer messages,
	// the instructions the conversations of one app share, and InstructionsEnd the offset
	// in the body where they end. Both 0 when the first message is neither.
	Instructions, InstructionsEnd int
	// ToolChoice is what tool_choice asks for; ToolChoiceName is the function a named
	// choice names (a capped slice of the body, or unescaped storage when it has escapes).
	// The model-dependent rule (tool calling is configured per model) is the handler's.
	ToolChoice     ToolChoice
	ToolChoiceName []byte
	// PreviousResponseID is the Responses API's previous_response_id ("" when absent
	// or null), copied out of the body; Background is its "background": true.
	PreviousResponseID string
	Background         bool

	// modelBuf backs Model when the model id carries escapes and cannot be a slice of the
	// body. Model ids are short, so 64 bytes avoids an allocation in practice.
	modelBuf [64]byte
}

// ToolChoice is the kind of tool_choice a request sends.
type ToolChoice uint8

const (
	// ToolChoiceAbsent is no tool_choice, or null: the backend's default applies.
	ToolChoiceAbsent   ToolChoice = iota
	ToolChoiceNone                // "none": tools may be described but are never called
	ToolChoiceAuto                // "auto": the model decides whether to call a tool
	ToolChoiceRequired            // "required": the model must call at least one tool
	ToolChoiceNamed               // {"type":"function","function":{"name":...}}: that function
)

// String returns the choice as a client writes it, for messages.
func (t ToolChoice) String() string {
	switch t {
	case ToolChoiceNone:
		return `"none"`
	case ToolChoiceAuto:
		return `"auto"`
	case ToolChoiceRequired:
		return `"required"`
	case ToolChoiceNamed:
		return "a named function"
	}
	return "absent"
}

// BodyLimits bounds what a request body may hold beyond its size, from the server
// configuration. A zero field takes the default stated beside it, so a zero BodyLimits
// is the gateway's defaults.
type BodyLimits struct {
	MaxDepth       int // nesting levels; zero (or more than maxDepth) means maxDepth
	MaxStopStrings int // strings in stop; zero means defaultMaxStopStrings
	MaxLogitBias   int // entries in logit_bias; zero means defaultMaxLogitBias
	MaxInputItems  int // input items of the Responses API; zero means no bound
}

// The defaults of BodyLimits, the same as the configuration's (server.max_stop_strings
// and server.max_logit_bias). OpenAI accepts 4 stop strings and vLLM sets no cap; 64 is
// more than any client sends. A logit_bias entry is a vocabulary token, and the largest
// vocabularies of current open models have about 262,000 tokens, so 300,000 entries still
// lets a client bias every token, while a body holding millions (possible only with a
// raised max_body_bytes) never costs a backend the time to decode it.
const (
	defaultMaxStopStrings = 64
	defaultMaxLogitBias   = 300000
)

// ValidationError says which request field is wrong and what was expected.
type ValidationError struct {
	Param   string // "temperature", "messages[1].role", "stream_options.include_usage", "" for whole-body problems
	Message string // full sentence a user can act on, e.g. "temperature must be a number between 0 and 2 or null, got 3."
}

// Error returns the message, which already names the field.
func (e *ValidationError) Error() string { return e.Message }

// Prompt is the prompt's whole value in body, the body r was filled from
// (PromptStart to PromptEnd), and the system prompt kept apart from it
// (SystemStart to SystemEnd), without copying; each nil when absent.
func (r *Request) Prompt(body []byte) (system, prompt []byte) {
	return span(body, r.SystemStart, r.SystemEnd), span(body, r.PromptStart, r.PromptEnd)
}

// span is body[start:end], capped, or nil when that is empty or outside body.
func span(body []byte, start, end int) []byte {
	if end <= start || start < 0 || end > len(body) {
		return nil
	}
	return body[start:end:end]
}

// ValidateChat checks body against the chat completion request rules and fills req.
// It returns nil when the body is valid; req is only meaningful then. It bounds the
// nesting depth, checks the syntax and UTF-8 in one pass (validJSON) and then walks the
// body once with a small cursor, never unmarshalling it into Go structs; a valid body
// costs no allocation.
//
// The model-dependent rules are not checked here: Priority and ToolChoice are reported
// and the handler, which knows the model, decides.
func ValidateChat(body []byte, req *Request) *ValidationError {
	return validateChatDepth(body, req, maxDepth)
}

// validateChatDepth is ValidateChat with nesting bounded at depth levels
// (the server's max_json_depth); depth is capped at maxDepth.
func validateChatDepth(body []byte, req *Request, depth int) *ValidationError {
	return ValidateChatLimits(body, req, BodyLimits{MaxDepth: depth})
}

// ValidateChatLimits is ValidateChat within the server's limits.
//
// A body that passes is checked in one walk: the walk of its fields checks
// the JSON syntax of every byte as it goes (see iter.check), instead of
// validJSON reading the whole body first, which cost about as much as the
// walk itself. A body the walk finds anything wrong with, in its syntax or
// its fields, is checked again the old way (validateChatTwoPasses): the
// syntax first, so that a body both malformed and wrong in a field gets the
// syntax error, then the walk. Only the accepting walk is new; every error
// comes from the two passes (FuzzValidateChatOnePass compares the two).
func ValidateChatLimits(body []byte, req *Request, lim BodyLimits) *ValidationError {
	if validateChatOnePass(body, req, lim) {
		return nil
	}
	return validateChatTwoPasses(body, req, lim)
}

// validateChatOnePass reports whether body is a valid chat request, filling
// req, in one walk that checks the syntax as it goes. False says only that
// the walk cannot accept the body, not why: req is then to be refilled.
func validateChatOnePass(body []byte, req *Request, lim BodyLimits) bool {
	s := bytesconv.String(body)
	first := skipSpace(s, 0)
	// The checked walk recurses once per level of the values it delimits,
	// so the depth is bounded first, as for validJSON.
	if first == len(s) || s[first] != '{' || jsonscan.TooDeep(s, depthLimit(lim.MaxDepth)) {
		return false
	}
	*req = Request{N: 1}
	v := validator{body: body, s: s, req: req, limits: lim}
	verr, checked := v.walkChat(first, true)
	return verr == nil && checked
}

// validateChatTwoPasses checks body's syntax with checkDocument, then walks
// its fields.
func validateChatTwoPasses(body []byte, req *Request, lim BodyLimits) *ValidationError {
	var v validator
	first, verr := v.start(body, req, lim, `The request body is empty; send a JSON object with a "messages" array.`)
	if verr != nil {
		return verr
	}
	verr, _ = v.walkChat(first, false)
	return verr
}

// walkChat walks the fields of the chat request whose opening brace is at
// first. Unless check is set, the body is known to be valid JSON; with
// check, the walk checks the syntax as it goes (see iter.check), and
// checked reports that the body is valid JSON, when the walk ends without
// an error.
func (v *validator) walkChat(first int, check bool) (verr *ValidationError, checked bool) {
	v.addGenerationPrompt = true
	it := iter{s: v.s, i: first + 1, obj: true, check: check}
	for {
		key, start, ok := it.member()
		if !ok {
			break
		}
		id := fieldID(key)
		if id < 0 {
			// Unknown top-level fields pass through to the backend untouched.
			it.finish(start)
			continue
		}
		// A repeated key is refused because JSON parsers disagree on which copy wins: the
		// backend (Python) keeps the last one, so a gateway that checked or rewrote the
		// first would be checking a different request from the one that runs.
		bit := uint64(1) << uint(id)
		if v.seen&bit != 0 {
			name := chatFields[id].param
			return &ValidationError{Param: name, Message: fmt.Sprintf(
				"The request body repeats the key %q; send each field once, because JSON parsers disagree on which copy wins.", name)}, false
		}
		v.seen |= bit
		if err := v.field(id, &it, start); err != nil {
			return err, false
		}
	}
	// A checked walk that met a syntax error has moved to the end of the
	// body; one that did not stands on the closing brace, which only
	// whitespace may follow.
	checked = check && it.i < len(v.s) && skipSpace(v.s, it.i+1) == len(v.s)
	return v.crossChecks(), checked
}

// start begins the validation of body, which every endpoint's starts the same
// way: req is reset to a request of one sequence, the body is checked with
// checkDocument (empty is the error for an empty one), and v is set to walk it
// within lim. It returns the offset of the body's opening brace.
func (v *validator) start(body []byte, req *Request, lim BodyLimits, empty string) (int, *ValidationError) {
	*req = Request{N: 1}
	s, first, verr := checkDocument(body, lim.MaxDepth, empty)
	if verr != nil {
		return 0, verr
	}
	*v = validator{body: body, s: s, req: req, limits: lim}
	return first, nil
}

// checkDocument checks what every endpoint's body must be: not empty (else
// the error says empty), nested at most depth levels (capped at maxDepth),
// valid JSON in UTF-8, and an object. It returns the body as a string and
// the offset of its opening brace.
func checkDocument(body []byte, depth int, empty string) (string, int, *ValidationError) {
	s := bytesconv.String(body)
	first := skipSpace(s, 0)
	if first == len(s) {
		return "", 0, &ValidationError{Message: empty}
	}
	depth = depthLimit(depth)
	if jsonscan.TooDeep(s, depth) {
		return "", 0, &ValidationError{Message: fmt.Sprintf(
			"The request body nests arrays and objects more than %d levels deep.", depth)}
	}
	if !validJSON(s) {
		// JSON text is UTF-8 (RFC 8259); a backend decoding the body would
		// refuse it, and invalid bytes must not reach logs or the store.
		// validJSON refuses both; the message says which it was.
		if !utf8.Valid(body) {
			return "", 0, &ValidationError{Message: "The request body is not valid UTF-8."}
		}
		return "", 0, &ValidationError{Message: "The request body is not valid JSON."}
	}
	if s[first] != '{' {
		top := value{raw: s[first:valueEnd(s, first)], off: first}
		return "", 0, &ValidationError{Message: fmt.Sprintf("The request body must be a JSON object, got %s.", describe(top))}
	}
	return s, first, nil
}

// depthLimit is the nesting bound for a configured depth: maxDepth when
// depth is unset or above it.
func depthLimit(depth int) int {
	if depth <= 0 || depth > maxDepth {
		return maxDepth
	}
	return depth
}

// maxDepth bounds how deeply arrays and objects may nest. validJSON recurses once per
// level, so without a bound the stack grows with a body of nothing but "[", and past
// Go's 1 GB stack limit it kills the whole process (a fatal
// error, not a recoverable panic). The backend's Python JSON decoder gives up near depth
// 1000 anyway, so nothing it could serve is refused.
const maxDepth = 1000

// validator carries what the walk has seen so far, for the rules that span fields.
type validator struct {
	body []byte
	s    string // the body as a string sharing its memory
	req  *Request
	seen uint64 // bitset of top-level field ids already seen

	limits BodyLimits

	logprobs            bool
	topLogprobs         int64
	promptLogprobs      int64
	maxTokens           int64
	maxCompletionTokens int64
	minTokens           int64
	temperature         float64
	temperatureSet      bool // temperature was sent as a number
	useBeamSearch       bool
	continueFinal       bool
	addGenerationPrompt bool  // true unless the body says otherwise, as in vLLM
	addGenerationSet    bool  // add_generation_prompt was sent, to word the error precisely
	toolsArray          value // the tools array, when one was sent
	toolCount           int
	toolChoiceName      value // the name a named tool_choice gives
}

// maxStopStrings and maxLogitBias are the limits in force, defaults for zero fields.
func (v *validator) maxStopStrings() int {
	if v.limits.MaxStopStrings > 0 {
		return v.limits.MaxStopStrings
	}
	return defaultMaxStopStrings
}

func (v *validator) maxLogitBias() int {
	if v.limits.MaxLogitBias > 0 {
		return v.limits.MaxLogitBias
	}
	return defaultMaxLogitBias
}

// crossChecks applies the rules that relate fields to each other; they run after the walk
// because JSON does not order keys.
func (v *validator) crossChecks() *ValidationError {
	req := v.req
	if v.seen&(1<<fMessages) == 0 {
		return &ValidationError{Param: "messages", Message: "messages is required: an array of message objects, each with a role and content."}
	}
	if req.StreamOptions && !req.Stream {
		return &ValidationError{Param: "stream_options", Message: `stream_options is only allowed when stream is true; remove stream_options or send "stream": true.`}
	}
	if v.continueFinal && v.addGenerationPrompt {
		if v.addGenerationSet {
			return &ValidationError{Param: "continue_final_message", Message: `continue_final_message and add_generation_prompt cannot both be true; send "add_generation_prompt": false to continue the final message.`}
		}
		// vLLM's request check lets this through, but the chat template renderer then
		// refuses it, because add_generation_prompt defaults to true.
		return &ValidationError{Param: "continue_final_message", Message: `continue_final_message cannot be used together with add_generation_prompt, which defaults to true; send "add_generation_prompt": false as well.`}
	}
	if v.topLogprobs > 0 && !v.logprobs {
		return &ValidationError{Param: "top_logprobs", Message: fmt.Sprintf(
			`top_logprobs is %d, which requires "logprobs": true; send logprobs true or set top_logprobs to 0.`, v.topLogprobs)}
	}
	if v.promptLogprobs > 0 && req.Stream {
		return &ValidationError{Param: "prompt_logprobs", Message: `prompt_logprobs is not available when stream is true; remove prompt_logprobs or send "stream": false.`}
	}
	req.MaxTokens = v.maxTokens
	maxName := "max_tokens"
	if v.maxCompletionTokens > 0 {
		req.MaxTokens, maxName = v.maxCompletionTokens, "max_completion_tokens"
	}
	// vLLM's sampling parameters: temperature below 1e-5 is greedy decoding, which has
	// one answer to give (beam search reads n as its width instead).
	if v.temperatureSet && v.temperature < 1e-5 && req.N > 1 && !v.useBeamSearch {
		return &ValidationError{Param: "n", Message: fmt.Sprintf(
			"n is %d, but temperature %s means greedy sampling, which gives a single answer; send n 1, or a temperature above 0 for several answers.",
			req.N, strconv.FormatFloat(v.temperature, 'g', -1, 64))}
	}
	if req.MaxTokens > 0 && v.minTokens > req.MaxTokens {
		return &ValidationError{Param: "min_tokens", Message: fmt.Sprintf(
			"min_tokens is %d, more than %s (%d); send a min_tokens of at most %d.", v.minTokens, maxName, req.MaxTokens, req.MaxTokens)}
	}
	return v.toolChoiceChecks()
}

// Top-level field ids. They index chatFields and the duplicate-key bitset, so there must
// be at most 64 of them.
const (
	fMessages = iota
	fModel
	fFrequencyPenalty
	fLogitBias
	fLogprobs
	fTopLogprobs
	fMaxTokens
	fMaxCompletionTokens
	fN
	fPresencePenalty
	fResponseFormat
	fSeed
	fStop
	fStream
	fStreamOptions
	fTemperature
	fTopP
	fTools
	fToolChoice
	fReasoningEffort
	fIncludeReasoning
	fParallelToolCalls
	fUser
	fUseBeamSearch
	fTopK
	fMinP
	fRepetitionPenalty
	fLengthPenalty
	fStopTokenIDs
	fIncludeStopStrInOutput
	fIgnoreEOS
	fMinTokens
	fSkipSpecialTokens
	fSpacesBetweenSpecialTokens
	fTruncatePromptTokens
	fPromptLogprobs
	fAllowedTokenIDs
	fBadWords
	fEcho
	fAddGenerationPrompt
	fContinueFinalMessage
	fAddSpecialTokens
	fDocuments
	fChatTemplate
	fChatTemplateKwargs
	fMMProcessorKwargs
	fStructuredOutputs
	fPriority
	fRequestID
	fReturnTokensAsTokenIDs
	fReturnTokenIDs
	fCacheSalt
	fKVTransferParams
	fEngineXargs
	fRepetitionDetection
	numChatFields
)

// The id space must fit the uint64 duplicate-key bitset; this fails to compile otherwise.
var _ [64 - numChatFields]struct{}

// fieldID maps a top-level key to its field id, or -1 for keys the spec does not list. A
// switch compiles to a length-then-content search and, unlike a map, needs no set-up.
func fieldID(key string) int {
	switch key {
	case "messages":
		return fMessages
	case "model":
		return fModel
	case "frequency_penalty":
		return fFrequencyPenalty
	case "logit_bias":
		return fLogitBias
	case "logprobs":
		return fLogprobs
	case "top_logprobs":
		return fTopLogprobs
	case "max_tokens":
		return fMaxTokens
	case "max_completion_tokens":
		return fMaxCompletionTokens
	case "n":
		return fN
	case "presence_penalty":
		return fPresencePenalty
	case "response_format":
		return fResponseFormat
	case "seed":
		return fSeed
	case "stop":
		return fStop
	case "stream":
		return fStream
	case "stream_options":
		return fStreamOptions
	case "temperature":
		return fTemperature
	case "top_p":
		return fTopP
	case "tools":
		return fTools
	case "tool_choice":
		return fToolChoice
	case "reasoning_effort":
		return fReasoningEffort
	case "include_reasoning":
		return fIncludeReasoning
	case "parallel_tool_calls":
		return fParallelToolCalls
	case "user":
		return fUser
	case "use_beam_search":
		return fUseBeamSearch
	case "top_k":
		return fTopK
	case "min_p":
		return fMinP
	case "repetition_penalty":
		return fRepetitionPenalty
	case "length_penalty":
		return fLengthPenalty
	case "stop_token_ids":
		return fStopTokenIDs
	case "include_stop_str_in_output":
		return fIncludeStopStrInOutput
	case "ignore_eos":
		return fIgnoreEOS
	case "min_tokens":
		return fMinTokens
	case "skip_special_tokens":
		return fSkipSpecialTokens
	case "spaces_between_special_tokens":
		return fSpacesBetweenSpecialTokens
	case "truncate_prompt_tokens":
		return fTruncatePromptTokens
	case "prompt_logprobs":
		return fPromptLogprobs
	case "allowed_token_ids":
		return fAllowedTokenIDs
	case "bad_words":
		return fBadWords
	case "echo":
		return fEcho
	case "add_generation_prompt":
		return fAddGenerationPrompt
	case "continue_final_message":
		return fContinueFinalMessage
	case "add_special_tokens":
		return fAddSpecialTokens
	case "documents":
		return fDocuments
	case "chat_template":
		return fChatTemplate
	case "chat_template_kwargs":
		return fChatTemplateKwargs
	case "mm_processor_kwargs":
		return fMMProcessorKwargs
	case "structured_outputs":
		return fStructuredOutputs
	case "priority":
		return fPriority
	case "request_id":
		return fRequestID
	case "return_tokens_as_token_ids":
		return fReturnTokensAsTokenIDs
	case "return_token_ids":
		return fReturnTokenIDs
	case "cache_salt":
		return fCacheSalt
	case "kv_transfer_params":
		return fKVTransferParams
	case "engine_xargs":
		return fEngineXargs
	case "repetition_detection":
		return fRepetitionDetection
	}
	return -1
}

// kind is the JSON shape a field must have. Fields of kindSpecial have rules of their own.
type kind uint8

const (
	kindBool kind = iota + 1
	kindInt
	kindNumber
	kindString
	kindID // a string a client chooses as an id: see ValidID
	kindObject
	kindStringOrObject
	kindIntArray
	kindStringArray
	kindObjectArray
	kindTokenIDs      // a non-empty array of integers (vLLM refuses an empty one)
	kindLogitBias     // an object of token ids to numbers: see logitBias
	kindStringObjects // an array of objects whose values are strings
	kindSpecial
)

// field describes one request field: its shape, whether null is accepted and its range.
type field struct {
	key    string // the JSON key inside its object
	param  string // how errors name it, e.g. "stream_options.include_usage"
	kind   kind
	null   bool    // null is accepted (the spec says "or null")
	minInt int64   // kindInt: the smallest accepted value
	lo, hi float64 // kindNumber: the accepted range
	loOpen bool    // kindNumber: lo itself is refused
	want   string  // what errors say is expected; derived from kind and null when empty
}

func newField(param string, k kind, null bool) field {
	return field{key: param[strings.LastIndexByte(param, '.')+1:], param: param, kind: k, null: null,
		minInt: math.MinInt64, lo: math.Inf(-1), hi: math.Inf(1)}
}

func intField(param string, null bool, minInt int64, want string) field {
	f := newField(param, kindInt, null)
	f.minInt, f.want = minInt, want
	return f
}

func numField(param string, null bool, lo, hi float64, loOpen bool, want string) field {
	f := newField(param, kindNumber, null)
	f.lo, f.hi, f.loOpen, f.want = lo, hi, loOpen, want
	return f
}

// Readable names for field.null in the tables below.
const (
	orNull  = true
	notNull = false
)

// chatFields is indexed by field id. The bounds come from the spec and vLLM's own request
// checks (see wire-facts.md); the table test checks every row against fieldID.
var chatFields = [numChatFields]field{
	fMessages:                   newField("messages", kindSpecial, notNull),
	fModel:                      newField("model", kindString, orNull),
	fFrequencyPenalty:           numField("frequency_penalty", orNull, -2, 2, false, "a number between -2 and 2 or null"),
	fLogitBias:                  newField("logit_bias", kindLogitBias, orNull),
	fLogprobs:                   newField("logprobs", kindBool, orNull),
	fTopLogprobs:                intField("top_logprobs", orNull, 0, "an integer of at least 0, or null"),
	fMaxTokens:                  intField("max_tokens", orNull, 1, "an integer of at least 1, or null"),
	fMaxCompletionTokens:        intField("max_completion_tokens", orNull, 1, "an integer of at least 1, or null"),
	fN:                          intField("n", orNull, 1, "an integer of at least 1, or null"),
	fPresencePenalty:            numField("presence_penalty", orNull, -2, 2, false, "a number between -2 and 2 or null"),
	fResponseFormat:             newField("response_format", kindSpecial, notNull),
	fSeed:                       intField("seed", orNull, math.MinInt64, "an integer or null"),
	fStop:                       newField("stop", kindSpecial, orNull),
	fStream:                     newField("stream", kindBool, orNull),
	fStreamOptions:              newField("stream_options", kindSpecial, orNull),
	fTemperature:                numField("temperature", orNull, 0, 2, false, "a number between 0 and 2 or null"),
	fTopP:                       numField("top_p", orNull, 0, 1, true, "a number greater than 0 and at most 1, or null"),
	fTools:                      newField("tools", kindSpecial, orNull),
	fToolChoice:                 newField("tool_choice", kindSpecial, orNull),
	fReasoningEffort:            newField("reasoning_effort", kindSpecial, orNull),
	fIncludeReasoning:           newField("include_reasoning", kindBool, notNull),
	fParallelToolCalls:          newField("parallel_tool_calls", kindBool, orNull),
	fUser:                       newField("user", kindString, orNull),
	fUseBeamSearch:              newField("use_beam_search", kindBool, notNull),
	fTopK:                       intField("top_k", orNull, -1, "-1, 0 (both turn top-k off) or an integer of at least 1, or null"),
	fMinP:                       numField("min_p", orNull, 0, 1, false, "a number between 0 and 1 or null"),
	fRepetitionPenalty:          numField("repetition_penalty", orNull, 0, math.Inf(1), true, "a number greater than 0, or null"),
	fLengthPenalty:              numField("length_penalty", notNull, math.Inf(-1), math.Inf(1), false, "a finite number"),
	fStopTokenIDs:               newField("stop_token_ids", kindIntArray, orNull),
	fIncludeStopStrInOutput:     newField("include_stop_str_in_output", kindBool, notNull),
	fIgnoreEOS:                  newField("ignore_eos", kindBool, notNull),
	fMinTokens:                  intField("min_tokens", notNull, 0, "an integer of at least 0"),
	fSkipSpecialTokens:          newField("skip_special_tokens", kindBool, notNull),
	fSpacesBetweenSpecialTokens: newField("spaces_between_special_tokens", kindBool, notNull),
	fTruncatePromptTokens:       intField("truncate_prompt_tokens", orNull, -1, "an integer of at least -1, or null"),
	fPromptLogprobs:             intField("prompt_logprobs", orNull, 0, "an integer of at least 0, or null"),
	fAllowedTokenIDs:            newField("allowed_token_ids", kindTokenIDs, orNull),
	fBadWords:                   newField("bad_words", kindStringArray, notNull),
	fEcho:                       newField("echo", kindBool, notNull),
	fAddGenerationPrompt:        newField("add_generation_prompt", kindBool, notNull),
	fContinueFinalMessage:       newField("continue_final_message", kindBool, notNull),
	fAddSpecialTokens:           newField("add_special_tokens", kindBool, notNull),
	fDocuments:                  newField("documents", kindStringObjects, orNull),
	fChatTemplate:               newField("chat_template", kindString, orNull),
	fChatTemplateKwargs:         newField("chat_template_kwargs", kindObject, orNull),
	fMMProcessorKwargs:          newField("mm_processor_kwargs", kindObject, orNull),
	fStructuredOutputs:          newField("structured_outputs", kindSpecial, orNull),
	fPriority:                   intField("priority", notNull, math.MinInt64, "an integer"),
	fRequestID:                  newField("request_id", kindID, notNull),
	fReturnTokensAsTokenIDs:     newField("return_tokens_as_token_ids", kindBool, orNull),
	fReturnTokenIDs:             newField("return_token_ids", kindBool, orNull),
	fCacheSalt:                  newField("cache_salt", kindSpecial, orNull),
	fKVTransferParams:           newField("kv_transfer_params", kindObject, orNull),
	fEngineXargs:                newField("engine_xargs", kindSpecial, orNull),
	fRepetitionDetection:        newField("repetition_detection", kindSpecial, orNull),
}

var streamOptionsFields = []field{
	newField("stream_options.include_usage", kindBool, notNull),
	newField("stream_options.continuous_usage_stats", kindBool, notNull),
}

// The first six structured_outputs fields are the constraint kinds, of which vLLM accepts
// at most one; soConstraints counts them by index.
const soConstraints = 6

var structuredOutputsFields = []field{
	newField("structured_outputs.json", kindStringOrObject, notNull),
	newField("structured_outputs.regex", kindString, notNull),
	newField("structured_outputs.choice", kindStringArray, notNull),
	newField("structured_outputs.grammar", kindString, notNull),
	newField("structured_outputs.json_object", kindBool, notNull),
	newField("structured_outputs.structural_tag", kindString, notNull),
	newField("structured_outputs.disable_fallback", kindBool, notNull),
	newField("structured_outputs.disable_any_whitespace", kindBool, notNull),
	newField("structured_outputs.disable_additional_properties", kindBool, notNull),
	newField("structured_outputs.whitespace_pattern", kindString, notNull),
	newField("structured_outputs._backend", kindString, notNull),
	newField("structured_outputs._backend_was_auto", kindBool, notNull),
}

var responseFormatFields = []field{
	newField("response_format.type", kindString, notNull),
	newField("response_format.json_schema", kindObject, notNull),
}

var jsonSchemaFields = []field{
	newField("response_format.json_schema.name", kindString, notNull),
	newField("response_format.json_schema.description", kindString, notNull),
	newField("response_format.json_schema.schema", kindObject, notNull),
	newField("response_format.json_schema.strict", kindBool, notNull),
}

var repetitionDetectionFields = []field{
	intField("repetition_detection.max_pattern_size", notNull, 0, "an integer of at least 0"),
	intField("repetition_detection.min_pattern_size", notNull, 0, "an integer of at least 0"),
	intField("repetition_detection.min_count", notNull, 0, "an integer of at least 0"),
}

// field validates top-level field id, whose value starts at start, moves it past the value
// and records what the handler and the cross-field rules need.
func (v *validator) field(id int, it *iter, start int) *ValidationError {
	if id == fMessages {
		// Messages are most of a body, so they are walked in place rather than delimited
		// first and walked afterwards.
		return v.messages(it, start)
	}
	val := it.finish(start)
	f := &chatFields[id]
	if f.kind != kindSpecial {
		n, err := v.check(f.param, f, val)
		if err != nil {
			return err
		}
		v.record(id, val, n)
		return nil
	}
	switch id {
	case fStop:
		return v.stop(val)
	case fStreamOptions:
		return v.streamOptions(val)
	case fResponseFormat:
		return v.responseFormat(val)
	case fTools:
		return v.tools(val)
	case fToolChoice:
		return v.toolChoice(val)
	case fReasoningEffort:
		if val.isNull() {
			return nil
		}
		switch unquoteIfString(val) {
		case "low", "medium", "high":
			return nil
		}
		return &ValidationError{Param: "reasoning_effort", Message: fmt.Sprintf(
			`reasoning_effort must be "low", "medium", "high" or null, got %s.`, describe(val))}
	case fCacheSalt:
		// An empty salt would salt nothing; vLLM refuses it too.
		if !val.isNull() && (!val.isString() || len(val.raw) == 2) {
			return &ValidationError{Param: "cache_salt", Message: fmt.Sprintf(
				"cache_salt must be a non-empty string or null, got %s.", describe(val))}
		}
	case fStructuredOutputs:
		return v.structuredOutputs(val)
	case fEngineXargs:
		return v.engineXargs(val)
	case fRepetitionDetection:
		return v.repetitionDetection(val)
	}
	return nil
}

// repetitionDetection checks vLLM's repetition detection: sizes and a count of at least
// 0, and, when detection is on (max_pattern_size > 0), a pattern size range that is not
// empty and a count of at least 2, since one occurrence is no repetition.
func (v *validator) repetitionDetection(val value) *ValidationError {
	if obj, err := nullableObject("repetition_detection", val); !obj {
		return err
	}
	var n [3]int64 // max_pattern_size, min_pattern_size, min_count, as in the table
	it := v.iter(val)
	for {
		i, x, ok, err := v.nextKnown(&it, repetitionDetectionFields)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		n[i], _, _ = laxInt(x.raw)
	}
	maxSize, minSize, minCount := n[0], n[1], n[2]
	if maxSize <= 0 {
		return nil
	}
	if minSize > maxSize {
		return &ValidationError{Param: "repetition_detection.min_pattern_size", Message: fmt.Sprintf(
			"repetition_detection.min_pattern_size is %d, more than max_pattern_size (%d); send a min_pattern_size of at most %d.", minSize, maxSize, maxSize)}
	}
	if minCount < 2 {
		return &ValidationError{Param: "repetition_detection.min_count", Message: fmt.Sprintf(
			"repetition_detection.min_count must be at least 2 when max_pattern_size is above 0, got %d.", minCount)}
	}
	return nil
}

// emptyArray reports whether array val has no elements.
func emptyArray(val value) bool {
	return val.raw[skipSpace(val.raw, 1)] == ']'
}

// nullableObject reports whether val is an object to look into. Null is accepted (with
// nothing to look into) and anything else is refused, naming the field param.
func nullableObject(param string, val value) (bool, *ValidationError) {
	if val.isObject() {
		return true, nil
	}
	if val.isNull() {
		return false, nil
	}
	return false, typeError(param, "an object or null", val)
}

// record keeps the values of plain fields that the handler or the cross-field rules use.
// n is the parsed integer of kindInt fields (0 for null).
func (v *validator) record(id int, val value, n int64) {
	req := v.req
	switch id {
	case fModel:
		req.ModelStart, req.ModelEnd = val.off, val.end()
		if val.isString() {
			req.Model = v.stringBytes(val, req.modelBuf[:0])
		}
	case fStream:
		req.Stream = val.isTrue()
	case fLogprobs:
		v.logprobs = val.isTrue()
	case fTopLogprobs:
		v.topLogprobs = n
	case fMaxTokens:
		v.maxTokens = n
	case fMaxCompletionTokens:
		v.maxCompletionTokens = n
	case fMinTokens:
		v.minTokens = n
	case fTemperature:
		if val.isNumber() {
			// check accepted it, so it parses.
			v.temperature, _ = strconv.ParseFloat(val.raw, 64)
			v.temperatureSet = true
		}
	case fUseBeamSearch:
		v.useBeamSearch = val.isTrue()
	case fN:
		if !val.isNull() {
			req.N = n
		}
	case fPriority:
		req.Priority = n
	case fPromptLogprobs:
		v.promptLogprobs = n
	case fAddGenerationPrompt:
		v.addGenerationPrompt, v.addGenerationSet = val.isTrue(), true
	case fContinueFinalMessage:
		v.continueFinal = val.isTrue()
	}
}

// stringBytes returns the content of string value val as bytes: a capped slice of the
// body when it has no escapes, else the unescaped text appended to buf.
func (v *validator) stringBytes(val value, buf []byte) []byte {
	a, b := val.off+1, val.end()-1
	if strings.IndexByte(val.raw, '\\') < 0 {
		return v.body[a:b:b]
	}
	return append(buf, unquote(val.raw)...)
}

func (v *validator) messages(parent *iter, start int) *ValidationError {
	if v.s[start] != '[' {
		return typeError("messages", "a non-empty array of message objects", parent.finish(start))
	}
	it := parent.enter(start)
	i := 0
	leading := true // every message so far is an instruction
	for {
		_, m, ok := it.member()
		if !ok {
			break
		}
		instructs, err := v.message(i, &it, m)
		if err != nil {
			return err
		}
		if leading = leading && instructs; leading {
			v.req.Instructions, v.req.InstructionsEnd = i+1, it.i
		}
		i++
	}
	parent.leave(&it)
	if i == 0 {
		return &ValidationError{Param: "messages", Message: "messages must contain at least one message, got an empty array."}
	}
	v.req.Messages = i
	v.req.PromptStart, v.req.PromptEnd = start, parent.i
	return nil
}

// message checks messages[i], which starts at start, and moves parent past it. As in the
// backend's JSON parser, the last copy of a repeated key is the one that counts, so values
// are collected first and checked afterwards; only content parts are checked as they come,
// in the same pass that finds their end.
func (v *validator) message(i int, parent *iter, start int) (instructs bool, _ *ValidationError) {
	if v.s[start] != '{' {
		return false, &ValidationError{Param: fmt.Sprintf("messages[%d]", i), Message: fmt.Sprintf(
			"messages[%d] must be a message object with a role and content, got %s.", i, describe(parent.finish(start)))}
	}
	var role, content, name, toolCalls, toolCallID value
	var functionCall bool
	var contentBytes int
	it := parent.enter(start)
	for {
		key, xs, ok := it.member()
		if !ok {
			break
		}
		if key == "content" && v.s[xs] == '[' {
			n, err := v.contentParts(i, &it, xs)
			if err != nil {
				return false, err
			}
			content, contentBytes = it.last(xs), n
			continue
		}
		x := it.finish(xs)
		switch key {
		case "role":
			role = x
		case "content":
			content, contentBytes = x, len(x.raw)-2
		case "name":
			name = x
		case "tool_calls":
			toolCalls = x
		case "tool_call_id":
			toolCallID = x
		case "function_call":
			functionCall = !x.isNull()
		}
	}
	parent.leave(&it)
	if !role.exists() {
		return false, &ValidationError{Param: fmt.Sprintf("messages[%d].role", i), Message: fmt.Sprintf(
			`messages[%d].role is required: a string such as "system", "user" or "assistant".`, i)}
	}
	if !role.isString() {
		return false, &ValidationError{Param: fmt.Sprintf("messages[%d].role", i), Message: fmt.Sprintf(
			"messages[%d].role must be a string, got %s.", i, describe(role))}
	}
	switch {
	case content.isString(), content.isArray():
		v.req.PromptBytes += contentBytes
	case (!content.exists() || content.isNull()) && (toolCalls.exists() && !toolCalls.isNull() || functionCall) && unquote(role.raw) == "assistant":
		// An assistant message that calls tools may leave its content out.
	case !content.exists():
		return false, &ValidationError{Param: fmt.Sprintf("messages[%d].content", i), Message: fmt.Sprintf(
			"messages[%d].content is required; only an assistant message with tool_calls or function_call may leave it out.", i)}
	case content.isNull():
		return false, &ValidationError{Param: fmt.Sprintf("messages[%d].content", i), Message: fmt.Sprintf(
			"messages[%d].content must be a string or an array of content parts; only an assistant message with tool_calls or function_call may leave it null, got null.", i)}
	default:
		return false, &ValidationError{Param: fmt.Sprintf("messages[%d].content", i), Message: fmt.Sprintf(
			"messages[%d].content must be a string or an array of content parts, got %s.", i, describe(content))}
	}
	if name.exists() && !name.isString() {
		return false, &ValidationError{Param: fmt.Sprintf("messages[%d].name", i), Message: fmt.Sprintf(
			"messages[%d].name must be a string, got %s.", i, describe(name))}
	}
	if toolCalls.exists() {
		if err := v.toolCalls(i, toolCalls); err != nil {
			return false, err
		}
	}
	// tool_call_id may be left out or null on any role, a tool message's too: vLLM
	// takes a message its OpenAI types refuse as a custom message whose
	// tool_call_id is optional, and the chat template decides what it needs.
	if toolCallID.exists() && !toolCallID.isString() && !toolCallID.isNull() {
		return false, typeError(fmt.Sprintf("messages[%d].tool_call_id", i), "a string or null", toolCallID)
	}
	r := unquote(role.raw)
	return r == "system" || r == "developer", nil
}

// contentParts checks the array of content parts of messages[i] that starts at start,
// moves parent past it and returns the length of the parts' text.
func (v *validator) contentParts(i int, parent *iter, start int) (int, *ValidationError) {
	it := parent.enter(start)
	textBytes := 0
	for j := 0; ; j++ {
		_, ps, ok := it.member()
		if !ok {
			break
		}
		if v.s[ps] != '{' {
			return 0, &ValidationError{Param: fmt.Sprintf("messages[%d].content[%d]", i, j), Message: fmt.Sprintf(
				`messages[%d].content[%d] must be a content part object such as {"type":"text","text":"..."}, got %s.`, i, j, describe(it.finish(ps)))}
		}
		var typ, text value
		pit := it.enter(ps)
		for {
			k, x, ok := pit.next()
			if !ok {
				break
			}
			switch k {
			case "type":
				typ = x
			case "text":
				text = x
			}
		}
		it.leave(&pit)
		if !typ.exists() {
			return 0, &ValidationError{Param: fmt.Sprintf("messages[%d].content[%d].type", i, j), Message: fmt.Sprintf(
				`messages[%d].content[%d].type is required: a string such as "text" or "image_url".`, i, j)}
		}
		if !typ.isString() {
			return 0, &ValidationError{Param: fmt.Sprintf("messages[%d].content[%d].type", i, j), Message: fmt.Sprintf(
				"messages[%d].content[%d].type must be a string, got %s.", i, j, describe(typ))}
		}
		if unquote(typ.raw) != "text" {
			continue
		}
		if !text.exists() {
			return 0, &ValidationError{Param: fmt.Sprintf("messages[%d].content[%d].text", i, j), Message: fmt.Sprintf(
				`messages[%d].content[%d].text is required on a part of type "text".`, i, j)}
		}
		if !text.isString() {
			return 0, &ValidationError{Param: fmt.Sprintf("messages[%d].content[%d].text", i, j), Message: fmt.Sprintf(
				"messages[%d].content[%d].text must be a string, got %s.", i, j, describe(text))}
		}
		textBytes += len(text.raw) - 2
	}
	parent.leave(&it)
	return textBytes, nil
}

// stop is a string, an array of at most maxStopStrings strings, or null. No stop string
// may be empty: vLLM refuses one, as it would stop before the first token.
func (v *validator) stop(val value) *ValidationError {
	if val.isNull() {
		return nil
	}
	if val.isString() {
		if len(val.raw) == 2 {
			return &ValidationError{Param: "stop", Message: `stop must not be an empty string; send null, or leave it out, for no stop string.`}
		}
		return nil
	}
	if !val.isArray() {
		return typeError("stop", "a string, an array of strings or null", val)
	}
	limit := v.maxStopStrings()
	it := v.iter(val)
	for i := 0; ; i++ {
		_, e, ok := it.next()
		if !ok {
			return nil
		}
		if i == limit {
			return &ValidationError{Param: "stop", Message: fmt.Sprintf(
				"stop has more than %d strings, the most the gateway accepts.", limit)}
		}
		if !e.isString() {
			return typeError(fmt.Sprintf("stop[%d]", i), "a string", e)
		}
		if len(e.raw) == 2 {
			return &ValidationError{Param: fmt.Sprintf("stop[%d]", i), Message: fmt.Sprintf(
				"stop[%d] is an empty string; every stop string must have at least one character.", i)}
		}
	}
}

// logitBias checks object val, a logit_bias named param: it maps token ids, written as
// decimal integer strings, to the bias added to their logits (vLLM clamps it to
// [-100, 100]), and holds at most maxLogitBias entries.
func (v *validator) logitBias(param string, val value) *ValidationError {
	limit := v.maxLogitBias()
	it := v.iter(val)
	for i := 0; ; i++ {
		k, x, ok := it.next()
		if !ok {
			return nil
		}
		if i == limit {
			return &ValidationError{Param: param, Message: fmt.Sprintf(
				"%s has more than %d entries, the most the gateway accepts.", param, limit)}
		}
		if !tokenID(k) {
			return &ValidationError{Param: param, Message: fmt.Sprintf(
				`%s keys must be token ids written as integer strings, such as "50256", got %s.`,
				param, describe(value{raw: strconv.Quote(k)}))}
		}
		if !x.isNumber() {
			return typeError(param+"."+k, "a number", x)
		}
	}
}

// tokenID reports whether k is a token id as logit_bias keys write it: 1 to 19 decimal
// digits, which fits an int64. Token ids are never negative.
func tokenID(k string) bool {
	if len(k) == 0 || len(k) > 19 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < '0' || k[i] > '9' {
			return false
		}
	}
	return true
}

// stringObjects checks array val, named param, whose elements are objects with string
// values (vLLM reads documents as list[dict[str, str]], such as {"title": "...",
// "text": "..."}).
func (v *validator) stringObjects(param string, val value) *ValidationError {
	it := v.iter(val)
	for i := 0; ; i++ {
		_, d, ok := it.next()
		if !ok {
			return nil
		}
		if !d.isObject() {
			return typeError(fmt.Sprintf("%s[%d]", param, i), "an object", d)
		}
		dit := v.iter(d)
		for {
			k, x, ok := dit.next()
			if !ok {
				break
			}
			if !x.isString() {
				return typeError(fmt.Sprintf("%s[%d].%s", param, i, k), "a string", x)
			}
		}
	}
}

func (v *validator) streamOptions(val value) *ValidationError {
	req := v.req
	req.StreamOptionsStart, req.StreamOptionsEnd = val.off, val.end()
	if obj, err := nullableObject("stream_options", val); !obj {
		return err
	}
	req.StreamOptions = true
	it := v.iter(val)
	for {
		i, x, ok, err := v.nextKnown(&it, streamOptionsFields)
		if err != nil || !ok {
			return err
		}
		if i == 0 {
			req.IncludeUsage = x.isTrue()
		} else {
			req.ContinuousUsage = x.isTrue()
		}
	}
}

func (v *validator) responseFormat(val value) *ValidationError {
	if !val.isObject() {
		return typeError("response_format", "an object", val)
	}
	var typ, schema value
	it := v.iter(val)
	for {
		i, x, ok, err := v.nextKnown(&it, responseFormatFields)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if i == 0 {
			typ = x
		} else {
			schema = x
		}
	}
	if !typ.exists() {
		return &ValidationError{Param: "response_format.type", Message: `response_format.type is required: "text", "json_object", "json_schema" or "structural_tag".`}
	}
	t := unquote(typ.raw)
	switch t {
	case "text", "json_object", "json_schema", "structural_tag":
	default:
		return &ValidationError{Param: "response_format.type", Message: fmt.Sprintf(
			`response_format.type must be "text", "json_object", "json_schema" or "structural_tag", got %s.`, describe(typ))}
	}
	if schema.exists() {
		if err := v.checkKnown(schema, jsonSchemaFields); err != nil {
			return err
		}
		if !v.hasKey(schema, "name") {
			return &ValidationError{Param: "response_format.json_schema.name", Message: `response_format.json_schema.name is required: a name for the schema, such as "answer".`}
		}
		return nil
	}
	if t == "json_schema" {
		return &ValidationError{Param: "response_format.json_schema", Message: `response_format.json_schema is required when response_format.type is "json_schema": an object with the schema and its name.`}
	}
	return nil
}

// maxMembers is how many members members can fetch in one walk.
const maxMembers = 3

// members walks object obj once and returns the values of its members named keys (at
// most maxMembers of them), in the order of keys; an absent member is the zero value,
// which does not exist. As in the backend's JSON parser, the last copy of a repeated key
// is the one that counts.
func (v *validator) members(obj value, keys ...string) (vals [maxMembers]value) {
	it := v.iter(obj)
	for {
		k, x, ok := it.next()
		if !ok {
			return vals
		}
		for i, key := range keys {
			if k == key {
				vals[i] = x
				break
			}
		}
	}
}

// hasKey reports whether object val has a member named key.
func (v *validator) hasKey(val value, key string) bool {
	it := v.iter(val)
	for {
		k, _, ok := it.next()
		if !ok {
			return false
		}
		if k == key {
			return true
		}
	}
}

func (v *validator) tools(val value) *ValidationError {
	if val.isNull() {
		return nil
	}
	if !val.isArray() {
		return typeError("tools", "an array of tool objects or null", val)
	}
	v.toolsArray = val
	it := v.iter(val)
	for i := 0; ; i++ {
		_, t, ok := it.next()
		if !ok {
			v.toolCount = i
			return nil
		}
		if !t.isObject() {
			return &ValidationError{Param: fmt.Sprintf("tools[%d]", i), Message: fmt.Sprintf(
				`tools[%d] must be an object with "type": "function" and a function, got %s.`, i, describe(t))}
		}
		m := v.members(t, "type", "function")
		typ, fn := m[0], m[1]
		// The type defaults to "function" in vLLM, so it may be left out, but nothing
		// else is accepted.
		if typ.exists() && unquoteIfString(typ) != "function" {
			return &ValidationError{Param: fmt.Sprintf("tools[%d].type", i), Message: fmt.Sprintf(
				`tools[%d].type must be "function", got %s.`, i, describe(typ))}
		}
		if !fn.exists() {
			return &ValidationError{Param: fmt.Sprintf("tools[%d].function", i), Message: fmt.Sprintf(
				"tools[%d].function is required: an object with at least a name.", i)}
		}
		if !fn.isObject() {
			return &ValidationError{Param: fmt.Sprintf("tools[%d].function", i), Message: fmt.Sprintf(
				"tools[%d].function must be an object with at least a name, got %s.", i, describe(fn))}
		}
		var name value
		fit := v.iter(fn)
		for {
			key, x, ok := fit.next()
			if !ok {
				break
			}
			switch key {
			case "name":
				name = x
			case "description", "parameters":
				want, good := "a string", x.isString()
				if key == "parameters" {
					want, good = "an object (a JSON Schema)", x.isObject()
				}
				if !good {
					return &ValidationError{Param: fmt.Sprintf("tools[%d].function.%s", i, key), Message: fmt.Sprintf(
						"tools[%d].function.%s must be %s, got %s.", i, key, want, describe(x))}
				}
			}
		}
		if !name.exists() {
			return &ValidationError{Param: fmt.Sprintf("tools[%d].function.name", i), Message: fmt.Sprintf(
				"tools[%d].function.name is required: the name the model calls the function by.", i)}
		}
		if !name.isString() {
			return &ValidationError{Param: fmt.Sprintf("tools[%d].function.name", i), Message: fmt.Sprintf(
				"tools[%d].function.name must be a string, got %s.", i, describe(name))}
		}
	}
}

func (v *validator) structuredOutputs(val value) *ValidationError {
	if obj, err := nullableObject("structured_outputs", val); !obj {
		return err
	}
	var kinds uint // bitset over the constraint kinds present
	it := v.iter(val)
	for {
		i, _, ok, err := v.nextKnown(&it, structuredOutputsFields)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if i < soConstraints {
			kinds |= 1 << uint(i)
		}
	}
	if kinds&(kinds-1) == 0 {
		return nil
	}
	var got []string
	for i := 0; i < soConstraints; i++ {
		if kinds&(1<<uint(i)) != 0 {
			got = append(got, structuredOutputsFields[i].key)
		}
	}
	return &ValidationError{Param: "structured_outputs", Message: fmt.Sprintf(
		"structured_outputs may set only one of json, regex, choice, grammar, json_object and structural_tag, got %s.",
		strings.Join(got, " and "))}
}

// engineXargs values are strings, numbers, or arrays of them, for custom engine extensions.
func (v *validator) engineXargs(val value) *ValidationError {
	if obj, err := nullableObject("engine_xargs", val); !obj {
		return err
	}
	it := v.iter(val)
	for {
		k, x, ok := it.next()
		if !ok {
			return nil
		}
		if x.isString() || x.isNumber() {
			continue
		}
		if !x.isArray() {
			return typeError("engine_xargs."+k, "a string, a number or an array of strings and numbers", x)
		}
		eit := v.iter(x)
		for j := 0; ; j++ {
			_, e, ok := eit.next()
			if !ok {
				break
			}
			if !e.isString() && !e.isNumber() {
				return typeError(fmt.Sprintf("engine_xargs.%s[%d]", k, j), "a string or a number", e)
			}
		}
	}
}

// elements checks that every element of array val has kind k (kindString, kindInt or
// kindObject), naming a bad one param[i].
func (v *validator) elements(param string, k kind, val value) *ValidationError {
	it := v.iter(val)
	for i := 0; ; i++ {
		_, e, ok := it.next()
		if !ok {
			return nil
		}
		var good bool
		var want string
		switch k {
		case kindString:
			good, want = e.isString(), "a string"
		case kindObject:
			good, want = e.isObject(), "an object"
		default:
			want = "an integer"
			if e.isNumber() {
				_, integral, overflow := laxInt(e.raw)
				if overflow {
					return overflowError(fmt.Sprintf("%s[%d]", param, i), e)
				}
				good = integral
			}
		}
		if !good {
			return typeError(fmt.Sprintf("%s[%d]", param, i), want, e)
		}
	}
}

// check validates val against the plain (not special) field f, naming it param in errors.
// For kindInt it returns the parsed integer (0 for null).
func (v *validator) check(param string, f *field, val value) (int64, *ValidationError) {
	if val.isNull() {
		if f.null {
			return 0, nil
		}
		return 0, typeError(param, f.expectation(), val)
	}
	var good bool
	switch f.kind {
	case kindBool:
		good = val.raw[0] == 't' || val.raw[0] == 'f'
	case kindString:
		good = val.isString()
	case kindID:
		// Empty is no id: the backend makes one, as when it is absent.
		good = val.isString() && (len(val.raw) == 2 || ValidID(unquote(val.raw)))
	case kindObject:
		good = val.isObject()
	case kindStringOrObject:
		good = val.isString() || val.isObject()
	case kindInt:
		if !val.isNumber() {
			break
		}
		n, integral, overflow := laxInt(val.raw)
		if overflow {
			return 0, overflowError(param, val)
		}
		if !integral || n < f.minInt {
			break
		}
		return n, nil
	case kindNumber:
		if !val.isNumber() {
			break
		}
		// A number too large for float64 (1e400) fails ParseFloat and is out of any range.
		x, err := strconv.ParseFloat(val.raw, 64)
		good = err == nil && x >= f.lo && x <= f.hi && !(f.loOpen && x == f.lo)
	case kindIntArray, kindStringArray, kindObjectArray:
		if !val.isArray() {
			break
		}
		elem := kindInt
		switch f.kind {
		case kindStringArray:
			elem = kindString
		case kindObjectArray:
			elem = kindObject
		}
		return 0, v.elements(param, elem, val)
	case kindTokenIDs:
		if !val.isArray() {
			break
		}
		if emptyArray(val) {
			return 0, &ValidationError{Param: param, Message: fmt.Sprintf(
				"%s must not be empty; send null, or leave it out, to allow every token.", param)}
		}
		return 0, v.elements(param, kindInt, val)
	case kindLogitBias:
		if !val.isObject() {
			break
		}
		return 0, v.logitBias(param, val)
	case kindStringObjects:
		if !val.isArray() {
			break
		}
		return 0, v.stringObjects(param, val)
	}
	if !good {
		return 0, typeError(param, f.expectation(), val)
	}
	return 0, nil
}

// expectation says what f accepts, for error messages.
func (f *field) expectation() string {
	if f.want != "" {
		return f.want
	}
	var s string
	switch f.kind {
	case kindBool:
		s = "a boolean"
	case kindString:
		s = "a string"
	case kindID:
		s = "a string of at most 128 visible ASCII characters without spaces, quotes or backslashes"
	case kindObject:
		s = "an object"
	case kindStringOrObject:
		s = "a string or an object"
	case kindIntArray, kindTokenIDs:
		s = "an array of integers"
	case kindStringArray:
		s = "an array of strings"
	case kindObjectArray, kindStringObjects:
		s = "an array of objects"
	case kindLogitBias:
		s = "an object"
	}
	if f.null {
		s += " or null"
	}
	return s
}

func typeError(param, want string, val value) *ValidationError {
	return &ValidationError{Param: param, Message: fmt.Sprintf("%s must be %s, got %s.", param, want, describe(val))}
}

func overflowError(param string, val value) *ValidationError {
	return &ValidationError{Param: param, Message: fmt.Sprintf(
		"%s must fit in a signed 64-bit integer (-9223372036854775808 to 9223372036854775807), got %s.", param, describe(val))}
}

// describe renders a found value for an error message. Short scalars are quoted as sent,
// longer ones summarised, so a message never echoes a whole prompt back. The result may
// share the body's memory; it is only ever formatted into a new string.
func describe(val value) string {
	switch val.raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		if len(val.raw) <= 42 {
			return val.raw
		}
		return fmt.Sprintf("a string of %d bytes", len(val.raw)-2)
	}
	if len(val.raw) > 40 {
		return val.raw[:40] + "..."
	}
	return val.raw
}

// isInt reports whether the JSON number token raw has no fraction and no exponent.
// Integer fields take more than that (see laxInt); this is for where only plain digits
// will do.
func isInt(raw string) bool {
	i := 0
	if i < len(raw) && raw[i] == '-' {
		i++
	}
	if i == len(raw) {
		return false
	}
	for ; i < len(raw); i++ {
		if raw[i] < '0' || raw[i] > '9' {
			return false
		}
	}
	return true
}

// laxInt reads the JSON number token raw as an integer the way the backend's pydantic
// models read integer fields: any number without a fractional part, so 5, 5.0, 1e1 and
// 1.5e1 are integers and 5.5 and 1e-1 are not. integral is false for a fraction;
// overflow is true for an integer outside int64. It works on the decimal digits, never
// through float64, which would round large values and accept 1.0000000000000001 as 1.
func laxInt(raw string) (n int64, integral, overflow bool) {
	i, neg := 0, false
	if i < len(raw) && raw[i] == '-' {
		neg = true
		i++
	}
	intStart := i
	for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
		i++
	}
	intDigits := raw[intStart:i]
	var fracDigits string
	if i < len(raw) && raw[i] == '.' {
		i++
		fs := i
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			i++
		}
		fracDigits = raw[fs:i]
	}
	var exp int64
	if i < len(raw) && (raw[i] == 'e' || raw[i] == 'E') {
		i++
		expNeg := false
		if i < len(raw) && (raw[i] == '+' || raw[i] == '-') {
			expNeg = raw[i] == '-'
			i++
		}
		for ; i < len(raw) && raw[i] >= '0' && raw[i] <= '9'; i++ {
			// Saturate: no body has 2^40 digits to balance a larger exponent.
			exp = min(exp*10+int64(raw[i]-'0'), 1<<40)
		}
		if expNeg {
			exp = -exp
		}
	}
	if i != len(raw) || len(intDigits) == 0 {
		return 0, false, false // not a JSON number; validJSON has refused it already
	}
	// The value is digits × 10^scale, digits being intDigits then fracDigits.
	digit := func(k int) byte {
		if k < len(intDigits) {
			return intDigits[k]
		}
		return fracDigits[k-len(intDigits)]
	}
	first, last := 0, len(intDigits)+len(fracDigits)
	scale := exp - int64(len(fracDigits))
	for last > first && digit(last-1) == '0' {
		last--
		scale++
	}
	for first < last && digit(first) == '0' {
		first++
	}
	if first == last {
		return 0, true, false // zero, however it is written
	}
	if scale < 0 {
		return 0, false, false
	}
	if int64(last-first)+scale > 19 {
		return 0, true, true
	}
	limit := uint64(math.MaxInt64)
	if neg {
		limit++
	}
	var u uint64
	for k := first; k < last; k++ {
		u = u*10 + uint64(digit(k)-'0') // at most 19 digits: no wrap-around
	}
	for ; scale > 0; scale-- {
		u *= 10
	}
	if u > limit {
		return 0, true, true
	}
	if neg {
		return int64(-u), true, false // -2^63 too
	}
	return int64(u), true, false
}

// unquote returns the content of a JSON string token. Keys and enum values practically
// never carry escapes, so the common case is a substring of the body; escapes are decoded
// with gjson, which allocates.
func unquote(raw string) string {
	if strings.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	return gjson.Parse(raw).Str
}

// unquoteIfString is unquote for a value that may not be a string; it returns "" then.
func unquoteIfString(val value) string {
	if !val.isString() {
		return ""
	}
	return unquote(val.raw)
}

// value is one JSON value in the body: its text and the byte offset where the text starts.
// The zero value stands for an absent member.
type value struct {
	raw string
	off int
}

func (x value) exists() bool   { return x.raw != "" }
func (x value) end() int       { return x.off + len(x.raw) }
func (x value) isNull() bool   { return x.raw != "" && x.raw[0] == 'n' }
func (x value) isTrue() bool   { return x.raw != "" && x.raw[0] == 't' }
func (x value) isString() bool { return x.raw != "" && x.raw[0] == '"' }
func (x value) isObject() bool { return x.raw != "" && x.raw[0] == '{' }
func (x value) isArray() bool  { return x.raw != "" && x.raw[0] == '[' }
func (x value) isNumber() bool {
	return x.raw != "" && (x.raw[0] == '-' || x.raw[0] >= '0' && x.raw[0] <= '9')
}

// iter walks the members of an object or the elements of an array in the body. It relies
// on validJSON having accepted the body, so it only finds where tokens end and never
// reports syntax errors; it still stops at the end of the input instead of running past
// it. It exists because gjson's ForEach unescapes every string it passes over, which
// allocates for any message content holding a newline or a quote, and re-scans nested
// values once per level.
//
// A member's value can be taken in two ways: finish finds where it ends (one scan of its
// text), or enter and leave walk it in place, for the values that get walked anyway, so
// that the bulk of a body (the messages) is scanned once rather than once per level.
type iter struct {
	s   string
	i   int  // where to look for the next member; at the closing bracket once done
	obj bool // members have keys
	// check makes the walk check the syntax it passes over instead of
	// relying on validJSON: member checks the brackets, commas, keys and
	// colons, and finish checks values with validValue, so that a walk
	// which reaches the closing brace of the body has checked every byte
	// before it, as validJSON would have (the walk enters only what it
	// walks in place, messages and their parts, and delimits everything
	// else with finish). At a syntax error the iter moves to the end of
	// the body, where it finds no more members, and so does every iter
	// that encloses it once it leaves the inner one; finish then gives
	// null, which no check reads past.
	check bool
	// more is set, in a checked walk, once a member has been read: a
	// comma must come before the next one.
	more bool
}

// iter starts a walk over object or array val, which has already been delimited.
func (v *validator) iter(val value) iter {
	return iter{s: v.s, i: val.off + 1, obj: val.isObject()}
}

// member returns the next member: for objects its key, unescaped, and the offset where the
// value starts. The caller must then call finish or enter and leave.
// ok is false at the end, where it.i is left at the closing bracket.
func (it *iter) member() (key string, start int, ok bool) {
	if it.check {
		return it.checkedMember()
	}
	s := it.s
	i := skipSpace(s, it.i)
	if i < len(s) && s[i] == ',' {
		i = skipSpace(s, i+1)
	}
	it.i = i
	if i >= len(s) || s[i] == '}' || s[i] == ']' {
		return "", 0, false
	}
	if it.obj {
		e, esc := keyEnd(s, i)
		key = s[i+1 : e-1]
		if esc {
			key = unquote(s[i:e])
		}
		i = skipSpace(s, e)
		i = skipSpace(s, i+1) // past the colon
		if i >= len(s) {
			it.i = i
			return "", 0, false
		}
	}
	return key, i, true
}

// checkedMember is member for a walk that checks the syntax: the closing
// bracket must match the opening one, members are separated by exactly one
// comma, and a key is a valid string followed by a colon.
func (it *iter) checkedMember() (key string, start int, ok bool) {
	s := it.s
	closing := byte(']')
	if it.obj {
		closing = '}'
	}
	i := skipSpace(s, it.i)
	if i < len(s) && s[i] == closing {
		it.i = i
		return "", 0, false
	}
	if it.more {
		if i >= len(s) || s[i] != ',' {
			return it.fail()
		}
		i = skipSpace(s, i+1)
	}
	it.more = true
	if it.obj {
		if i >= len(s) || s[i] != '"' {
			return it.fail()
		}
		e, valid := validString(s, i+1)
		if !valid {
			return it.fail()
		}
		key = s[i+1 : e-1]
		if strings.IndexByte(key, '\\') >= 0 {
			key = unquote(s[i:e])
		}
		i = skipSpace(s, e)
		if i >= len(s) || s[i] != ':' {
			return it.fail()
		}
		i = skipSpace(s, i+1)
	}
	if i >= len(s) {
		return it.fail()
	}
	it.i = i
	return key, i, true
}

// fail ends a checked walk at a syntax error.
func (it *iter) fail() (string, int, bool) {
	it.i = len(it.s)
	return "", 0, false
}

// finish delimits the value starting at start and moves past it.
func (it *iter) finish(start int) value {
	if it.check {
		e, ok := validValue(it.s, start)
		if !ok {
			it.i = len(it.s)
			return value{raw: "null", off: start}
		}
		it.i = e
		return value{raw: it.s[start:e], off: start}
	}
	e := valueEnd(it.s, start)
	it.i = e
	return value{raw: it.s[start:e], off: start}
}

// next returns the next member with its value delimited: member followed by finish.
func (it *iter) next() (key string, val value, ok bool) {
	key, start, ok := it.member()
	if !ok {
		return "", value{}, false
	}
	return key, it.finish(start), true
}

// enter starts walking, in place, the object or array value that starts at start.
func (it *iter) enter(start int) iter {
	return iter{s: it.s, i: start + 1, obj: it.s[start] == '{', check: it.check}
}

// leave moves it past the value that child, from enter, has walked to its end.
func (it *iter) leave(child *iter) {
	it.i = min(child.i+1, len(it.s))
}

// last returns the value starting at start that it has just moved past.
func (it *iter) last(start int) value {
	return value{raw: it.s[start:it.i], off: start}
}

// nextKnown advances to the next member whose key is in fields, checks its value and
// returns the index of its field; members with other keys pass through unchecked.
func (v *validator) nextKnown(it *iter, fields []field) (int, value, bool, *ValidationError) {
	for {
		k, x, ok := it.next()
		if !ok {
			return 0, value{}, false, nil
		}
		for i := range fields {
			if fields[i].key == k {
				_, err := v.check(fields[i].param, &fields[i], x)
				return i, x, err == nil, err
			}
		}
	}
}

// checkKnown checks the members of object val whose keys are in fields.
func (v *validator) checkKnown(val value, fields []field) *ValidationError {
	it := v.iter(val)
	for {
		_, _, ok, err := v.nextKnown(&it, fields)
		if err != nil || !ok {
			return err
		}
	}
}

// skipSpace returns the index of the first byte at or after s[i] that is not
// JSON whitespace. Nearly every call stands on a token already, so the test
// first asks whether the byte is above the space, which no whitespace is:
// one comparison instead of four for each of the couple of hundred calls a
// request and its reply make.
func skipSpace(s string, i int) int {
	for i < len(s) && s[i] <= ' ' && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t') {
		i++
	}
	return i
}

// keyEnd is jsonscan.StringEnd for object keys, which are short: IndexByte's set-up costs more
// than the key, and keyEnd also tells whether the key needs unescaping. It tests eight
// bytes at a time for a quote or a backslash, as validString does (the lowest byte
// marked is a true match), and a byte at a time only at the end of s: a plain loop over
// every byte was a visible cost in the keys of every chat body and its reply's usage.
func keyEnd(s string, i int) (end int, esc bool) {
	for j := i + 1; j < len(s); j++ {
		for j+8 <= len(s) {
			t := s[j : j+8]
			w := uint64(t[0]) | uint64(t[1])<<8 | uint64(t[2])<<16 | uint64(t[3])<<24 |
				uint64(t[4])<<32 | uint64(t[5])<<40 | uint64(t[6])<<48 | uint64(t[7])<<56
			quote := w ^ (lowBits * '"')
			backslash := w ^ (lowBits * '\\')
			if m := ((quote-lowBits)&^quote | (backslash-lowBits)&^backslash) & highBits; m != 0 {
				j += bits.TrailingZeros64(m) >> 3
				break
			}
			j += 8
		}
		if j >= len(s) {
			break
		}
		switch s[j] {
		case '"':
			return j + 1, esc
		case '\\':
			esc = true
			j++ // the escaped character, which may be a quote
		}
	}
	return len(s), esc
}

// valueEnd returns the index just past the value token starting at s[i].
func valueEnd(s string, i int) int {
	switch s[i] {
	case '"':
		return jsonscan.StringEnd(s, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(s); j++ {
			switch s[j] {
			case '"':
				j = jsonscan.StringEnd(s, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(s)
	case 't', 'n':
		return min(i+4, len(s))
	case 'f':
		return min(i+5, len(s))
	}
	j := i + 1
	for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.' || s[j] == 'e' || s[j] == 'E' || s[j] == '+' || s[j] == '-') {
		j++
	}
	return j
}
