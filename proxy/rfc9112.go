package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/openai"
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
//     With "Transfer-Encoding: identity" it does the opposite, which a
//     front proxy may not.
//   - Transfer-Encoding more than once (§6.1: a server that receives a
//     transfer coding after chunked MUST respond 400 and close, as the
//     framing cannot be determined). fasthttp takes "chunked" from the
//     first line and drops "identity" on a second, where a front proxy
//     may frame the body by the last line or by Content-Length.
//   - Whitespace in a field name, or between it and its colon (§5.1: "MUST
//     reject ... with a response status code of 400"). fasthttp trims it,
//     or keeps it inside the name.
//
// The check reads the raw header block fasthttp keeps for the request, in
// one pass and copying nothing: the parsed headers no longer show either
// fault. The handler calls it first, so a refused request reaches nothing.
func refuseFraming(ctx *fasthttp.RequestCtx) bool {
	f := scanFraming(ctx.Request.Header.RawHeaders())
	msg := ""
	switch {
	case f.spaceInName:
		msg = "A header field name contains whitespace or is followed by whitespace before its colon; RFC 9112 forbids it."
	case f.contentLength && f.transferEncodings > 0:
		msg = "The request has both Content-Length and Transfer-Encoding; RFC 9112 forbids it."
	case f.transferEncodings > 1:
		msg = "The request has more than one Transfer-Encoding field; RFC 9112 forbids a coding after chunked."
	default:
		return false
	}
	ctx.SetConnectionClose()
	writeError(ctx, &openai.Error{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_http", Message: msg})
	return true
}

// RefuseBadFraming wraps a handler of another fasthttp server of the
// gateway (admin_listen) with the same RFC 9112 checks.
func RefuseBadFraming(next fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if refuseFraming(ctx) {
			return
		}
		next(ctx)
	}
}

var (
	strContentLength    = []byte("Content-Length")
	strTransferEncoding = []byte("Transfer-Encoding")
)

// framing is what scanFraming found in a raw header block.
type framing struct {
	spaceInName, contentLength bool
	transferEncodings          int // Transfer-Encoding field lines
}

// scanFraming reads each field line's name: whether it holds a space or a
// tab, and whether it is Content-Length or Transfer-Encoding (any case),
// counting the latter.
// Continuation lines (obsolete line folding, which fasthttp refuses anyway)
// start with whitespace and are skipped.
func scanFraming(raw []byte) framing {
	var f framing
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
		c := bytes.IndexByte(line, ':')
		if c <= 0 {
			continue
		}
		name := line[:c]
		if bytes.IndexByte(name, ' ') >= 0 || bytes.IndexByte(name, '\t') >= 0 {
			f.spaceInName = true
			continue
		}
		// By length first: EqualFold walks names of another length too
		// (Content-Type against Content-Length, on every request).
		switch len(name) {
		case len(strContentLength):
			f.contentLength = f.contentLength || bytes.EqualFold(name, strContentLength)
		case len(strTransferEncoding):
			if bytes.EqualFold(name, strTransferEncoding) {
				f.transferEncodings++
			}
		}
	}
	return f
}
