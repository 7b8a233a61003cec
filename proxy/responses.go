package proxy

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/openai"
)

// The Responses API differs from chat in three ways: usage is named
// input/output tokens, stream events carry an "event:" line and end with
// response.completed rather than [DONE] (both are the wire's, in package
// openai), and a response is stored on the backend that made it, so every
// later request about it must reach that backend. This file holds that
// last difference; the rest of the path is chat's.

// pickOwner takes a slot on owner, the backend of route holding the
// previous response. It returns nil when the route has no such backend any
// more (a reload removed it), so that normal selection applies, and an
// error when the backend is at its concurrency limit: no other backend has
// the response.
func pickOwner(route *backends.Route, owner string) (*backends.Backend, *openai.Error) {
	for _, b := range route.Backends() {
		if b.Name != owner {
			continue
		}
		if !b.TryAcquire() {
			return nil, &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "overloaded",
				Message: "Backend " + owner + ", which holds the previous response, is at its concurrency limit; retry shortly.", RetryAfter: time.Second}
		}
		return b, nil
	}
	return nil, nil
}

// The parameters naming a stored response that a 404 may point at: the
// {response_id} of the path, and a request's previous_response_id.
const (
	paramResponseID       = "response_id"
	paramPreviousResponse = "previous_response_id"
)

// responseNotFound is OpenAI's 404 for a stored response that does not
// exist, named by param. It is the answer whenever the gateway cannot
// serve the response to this key, whatever the reason (no backend holds
// it, or it belongs to another team), so that the answer says nothing of
// whether it exists; the backend's own 404 text is not passed on.
func responseNotFound(id, param string) *openai.Error {
	return &openai.Error{Status: fasthttp.StatusNotFound, Type: "invalid_request_error", Param: param, Code: "response_not_found",
		Message: "No response found with id '" + openai.Clip(id) + "'."}
}

// foreignRequestID refuses a Responses API request whose request_id names
// a stored response that key may not use. vLLM names a response after the
// request's request_id, and stores it under that id unless store is false:
// forwarded, such a request would overwrite the other team's response on
// the backend. It is refused before any backend hears of it; the refusal
// tells the client only that an id it already holds is taken, as any
// service with client-chosen ids must. A request_id naming the key's own
// response (a retry) goes through.
func (s *Server) foreignRequestID(ep *endpoint, body []byte, key *auth.Key) *openai.Error {
	if !ep.responses {
		return nil
	}
	id := gjson.Get(bytesconv.String(body), "request_id")
	if id.Type != gjson.String || id.Str == "" {
		return nil
	}
	owner, found := s.owners.owner(id.Str)
	if !found || owner.allows(key) {
		return nil
	}
	return &openai.Error{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Param: "request_id", Code: "request_id_in_use",
		Message: "request_id names a stored response this key may not use; choose another request_id."}
}

// validResponseID accepts the ids backends make (resp_ followed by hex or
// base62), and refuses anything that could change the upstream path.
func validResponseID(id []byte) bool {
	if len(id) == 0 || len(id) > 256 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// serveStoredResponse is the handler of the requests about one stored
// response: GET and DELETE /v1/responses/{id}, and GET or POST on its
// sub-resource suffix (/cancel, /input_items). They go to the backend that
// made the response, for keys of the team it was made for (see
// responseOwners.ownerFor); when the gateway does not know it (made through
// another replica without a shared store, or forgotten), each backend
// serving the Responses API is asked in turn until one knows the response,
// for keys of every team only.
//
// These requests are counted in tollgate_requests_total (endpoint
// "responses", no model) and logged, but make no usage record, by design:
// a usage record stands for a model call, which the usage API and
// `tollgate usage` count as a request, budgets and limits charge, and the
// trace service shows as a call. Reading, deleting or cancelling a stored
// response runs no model and uses no tokens; the request that made the
// response is the model call, and has its record.
func (s *Server) serveStoredResponse(suffix string) func(*fasthttp.RequestCtx, []byte) {
	return func(ctx *fasthttp.RequestCtx, rawID []byte) {
		st := s.acquire()
		defer st.release()
		started := time.Now()
		requestID := s.replyRequestID(ctx, started)
		backend, e := s.storedResponse(ctx, st, rawID, suffix, requestID)
		if e != nil {
			writeError(ctx, e)
		}
		status := ctx.Response.StatusCode()
		s.metrics.requests.WithLabelValues("", backend, statusLabel(status), responsesEndpoint.name).Inc()
		if ce := s.log.Check(zap.InfoLevel, "request"); ce != nil {
			ce.Write(zap.String("request_id", requestID), zap.String("endpoint", responsesEndpoint.name),
				zap.ByteString("method", ctx.Method()), zap.ByteString("response_id", rawID),
				zap.String("backend", backend), zap.Int("status", status), zap.Duration("duration", time.Since(started)))
		}
	}
}

// storedResponse forwards one request about a stored response and copies
// the answer into ctx, or returns the error to answer. It returns the
// backend that answered.
func (s *Server) storedResponse(ctx *fasthttp.RequestCtx, st *state, rawID []byte, suffix, requestID string) (string, *openai.Error) {
	key, e := s.authenticate(ctx, st)
	if e != nil {
		return "", e
	}
	id := string(rawID)
	if !validResponseID(rawID) {
		return "", responseNotFound(id, paramResponseID)
	}
	known, allowed := s.owners.ownerFor(id, key)
	if !allowed {
		return "", responseNotFound(id, paramResponseID)
	}
	if ctx.IsDelete() {
		// A deleted response cannot be asked about any more.
		s.settleBeforeDelete(id)
	}
	var candidates []*backends.Backend
	for _, rt := range st.reg.Routes() {
		if !rt.Serves(backends.EndpointResponses) {
			continue
		}
		for _, b := range rt.Backends() {
			if (known == "" || b.Name == known) && !containsBackend(candidates, b) {
				candidates = append(candidates, b)
			}
		}
	}
	// unreached is why a backend that may hold the response could not be
	// asked; it is answered rather than a 404 that may not be true.
	var notFound, unreached *openai.Error
	for _, b := range candidates {
		if !b.TryAcquire() {
			unreached = &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "overloaded",
				Message: "Backend " + b.Name + " is at its concurrency limit; retry shortly.", RetryAfter: time.Second}
			continue
		}
		status, streaming, e := s.storedResponseAttempt(ctx, st, b, id, suffix, requestID)
		if !streaming {
			b.Release()
		}
		switch {
		case e == nil:
			if known == "" {
				// Asked by a key of every team, about a response made
				// elsewhere: its team is not known.
				s.owners.claim(id, responseOwner{backend: b.Name})
			}
			return b.Name, nil
		case status == fasthttp.StatusNotFound:
			notFound = e
		case status == 0 || status >= 500:
			unreached = e
		default:
			// The backend holding the response refused the request
			// (cancelling a finished response, say): that is the answer.
			return b.Name, e
		}
	}
	switch {
	case unreached != nil:
		return "", unreached
	case notFound != nil:
		return "", notFound
	}
	return "", responseNotFound(id, paramResponseID)
}

// storedResponseAttempt sends the client's request about response id to b
// and copies a non-error answer into ctx. It returns the upstream status,
// whether the answer is a stream that now holds b's slot (GET
// …?stream=true replays a background response's events), and, for anything
// but a 2xx, the error to answer.
func (s *Server) storedResponseAttempt(ctx *fasthttp.RequestCtx, st *state, b *backends.Backend, id, suffix, requestID string) (int, bool, *openai.Error) {
	started := time.Now()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	streaming := false
	defer func() {
		if !streaming {
			// A body asked for as a stream was read to its end, or the
			// connection is marked to close: either way it can go back.
			b.CloseStream(resp, false)
			fasthttp.ReleaseResponse(resp)
		}
	}()
	resp.StreamBody = ctx.IsGet() && suffix == "" && string(ctx.QueryArgs().Peek("stream")) == "true"
	forwardHeaders(&req.Header, &ctx.Request.Header)
	req.Header.Set(headerRequestID, requestID)
	b.PrepareResponse(req, string(ctx.Method()), id, suffix)
	if q := ctx.URI().QueryString(); len(q) > 0 {
		req.URI().SetQueryStringBytes(q)
	}
	if body := ctx.PostBody(); len(body) > 0 {
		req.SetBody(body)
	}
	if err := b.Do(req, resp); err != nil {
		b.ReportFailure()
		return 0, false, upstreamError(err, b.Name)
	}
	status := resp.StatusCode()
	if status >= 500 {
		b.ReportFailure()
	} else {
		b.ReportSuccess(time.Since(started))
	}
	if resp.StreamBody && status >= 200 && status <= 299 && hasPrefixFold(resp.Header.ContentType(), eventStream) {
		if s.streams.Add(1) > int64(st.cfg.Server.MaxStreams) {
			s.streams.Add(-1)
			resp.SetConnectionClose()
			return status, false, &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: "api_error", Code: "too_many_streams",
				Message: "The gateway is at its limit of concurrent streams; retry shortly.", RetryAfter: time.Second}
		}
		streaming = true
		s.startStoredStream(ctx, st, resp, b)
		return status, true, nil
	}
	body, err := replyBody(resp, st.cfg.Server.MaxResponseBytes)
	if err != nil {
		resp.SetConnectionClose()
		return status, false, &openai.Error{Status: fasthttp.StatusBadGateway, Type: "api_error", Code: "upstream_error",
			Message: "Backend " + b.Name + " answered with a body over the gateway's limit of " + strconv.Itoa(st.cfg.Server.MaxResponseBytes) + " bytes."}
	}
	if status < 200 || status > 299 {
		e := openai.NormalizeUpstreamError(status, body, b.Name, st.secrets.redact)
		if status == fasthttp.StatusNotFound {
			e = responseNotFound(id, paramResponseID)
		}
		return status, false, e
	}
	if suffix == "" || suffix == "/cancel" {
		// The response object: a background response seen finished is
		// settled now, if the poller has not already.
		s.observeBackground(id, body)
	}
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	if public := publicModelOf(st, b, body); public != nil {
		ctx.Response.SetBodyRaw(openai.RewriteModel(nil, body, public))
	} else {
		ctx.Response.SetBody(body)
	}
	return status, false, nil
}

// errReplyTooLarge is a reply body past server.max_response_bytes.
var errReplyTooLarge = errors.New("reply body too large")

// replyBody is resp's body; one asked for as a stream but answered
// otherwise is read to its end, within limit bytes.
func replyBody(resp *fasthttp.Response, limit int) ([]byte, error) {
	if !resp.StreamBody || resp.BodyStream() == nil {
		return resp.Body(), nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.BodyStream(), int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(body) > limit {
		return nil, errReplyTooLarge
	}
	return body, nil
}

// storedStream passes a stored response's events, replayed by the backend
// holding it, to the client as they come, event by event: each is held to
// server.max_event_bytes as a stream's are, and names the public model as
// the events of the stream that made the response did. It holds the
// backend's slot and a stream slot until the replay ends. The events are
// not accounted: the response was metered when it was made.
type storedStream struct {
	srv     *Server
	resp    *fasthttp.Response
	backend *backends.Backend
	aliases []modelAlias

	scan openai.EventScanner
	out  []byte
	pos  int
	// sequence is the sequence_number of the last event passed on, which
	// an error event closing the replay follows.
	sequence int64
	ended    bool // the upstream replay is over (cleanly or not)
	eof      bool // the upstream body was read to its end
}

func (s *Server) startStoredStream(ctx *fasthttp.RequestCtx, st *state, resp *fasthttp.Response, b *backends.Backend) {
	ss := &storedStream{srv: s, resp: resp, backend: b, aliases: modelAliasesOf(st, b)}
	ss.scan.Reset(resp.BodyStream(), st.cfg.Server.MaxEventBytes)
	ctx.SetStatusCode(resp.StatusCode())
	ctx.Response.Header.SetContentTypeBytes(eventStream)
	ctx.Response.Header.Set(fasthttp.HeaderCacheControl, "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	ctx.Response.ImmediateHeaderFlush = true
	ctx.Response.SetBodyStream(ss, -1)
	s.metrics.streamsInFlight.Inc()
}

// Read returns the next events for the client. It blocks until at least
// one event arrived, and returns io.EOF once the replay is over.
func (ss *storedStream) Read(p []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			// As for streams (see streamBody.Read): a bug met by hostile
			// bytes ends this replay, not the process.
			ss.srv.countPanic("replay", r)
			ss.ended = true
			n, err = 0, io.EOF
		}
	}()
	for ss.pos >= len(ss.out) {
		if ss.ended {
			return 0, io.EOF
		}
		ss.out, ss.pos = ss.out[:0], 0
		ss.fill()
	}
	n = copy(p, ss.out[ss.pos:])
	ss.pos += n
	return n, nil
}

// fill reads one upstream event, plus any others already buffered, into
// out; at the end of the upstream body it ends the replay.
func (ss *storedStream) fill() {
	ev, err := ss.scan.Next()
	if err != nil {
		ss.end(err, ev)
		return
	}
	ss.appendEvent(ev)
	for len(ss.out) < maxCoalesce {
		ev := ss.scan.Buffered()
		if ev == nil {
			return
		}
		ss.appendEvent(ev)
	}
}

// appendEvent appends ev to out, with the public model id in place of the
// upstream one in the response object it may carry.
func (ss *storedStream) appendEvent(ev []byte) {
	start, end, ok := openai.ResponseEventData(ev)
	if !ok {
		ss.out = append(ss.out, ev...)
		return
	}
	data := ev[start:end]
	if seq := gjson.GetBytes(data, "sequence_number"); seq.Type == gjson.Number {
		ss.sequence = seq.Int()
	}
	if len(ss.aliases) == 0 {
		ss.out = append(ss.out, ev...)
		return
	}
	model := gjson.GetBytes(data, "response.model")
	public := publicModel(ss.aliases, model)
	if public == nil || model.Index <= 0 {
		ss.out = append(ss.out, ev...)
		return
	}
	at := start + model.Index
	ss.out = append(ss.out, ev[:at]...)
	ss.out = append(ss.out, public...)
	ss.out = append(ss.out, ev[at+len(model.Raw):]...)
}

// end handles the end of the upstream replay: a clean end passes as is;
// an event over the bound, a break or a cut in the middle of an event ends
// the replay with the Responses API's error event, since the client
// already has its 200.
func (ss *storedStream) end(err error, rest []byte) {
	ss.ended = true
	if errors.Is(err, io.EOF) {
		ss.eof = true
		if len(bytes.TrimSpace(rest)) == 0 {
			return
		}
		err = errUpstreamTruncated
	}
	e := upstreamError(err, ss.backend.Name)
	switch {
	case errors.Is(err, errUpstreamTruncated):
		e.Message = "Backend " + ss.backend.Name + " ended the replay in the middle of an event."
	case errors.Is(err, openai.ErrEventTooLarge):
		e.Message = "Backend " + ss.backend.Name + " sent an event over the gateway's limit of " +
			strconv.Itoa(ss.scan.MaxEvent()) + " bytes; it is not speaking SSE."
	}
	if ce := ss.srv.log.Check(zap.WarnLevel, "stored response replay broken"); ce != nil {
		ce.Write(zap.String("backend", ss.backend.Name), zap.Error(err))
	}
	ss.out = openai.AppendResponsesError(ss.out, e, ss.sequence+1)
}

// CloseWithError ends the replay; fasthttp calls it once, with the error
// that stopped writing to the client (nil at the end of the stream).
func (ss *storedStream) CloseWithError(clientErr error) error {
	// Unless the upstream body was read to its end (the client left, or
	// the replay broke), the connection cannot be reused, and closing it
	// stops the replay upstream.
	ss.backend.CloseStream(ss.resp, clientErr != nil || !ss.eof)
	fasthttp.ReleaseResponse(ss.resp)
	ss.backend.Release()
	ss.srv.streams.Add(-1)
	ss.srv.metrics.streamsInFlight.Dec()
	ss.scan.Reset(nil, 0)
	return nil
}

// modelAlias is a model served by a backend under another upstream id:
// what the backend names upstream is shown to clients as public (quoted).
type modelAlias struct {
	upstream string
	public   []byte
}

// modelAliasesOf lists the models b serves through the Responses API under
// an upstream id other than their public one.
func modelAliasesOf(st *state, b *backends.Backend) []modelAlias {
	var out []modelAlias
	for _, rt := range st.reg.Routes() {
		if rt.Name != rt.Upstream && rt.Serves(backends.EndpointResponses) && containsBackend(rt.Backends(), b) {
			out = append(out, modelAlias{upstream: rt.Upstream, public: rt.NameJSON})
		}
	}
	return out
}

// publicModel is the quoted public id to show in place of model, an
// upstream id, or nil when it is shown as is.
func publicModel(aliases []modelAlias, model gjson.Result) []byte {
	if model.Type != gjson.String {
		return nil
	}
	for _, a := range aliases {
		if a.upstream == model.Str {
			return a.public
		}
	}
	return nil
}

// publicModelOf is the quoted public id to show in place of the upstream
// model id a stored response names, as replies made through the gateway
// show it: the model, served by b, whose upstream id that is. It is nil
// when the reply names no such model or the ids are the same.
func publicModelOf(st *state, b *backends.Backend, reply []byte) []byte {
	return publicModel(modelAliasesOf(st, b), gjson.GetBytes(reply, "model"))
}

func containsBackend(list []*backends.Backend, b *backends.Backend) bool {
	for _, x := range list {
		if x == b {
			return true
		}
	}
	return false
}

// noteResponseOwner remembers the backend of a streamed response as soon
// as its id is seen, before the client can ask about it.
func (sb *streamBody) noteResponseOwner() {
	if sb.ownerNoted {
		return
	}
	id, _ := sb.events.ReplyKey()
	if id == "" {
		return
	}
	sb.srv.owners.claim(id, responseOwner{backend: sb.backend.Name, team: sb.c.rec.Team, project: sb.c.rec.Project})
	sb.ownerNoted = true
}
