package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// droppedRequestHeaders are never forwarded upstream: hop-by-hop headers
// (RFC 9110 §7.6.1), the client's credentials (the backend gets the
// gateway's own key), headers the gateway sets itself, and
// Accept-Encoding, because the gateway reads replies to count usage and
// must receive them uncompressed.
var droppedRequestHeaders = [...][]byte{
	[]byte("Connection"),
	[]byte("Keep-Alive"),
	[]byte("Proxy-Authenticate"),
	[]byte("Proxy-Authorization"),
	[]byte("Proxy-Connection"),
	[]byte("Te"),
	[]byte("Trailer"),
	[]byte("Transfer-Encoding"),
	[]byte("Upgrade"),
	[]byte("Host"),
	[]byte("Content-Length"),
	[]byte("Content-Type"),
	[]byte("Authorization"),
	[]byte("X-Api-Key"),
	[]byte("Cookie"),
	[]byte("Accept-Encoding"),
	[]byte("X-Request-Id"),
	[]byte("Traceparent"),
}

// compatPrefix marks the gateway's own attribution and trace headers,
// which are for the gateway and not for backends.
var compatPrefix = []byte("Compat-")

// forwardHeaders copies the client's end-to-end request headers to the
// upstream request, dropping hop-by-hop ones, those the client's
// Connection header names, and those in droppedRequestHeaders.
func forwardHeaders(dst, src *fasthttp.RequestHeader) {
	connection := src.Peek(fasthttp.HeaderConnection)
	for k, v := range src.All() {
		if dropHeader(k, connection) {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// droppedByLength indexes droppedRequestHeaders by length, so that a name
// is compared only with the dropped names it could equal: one or two, not
// all of them, for every header of every request.
var droppedByLength = func() (idx [len("Proxy-Authorization") + 1][][]byte) {
	for _, h := range droppedRequestHeaders {
		idx[len(h)] = append(idx[len(h)], h)
	}
	return idx
}()

func dropHeader(k, connection []byte) bool {
	if len(k) < len(droppedByLength) {
		for _, h := range droppedByLength[len(k)] {
			if equalFold(k, h) {
				return true
			}
		}
	}
	if len(k) >= len(compatPrefix) && equalFold(k[:len(compatPrefix)], compatPrefix) {
		return true
	}
	return len(connection) > 0 && connectionNames(connection, k)
}

// equalFold is bytes.EqualFold, which folds byte by byte even when a and b
// are the same bytes. Names come in their canonical case (the server
// canonicalizes them, and so do clients): an exact comparison first settles
// those at once, where EqualFold would fold every dropped header of every
// request (Host, Content-Length, Content-Type, Authorization) byte by byte.
func equalFold(a, b []byte) bool {
	return bytes.Equal(a, b) || bytes.EqualFold(a, b)
}

// connectionNames reports whether the Connection header value lists name.
func connectionNames(connection, name []byte) bool {
	for len(connection) > 0 {
		var tok []byte
		if i := bytes.IndexByte(connection, ','); i >= 0 {
			tok, connection = connection[:i], connection[i+1:]
		} else {
			tok, connection = connection, nil
		}
		if bytes.EqualFold(bytes.TrimSpace(tok), name) {
			return true
		}
	}
	return false
}

// clientHeaders are the client's request headers serve reads.
type clientHeaders struct {
	authorization, requestID, project, traceID, parentID, traceparent []byte
	// apiKey is X-Api-Key, where Anthropic's clients send the key.
	apiKey []byte
}

// readClientHeaders finds the headers serve reads in one pass over h, each
// as Peek finds it: the first of duplicate names, compared as stored
// (canonical, as the server parsed them, and as serve's constants are; see
// serve). A Peek of each copied its name and looked it over for a space
// before looking it up, six times on every request; one pass does that
// work once.
func readClientHeaders(h *fasthttp.RequestHeader) clientHeaders {
	var (
		ch   clientHeaders
		seen uint8
	)
	for k, v := range h.All() {
		var (
			dst *[]byte
			bit uint8
		)
		switch string(k) {
		case fasthttp.HeaderAuthorization:
			dst, bit = &ch.authorization, 1<<0
		case headerRequestID:
			dst, bit = &ch.requestID, 1<<1
		case headerProject:
			dst, bit = &ch.project, 1<<2
		case headerTraceID:
			dst, bit = &ch.traceID, 1<<3
		case headerParentID:
			dst, bit = &ch.parentID, 1<<4
		case headerTraceparent:
			dst, bit = &ch.traceparent, 1<<5
		case headerAPIKey:
			dst, bit = &ch.apiKey, 1<<6
		default:
			continue
		}
		if seen&bit == 0 {
			*dst, seen = v, seen|bit
		}
	}
	return ch
}
