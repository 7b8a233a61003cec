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
	[]byte("Cookie"),
	[]byte("Accept-Encoding"),
	[]byte("X-Request-Id"),
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
// all sixteen, for every header of every request.
var droppedByLength = func() (idx [len("Proxy-Authorization") + 1][][]byte) {
	for _, h := range droppedRequestHeaders {
		idx[len(h)] = append(idx[len(h)], h)
	}
	return idx
}()

func dropHeader(k, connection []byte) bool {
	if len(k) < len(droppedByLength) {
		for _, h := range droppedByLength[len(k)] {
			if bytes.EqualFold(k, h) {
				return true
			}
		}
	}
	if len(k) >= len(compatPrefix) && bytes.EqualFold(k[:len(compatPrefix)], compatPrefix) {
		return true
	}
	return len(connection) > 0 && connectionNames(connection, k)
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
