package backends

import (
	"errors"
	"net"

	"github.com/valyala/fasthttp"
)

// The upstream errors below are small typed wrappers, so that the proxy can
// map each kind to one status code in one place.

// DialError means no connection to the backend could be made.
type DialError struct{ error }

// TimeoutError means a phase of the upstream request ran out of time.
type TimeoutError struct {
	error
	// BeforeFirstByte is true when no response had begun, so the request
	// may be retried elsewhere without risk of a duplicated reply.
	BeforeFirstByte bool
}

// ConnError means the connection broke after it was made (reset, closed
// before any response byte, malformed response).
type ConnError struct{ error }

// TooLargeError means the upstream reply body exceeded
// server.max_response_bytes; the connection was closed unread.
type TooLargeError struct{ error }

// AbortedError means the request was aborted (its client went away) and
// its upstream connection closed.
type AbortedError struct{ error }

// errAborted is the cause of an AbortedError.
var errAborted = errors.New("request aborted: the client went away")

// Unwrap returns the underlying error.
func (e DialError) Unwrap() error { return e.error }

// Unwrap returns the underlying error.
func (e TooLargeError) Unwrap() error { return e.error }

// Unwrap returns the underlying error.
func (e AbortedError) Unwrap() error { return e.error }

// Unwrap returns the underlying error.
func (e TimeoutError) Unwrap() error { return e.error }

// Unwrap returns the underlying error.
func (e ConnError) Unwrap() error { return e.error }

// classify wraps a fasthttp client error in the typed error it belongs to.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ne net.Error
	switch {
	case errors.Is(err, errAborted):
		return AbortedError{err}
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return TooLargeError{err}
	case errors.Is(err, fasthttp.ErrDialTimeout), errors.Is(err, fasthttp.ErrNoFreeConns):
		return DialError{err}
	case errors.Is(err, fasthttp.ErrTimeout):
		// fasthttp turns a timeout while awaiting the response headers
		// (and only there) into this sentinel.
		return TimeoutError{error: err, BeforeFirstByte: true}
	case errors.As(err, &ne) && ne.Timeout():
		return TimeoutError{error: err}
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return DialError{err}
	}
	return ConnError{err}
}

// errUnhealthyStatus is a health probe answered with a non-2xx status.
var errUnhealthyStatus = errors.New("health probe answered a non-2xx status")
