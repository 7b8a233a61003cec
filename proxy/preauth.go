package proxy

import (
	"bytes"
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
)

// unauthenticatedBodyBytes is the most of a request body either listener
// reads before it knows the request's key. fasthttp reads the whole body
// before the handler runs, into a buffer of the declared Content-Length
// taken at once, so without it a client with no key that declares a body
// of server.max_body_bytes and sends it a byte at a time holds that much
// memory per connection for the whole read timeout. Requests that
// declare at most this much (most of them) are read without a check; a
// larger or chunked body is read in full only with a valid key.
const unauthenticatedBodyBytes = 8 << 10

// headerReceived is fasthttp's hook between a request's headers and its
// body (Server.HeaderReceived). It checks the key of a request whose
// declared body is larger than unauthenticatedBodyBytes, or chunked, and
// without a valid one lowers the request's body limit to
// unauthenticatedBodyBytes: fasthttp then refuses the body before taking
// its buffer (or once a chunked body passes the limit), and the error
// handler answers 401 (see serveWithoutKey). The check allocates nothing,
// and only requests with large bodies pay it: a key authenticated since
// the keys last changed is known by a 64-bit keyed hash (Keyring.Known),
// another is hashed with SHA-256, which authentication then does again.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if n := h.ContentLength(); n == -2 || (n >= 0 && n <= unauthenticatedBodyBytes) || s.validKey(h) {
		return fasthttp.RequestConfig{} // the server's own limits
	}
	return fasthttp.RequestConfig{MaxRequestBodySize: unauthenticatedBodyBytes}
}

// validKey reports whether the request's Authorization header, or its
// X-Api-Key, holds a known key; it bounds what is read of a request before
// authentication, and is not authentication (see Keyring.Known).
func (s *Server) validKey(h *fasthttp.RequestHeader) bool {
	var basic [128]byte // decoded Basic credentials, kept off the heap
	return s.keys.Known(requestSecretInto(basic[:0], h.Peek(fasthttp.HeaderAuthorization), h.Peek(headerAPIKey)))
}

// requestSecret is the key a request presents: its Authorization header's
// (Bearer, or Basic as the trace service's clients send it), or else its
// X-Api-Key, where Anthropic's clients send it.
func requestSecret(authorization, apiKey []byte) []byte {
	return requestSecretInto(nil, authorization, apiKey)
}

// requestSecretInto is requestSecret decoding Basic credentials into dst.
func requestSecretInto(dst, authorization, apiKey []byte) []byte {
	if len(authorization) == 0 {
		return bytes.TrimSpace(apiKey)
	}
	return auth.Secret(dst, authorization)
}

// serveWithoutKey answers a request whose body fasthttp refused as too
// large because its key is missing or invalid (see headerReceived), and
// reports whether it did: the request goes to its route with no body, and
// every route that takes a body checks the key first, so the client gets
// the 401 its route answers, in its route's shape. fasthttp closes the
// connection after the answer, with the body unread.
func (s *Server) serveWithoutKey(ctx *fasthttp.RequestCtx, err error, handler fasthttp.RequestHandler) bool {
	if !errors.Is(err, fasthttp.ErrBodyTooLarge) || s.validKey(&ctx.Request.Header) {
		return false
	}
	ctx.Request.ResetBody()
	handler(ctx)
	return true
}
