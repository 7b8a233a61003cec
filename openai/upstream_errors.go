package openai

import (
	"bytes"
	"net/http"
	"regexp"
	"strconv"

	"github.com/tidwall/gjson"
)

// NormalizeUpstreamError turns a non-2xx upstream reply of backend into the
// error the client gets. Upstreams answer in several shapes: vLLM ≥ 0.10.1 nests
// {"error":{"message","type","param","code":400}}, older vLLM is flat
// {"object":"error","message",...}, vLLM's --api-key middleware answers
// {"error":"Unauthorized"}, and proxies in between answer plain text.
//
// What the client is told depends on whom the error is about:
//
//   - 400, 413 and 422 are about the client's request (a prompt over the
//     context window, a bad parameter): the client needs the backend's
//     words to fix it, so they keep their status and message, clipped,
//     made valid UTF-8, and with anything that looks like a network
//     address replaced.
//   - Everything else is about the backend or the gateway's configuration,
//     and its text can name internal hosts, file paths or tracebacks: the
//     gateway describes it ("backend vllm-a answered 500 with an error"),
//     and the backend's own text goes only to the log and the usage
//     record's error (through Cause), which only admins read. 429, 503 and
//     504 keep their status, which clients act on; 401, 403 (the backend
//     refusing the gateway's credentials) and 404 (the configured model
//     unknown upstream) are the gateway's fault and become 502, as does
//     any 5xx; other 4xx keep their status.
//
// Either way the text has the gateway's secrets replaced first, by
// redactSecrets (which knows them by value), then anything shaped like a
// credential (RedactCredentials).
func NormalizeUpstreamError(status int, body []byte, backend string, redactSecrets func(string) string) *Error {
	// vLLM's own error types (BadRequestError) say no more than the status;
	// the client gets the OpenAI vocabulary chosen below instead.
	msg, param := parseUpstreamError(body)
	msg = RedactCredentials(redactSecrets(msg))
	if msg == "" {
		msg = statusText(status)
	}
	e := &Error{Cause: &upstreamReply{status: status, message: msg}}
	answered := "Backend " + backend + " answered " + strconv.Itoa(status)
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		e.Status, e.Type, e.Param = status, "invalid_request_error", param
		e.Message = scrubAddresses(msg)
		e.Cause = nil // the message is the whole detail
	case http.StatusTooManyRequests:
		e.Status, e.Type, e.Code = status, "rate_limit_exceeded", "rate_limit_exceeded"
		e.Message = "Backend " + backend + " is at its rate limit; retry shortly."
	case http.StatusUnauthorized, http.StatusForbidden:
		e.Status, e.Type, e.Code = http.StatusBadGateway, "api_error", "upstream_auth_failed"
		e.Message = "Backend " + backend + " refused the gateway's credentials (" + strconv.Itoa(status) + ")."
	case http.StatusNotFound:
		e.Status, e.Type, e.Code = http.StatusBadGateway, "api_error", "upstream_model_not_found"
		e.Message = "Backend " + backend + " does not serve the configured model (404)."
	case http.StatusServiceUnavailable:
		e.Status, e.Type, e.Code = status, "api_error", "upstream_error"
		e.Message = answered + ": it is unavailable; retry shortly."
	case http.StatusGatewayTimeout:
		e.Status, e.Type, e.Code = status, "api_error", "upstream_timeout"
		e.Message = answered + ": a server in front of it timed out."
	default:
		if status >= 400 && status < 500 {
			e.Status, e.Type = status, "invalid_request_error"
			e.Message = answered + ", refusing the request."
		} else {
			e.Status, e.Type, e.Code = http.StatusBadGateway, "api_error", "upstream_error"
			e.Message = answered + " with an error."
		}
	}
	return e
}

// upstreamReply is the backend's own account of an error reply, kept for
// the log and the usage record.
type upstreamReply struct {
	status  int
	message string
}

func (r *upstreamReply) Error() string {
	return "backend answered " + strconv.Itoa(r.status) + ": " + r.message
}

// networkAddress matches what would tell a client about the inside of the
// deployment: URLs, IPv4 addresses (with a port or not), bracketed IPv6
// addresses and host:port pairs.
var networkAddress = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"'<>]+|\[[0-9a-fA-F:.]+\](:\d+)?|\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b|\b[a-zA-Z0-9][a-zA-Z0-9.-]*:\d{2,5}\b`)

// scrubAddresses replaces network addresses in a message passed on to the
// client. It runs on error replies only.
func scrubAddresses(msg string) string {
	return networkAddress.ReplaceAllLiteralString(msg, "[address]")
}

// parseUpstreamError extracts message and param from any known upstream
// error shape; for a body in no known shape the message is its text.
func parseUpstreamError(body []byte) (msg, param string) {
	body = bytes.TrimSpace(body)
	if gjson.ValidBytes(body) {
		r := gjson.ParseBytes(body)
		if e := r.Get("error"); e.Exists() {
			if e.Type == gjson.String {
				return Clip(e.String()), ""
			}
			if e.IsObject() {
				return Clip(e.Get("message").String()), e.Get("param").String()
			}
		}
		if m := r.Get("message"); m.Exists() {
			return Clip(m.String()), r.Get("param").String()
		}
		if d := r.Get("detail"); d.Exists() {
			return Clip(d.String()), ""
		}
	}
	return Clip(string(body)), ""
}

// statusText is the status's reason phrase, for an error reply that came
// with no text of its own.
func statusText(status int) string {
	if t := http.StatusText(status); t != "" {
		return t
	}
	return "Unknown Status Code"
}

// credential is a bearer token or an OpenAI-style key written bare.
var credential = regexp.MustCompile(`(?i)(bearer\s+|basic\s+)\S+|sk-[A-Za-z0-9_\-]{4,}`)

// RedactCredentials replaces what looks like a credential in s: a backend's
// error message can echo the request's Authorization header, which holds
// the gateway's upstream key.
func RedactCredentials(s string) string {
	return credential.ReplaceAllString(s, "${1}[redacted]")
}
