package simulated

import (
	"io"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// chat serves one chat completion request.
func (s *Server) chat(ctx *fasthttp.RequestCtx) {
	if !s.admit(ctx) {
		return
	}

	var req chatRequest
	if e := s.parseChat(ctx.PostBody(), &req); e.status != 0 {
		s.refuse(ctx, e)
		return
	}
	tokens, finish := req.maxTokens, "length"
	if tokens == 0 {
		// With no limit from the request the simulated model "decides" to stop on its own.
		tokens, finish = s.opts.Tokens, "stop"
	}
	if e, long := contextTooLong(req.prompt, tokens); long {
		writeError(ctx, fasthttp.StatusBadRequest, shapeNested, e)
		s.completed.Add(1)
		return
	}

	if s.prefix != nil {
		req.cached = s.prefix.lookup(gjson.GetBytes(ctx.PostBody(), "messages"))
	}
	id := s.seq.Add(1)
	created := time.Now().Unix()
	call := req.tools.chooseForMessages(req.messages)
	if call >= 0 || req.logprobs || req.sampling.rich() {
		s.chatRich(ctx, &req, id, created, call)
		return
	}
	failAfter, breakAfter := -1, -1
	if req.stream {
		var ok bool
		if failAfter, breakAfter, ok = s.streamInjections(ctx); !ok {
			return
		}
	}
	// The engine admits the request once it has nothing left to refuse, since it may wait in
	// the queue; every path from here finishes the sequence.
	q := s.startSequence(ctx.PostBody(), &req)
	if !req.stream {
		s.decodeWhole(q, req.n*tokens)
		b := replyBuffer(ctx)
		b = appendCompletion(b, id, created, req.modelRaw, req.n, tokens, finish, req.prompt, req.cached)
		setJSON(ctx, b)
		s.completed.Add(1)
		return
	}
	st := s.streams.Get().(*stream)
	st.start(s, id, created, &req, tokens, finish, failAfter, breakAfter)
	st.seq = q
	startStream(ctx, st, breakAfter)
}

// contextTooLong reports vLLM's 400 for a prompt and completion beyond the context length.
func contextTooLong(prompt, tokens int) (apiError, bool) {
	if prompt+tokens <= maxModelLen {
		return apiError{}, false
	}
	return apiError{
		status: fasthttp.StatusBadRequest, typ: "BadRequestError",
		msg: "This model's maximum context length is " + strconv.Itoa(maxModelLen) +
			" tokens. However, you requested " + strconv.Itoa(prompt+tokens) + " tokens (" +
			strconv.Itoa(prompt) + " in the messages, " + strconv.Itoa(tokens) +
			" in the completion). Please reduce the length of the messages or completion.",
	}, true
}

// streamInjections reads X-Mock-Fail-After and X-Mock-Break-After (-1 when absent). When one is
// malformed it answers 400, counts the request completed, and reports false.
func (s *Server) streamInjections(ctx *fasthttp.RequestCtx) (failAfter, breakAfter int, ok bool) {
	failAfter, ok1 := countHeader(ctx, "X-Mock-Fail-After")
	breakAfter, ok2 := countHeader(ctx, "X-Mock-Break-After")
	if !ok1 || !ok2 {
		writeError(ctx, fasthttp.StatusBadRequest, shapeNested, apiError{
			typ: "BadRequestError", msg: "X-Mock-Fail-After and X-Mock-Break-After must be non-negative integers",
		})
		s.completed.Add(1)
		return 0, 0, false
	}
	return failAfter, breakAfter, true
}

// startStream makes body the response's body stream.
func startStream(ctx *fasthttp.RequestCtx, body io.Reader, breakAfter int) {
	ctx.SetContentType(contentTypeSSE)
	// Headers go out at once, as a real server sends them before the first token; the time to
	// first token is then spent waiting for the first event, which is what clients measure.
	ctx.Response.ImmediateHeaderFlush = true
	if breakAfter >= 0 {
		ctx.SetConnectionClose()
	}
	// fasthttp reads the stream from the connection's own goroutine after the handler returns,
	// writing each Read as one chunk and flushing it; see stream.
	ctx.Response.SetBodyStream(body, -1)
}

// countHeader parses an optional non-negative integer header; -1 means absent.
func countHeader(ctx *fasthttp.RequestCtx, name string) (int, bool) {
	v := ctx.Request.Header.Peek(name)
	if len(v) == 0 {
		return -1, true
	}
	n, err := fasthttp.ParseUint(v)
	if err != nil {
		return 0, false
	}
	return n, true
}

// chatRequest is what the server needs from a chat completion request. The strings point into the
// request body and are valid only while the handler runs.
type chatRequest struct {
	model     string // decoded model id; "" when the request names none
	modelRaw  string // the JSON literal echoed as the reply's "model"
	prompt    int
	cached    int // prompt tokens served from the prefix cache
	maxTokens int // from max_completion_tokens, else max_tokens; 0 when neither is set
	n         int
	streamRequest

	messages    gjson.Result
	sampling    sampling
	logprobs    bool
	topLogprobs int
	tools       toolRequest
}

// streamRequest is what a chat or text completion request asks of its stream.
type streamRequest struct {
	stream        bool
	streamOptions bool // stream_options is present and not null
	includeUsage  bool
	continuous    bool
}

// setStreamOptions reads stream_options, an object.
func (r *streamRequest) setStreamOptions(v gjson.Result) {
	r.streamOptions = true
	r.includeUsage = v.Get("include_usage").Type == gjson.True
	r.continuous = v.Get("continuous_usage_stats").Type == gjson.True
}

// checkStreamOptions refuses stream_options on a request that is not streamed, as vLLM does;
// a gateway that adds them to such a request should find out here rather than in production.
func (r *streamRequest) checkStreamOptions() apiError {
	if r.streamOptions && !r.stream {
		return badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
	}
	return apiError{}
}

// parseChat reads the fields the server uses in one pass over the top-level object with gjson
// (no encoding/json, no allocation for plain strings) and validates them minimally: the body must
// be a JSON object with a messages array, the model must be served, and the few fields that shape
// the reply must have usable values.
func (s *Server) parseChat(body []byte, r *chatRequest) (e apiError) {
	js := bytesconv.String(body)
	if !gjson.Valid(js) {
		return badRequest("", "The request body is not valid JSON.")
	}
	root := gjson.Parse(js)
	if !root.IsObject() {
		return badRequest("", "The request body must be a JSON object.")
	}
	r.n = 1
	s.vary(&r.sampling)
	haveMessages := false
	maxTokens, maxCompletionTokens := 0, 0
	var tools, toolChoice gjson.Result
	root.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "tools":
			tools = v
		case "tool_choice":
			toolChoice = v
		case "logprobs":
			switch v.Type {
			case gjson.Null, gjson.False:
			case gjson.True:
				r.logprobs = true
			default:
				e = badRequest("logprobs", "logprobs must be a boolean.")
				return false
			}
		case "top_logprobs":
			if v.Type == gjson.Null {
				break
			}
			var ok bool
			if r.topLogprobs, ok = logprobCount(v); !ok {
				e = badRequest("top_logprobs", "top_logprobs must be an integer from 0 to "+strconv.Itoa(maxTopLogprobs)+".")
				return false
			}
		case "messages":
			if !v.IsArray() {
				e = badRequest("messages", "messages must be an array of message objects.")
				return false
			}
			n, ok := promptTokens(v)
			if !ok {
				e = badRequest("messages", "Each message must be a JSON object.")
				return false
			}
			haveMessages, r.prompt, r.messages = true, n, v
		case "model":
			switch v.Type {
			case gjson.Null:
			case gjson.String:
				r.model, r.modelRaw = v.Str, v.Raw
			default:
				e = badRequest("model", "model must be a string.")
				return false
			}
		case "max_tokens", "max_completion_tokens":
			if v.Type == gjson.Null {
				break
			}
			n, ok := positiveInt(v, maxModelLen+1)
			if !ok {
				e = badRequest(key.Str, key.Str+" must be an integer greater than or equal to 1.")
				return false
			}
			if key.Str == "max_tokens" {
				maxTokens = n
			} else {
				maxCompletionTokens = n
			}
		case "n":
			if v.Type == gjson.Null {
				break
			}
			n, ok := positiveInt(v, maxChoices)
			if !ok {
				e = badRequest("n", "n must be an integer from 1 to "+strconv.Itoa(maxChoices)+".")
				return false
			}
			r.n = n
		case "stream":
			switch v.Type {
			case gjson.Null, gjson.False:
				r.stream = false
			case gjson.True:
				r.stream = true
			default:
				e = badRequest("stream", "stream must be a boolean.")
				return false
			}
		case "stream_options":
			switch {
			case v.Type == gjson.Null:
				r.streamOptions = false
			case v.IsObject():
				r.setStreamOptions(v)
			default:
				e = badRequest("stream_options", "stream_options must be an object.")
				return false
			}
		default:
			if ok, fe := r.sampling.field(key.Str, v); ok && fe.status != 0 {
				e = fe
				return false
			}
		}
		return true
	})
	if e.status != 0 {
		return e
	}
	if !haveMessages {
		return badRequest("messages", "Field required: messages.")
	}
	if e := r.checkStreamOptions(); e.status != 0 {
		return e
	}
	if r.topLogprobs > 0 && !r.logprobs {
		return badRequest("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.")
	}
	if tools.Exists() || toolChoice.Exists() {
		var te apiError
		if r.tools, te = parseTools(tools, toolChoice, false); te.status != 0 {
			return te
		}
	}
	r.maxTokens = maxTokens
	if maxCompletionTokens > 0 {
		// max_tokens is deprecated in favour of max_completion_tokens, which wins when both are set.
		r.maxTokens = maxCompletionTokens
	}
	if r.modelRaw == "" {
		r.modelRaw = s.defaultModelRaw
	} else if !s.serves(r.model) {
		return apiError{
			status: fasthttp.StatusNotFound, typ: "NotFoundError", param: "model",
			msg: "The model `" + r.model + "` does not exist.",
		}
	}
	return apiError{}
}

// serves reports whether model is one of Options.Models, or true when that list is empty. A
// linear scan beats a map for the handful of models a test configures.
func (s *Server) serves(model string) bool {
	if len(s.opts.Models) == 0 || (s.engine != nil && s.engine.serves(model)) {
		return true
	}
	for _, m := range s.opts.Models {
		if m == model {
			return true
		}
	}
	return false
}

// logprobCount returns v as an int when it is an integral JSON number from 0 to
// maxTopLogprobs: how many alternatives a reply lists per token.
func logprobCount(v gjson.Result) (int, bool) {
	if v.Type != gjson.Number || v.Num != float64(int(v.Num)) || v.Num < 0 || v.Num > maxTopLogprobs {
		return 0, false
	}
	return int(v.Num), true
}

// positiveInt returns v as an int when it is an integral JSON number from 1 to limit.
func positiveInt(v gjson.Result, limit int) (int, bool) {
	if v.Type != gjson.Number {
		return 0, false
	}
	n := v.Int()
	if float64(n) != v.Num || n < 1 || n > int64(limit) {
		return 0, false
	}
	return int(n), true
}

// promptTokens is the deterministic prompt length: for every message, 4 tokens of overhead plus
// the number of whitespace-separated words (as strings.Fields splits them) in its content, where
// content is either a string or an array of parts whose "text" parts count. Other fields (role,
// name, tool calls, images) count nothing. It reports false when a message is not an object.
func promptTokens(messages gjson.Result) (int, bool) {
	total, ok := 0, true
	messages.ForEach(func(_, m gjson.Result) bool {
		if !m.IsObject() {
			ok = false
			return false
		}
		total += tokensPerMessage
		c := m.Get("content")
		switch {
		case c.Type == gjson.String:
			total += countWords(c.Str)
		case c.IsArray():
			c.ForEach(func(_, part gjson.Result) bool {
				if part.Get("type").Str == "text" {
					total += countWords(part.Get("text").Str)
				}
				return true
			})
		}
		return true
	})
	return total, ok
}

// countWords counts runs of non-space characters, like len(strings.Fields(s)) without allocating.
func countWords(s string) int {
	n, inWord := 0, false
	for i := 0; i < len(s); {
		var space bool
		if c := s[i]; c < utf8.RuneSelf {
			space = asciiSpace[c]
			i++
		} else {
			r, size := utf8.DecodeRuneInString(s[i:])
			space = unicode.IsSpace(r)
			i += size
		}
		if space {
			inWord = false
		} else if !inWord {
			inWord = true
			n++
		}
	}
	return n
}

var asciiSpace = [utf8.RuneSelf]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

// appendCompletion appends the non-streaming reply: n identical choices of tokens tokens.
func appendCompletion(b []byte, id, created int64, modelRaw string, n, tokens int, finish string, prompt, cached int) []byte {
	b = append(b, `{"id":"chatcmpl-`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `","object":"chat.completion","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = append(b, modelRaw...)
	b = append(b, `,"choices":[`...)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"message":{"role":"assistant","content":"`...)
		for t := range tokens {
			b = appendToken(b, t)
		}
		b = append(b, `","refusal":null},"logprobs":null,"finish_reason":"`...)
		b = append(b, finish...)
		b = append(b, `","stop_reason":null}`...)
	}
	b = append(b, `],"usage":`...)
	b = appendUsage(b, prompt, cached, n*tokens)
	return append(b, '}')
}

// appendToken appends the text of completion token i, "tok<i> ".
func appendToken(b []byte, i int) []byte {
	b = append(b, "tok"...)
	b = strconv.AppendInt(b, int64(i), 10)
	return append(b, ' ')
}
