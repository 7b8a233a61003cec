package proxy

import (
	"fmt"
	"runtime/debug"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/openai"
)

// recoverHandler is deferred by the request handler, the boundary where a
// request's foreign bytes (the client's, then the backend's reply) are
// handled. A panic there is a bug met by hostile input: it is counted,
// logged with its stack, and answered 500, and the process keeps serving
// every other request. fasthttp itself does not recover handler panics.
func (s *Server) recoverHandler(ctx *fasthttp.RequestCtx) {
	r := recover()
	if r == nil {
		return
	}
	s.countPanic("handler", r)
	ctx.Response.Reset()
	ctx.SetConnectionClose()
	writeError(ctx, &openai.Error{Status: fasthttp.StatusInternalServerError, Type: "api_error", Code: "internal_error",
		Message: "The gateway failed while handling this request; it has been logged."})
}

// countPanic counts and logs a recovered panic; where says which boundary
// caught it (handler, stream).
func (s *Server) countPanic(where string, r any) {
	s.metrics.panics.WithLabelValues(where).Inc()
	s.log.Error("recovered from a panic", zap.String("where", where),
		zap.String("panic", fmt.Sprint(r)), zap.ByteString("stack", debug.Stack()))
}

// abandon settles an exchange a panic left open: the generation, the
// stream slot and the reservation are released, and the request is
// recorded as a 500, so that a bug met by hostile input leaks nothing
// that a reload, max_streams or a budget would wait on. A backend slot
// taken by an attempt in progress is not known here and stays taken.
func (s *Server) abandon(c *exchange) {
	if c.closed || c.gen == nil {
		return
	}
	c.rec.Status = fasthttp.StatusInternalServerError
	c.rec.Error = "the gateway failed while handling the request (a recovered panic)"
	c.rec.Ended = time.Now()
	s.settle(c)
}
