package proxy

import (
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/openai"
)

// writeError answers the request with e.
func writeError(ctx *fasthttp.RequestCtx, e *openai.Error) {
	ctx.Response.Header.SetContentType("application/json")
	ctx.SetStatusCode(e.Status)
	setRetryAfter(ctx, e.RetryAfter)
	ctx.Response.SetBodyRaw(e.AppendJSON(nil))
}

// setRetryAfter sets Retry-After to d in whole seconds, rounded up; zero
// sets none.
func setRetryAfter(ctx *fasthttp.RequestCtx, d time.Duration) {
	if d > 0 {
		secs := int64((d + time.Second - 1) / time.Second)
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.FormatInt(secs, 10))
	}
}

// upstreamError maps an error of the upstream round trip to what the
// client is told. This is the one place where upstream failures become
// status codes. The message is the gateway's: the error itself can name
// internal addresses, so it is the Cause, for the log and the record.
func upstreamError(err error, backend string) *openai.Error {
	var (
		dial     backends.DialError
		timeout  backends.TimeoutError
		tooLarge backends.TooLargeError
		aborted  backends.AbortedError
		netErr   net.Error
	)
	e := &openai.Error{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_error", Cause: err}
	switch {
	case errors.As(err, &aborted):
		// Nobody reads this answer; the status is nginx's for a client
		// that closed its request, so the record says what happened.
		e.Status, e.Code = statusClientClosed, "client_closed"
		e.Message = "The client closed the connection before backend " + backend + " answered."
	case errors.As(err, &dial):
		e.Code = "upstream_unavailable"
		e.Message = "The gateway could not connect to backend " + backend + "."
	case errors.As(err, &tooLarge):
		e.Message = "Backend " + backend + " sent a reply larger than the gateway's limit (server.max_response_bytes)."
	case errors.As(err, &timeout) && timeout.BeforeFirstByte:
		e.Status, e.Code = fasthttp.StatusGatewayTimeout, "upstream_timeout"
		e.Message = "Backend " + backend + " timed out before the first byte of its reply."
	// A stream's reads are not classified by the upstream client, so its
	// idle and total timeouts arrive as plain network timeouts.
	case errors.As(err, &timeout), errors.As(err, &netErr) && netErr.Timeout():
		e.Status, e.Code = fasthttp.StatusGatewayTimeout, "upstream_timeout"
		e.Message = "Backend " + backend + " timed out in the middle of its reply."
	default:
		e.Message = "The connection to backend " + backend + " failed before its reply was complete."
	}
	return e
}

// invalidUsage is the 502 for a reply whose usage block was refused; err,
// the detail, goes to the log and the record.
func invalidUsage(backend string, err error) *openai.Error {
	return &openai.Error{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_invalid_usage",
		Message: invalidUsageMessage(backend), Cause: err}
}

// invalidUsageMessage is what the client is told when a backend reported
// token counts that are not counts.
func invalidUsageMessage(backend string) string {
	return "Backend " + backend + " reported token usage the gateway cannot accept; the reply was discarded."
}

// statusClientClosed is the status recorded for a request whose client
// left before it was answered (nginx's 499).
const statusClientClosed = 499

// limitError maps a refusal of the limiter to a 429.
func limitError(err error) *openai.Error {
	var le *accounting.LimitError
	if errors.As(err, &le) {
		return &openai.Error{Status: fasthttp.StatusTooManyRequests, Type: le.Code, Code: le.Code,
			Message: le.Message, RetryAfter: le.RetryAfter}
	}
	return &openai.Error{Status: fasthttp.StatusInternalServerError, Type: "api_error", Message: "limit check failed: " + err.Error()}
}
