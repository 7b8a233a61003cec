package proxy

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/anthropic"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/openai"
	"github.com/tollgate-dev/tollgate/translate"
)

// messagesAPI is what an endpoint of Anthropic's Messages API changes on
// the request path every endpoint routed by model shares (serve, forward,
// attempt, the stream body, settle): the body is validated by package
// anthropic, errors are in Anthropic's shape, and a backend either serves
// the API itself (the body goes upstream with the model spliced in) or
// is sent chat completions that package translate makes from the request
// and turns back. Nothing else differs: limits, budgets, retries and the
// usage record are chat's.
type messagesAPI struct {
	// count is POST /v1/messages/count_tokens: no generation; a chat
	// backend is asked for one token to learn the prompt's count, and
	// that request is charged as any other (see messagesReply).
	count bool
}

// The endpoints of the Messages API. They are read-only.
var (
	messagesEndpoint = endpoint{name: "messages", path: "/v1/messages", config: "messages",
		upstream: backends.EndpointMessages, generates: true, messages: &messagesAPI{}}
	countTokensEndpoint = endpoint{name: "messages.count_tokens", path: "/v1/messages/count_tokens", config: "messages",
		upstream: backends.EndpointMessages, messages: &messagesAPI{count: true}}
)

// messagesLimits are the bounds of srv a Messages API body obeys: chat's.
func messagesLimits(srv *config.Server) anthropic.Limits {
	return anthropic.Limits{MaxDepth: srv.MaxJSONDepth, MaxMessages: srv.MaxMessages, MaxStopSequences: srv.MaxStopStrings}
}

// validateMessages checks a Messages API body into c.msg, and copies into
// c.req the facts the shared path reads (model, max_tokens, stream, sizes).
// A Messages reply carries its usage itself, so the path asks the backend
// for none on the client's behalf: IncludeUsage and ContinuousUsage say so.
func (c *exchange) validateMessages(body []byte, srv *config.Server) *openai.Error {
	m := c.msg
	var e *anthropic.Error
	if c.ep.messages.count {
		e = anthropic.ValidateCountTokens(body, m, messagesLimits(srv))
	} else {
		e = anthropic.Validate(body, m, messagesLimits(srv))
	}
	if e != nil {
		return fromAnthropic(e)
	}
	r := c.req
	r.Model, r.ModelStart, r.ModelEnd = m.Model, m.ModelStart, m.ModelEnd
	r.MaxTokens, r.Stream, r.Messages, r.PromptBytes = m.MaxTokens, m.Stream, m.Messages, m.PromptBytes
	r.PromptStart, r.PromptEnd, r.SystemStart, r.SystemEnd = m.MessagesStart, m.MessagesEnd, m.SystemStart, m.SystemEnd
	r.IncludeUsage, r.ContinuousUsage = true, true
	return nil
}

// checkMessagesRoute refuses, before any backend, a max_tokens above the
// model's models[].max_output_tokens.
func (c *exchange) checkMessagesRoute() *openai.Error {
	if e := c.msg.CheckMaxTokens(c.route.MaxOutputTokens); e != nil {
		return fromAnthropic(e)
	}
	return nil
}

// fromAnthropic carries an Anthropic error on the shared path, which
// renders it back in Anthropic's shape (see writeMessagesError).
func fromAnthropic(e *anthropic.Error) *openai.Error {
	return &openai.Error{Status: e.Type.Status(), Type: e.Type.String(), Param: e.Param, Message: e.Message}
}

// messagesErrorType is the Anthropic error type of a status the gateway
// answers: Anthropic's own mapping, with every other 4xx (a wrong
// Content-Type, a bad Compat-Project) an invalid_request_error.
func messagesErrorType(status int) anthropic.ErrorType {
	t := anthropic.TypeForStatus(status)
	if t == anthropic.APIError && status >= 400 && status < 500 {
		return anthropic.InvalidRequest
	}
	return t
}

// writeMessagesError answers e in Anthropic's shape, with its status
// (503 stays 503: Anthropic's SDKs retry it as they retry 529).
func writeMessagesError(ctx *fasthttp.RequestCtx, e *openai.Error, requestID string) {
	ctx.Response.Header.SetContentType("application/json")
	ctx.SetStatusCode(e.Status)
	setRetryAfter(ctx, e.RetryAfter)
	ae := anthropic.Error{Type: messagesErrorType(e.Status), Message: e.Message}
	_, body := anthropic.Reply(ctx.Response.SwapBody(nil)[:0], &ae, requestID)
	ctx.Response.SetBodyRaw(body)
}

// messagesUpstream appends to dst the body sent to b, a backend of route,
// and returns the backend endpoint it goes to. A backend serving the API
// natively gets the client's body with the upstream model id spliced in;
// any other gets the chat completions request translation makes (for
// count_tokens, one asking for a single token, whose prompt count is the
// answer). It sets c.native for the reply's handling. A request
// translated for a model without tool calling may not ask for a tool
// (anthropic.Request.ToolChoiceRefusal).
func (c *exchange) messagesUpstream(dst, body []byte, route *backends.Route, b *backends.Backend) ([]byte, backends.Endpoint, *openai.Error) {
	c.native = route.MessagesNative(b)
	if c.native {
		up := backends.EndpointMessages
		if c.ep.messages.count {
			up = backends.EndpointMessagesCount
		}
		return openai.AppendUpstreamBody(dst, body, c.req, route.UpstreamJSON, false), up, nil
	}
	// The model's tool calling rule is chat's (serve applies it to chat
	// requests); a backend serving the API natively decides for itself.
	if e := c.msg.ToolChoiceRefusal(route.Name, route.ToolCalling); e != nil {
		return dst, backends.EndpointChat, fromAnthropic(e)
	}
	if c.ep.messages.count {
		c.msg.MaxTokens = 1
	}
	out, e := translate.ChatRequest(dst, body, c.msg, translate.ChatOptions{Model: route.Upstream,
		MaxOutputTokens: route.MaxOutputTokens, Reasoning: chatReasoning(route.Reasoning),
		ContinuousUsage: b.ContinuousUsage()})
	if e != nil {
		return dst, backends.EndpointChat, fromAnthropic(e)
	}
	return out, backends.EndpointChat, nil
}

// chatReasoning is how translation asks a backend to think, for a model
// whose models[].reasoning is mode.
func chatReasoning(mode string) translate.Reasoning {
	switch mode {
	case config.ReasoningEffort:
		return translate.ReasoningEffort
	case config.ReasoningTemplate:
		return translate.ReasoningTemplate
	}
	return translate.ReasoningNone
}

// shownModel is the model id a reply names (see replyModel).
func (c *exchange) shownModel(served *backends.Route) string {
	if served != c.route && c.route.FallbackKeepsModel {
		return c.route.Name
	}
	return served.Name
}

// messagesReply turns a backend's 2xx non-streamed reply, rbody, into the
// client's body, appended to dst, and fills c's usage and completion id.
// A native reply passes with the model renamed (replyModel, when not nil);
// a chat reply is translated. A native count_tokens answer charges
// nothing (the backend only tokenized the prompt); a translated one is
// charged the tokens of the one-token chat request that counted them.
func (c *exchange) messagesReply(dst, rbody []byte, served *backends.Route, backend string, replyModel []byte) ([]byte, *openai.Error) {
	if !anthropic.ValidReply(rbody, c.gen.cfg.Server.MaxJSONDepth) {
		return dst, &openai.Error{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_error",
			Message: "Backend " + backend + " answered 200 with a body that is not a JSON object."}
	}
	var (
		u          openai.UsageCounts
		cacheWrite int64
	)
	switch {
	case c.native && c.ep.messages.count:
		return append(dst, rbody...), nil
	case c.native:
		root := gjson.Parse(bytesconv.String(rbody))
		var au anthropic.Usage
		if err := au.Set(root.Get("usage"), false); err != nil {
			return dst, invalidUsage(backend, err)
		}
		u, cacheWrite = messagesUsage(au), au.CacheCreation
		// The id enters here, bounded by the rule every backend id obeys.
		c.rec.CompletionID = strings.Clone(openai.BackendID(root.Get("id").Str))
		c.rec.FinishReasons = anthropic.FinishReasons(root)
		if replyModel != nil {
			dst = openai.RewriteModel(dst, rbody, replyModel)
		} else {
			dst = append(dst, rbody...)
		}
	default:
		reply, ok := openai.ScanReply(rbody, c.gen.cfg.Server.MaxJSONDepth, false)
		if !ok {
			return dst, &openai.Error{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_error",
				Message: "Backend " + backend + " answered 200 with a body that is not a JSON chat completion."}
		}
		if err := u.SetChatReply(reply.Usage); err != nil {
			return dst, invalidUsage(backend, err)
		}
		if c.ep.messages.count {
			// The backend ran the prompt and generated a token for it:
			// recorded and charged as the chat request it was.
			dst = append(dst, `{"input_tokens":`...)
			dst = append(strconv.AppendInt(dst, u.Input, 10), '}')
			break
		}
		var ae *anthropic.Error
		if dst, _, ae = translate.MessagesReply(dst, rbody, c.shownModel(served)); ae != nil {
			return dst, &openai.Error{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_error",
				Message: "Backend " + backend + ": " + ae.Message}
		}
		c.rec.CompletionID = translate.MessageID(reply.ID)
		c.rec.FinishReasons = reply.Finish
	}
	recordUsage(&c.rec, &u, u.Output)
	c.rec.CacheWriteTokens = cacheWrite
	return dst, nil
}

// answerMessages answers the client with a backend's 2xx non-streamed
// reply to a Messages API request (see messagesReply), in the client
// response's own buffer, and settles the exchange.
func (s *Server) answerMessages(ctx *fasthttp.RequestCtx, c *exchange, served *backends.Route, b *backends.Backend,
	resp *fasthttp.Response, replyModel []byte) {
	rbody := resp.Body()
	out, e := c.messagesReply(ctx.Response.SwapBody(nil)[:0], rbody, served, b.Name, replyModel)
	if e == nil && c.payloads {
		c.rec.Input = append([]byte(nil), ctx.PostBody()...)
		c.rec.Output = append([]byte(nil), out...)
	}
	ctx.Response.SwapBody(out)
	status := resp.StatusCode()
	fasthttp.ReleaseResponse(resp)
	c.tenancy.Release(b)
	if e != nil {
		b.ReportFailure()
		s.finish(ctx, c, e)
		return
	}
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(jsonContentType)
	s.finish(ctx, c, nil)
}
