package openai

import (
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"
)

// Error is an error answered to the client in the OpenAI shape:
// {"error":{"message","type","param","code"}}, the shape every OpenAI SDK
// parses into its typed exceptions. The HTTP side (proxy) maps it onto a
// response in one place.
type Error struct {
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

func (e *Error) Error() string { return e.Message }

// errorBody is the wire shape of an Error. Param and Code are pointers so
// that an absent value is written as null, as OpenAI does.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// AppendJSON appends e in the OpenAI error shape. Errors are the cold
// path, so encoding/json's exact escaping is worth its allocations.
func (e *Error) AppendJSON(dst []byte) []byte {
	var body errorBody
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

// MaxMessageBytes bounds how much of a text the gateway did not write (an
// upstream error, a tool name) is passed on, so a backend answering with
// an HTML page does not flood the client.
const MaxMessageBytes = 1024

// Clip shortens s to MaxMessageBytes bytes on a rune boundary and
// replaces invalid UTF-8, so the message is always valid JSON text.
func Clip(s string) string {
	if len(s) > MaxMessageBytes {
		s = s[:MaxMessageBytes]
		for len(s) > 0 && !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
