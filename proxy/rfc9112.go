package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// refuseFraming answers 400 and closes the connection when the request's
// header block is one RFC 9112 says a server must refuse, and reports
// whether it did. fasthttp 1.70 accepts both, silently:
//
//   - Content-Length together with Transfer-Encoding (§6.1: "ought to be
//     handled as an error"; a server MUST close the connection after
//     responding). fasthttp lets chunked win and forgets the length, so
//     bytes a front proxy that trusted the length took for the body would
//     run here as a second request on the connection: request smuggling.
//   - Whitespace between a field name and its colon (§5.1: "MUST reject
//     ... with a response status code of 400"). fasthttp trims it.
//
// Both checks read the raw header block fasthttp keeps for the request,
// which copies nothing: the parsed headers no longer show either fault. The
// Content-Length search runs only for a chunked request (ContentLength()
// is -1), which no ordinary client sends to an inference API; the colon
// check is one IndexByte per header line.
func refuseFraming(ctx *fasthttp.RequestCtx) bool {
	raw := ctx.Request.Header.RawHeaders()
	msg := ""
	switch {
	case spaceBeforeColon(raw):
		msg = "A header field name is followed by whitespace before its colon; RFC 9112 forbids it."
	case ctx.Request.Header.ContentLength() == -1 && hasField(raw, strContentLength):
		msg = "The request has both Content-Length and Transfer-Encoding; RFC 9112 forbids it."
	default:
		return false
	}
	ctx.SetConnectionClose()
	writeError(ctx, &apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_http", Message: msg})
	return true
}

var strContentLength = []byte("Content-Length")

// spaceBeforeColon reports whether a line of the raw header block has a
// space or tab right before its first colon. Continuation lines (obsolete
// line folding, which fasthttp refuses anyway) start with whitespace and
// are skipped.
func spaceBeforeColon(raw []byte) bool {
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) == 0 || line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if c := bytes.IndexByte(line, ':'); c > 0 && (line[c-1] == ' ' || line[c-1] == '\t') {
			return true
		}
	}
	return false
}

// hasField reports whether the raw header block has a field named name
// (any case).
func hasField(raw, name []byte) bool {
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if c := bytes.IndexByte(line, ':'); c >= 0 && bytes.EqualFold(bytes.TrimRight(line[:c], " \t"), name) {
			return true
		}
	}
	return false
}
