package proxy

import (
	"bytes"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// maxUpstreamMessage bounds how much of an upstream error text is passed
// on, so a backend answering with an HTML page does not flood the client.
const maxUpstreamMessage = 1024

// normalizeUpstreamError turns a non-2xx upstream reply into the error the
// client gets. Upstreams answer in several shapes: vLLM ≥ 0.10.1 nests
// {"error":{"message","type","param","code":400}}, older vLLM is flat
// {"object":"error","message",...}, vLLM's --api-key middleware answers
// {"error":"Unauthorized"}, and proxies in between answer plain text.
//
// The status is chosen for the client: a request the backend refused as
// invalid (400, 413, 422) or rate-limited (429) keeps its status, because it
// is about the client's request. A backend refusing the gateway's own
// credentials or not knowing the configured upstream model (401, 403, 404)
// is the gateway's configuration fault, so the client sees 502 rather than
// an authentication error about a key it did not send. Backend failures
// (5xx) become 502, except 503 and 504, which keep their meaning.
func normalizeUpstreamError(status int, body []byte, backend string) *apiError {
	// vLLM's own error types (BadRequestError) say no more than the status;
	// the client gets the OpenAI vocabulary chosen below instead.
	msg, param := parseUpstreamError(body)
	if msg == "" {
		msg = fasthttp.StatusMessage(status)
	}
	e := &apiError{Message: msg, Param: param}
	switch status {
	case fasthttp.StatusBadRequest, fasthttp.StatusRequestEntityTooLarge, fasthttp.StatusUnprocessableEntity:
		e.Status, e.Type = status, "invalid_request_error"
	case fasthttp.StatusTooManyRequests:
		e.Status, e.Type, e.Code = status, "rate_limit_exceeded", "rate_limit_exceeded"
	case fasthttp.StatusUnauthorized, fasthttp.StatusForbidden:
		e.Status, e.Type, e.Code = fasthttp.StatusBadGateway, "api_error", "upstream_auth_failed"
		e.Message = "Backend " + backend + " refused the gateway's credentials: " + msg
	case fasthttp.StatusNotFound:
		e.Status, e.Type, e.Code = fasthttp.StatusBadGateway, "api_error", "upstream_model_not_found"
		e.Message = "Backend " + backend + " does not serve the configured model: " + msg
	case fasthttp.StatusServiceUnavailable, fasthttp.StatusGatewayTimeout:
		e.Status, e.Type, e.Code = status, "api_error", "upstream_error"
	default:
		if status >= 400 && status < 500 {
			e.Status, e.Type = status, "invalid_request_error"
		} else {
			e.Status, e.Type, e.Code = fasthttp.StatusBadGateway, "api_error", "upstream_error"
		}
	}
	return e
}

// parseUpstreamError extracts message and param from any known upstream
// error shape; for a body in no known shape the message is its text.
func parseUpstreamError(body []byte) (msg, param string) {
	body = bytes.TrimSpace(body)
	if gjson.ValidBytes(body) {
		r := gjson.ParseBytes(body)
		if e := r.Get("error"); e.Exists() {
			if e.Type == gjson.String {
				return clip(e.String()), ""
			}
			if e.IsObject() {
				return clip(e.Get("message").String()), e.Get("param").String()
			}
		}
		if m := r.Get("message"); m.Exists() {
			return clip(m.String()), r.Get("param").String()
		}
		if d := r.Get("detail"); d.Exists() {
			return clip(d.String()), ""
		}
	}
	return clip(string(body)), ""
}

// clip shortens s to maxUpstreamMessage bytes on a rune boundary and
// replaces invalid UTF-8, so the message is always valid JSON text.
func clip(s string) string {
	if len(s) > maxUpstreamMessage {
		s = s[:maxUpstreamMessage]
		for len(s) > 0 && !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
