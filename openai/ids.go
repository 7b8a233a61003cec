package openai

import "unicode/utf8"

// MaxIDBytes bounds request, trace and parent ids a client supplies.
const MaxIDBytes = 128

// ValidID reports whether s, an id a client chose, is 1 to MaxIDBytes
// visible ASCII characters with no spaces, quotes or backslashes, so it is
// safe in logs, headers and JSON without escaping. Every id a client
// chooses goes through it where it enters (X-Request-Id, Compat-Trace-Id
// and Compat-Parent-Id, a body's request_id): a backend names its
// completion or stored response after the request id it is given (vLLM
// does), and that name is kept in usage records and the response-owner map.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// maxBackendIDBytes bounds the id a backend gives its completion or
// response: twice a client's id, room for the prefix a backend adds to
// the request id it was given ("chatcmpl-", "resp_"), and well within what
// every store indexes.
const maxBackendIDBytes = 2 * MaxIDBytes

// BackendID is id, read from a backend's reply, when it is 1 to 256 bytes
// of UTF-8 without control characters, and "" otherwise. Every completion
// and response id read from a reply goes through it where it is read: the
// usage record joins traces by it and the response-owner map keys by it,
// and a store cannot hold (or index) any text. A reply whose id it refuses
// is still served as the backend sent it, since the tokens were spent and
// the id concerns only the gateway's join: the record and the owner map
// then have no id, as for a reply that carries none.
func BackendID(id string) string {
	if len(id) == 0 || len(id) > maxBackendIDBytes || !utf8.ValidString(id) {
		return ""
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < ' ' || c == 0x7f {
			return ""
		}
	}
	return id
}
