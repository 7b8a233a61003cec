package simulated

import (
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// Legacy text completions (POST /v1/completions), as vLLM serves them. The prompt is a string,
// an array of strings, an array of token ids, or an array of such arrays; each prompt gets n
// choices (index prompt*n + i). A string prompt counts its whitespace-separated words as tokens,
// a token-id prompt its ids. The text is generated as for chat (generate.go), with the same
// seed, stop, max_tokens and structured-output rules; echo puts the prompt before it, and
// logprobs (an integer) adds the text_completion logprobs object with that many alternatives.
// best_of (at least n) is accepted and changes nothing; suffix is refused as vLLM refuses it.

// maxCompletionChoices bounds prompts × n, which are all generated in memory.
const maxCompletionChoices = 1024

// completionPrompt is one prompt: its text (token ids are decoded) and its token count.
type completionPrompt struct {
	text   string
	tokens int
}

type completionRequest struct {
	modelRaw  string
	prompts   []completionPrompt
	n         int
	maxTokens int
	echo      bool
	logprobs  int // -1 when not asked for
	streamRequest
	sampling sampling
}

// completions serves one text completion request.
func (s *Server) completions(ctx *fasthttp.RequestCtx) {
	if !s.admit(ctx) {
		return
	}
	var req completionRequest
	if e := s.parseCompletion(ctx.PostBody(), &req); e.status != 0 {
		s.refuse(ctx, e)
		return
	}
	prompt := 0
	for _, p := range req.prompts {
		prompt += p.tokens
		tokens := req.maxTokens
		if tokens == 0 {
			tokens = s.opts.Tokens
		}
		if need := p.tokens + tokens; need > maxModelLen {
			writeError(ctx, fasthttp.StatusBadRequest, shapeNested, apiError{
				typ: "BadRequestError",
				msg: "This model's maximum context length is " + strconv.Itoa(maxModelLen) +
					" tokens. However, you requested " + strconv.Itoa(need) + " tokens (" +
					strconv.Itoa(need-tokens) + " in the prompt, " + strconv.Itoa(tokens) +
					" in the completion). Please reduce the length of the prompt or completion.",
			})
			s.completed.Add(1)
			return
		}
	}
	outs := make([]output, 0, len(req.prompts)*req.n)
	for _, p := range req.prompts {
		limit, limitFinish := req.sampling.limit(req.maxTokens, s.opts.Tokens, p.tokens)
		base := req.sampling.base(p.text)
		for i := 0; i < req.n; i++ {
			r := rng{state: mix(base, uint64(i))}
			src := req.sampling.source(&r)
			outs = append(outs, generate(&src, limit, limitFinish, &req.sampling.stops))
		}
	}
	id := s.seq.Add(1)
	created := time.Now().Unix()
	if !req.stream {
		s.waitFirstToken()
		b := replyBuffer(ctx)
		b = appendTextCompletion(b, id, created, &req, outs, prompt)
		setJSON(ctx, b)
		s.completed.Add(1)
		return
	}
	failAfter, breakAfter, ok := s.streamInjections(ctx)
	if !ok {
		return
	}
	src := &completionEvents{
		chunkFrame: chunkFrame{
			head:         appendChunkHead(nil, "cmpl-", id, "text_completion", created, req.modelRaw),
			includeUsage: req.includeUsage, continuous: req.continuous, prompt: prompt,
		},
		outs: outs, n: req.n, echo: req.echo, logprobs: req.logprobs,
	}
	for _, p := range req.prompts {
		// Copies: the text may point into the body, which is gone once the handler returns.
		src.echoes = append(src.echoes, strings.Clone(p.text))
	}
	steps := make([]int, len(outs))
	for i := range outs {
		steps[i] = src.stepsOf(i)
	}
	src.setSteps(steps)
	startStream(ctx, newEventStream(s, src, failAfter, breakAfter), breakAfter)
}

func (s *Server) parseCompletion(body []byte, r *completionRequest) (e apiError) {
	js := bytesconv.String(body)
	if !gjson.Valid(js) {
		return badRequest("", "The request body is not valid JSON.")
	}
	root := gjson.Parse(js)
	if !root.IsObject() {
		return badRequest("", "The request body must be a JSON object.")
	}
	r.n, r.logprobs = 1, -1
	s.vary(&r.sampling)
	var model gjson.Result
	havePrompt, bestOf := false, 0
	root.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "model":
			model = v
		case "prompt":
			havePrompt = true
			var ok bool
			if r.prompts, ok = parsePrompts(v); !ok {
				e = badRequest("prompt", "prompt must be a string, an array of strings, an array of token ids, or an array of arrays of token ids, and not empty.")
				return false
			}
		case "max_tokens", "n", "best_of":
			if v.Type == gjson.Null {
				break
			}
			limit := maxModelLen + 1
			if key.Str != "max_tokens" {
				limit = maxChoices
			}
			n, ok := positiveInt(v, limit)
			if !ok {
				e = badRequest(key.Str, key.Str+" must be an integer from 1 to "+strconv.Itoa(limit)+".")
				return false
			}
			switch key.Str {
			case "max_tokens":
				r.maxTokens = n
			case "n":
				r.n = n
			case "best_of":
				bestOf = n
			}
		case "echo":
			r.echo = v.Type == gjson.True
		case "suffix":
			// vLLM declares suffix but serves no fill-in-the-middle, and says so.
			if v.Type != gjson.Null {
				e = badRequest("suffix", "suffix is not currently supported")
				return false
			}
		case "logprobs":
			if v.Type == gjson.Null {
				break
			}
			var ok bool
			if r.logprobs, ok = logprobCount(v); !ok {
				e = badRequest("logprobs", "logprobs must be an integer from 0 to "+strconv.Itoa(maxTopLogprobs)+".")
				return false
			}
		case "stream":
			r.stream = v.Type == gjson.True
		case "stream_options":
			if v.IsObject() {
				r.setStreamOptions(v)
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
	if !havePrompt {
		return badRequest("prompt", "Field required: prompt.")
	}
	if e := r.checkStreamOptions(); e.status != 0 {
		return e
	}
	if bestOf > 0 && bestOf < r.n {
		return badRequest("best_of", "best_of must be greater than or equal to n, got n="+strconv.Itoa(r.n)+" and best_of="+strconv.Itoa(bestOf)+".")
	}
	if len(r.prompts)*r.n > maxCompletionChoices {
		return badRequest("n", "prompts × n must be at most "+strconv.Itoa(maxCompletionChoices)+".")
	}
	return s.checkModel(model, &r.modelRaw)
}

// checkModel validates the request's model and sets raw to the JSON echoed as the reply's model.
func (s *Server) checkModel(model gjson.Result, raw *string) apiError {
	switch model.Type {
	case gjson.Null:
		*raw = s.defaultModelRaw
	case gjson.String:
		if !s.serves(model.Str) {
			return apiError{
				status: fasthttp.StatusNotFound, typ: "NotFoundError", param: "model",
				msg: "The model `" + model.Str + "` does not exist.",
			}
		}
		*raw = string(appendJSONString(nil, model.Str))
	default:
		return badRequest("model", "model must be a string.")
	}
	return apiError{}
}

// parsePrompts reads a prompt in any of its four forms (also the input of embeddings).
func parsePrompts(v gjson.Result) ([]completionPrompt, bool) {
	if v.Type == gjson.String {
		return []completionPrompt{{text: v.Str, tokens: countWords(v.Str)}}, true
	}
	if !v.IsArray() {
		return nil, false
	}
	items := v.Array()
	if len(items) == 0 {
		return nil, false
	}
	if items[0].Type == gjson.Number {
		p, ok := tokenPrompt(items)
		return []completionPrompt{p}, ok
	}
	out := make([]completionPrompt, 0, len(items))
	for _, it := range items {
		switch {
		case it.Type == gjson.String:
			out = append(out, completionPrompt{text: it.Str, tokens: countWords(it.Str)})
		case it.IsArray() && len(it.Array()) > 0:
			p, ok := tokenPrompt(it.Array())
			if !ok {
				return nil, false
			}
			out = append(out, p)
		default:
			return nil, false
		}
	}
	return out, true
}

// tokenPrompt decodes a list of token ids.
func tokenPrompt(ids []gjson.Result) (completionPrompt, bool) {
	var b []byte
	for _, id := range ids {
		if id.Type != gjson.Number || id.Num != float64(int64(id.Num)) || id.Num < 0 {
			return completionPrompt{}, false
		}
		b = tokenText(b, id.Int())
	}
	return completionPrompt{text: string(b), tokens: len(ids)}, true
}

// appendTextCompletion appends the non-streamed reply.
func appendTextCompletion(b []byte, id, created int64, req *completionRequest, outs []output, prompt int) []byte {
	b = append(b, `{"id":"cmpl-`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `","object":"text_completion","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = append(b, req.modelRaw...)
	b = append(b, `,"choices":[`...)
	completion := 0
	for i := range outs {
		o := &outs[i]
		completion += o.tokens()
		if i > 0 {
			b = append(b, ',')
		}
		echo := ""
		if req.echo {
			echo = req.prompts[i/req.n].text
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"text":`...)
		b = appendJSONString(b, echo+bytesconv.String(o.text))
		b = append(b, `,"logprobs":`...)
		if req.logprobs >= 0 {
			b = appendCompletionLogprobs(b, o, 0, o.tokens(), req.logprobs, len(echo))
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"finish_reason":"`...)
		b = append(b, o.finish...)
		b = append(b, `","stop_reason":`...)
		b = append(b, o.stopReason...)
		b = append(b, `,"prompt_logprobs":null}`...)
	}
	b = append(b, `],"usage":`...)
	b = appendUsage(b, prompt, 0, completion)
	return append(b, '}')
}

// completionEvents renders a streamed text completion: step by step a chunk per choice (the
// echoed prompt first when echo is set, then one per token), then a finish chunk per choice,
// then the usage chunk when asked for.
type completionEvents struct {
	chunkFrame
	outs     []output
	echoes   []string
	n        int
	echo     bool
	logprobs int
}

// stepsOf is the number of generation steps of choice i: one per token, and the echoed prompt
// first.
func (ce *completionEvents) stepsOf(i int) int {
	if ce.echo {
		return ce.outs[i].tokens() + 1
	}
	return ce.outs[i].tokens()
}

func (ce *completionEvents) next(b []byte) ([]byte, eventKind, bool) {
	if ce.phase == phaseRole {
		ce.phase = phaseTokens
	}
	switch ce.phase {
	case phaseTokens:
		if i, kind, ok := ce.nextToken(); ok {
			return ce.token(b, i), kind, true
		}
		return ce.next(b)
	case phaseFinish:
		o := &ce.outs[ce.choice]
		b = ce.start(b, ce.choice)
		b = append(b, `,"text":"","logprobs":null,"finish_reason":"`...)
		b = append(b, o.finish...)
		b = append(b, `","stop_reason":`...)
		b = append(b, o.stopReason...)
		b = append(b, "}]"...)
		b = ce.end(b)
		ce.finished()
		return b, eventTail, true
	case phaseUsage:
		ce.phase = phaseEOF
		return ce.usage(b), eventTail, true
	}
	return b, 0, false
}

func (ce *completionEvents) token(b []byte, i int) []byte {
	o := &ce.outs[i]
	k := ce.step
	b = ce.start(b, i)
	if ce.echo {
		if k == 0 {
			b = append(b, `,"text":`...)
			b = appendJSONString(b, ce.echoes[i/ce.n])
			b = append(b, `,"logprobs":null,"finish_reason":null,"stop_reason":null}]`...)
			return ce.end(b)
		}
		k--
	}
	ce.emitted++
	b = append(b, `,"text":`...)
	b = appendJSONString(b, bytesconv.String(o.piece(k)))
	b = append(b, `,"logprobs":`...)
	if ce.logprobs >= 0 && len(o.piece(k)) > 0 {
		offset := 0
		if ce.echo {
			offset = len(ce.echoes[i/ce.n])
		}
		b = appendCompletionLogprobs(b, o, k, k+1, ce.logprobs, offset)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":null,"stop_reason":null}]`...)
	return ce.end(b)
}
