package proxy

import (
	"encoding/hex"
	"errors"

	"github.com/google/uuid"
)

// maxIDBytes bounds request, trace and parent ids a client supplies.
const maxIDBytes = 128

// validID reports whether a client-supplied id is 1 to 128 visible ASCII
// characters with no spaces, quotes or backslashes, so it is safe in logs,
// headers and JSON without escaping.
func validID(b []byte) bool {
	if len(b) == 0 || len(b) > maxIDBytes {
		return false
	}
	for _, c := range b {
		if c <= ' ' || c > '~' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// newCallID returns a UUIDv7 string, the id format of trace calls: its
// time prefix keeps ids of one trace sortable by start time.
func newCallID() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// traceContext is where a chat completion joins a trace.
type traceContext struct {
	traceID  string
	parentID string
}

var (
	errParentWithoutTrace = errors.New("Compat-Parent-Id requires Compat-Trace-Id")
	errBadTraceID         = errors.New("Compat-Trace-Id must be 1 to 128 visible ASCII characters")
	errBadParentID        = errors.New("Compat-Parent-Id must be 1 to 128 visible ASCII characters")
	errBadTraceparent     = errors.New("traceparent is not a valid W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)")
)

// parseTraceHeaders reads Compat-Trace-Id and Compat-Parent-Id, or else a
// W3C traceparent. Both absent means the call starts a new trace.
func parseTraceHeaders(traceID, parentID, traceparent []byte) (traceContext, error) {
	if len(traceID) > 0 || len(parentID) > 0 {
		if len(traceID) == 0 {
			return traceContext{}, errParentWithoutTrace
		}
		if !validID(traceID) {
			return traceContext{}, errBadTraceID
		}
		if len(parentID) > 0 && !validID(parentID) {
			return traceContext{}, errBadParentID
		}
		return traceContext{traceID: string(traceID), parentID: string(parentID)}, nil
	}
	if len(traceparent) == 0 {
		return traceContext{}, nil
	}
	return parseTraceparent(traceparent)
}

// parseTraceparent parses a W3C traceparent header. The 32-hex trace id is
// written in UUID form, the id format of trace calls; the 16-hex parent
// span id is kept as is.
func parseTraceparent(h []byte) (traceContext, error) {
	// version "-" trace-id "-" parent-id "-" flags
	if len(h) < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-' {
		return traceContext{}, errBadTraceparent
	}
	if len(h) > 55 && (h[0] == '0' && h[1] == '0' || h[55] != '-') {
		// Version 00 has exactly four fields; later versions may append
		// fields after a dash.
		return traceContext{}, errBadTraceparent
	}
	version, trace, parent, flags := h[0:2], h[3:35], h[36:52], h[53:55]
	var tid [16]byte
	var pid [8]byte
	if !isLowerHex(version) || !isLowerHex(trace) || !isLowerHex(parent) || !isLowerHex(flags) ||
		string(version) == "ff" {
		return traceContext{}, errBadTraceparent
	}
	if _, err := hex.Decode(tid[:], trace); err != nil {
		return traceContext{}, errBadTraceparent
	}
	if _, err := hex.Decode(pid[:], parent); err != nil {
		return traceContext{}, errBadTraceparent
	}
	if tid == ([16]byte{}) || pid == ([8]byte{}) {
		// All-zero ids are invalid per the W3C spec.
		return traceContext{}, errBadTraceparent
	}
	return traceContext{traceID: uuid.UUID(tid).String(), parentID: string(parent)}, nil
}

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
