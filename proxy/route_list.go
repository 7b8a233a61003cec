package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/route"
	"github.com/tollgate-dev/tollgate/openai"
)

// Routes are the proxy's rows of the binary's table, with their handlers.
// Chat completions come first: they are most of the traffic, and the
// router's scan stops at the first match.
func (s *Server) Routes() []route.Route {
	chat := withoutID(s.serveEndpoint(&chatEndpoint))
	rows := []route.Route{
		{Method: fasthttp.MethodPost, Pattern: "/v1/chat/completions", Handler: chat},
		{Method: fasthttp.MethodPost, Pattern: "/v1/chat/completions/", Handler: chat},
		{Method: fasthttp.MethodPost, Pattern: "/v1/completions", Handler: withoutID(s.serveEndpoint(&completionsEndpoint))},
		{Method: fasthttp.MethodPost, Pattern: "/v1/embeddings", Handler: withoutID(s.serveEndpoint(&embeddingsEndpoint))},
		{Method: fasthttp.MethodPost, Pattern: "/v1/responses", Handler: withoutID(s.serveEndpoint(&responsesEndpoint))},
		{Method: fasthttp.MethodPost, Pattern: "/v1/messages", Handler: withoutID(s.serveEndpoint(&messagesEndpoint))},
		{Method: fasthttp.MethodPost, Pattern: "/v1/messages/count_tokens", Handler: withoutID(s.serveEndpoint(&countTokensEndpoint))},
		{Method: fasthttp.MethodGet, Pattern: "/v1/responses/{id}", Handler: withID(s.serveStoredResponse(""))},
		{Method: fasthttp.MethodDelete, Pattern: "/v1/responses/{id}", Handler: withID(s.serveStoredResponse(""))},
		{Method: fasthttp.MethodPost, Pattern: "/v1/responses/{id}/cancel", Handler: withID(s.serveStoredResponse("/cancel"))},
		{Method: fasthttp.MethodGet, Pattern: "/v1/responses/{id}/input_items", Handler: withID(s.serveStoredResponse("/input_items"))},
		{Method: fasthttp.MethodGet, Pattern: "/v1/models", Handler: func(ctx *fasthttp.RequestCtx, _ route.Params) { s.serveModels(ctx) }},
		{Method: fasthttp.MethodGet, Pattern: "/v1/models/{id...}", Handler: withID(s.serveModel)},
		{Pattern: "/healthz", Handler: func(ctx *fasthttp.RequestCtx, _ route.Params) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"status":"ok"}`)
		}},
		{Pattern: "/readyz", Handler: func(ctx *fasthttp.RequestCtx, _ route.Params) { s.serveReady(ctx) }},
	}
	for i := range rows {
		rows[i].Module = "proxy"
	}
	return rows
}

// withID adapts a handler of a pattern's one "{id}" (or "{id...}").
func withID(h func(*fasthttp.RequestCtx, []byte)) route.Handler {
	return func(ctx *fasthttp.RequestCtx, p route.Params) { h(ctx, p.Get("id")) }
}

// withoutID adapts a handler of a pattern without parameters.
func withoutID(h func(*fasthttp.RequestCtx, []byte)) route.Handler {
	return func(ctx *fasthttp.RequestCtx, _ route.Params) { h(ctx, nil) }
}

// NotFound answers a path no route serves in the shape its client parses:
// Anthropic's under /v1/messages, else OpenAI's (unknown_url under /v1/).
func NotFound(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	if bytes.HasPrefix(path, []byte("/v1/")) {
		refuse(ctx, &openai.Error{Status: fasthttp.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "Unknown request URL: " + string(ctx.Method()) + " " + openai.Clip(string(path)) + "."})
		return
	}
	writeError(ctx, &openai.Error{Status: fasthttp.StatusNotFound, Type: "invalid_request_error",
		Message: "Unknown path " + openai.Clip(string(path)) + "."})
}

// MethodNotAllowed answers a path served with other methods, named by
// allow, in the shape its client parses.
func MethodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set(fasthttp.HeaderAllow, allow)
	refuse(ctx, &openai.Error{Status: fasthttp.StatusMethodNotAllowed, Type: "invalid_request_error",
		Message: "Method " + string(ctx.Method()) + " is not allowed on " + string(ctx.Path()) + "; use " + allow + "."})
}

// refuse answers e in Anthropic's shape for a path of the Messages API,
// whose SDKs parse nothing else, and in OpenAI's for every other path.
func refuse(ctx *fasthttp.RequestCtx, e *openai.Error) {
	if bytes.HasPrefix(ctx.Path(), []byte("/v1/messages")) {
		writeMessagesError(ctx, e, string(ctx.Response.Header.Peek(headerRequestID)))
		return
	}
	writeError(ctx, e)
}
