package proxy

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/openai"
)

// headerAnthropicVersion marks a request from an Anthropic client, which
// reads GET /v1/models in Anthropic's list shape and errors in its shape.
const headerAnthropicVersion = "Anthropic-Version"

// fromAnthropicClient reports whether the request carries
// anthropic-version, whatever its value.
func fromAnthropicClient(ctx *fasthttp.RequestCtx) bool {
	return len(ctx.Request.Header.Peek(headerAnthropicVersion)) > 0
}

// anthropicModel is one model in Anthropic's shape.
type anthropicModel struct {
	Type        string `json:"type"`
	ID          string `json:"id"`
	DisplayName string `json:"display_name"`
	CreatedAt   string `json:"created_at"`
}

func anthropicModelOf(rt *backends.Route, created time.Time) anthropicModel {
	return anthropicModel{Type: "model", ID: rt.Name, DisplayName: rt.Name, CreatedAt: created.UTC().Format(time.RFC3339)}
}

// buildAnthropicModelList renders GET /v1/models in Anthropic's list shape
// once per configuration: every model on one page.
func buildAnthropicModelList(reg *backends.Registry, created time.Time) []byte {
	list := struct {
		Data    []anthropicModel `json:"data"`
		HasMore bool             `json:"has_more"`
		FirstID *string          `json:"first_id"`
		LastID  *string          `json:"last_id"`
	}{Data: []anthropicModel{}}
	for _, rt := range reg.Routes() {
		list.Data = append(list.Data, anthropicModelOf(rt, created))
	}
	if n := len(list.Data); n > 0 {
		list.FirstID, list.LastID = &list.Data[0].ID, &list.Data[n-1].ID
	}
	b, _ := json.Marshal(list) // plain strings always marshal
	return b
}

// writeErrorTo answers e in Anthropic's shape when anthropicShape, else in
// OpenAI's.
func writeErrorTo(ctx *fasthttp.RequestCtx, e *openai.Error, anthropicShape bool) {
	if anthropicShape {
		writeMessagesError(ctx, e, string(ctx.Response.Header.Peek(headerRequestID)))
		return
	}
	writeError(ctx, e)
}

// isMessagesPath reports whether path is the Messages API's, whose
// clients read errors only in Anthropic's shape.
func isMessagesPath(path []byte) bool {
	return bytes.HasPrefix(path, []byte("/v1/messages"))
}
