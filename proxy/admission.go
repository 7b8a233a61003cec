package proxy

import (
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/openai"
	"github.com/tollgate-dev/tollgate/org"
)

// Admission checks a request against policies beyond the configured
// limits, once its key and model are known: the Admin API's model
// permissions, and its projects' rate and spend limits (org.Enforcer). It
// reads memory only. The Hold it returns goes into the request's usage
// record, whose recording settles it; an error is an *org.Refusal or a
// failure.
type Admission interface {
	Admit(key *auth.Key, model string, estimate int64) (accounting.Hold, error)
}

// admit runs the server's Admission for a request of key to model, with
// estimate tokens, putting what it reserved into rec. It is the one call
// of the request path into the Admin API's policies.
func (s *Server) admit(ctx *fasthttp.RequestCtx, key *auth.Key, model string, estimate int64, rec *accounting.Record) *openai.Error {
	if s.admission == nil {
		return nil
	}
	hold, err := s.admission.Admit(key, model, estimate)
	if err == nil {
		rec.Hold = hold
		return nil
	}
	var r *org.Refusal
	if !errors.As(err, &r) {
		return &openai.Error{Status: fasthttp.StatusInternalServerError, Type: "api_error", Message: "admission failed", Cause: err}
	}
	if r.NoRetry {
		ctx.Response.Header.Set("x-should-retry", "false")
	}
	return &openai.Error{Status: r.Status, Type: r.Type, Code: r.Code, Message: r.Message, RetryAfter: r.RetryAfter}
}
