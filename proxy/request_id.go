package proxy

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// replyRequestID is the X-Request-Id of a reply: the client's when it is a
// valid id, otherwise a new one, set on the reply and returned.
func (s *Server) replyRequestID(ctx *fasthttp.RequestCtx, now time.Time) string {
	id := string(ctx.Request.Header.PeekBytes(requestIDName))
	if !validID(bytesconv.Bytes(id)) {
		id = s.callIDs.next(now)
	}
	ctx.Response.Header.SetCanonical(requestIDName, bytesconv.Bytes(id))
	return id
}

// ensureRequestID gives a reply that has no X-Request-Id one, so that every
// reply carries it, as the README promises: the models list, the routes
// handed to Options.Next (the usage API, /metrics, the trace service), the
// router's 404 and 405, a recovered panic's 500, fasthttp's transport
// errors. The model endpoints set theirs before anything else (it names
// their usage record and log line); for them this only finds it.
func (s *Server) ensureRequestID(ctx *fasthttp.RequestCtx) {
	if len(ctx.Response.Header.PeekBytes(requestIDName)) == 0 {
		s.replyRequestID(ctx, time.Now())
	}
}
