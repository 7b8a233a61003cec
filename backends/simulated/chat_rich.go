package simulated

import (
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// The chat path for requests that need more than the counting text of the hot path (chat.go):
// a seed, stop strings or ids, logprobs, structured outputs or a tool call. Every choice is
// generated up front (generate.go), then written as one reply or streamed event by event.

// chatChoice is one generated choice.
type chatChoice struct {
	out  output
	call *toolCall // nil when the choice answers in text
}

// chatRich serves a chat completion request that is not plain; call is the tool to call, or -1.
func (s *Server) chatRich(ctx *fasthttp.RequestCtx, req *chatRequest, id, created int64, call int) {
	choices := s.chatChoices(req, id, call)
	if !req.stream {
		s.waitFirstToken()
		b := replyBuffer(ctx)
		b = appendChatRich(b, id, created, req, choices)
		setJSON(ctx, b)
		s.completed.Add(1)
		return
	}
	failAfter, breakAfter, ok := s.streamInjections(ctx)
	if !ok {
		return
	}
	startStream(ctx, newEventStream(s, newChatEvents(req, choices, id, created), failAfter, breakAfter), breakAfter)
}

// newChatEvents returns the event source of a rich chat stream of choices.
func newChatEvents(req *chatRequest, choices []chatChoice, id, created int64) *chatEvents {
	src := &chatEvents{
		chunkFrame: chunkFrame{prompt: req.prompt, cached: req.cached},
		choices:    choices, n: len(choices),
	}
	src.head = appendChunkHead(nil, "chatcmpl-", id, "chat.completion.chunk", created, req.modelRaw)
	steps := make([]int, len(choices))
	for i := range choices {
		steps[i] = choices[i].steps()
	}
	src.setSteps(steps)
	// The request body is gone once the handler returns: the events keep only copies.
	src.logprobs, src.top = req.logprobs, req.topLogprobs
	src.includeUsage, src.continuous = req.includeUsage, req.continuous
	return src
}

// chatChoices generates the request's choices.
func (s *Server) chatChoices(req *chatRequest, id int64, call int) []chatChoice {
	limit, limitFinish := req.sampling.limit(req.maxTokens, s.opts.Tokens, req.prompt)
	base := req.sampling.base(req.messages.Raw)
	choices := make([]chatChoice, req.n)
	for i := range choices {
		r := rng{state: mix(base, uint64(i))}
		if call < 0 {
			src := req.sampling.source(&r)
			choices[i].out = generate(&src, limit, limitFinish, &req.sampling.stops)
			continue
		}
		tool := req.tools.tools[call]
		src := documentSource(toolArguments(tool.parameters, &r))
		callLimit := req.maxTokens
		if callLimit == 0 {
			callLimit = max(maxModelLen-req.prompt, 1)
		}
		out := generate(&src, callLimit, "length", &stopRules{})
		if out.finish == "stop" {
			// The arguments are complete: a call. Cut short by max_tokens they would not parse,
			// and a tool parser hands them back as text, which is what a client sees then.
			out.finish = "tool_calls"
			choices[i].call = &toolCall{id: toolCallID(id, i), name: strings.Clone(tool.name)}
		}
		choices[i].out = out
	}
	return choices
}

// steps is the number of streamed events the choice has between its role and finish chunks: one
// per token, and one more that opens a tool call.
func (c *chatChoice) steps() int {
	if c.call != nil {
		return c.out.tokens() + 1
	}
	return c.out.tokens()
}

// appendChunkHead appends `data: {"id":"<prefix><id>","object":…,"created":…,"model":…,"choices":[`.
func appendChunkHead(b []byte, prefix string, id int64, object string, created int64, modelRaw string) []byte {
	b = append(b, `data: {"id":"`...)
	b = append(b, prefix...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `","object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = append(b, modelRaw...)
	return append(b, `,"choices":[`...)
}

// appendChatRich appends the non-streamed reply.
func appendChatRich(b []byte, id, created int64, req *chatRequest, choices []chatChoice) []byte {
	b = append(b, `{"id":"chatcmpl-`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `","object":"chat.completion","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = append(b, req.modelRaw...)
	b = append(b, `,"choices":[`...)
	completion := 0
	for i := range choices {
		c := &choices[i]
		completion += c.out.tokens()
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"message":{"role":"assistant","content":`...)
		if c.call != nil {
			b = append(b, "null,"...)
			b = appendToolCalls(b, c.call, c.out.text)
		} else {
			b = appendJSONString(b, bytesconv.String(c.out.text))
		}
		b = append(b, `,"refusal":null},"logprobs":`...)
		b = appendChatLogprobs(b, &c.out, 0, c.out.tokens(), req.logprobs, req.topLogprobs)
		b = append(b, `,"finish_reason":"`...)
		b = append(b, c.out.finish...)
		b = append(b, `","stop_reason":`...)
		b = append(b, c.out.stopReason...)
		b = append(b, '}')
	}
	b = append(b, `],"usage":`...)
	b = appendUsage(b, req.prompt, req.cached, completion)
	return append(b, '}')
}

// chatEvents renders a rich chat stream in vLLM's order: a role chunk per choice; then, step by
// step, a chunk per choice that has something at that step (the opening of its tool call, or a
// token of text or arguments); a finish chunk per choice; the usage chunk when asked for.
type chatEvents struct {
	chunkFrame
	req     *chatRequest
	choices []chatChoice
	n       int

	logprobs bool
	top      int
}

func (ce *chatEvents) next(b []byte) ([]byte, eventKind, bool) {
	switch ce.phase {
	case phaseRole:
		b = ce.start(b, ce.choice)
		b = append(b, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
		b = ce.end(b)
		if ce.choice++; ce.choice == ce.n {
			ce.phase, ce.choice = phaseTokens, 0
		}
		return b, eventHead, true
	case phaseTokens:
		if i, kind, ok := ce.nextToken(); ok {
			return ce.token(b, i, &ce.choices[i]), kind, true
		}
		return ce.next(b)
	case phaseFinish:
		c := &ce.choices[ce.choice]
		b = ce.start(b, ce.choice)
		b = append(b, `,"delta":{},"logprobs":null,"finish_reason":"`...)
		b = append(b, c.out.finish...)
		b = append(b, `","stop_reason":`...)
		b = append(b, c.out.stopReason...)
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

// token renders choice i's event at the current step.
func (ce *chatEvents) token(b []byte, i int, c *chatChoice) []byte {
	k := ce.step
	b = ce.start(b, i)
	b = append(b, ',')
	if c.call != nil {
		if k == 0 {
			b = appendToolCallHead(b, c.call)
			b = append(b, `,"logprobs":null,"finish_reason":null}]`...)
			return ce.end(b)
		}
		k--
		b = appendToolCallFragment(b, c.out.piece(k))
	} else {
		b = append(b, `"delta":{"content":`...)
		b = appendJSONString(b, bytesconv.String(c.out.piece(k)))
		b = append(b, '}')
	}
	ce.emitted++
	b = append(b, `,"logprobs":`...)
	if ce.logprobs && len(c.out.piece(k)) > 0 {
		b = appendChatLogprobs(b, &c.out, k, k+1, true, ce.top)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":null}]`...)
	return ce.end(b)
}
