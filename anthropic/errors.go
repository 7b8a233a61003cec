// Package anthropic is the wire format of Anthropic's Messages API
// (POST /v1/messages and /v1/messages/count_tokens): what a request body may
// hold, the facts a gateway needs from it, and errors in Anthropic's shape.
// It reads bytes and reports facts (a native stream's accounting too, see
// EventProcessor); it knows nothing of HTTP servers, so the
// proxy and the simulated backend share it. Translation to and from OpenAI's
// chat completions lives in package translate.
package anthropic

import (
	"strconv"

	"github.com/tollgate-dev/tollgate/internal/jsonstr"
)

// ErrorType is the "type" of an Anthropic error, which fixes its status.
type ErrorType uint8

// The error types of Anthropic's API, each with the status it is answered
// with (see Status).
const (
	InvalidRequest  ErrorType = iota // invalid_request_error, 400
	Authentication                   // authentication_error, 401
	Permission                       // permission_error, 403
	NotFound                         // not_found_error, 404
	RequestTooLarge                  // request_too_large, 413
	RateLimit                        // rate_limit_error, 429
	APIError                         // api_error, 500
	Overloaded                       // overloaded_error, 529
)

var errorTypes = [...]struct {
	name   string
	status int
}{
	InvalidRequest:  {"invalid_request_error", 400},
	Authentication:  {"authentication_error", 401},
	Permission:      {"permission_error", 403},
	NotFound:        {"not_found_error", 404},
	RequestTooLarge: {"request_too_large", 413},
	RateLimit:       {"rate_limit_error", 429},
	APIError:        {"api_error", 500},
	Overloaded:      {"overloaded_error", 529},
}

// String is the type as the wire writes it.
func (t ErrorType) String() string {
	if int(t) < len(errorTypes) {
		return errorTypes[t].name
	}
	return errorTypes[APIError].name
}

// Status is the HTTP status Anthropic answers an error of this type with.
func (t ErrorType) Status() int {
	if int(t) < len(errorTypes) {
		return errorTypes[t].status
	}
	return errorTypes[APIError].status
}

// TypeForStatus is the error type an upstream status maps to, for errors
// that come from a backend rather than from the gateway: a 400-range status
// keeps its meaning, 503 and 529 are overload, anything else is api_error.
func TypeForStatus(status int) ErrorType {
	switch status {
	case 400, 422:
		return InvalidRequest
	case 401:
		return Authentication
	case 403:
		return Permission
	case 404:
		return NotFound
	case 413:
		return RequestTooLarge
	case 429:
		return RateLimit
	case 503, 529:
		return Overloaded
	}
	return APIError
}

// Error is an error to answer a Messages API client with.
type Error struct {
	Type ErrorType
	// Param is the field at fault ("max_tokens", "messages.2.content.0.type"),
	// empty for whole-body problems. Anthropic's error body has no field for it,
	// so it is for logs and tests; Message names the field too.
	Param string
	// Message is a sentence a user can act on.
	Message string
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

// Invalid is an invalid_request_error about param.
func Invalid(param, message string) *Error {
	return &Error{Type: InvalidRequest, Param: param, Message: message}
}

// Reply is the status and body of e in Anthropic's shape:
// {"type":"error","error":{"type":…,"message":…},"request_id":…}, with
// request_id null when requestID is empty. The body is appended to dst.
func Reply(dst []byte, e *Error, requestID string) (status int, body []byte) {
	dst = append(dst, `{"type":"error","error":{"type":"`...)
	dst = append(dst, e.Type.String()...)
	dst = append(dst, `","message":`...)
	dst = jsonstr.Append(dst, e.Message)
	dst = append(dst, `},"request_id":`...)
	if requestID == "" {
		dst = append(dst, "null"...)
	} else {
		dst = jsonstr.Append(dst, requestID)
	}
	return e.Type.Status(), append(dst, '}')
}

// AppendErrorEvent appends e as the in-band error event of a stream already
// under way: "event: error" and the error body without request_id, as
// Anthropic sends it when a stream fails after its 200.
func AppendErrorEvent(dst []byte, e *Error) []byte {
	dst = append(dst, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\""...)
	dst = append(dst, e.Type.String()...)
	dst = append(dst, `","message":`...)
	dst = jsonstr.Append(dst, e.Message)
	return append(dst, "}}\n\n"...)
}

// itoa is strconv.Itoa, named for the messages below.
func itoa(n int) string { return strconv.Itoa(n) }
