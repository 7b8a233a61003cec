package openai

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
