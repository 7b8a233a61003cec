package proxy

import (
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/openai"
)

// endpoint describes one endpoint routed by model: how its body is
// validated, where it goes upstream and how its reply is accounted. Chat
// completions, completions, embeddings and the Responses API share one
// path through the proxy (serve, forward, attempt, the stream body), which
// reads what differs from here.
type endpoint struct {
	// name is accounting.Record.Endpoint and the metrics' endpoint label.
	name string
	// path is the client-facing path, for error messages.
	path string
	// config is the endpoint's name in models[].endpoints.
	config   string
	upstream backends.Endpoint
	// validate checks body against the endpoint's rules, within the
	// request bounds (nesting depth, stop strings, logit_bias entries,
	// input items), and fills req.
	validate func(body []byte, req *openai.Request, lim openai.BodyLimits) *openai.ValidationError
	// generates says the endpoint generates tokens, so the most it may
	// generate is reserved against budgets; embeddings only count input.
	generates bool
	// responses marks the Responses API: usage counted as input and
	// output tokens, stream events named by type with no [DONE], and each
	// response remembered with the backend that made it.
	responses bool
	// messages, when not nil, marks an endpoint of Anthropic's Messages
	// API, which validate does not serve (see messagesAPI).
	messages *messagesAPI
}

// The endpoints routed by model. They are read-only.
var (
	chatEndpoint = endpoint{name: "chat.completions", path: "/v1/chat/completions", config: "chat",
		upstream: backends.EndpointChat, validate: openai.ValidateChatLimits, generates: true}
	completionsEndpoint = endpoint{name: "completions", path: "/v1/completions", config: "completions",
		upstream: backends.EndpointCompletions, validate: openai.ValidateCompletions, generates: true}
	embeddingsEndpoint = endpoint{name: "embeddings", path: "/v1/embeddings", config: "embeddings",
		upstream: backends.EndpointEmbeddings, validate: openai.ValidateEmbeddings}
	responsesEndpoint = endpoint{name: "responses", path: "/v1/responses", config: "responses",
		upstream: backends.EndpointResponses, validate: openai.ValidateResponses, generates: true, responses: true}
)

// bodyLimits are the bounds of srv that the fields shared with chat obey,
// on every endpoint that has them.
func bodyLimits(srv *config.Server) openai.BodyLimits {
	return openai.BodyLimits{MaxDepth: srv.MaxJSONDepth, MaxStopStrings: srv.MaxStopStrings, MaxLogitBias: srv.MaxLogitBias,
		MaxInputItems: srv.MaxMessages}
}

// serveEndpoint is the routing table's handler for ep.
func (s *Server) serveEndpoint(ep *endpoint) func(*fasthttp.RequestCtx, []byte) {
	return func(ctx *fasthttp.RequestCtx, _ []byte) { s.serve(ctx, ep) }
}

// writeError answers e in the shape of the exchange's endpoint: OpenAI's,
// or Anthropic's for the Messages API.
func (c *exchange) writeError(ctx *fasthttp.RequestCtx, e *openai.Error) {
	if c.ep.messages != nil {
		writeMessagesError(ctx, e, c.rec.RequestID)
		return
	}
	writeError(ctx, e)
}

// endpointNotServed is the 400 for a model that is configured without
// the endpoint requested.
func endpointNotServed(ep *endpoint, model string) *openai.Error {
	return &openai.Error{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: "model", Code: "unsupported_endpoint",
		Message: "Model " + model + " does not serve " + ep.path + " (its endpoints are limited in the gateway's configuration)."}
}
