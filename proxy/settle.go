package proxy

import (
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/openai"
)

// recordUsage fills rec's counts from what the backend reported, u, and
// outputTokens, the generated tokens charged: u's own count, or for a
// stream that reported none the content deltas streamed (see
// openai.EventProcessor.OutputTokens). openai refuses a count above
// openai.MaxTokenCount, which is accounting.MaxRecordTokens (see
// TestTokenBoundsAgree), so every count read is recorded as it is.
func recordUsage(rec *accounting.Record, u *openai.UsageCounts, outputTokens int64) {
	rec.PromptTokens = u.Input
	rec.CompletionTokens = outputTokens
	rec.CachedTokens = u.Cached
	rec.TotalTokens = u.Total
	if !u.Reported || rec.TotalTokens < rec.PromptTokens+rec.CompletionTokens {
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

// finish ends an exchange that is not streamed: it answers e if non-nil, settles
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
// finished exchange.
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
