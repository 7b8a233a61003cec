package proxy

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/openai"
)

// A background response (POST /v1/responses with "background": true) is
// answered "queued", with no usage, while the backend goes on generating
// it: its usage is known only once it reaches a terminal status. So that
// budgets count it, the gateway keeps the request's reservation and its
// usage record pending, and the Server's poller asks the backend holding
// the response until it finishes; then the record is written, once, with
// the response's usage, and the reservation settled at it. A GET or cancel
// through the gateway that sees the finished response settles it too,
// whichever comes first. Pending responses live in memory only: a restart
// loses their usage (Shutdown records them with what is known, no tokens,
// and says so in the record's error).

const (
	// backgroundCapacity bounds the background responses waiting for
	// their usage. A request for one more is refused (503) before it
	// reaches a backend; the bound also caps the records held in memory,
	// each with the request's payloads when traces store them.
	backgroundCapacity = 1000
	// backgroundFirstPoll is how long after a background response is
	// made that the backend is first asked about it; each unfinished
	// answer doubles the wait, up to backgroundMaxPoll.
	backgroundFirstPoll = 500 * time.Millisecond
	backgroundMaxPoll   = 30 * time.Second
	// backgroundMaxAge is how long a background response is waited for:
	// one not finished by then is recorded with no usage, and an error
	// saying why.
	backgroundMaxAge = 24 * time.Hour
)

// tooManyBackground refuses a background response while the set of
// pending ones, capacity of them, is full.
func tooManyBackground(capacity int) *openai.Error {
	return &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: "api_error",
		Code: "too_many_background_responses", RetryAfter: 10 * time.Second,
		Message: "The gateway is waiting on its limit of " + strconv.Itoa(capacity) +
			" background responses to finish; retry shortly, or send the request without background."}
}

// overShare refuses a background response to a team that holds its share
// of the slots, limit of them: a 429, since it is this team's rate, not the
// gateway's, that stops it.
func overShare(team string, limit int) *openai.Error {
	return &openai.Error{Status: fasthttp.StatusTooManyRequests, Type: "rate_limit_exceeded",
		Code: "rate_limit_exceeded", RetryAfter: 10 * time.Second,
		Message: "Team " + team + " has " + strconv.Itoa(limit) + " background responses running, its share of the gateway's" +
			" (server.background_team_share); retry once one finished, or send the request without background."}
}

// backgroundResponses is the set of background responses whose usage is
// not known yet, and the state of the poller that learns it. It belongs to
// the Server, across reloads.
type backgroundResponses struct {
	mu sync.Mutex
	// capacity bounds slots: the background requests admitted and not yet
	// answered, plus the pending responses.
	capacity int
	slots    int
	// teamSlots is the slots each team holds; a team holding none has no
	// entry, so the map stays as small as the teams now waiting.
	teamSlots map[string]int
	pending   map[string]*pendingResponse
	// The poller runs from the first pending response until stop; once
	// stopped, nothing more is held.
	running, stopped bool
	wake             chan struct{} // a new response is due sooner
	stop, done       chan struct{}
}

// pendingResponse is one background response waiting for its usage: the
// request's usage record and reservation, the record naming the backend
// holding the response.
type pendingResponse struct {
	id      string
	rec     accounting.Record
	res     accounting.Reservation
	limiter Limiter // nil when nothing was reserved
	since   time.Time
	// next is when the poller asks next, delay the wait after that.
	next  time.Time
	delay time.Duration
}

func newBackgroundResponses(capacity int) *backgroundResponses {
	return &backgroundResponses{capacity: capacity, teamSlots: make(map[string]int), pending: make(map[string]*pendingResponse),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// admit takes a slot for a background request of team, which may hold
// share percent of them (at least one), or returns why it may not: the set
// is full (or the server is stopping), or team holds its share.
func (b *backgroundResponses) admit(team string, share int) *openai.Error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped || b.slots >= b.capacity {
		return tooManyBackground(b.capacity)
	}
	limit := max(b.capacity*share/100, 1)
	if b.teamSlots[team] >= limit {
		return overShare(team, limit)
	}
	b.slots++
	b.teamSlots[team]++
	return nil
}

// release gives a slot of team back.
func (b *backgroundResponses) release(team string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.slots--
	if b.teamSlots[team]--; b.teamSlots[team] <= 0 {
		delete(b.teamSlots, team)
	}
}

// take removes and returns the pending response id, or nil: whoever takes
// it records it, so it is recorded once.
func (b *backgroundResponses) take(id string) *pendingResponse {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.pending[id]
	delete(b.pending, id)
	return p
}

// pendingID is the id of a Responses API reply still being generated
// ("queued" or "in_progress"), or "". It is a copy: the reply is parsed
// from a pooled buffer that fasthttp reuses.
func pendingID(reply gjson.Result) string {
	switch reply.Get("status").Str {
	case "queued", "in_progress":
		return strings.Clone(openai.BackendID(reply.Get("id").String()))
	}
	return ""
}

// holdBackground takes over the usage record and reservation of c, a
// background response answered while still running, and reports whether
// it did; if not, the caller settles c as usual. It gives back c's slot
// unless the response is now pending.
func (s *Server) holdBackground(c *exchange) bool {
	if !c.backgroundSlot {
		return false
	}
	c.backgroundSlot = false
	b := s.background
	if c.pendingResponse == "" || c.rec.Error != "" {
		b.release(c.rec.Team)
		return false
	}
	now := time.Now()
	p := &pendingResponse{id: c.pendingResponse, rec: c.rec, res: c.res, limiter: c.limiter, since: now,
		next: now.Add(backgroundFirstPoll), delay: backgroundFirstPoll}
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		b.release(c.rec.Team)
		c.rec.Error = "the gateway stopped before background response " + p.id + " finished: its usage is not known"
		return false
	}
	b.pending[p.id] = p
	if !b.running {
		b.running = true
		go s.pollBackground()
	}
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return true
}

// observeBackground settles the pending response id from reply, a
// response object a client's GET or cancel received through the gateway,
// if it reached a terminal status.
func (s *Server) observeBackground(id string, reply []byte) {
	v := gjson.ParseBytes(reply)
	if !terminalStatus(v.Get("status").Str) {
		return
	}
	if p := s.background.take(id); p != nil {
		s.endBackground(p, v, "")
	}
}

// terminalStatus reports whether a response with status is over: its usage
// will not change any more.
func terminalStatus(status string) bool {
	switch status {
	case "completed", "failed", "cancelled", "incomplete":
		return true
	}
	return false
}

// endBackground writes the record of p, with the usage of reply (its
// final response object; empty when it is not known) and problem as the
// error if any, and settles its reservation at that usage.
func (s *Server) endBackground(p *pendingResponse, reply gjson.Result, problem string) {
	var u openai.UsageCounts
	if reply.Exists() {
		if err := u.SetResponses(reply.Get("usage")); err != nil {
			problem = invalidUsageMessage(p.rec.Backend) + " (" + err.Error() + ")"
			u = openai.UsageCounts{}
		}
		p.rec.FinishReasons = openai.ResponseFinish(reply)
		switch reply.Get("status").Str {
		case "failed":
			problem = "background response failed: " + openai.InBandErrorMessage(reply.Get("error"))
		case "cancelled":
			problem = "background response cancelled"
		}
		if p.rec.Output != nil {
			// Traces store payloads: the output is the finished response.
			p.rec.Output = []byte(reply.Raw)
		}
	}
	recordUsage(&p.rec, &u, u.Output)
	p.rec.Error = problem
	s.state.Load().secrets.record(&p.rec)
	p.rec.Ended = time.Now()
	if p.limiter != nil {
		p.limiter.Settle(p.res, p.rec.TotalTokens)
	}
	s.recorder.Record(p.rec)
	s.background.release(p.rec.Team)
	if ce := s.log.Check(zap.InfoLevel, "background response ended"); ce != nil {
		ce.Write(zap.String("request_id", p.rec.RequestID), zap.String("response_id", p.id),
			zap.String("backend", p.rec.Backend), zap.String("team", p.rec.Team), zap.String("project", p.rec.Project),
			zap.Int64("prompt_tokens", p.rec.PromptTokens), zap.Int64("completion_tokens", p.rec.CompletionTokens),
			zap.Duration("waited", p.rec.Ended.Sub(p.since)), zap.String("error", p.rec.Error))
	}
}

// pollBackground is the poller: it asks the backends about the pending
// responses as each is due, until stopBackground.
func (s *Server) pollBackground() {
	b := s.background
	defer close(b.done)
	timer := time.NewTimer(backgroundFirstPoll)
	defer timer.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-b.wake:
		case <-timer.C:
		}
		next := s.pollDue(time.Now())
		timer.Stop()
		select {
		case <-timer.C:
		default:
		}
		timer.Reset(max(time.Until(next), time.Millisecond))
	}
}

// pollDue asks about every pending response due at now, and returns when
// the next one is due.
func (s *Server) pollDue(now time.Time) time.Time {
	b := s.background
	var due []*pendingResponse
	next := now.Add(backgroundMaxPoll)
	b.mu.Lock()
	for _, p := range b.pending {
		if !p.next.After(now) {
			due = append(due, p)
		} else if p.next.Before(next) {
			next = p.next
		}
	}
	b.mu.Unlock()
	for _, p := range due {
		select {
		case <-b.stop:
			return next
		default:
		}
		reply, problem, over := s.pollOne(p)
		if !over && time.Since(p.since) > backgroundMaxAge {
			problem, over = "background response "+p.id+" did not finish within "+backgroundMaxAge.String()+": its usage is not known", true
		}
		if over {
			if q := b.take(p.id); q != nil {
				s.endBackground(q, reply, problem)
			}
			continue
		}
		b.mu.Lock()
		p.delay = min(2*p.delay, backgroundMaxPoll)
		p.next = time.Now().Add(p.delay)
		if p.next.Before(next) {
			next = p.next
		}
		b.mu.Unlock()
	}
	return next
}

// pollOne asks the backend holding p about it. over reports that the
// response ended: reply is its final object, or problem says why its usage
// is not known. Anything else (the backend busy, failing, or gone from the
// configuration for now) is asked again later.
func (s *Server) pollOne(p *pendingResponse) (reply gjson.Result, problem string, over bool) {
	st := s.acquire()
	defer st.release()
	be := backendNamed(st, p.rec.Backend)
	if be == nil || !be.TryAcquire() {
		return gjson.Result{}, "", false
	}
	defer be.Release()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.Header.Set(headerRequestID, p.rec.RequestID)
	be.PrepareResponse(req, fasthttp.MethodGet, p.id, "")
	started := time.Now()
	if err := be.Do(req, resp); err != nil {
		be.ReportFailure()
		if ce := s.log.Check(zap.DebugLevel, "background response poll failed"); ce != nil {
			ce.Write(zap.String("response_id", p.id), zap.String("backend", be.Name), zap.Error(err))
		}
		return gjson.Result{}, "", false
	}
	status := resp.StatusCode()
	if status >= 500 {
		be.ReportFailure()
		return gjson.Result{}, "", false
	}
	be.ReportSuccess(time.Since(started))
	switch {
	case status == fasthttp.StatusNotFound:
		return gjson.Result{}, "backend " + be.Name + " no longer holds background response " + p.id +
			" (deleted before it finished): its usage is not known", true
	case status < 200 || status > 299:
		return gjson.Result{}, "", false
	}
	// A copy: resp's body goes back to the pool.
	v := gjson.Parse(string(resp.Body()))
	if !terminalStatus(v.Get("status").Str) {
		return gjson.Result{}, "", false
	}
	return v, "", true
}

// backendNamed is the backend of st named name, or nil.
func backendNamed(st *state, name string) *backends.Backend {
	for _, rt := range st.reg.Routes() {
		for _, b := range rt.Backends() {
			if b.Name == name {
				return b
			}
		}
	}
	return nil
}

// stopBackground stops the poller, and records the responses still
// pending with no usage: the gateway will not learn it.
func (s *Server) stopBackground() {
	b := s.background
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return
	}
	b.stopped = true
	running := b.running
	b.mu.Unlock()
	if running {
		close(b.stop)
		<-b.done
	}
	b.mu.Lock()
	left := make([]*pendingResponse, 0, len(b.pending))
	for id, p := range b.pending {
		left = append(left, p)
		delete(b.pending, id)
	}
	b.mu.Unlock()
	for _, p := range left {
		s.endBackground(p, gjson.Result{}, "the gateway stopped before background response "+p.id+" finished: its usage is not known")
	}
}

// settleBeforeDelete asks the backend once more about the pending response
// id, which a client is about to delete, and settles it if it finished:
// after the delete, its usage can no longer be learned.
func (s *Server) settleBeforeDelete(id string) {
	b := s.background
	b.mu.Lock()
	p := b.pending[id]
	b.mu.Unlock()
	if p == nil {
		return
	}
	if reply, problem, over := s.pollOne(p); over {
		if q := b.take(id); q != nil {
			s.endBackground(q, reply, problem)
		}
	}
}
