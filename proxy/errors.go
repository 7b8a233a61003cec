package proxy

import (
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/backends"
)

// apiError is an error answered to the client in the OpenAI shape:
// {"error":{"message","type","param","code"}}, the shape every OpenAI SDK
// parses into its typed exceptions.
type apiError struct {
	Status  int
	Type    string
	Message string
	Param   string // empty means null
	Code    string // empty means null
	// RetryAfter, when positive, is sent as a Retry-After header so SDKs
	// back off for that long.
	RetryAfter time.Duration
	// Cause is the underlying failure, for the log line and the usage
	// record only: it can name internal addresses, so clients never see it.
	Cause error
}

func (e *apiError) Error() string { return e.Message }

// openAIErrorBody is the wire shape of an apiError. Param and Code are
// pointers so that an absent value is written as null, as OpenAI does.
type openAIErrorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// appendErrorJSON appends e in the OpenAI error shape. Errors are the cold
// path, so encoding/json's exact escaping is worth its allocations.
func appendErrorJSON(dst []byte, e *apiError) []byte {
	var body openAIErrorBody
	body.Error.Message = e.Message
	body.Error.Type = e.Type
	if e.Param != "" {
		body.Error.Param = &e.Param
	}
	if e.Code != "" {
		body.Error.Code = &e.Code
	}
	b, err := json.Marshal(&body)
	if err != nil {
		// Strings always marshal; keep a valid body regardless.
		return append(dst, `{"error":{"message":"internal error","type":"api_error","param":null,"code":null}}`...)
	}
	return append(dst, b...)
}

// writeError answers the request with e.
func writeError(ctx *fasthttp.RequestCtx, e *apiError) {
	ctx.Response.Header.SetContentType("application/json")
	ctx.SetStatusCode(e.Status)
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.FormatInt(secs, 10))
	}
	ctx.Response.SetBodyRaw(appendErrorJSON(nil, e))
}

// upstreamError maps an error of the upstream round trip to what the
// client is told. This is the one place where upstream failures become
// status codes.
func upstreamError(err error, backend string) *apiError {
	var (
		dial    backends.DialError
		timeout backends.TimeoutError
		netErr  net.Error
	)
	switch {
	case errors.As(err, &dial):
		return &apiError{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_unavailable",
			Message: "The gateway could not connect to backend " + backend + ".", Cause: err}
	// A stream's reads are not classified by the upstream client, so its
	// idle and total timeouts arrive as plain network timeouts.
	case errors.As(err, &timeout), errors.As(err, &netErr) && netErr.Timeout():
		return &apiError{Status: fasthttp.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout",
			Message: "Backend " + backend + " did not answer in time.", Cause: err}
	default:
		return &apiError{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_error",
			Message: "The connection to backend " + backend + " failed: " + err.Error() + "."}
	}
}

// limitError maps a refusal of the limiter to a 429.
func limitError(err error) *apiError {
	var le *accounting.LimitError
	if errors.As(err, &le) {
		return &apiError{Status: fasthttp.StatusTooManyRequests, Type: le.Code, Code: le.Code,
			Message: le.Message, RetryAfter: le.RetryAfter}
	}
	return &apiError{Status: fasthttp.StatusInternalServerError, Type: "api_error", Message: "limit check failed: " + err.Error()}
}
