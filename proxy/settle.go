package proxy

import (
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/openai"
)

// setUsage fills the record's counts from what the backend reported.
func (c *exchange) setUsage(u *usageCounts, completion int64) {
	setRecordUsage(&c.rec, u, completion)
}

// setRecordUsage fills rec's counts from what the backend reported.
func setRecordUsage(rec *accounting.Record, u *usageCounts, completion int64) {
	rec.PromptTokens = u.prompt
	rec.CompletionTokens = completion
	rec.CachedTokens = u.cached
	rec.TotalTokens = u.total
	if !u.reported || rec.TotalTokens < rec.PromptTokens+rec.CompletionTokens {
		rec.TotalTokens = rec.PromptTokens + rec.CompletionTokens
	}
}

// reject answers a request refused before it was attributed to a model:
// it is counted in metrics and logged, but makes no usage record, since it
// used no model.
func (s *Server) reject(ctx *fasthttp.RequestCtx, c *exchange, e *openai.Error) {
	c.closed = true
	c.gen.release()
	c.writeError(ctx, e)
	s.metrics.requests.WithLabelValues("", "", statusLabel(e.Status), c.ep.name).Inc()
	if ce := s.log.Check(zap.InfoLevel, "request rejected"); ce != nil {
		ce.Write(zap.String("request_id", c.rec.RequestID), zap.String("key", c.rec.KeyName),
			zap.Int("status", e.Status), zap.String("error", e.Message))
	}
}

// finish ends a non-streamed completion: it answers e if non-nil, settles
// the reservation, and records usage, metrics and the log line.
func (s *Server) finish(ctx *fasthttp.RequestCtx, c *exchange, e *openai.Error) {
	if e != nil {
		c.writeError(ctx, e)
		c.rec.Error = e.Message
		if e.Cause != nil {
			c.rec.Error += " (" + e.Cause.Error() + ")"
		}
		c.rec.Status = e.Status
	} else {
		c.rec.Status = ctx.Response.StatusCode()
	}
	c.rec.Ended = time.Now()
	if e == nil {
		s.metrics.observeOverhead(c.route.Name, c.rec.Ended.Sub(c.rec.Started)-c.upstream)
	}
	s.settle(c)
}

// settle releases the reservation and the stream slot, and records a
// finished completion.
func (s *Server) settle(c *exchange) {
	c.closed = true
	c.gen.release()
	if c.streamSlot {
		s.streams.Add(-1)
		c.streamSlot = false
	}
	// A background response still running is recorded, and its
	// reservation settled, once it has finished.
	if !s.holdBackground(c) {
		if c.limiter != nil {
			c.limiter.Settle(c.res, c.rec.TotalTokens)
		}
		c.gen.secrets.record(&c.rec)
		s.recorder.Record(c.rec)
	}
	s.metrics.countRequest(c.rec.Model, c.rec.Backend, c.rec.Status, c.ep.name, c.rec.Ended.Sub(c.rec.Started))
	if ce := s.log.Check(zap.InfoLevel, "request"); ce != nil {
		ce.Write(zap.Inline(requestLog{&c.rec}))
	}
}
