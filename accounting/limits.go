package accounting

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

// Error codes of a refused reservation, as OpenAI clients expect them with
// status 429.
const (
	CodeRateLimitExceeded = "rate_limit_exceeded"
	CodeInsufficientQuota = "insufficient_quota"
)

// LimitsStore is what the Limiter needs at start, to restore budget spend.
type LimitsStore interface {
	// SpentTokens sums the total tokens of the records started at or after
	// since, grouped by team, project and key.
	SpentTokens(ctx context.Context, since time.Time) ([]SpentRow, error)
}

// SpentRow is the total tokens one subject used since some time.
type SpentRow struct {
	Subject Subject
	Tokens  int64
}

// LimitError is a refused reservation: the proxy answers it with 429, the
// Code as the OpenAI error code and RetryAfter as the Retry-After header.
type LimitError struct {
	// Code is CodeRateLimitExceeded or CodeInsufficientQuota.
	Code string
	// Message is safe to show the client.
	Message string
	// RetryAfter is when the window that refused the request ends, rounded
	// up to whole seconds.
	RetryAfter time.Duration
	// Kind is the cap that refused: RefusedRPM, RefusedTPM or
	// RefusedBudget, the label of the refusal metric.
	Kind string
}

// The kinds of LimitError.
const (
	RefusedRPM    = "rpm"
	RefusedTPM    = "tpm"
	RefusedBudget = "budget"
)

func (e *LimitError) Error() string { return e.Message }

// Reservation is what Reserve counted for one request; pass it to Settle
// exactly once. The zero Reservation (no limit selected the request) settles
// to nothing.
type Reservation struct {
	l        *Limiter
	subject  Subject
	estimate int64
	// The windows the reservation was counted in: a correction at Settle
	// applies only while its window is still a counter's current one.
	minute, day, month int64
	// keys are the Redis token counters a RedisLimiter reservation
	// corrects at Settle; their names hold the windows they count.
	keys []string
}

// Limiter enforces the configured rate limits and token budgets.
//
// Requests per minute and tokens per minute are counted in fixed windows of
// one UTC calendar minute: cheap, exact to reason about, and Retry-After is
// simply the end of the minute. The price is that a client may burst up to
// twice the limit across a minute boundary, which a sliding window would
// smooth; for a gateway in front of GPU backends that bound is acceptable.
//
// Budgets count tokens per UTC calendar day or month. A request reserves its
// estimate against every limit that selects it, all or nothing, before it is
// forwarded; Settle replaces the estimate with the tokens used. Admission
// requires the settled spend plus the reservations in flight plus the new
// estimate to fit, so concurrent requests cannot overrun a budget except by
// what requests use beyond their own estimates.
//
// Tokens belong to the window their request was reserved in, as the store
// files a record under its start time (which is what Restore sums): a
// request settled after its window ended corrects nothing.
type Limiter struct {
	rules []limitRule
	now   func() time.Time
}

// limitRule is one configured limit and its counters.
type limitRule struct {
	team, project, key string // "" counts all together, "*" each value, else exact
	rpm, tpm, budget   int64
	monthly            bool
	perValue           bool // some selector is "*": one counter per distinct value

	single *counter // the only counter, when !perValue

	mu       sync.RWMutex
	counters map[Subject]*counter // when perValue, by the "*" fields of the subject
	sweepAt  int                  // map size at which idle counters are swept
}

// counter holds one limit's counts for one selected subject.
type counter struct {
	rule *limitRule

	mu       sync.Mutex
	minute   int64 // start of the current minute window, unix nanoseconds
	requests int64
	tokens   int64
	window   int64 // start of the current budget window, unix nanoseconds
	spent    int64 // settled tokens plus estimates in flight

	// pins counts lookups and reservations in flight; a per-value counter
	// is evicted only when it has none, so that no reservation is made on
	// or settled against a counter no longer in the map.
	pins atomic.Int32
}

// minSweep is the per-value counter map size below which idle counters are
// not swept.
const minSweep = 1024

// NewLimiter builds a Limiter from the configured limits; entries that cap
// nothing are ignored. now is the clock (nil means time.Now).
func NewLimiter(limits []config.Limit, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	l := &Limiter{now: now}
	for _, cl := range limits {
		if cl.RPM <= 0 && cl.TPM <= 0 && cl.TokenBudget <= 0 {
			continue
		}
		l.rules = append(l.rules, limitRule{
			team:    cl.Team,
			project: cl.Project,
			key:     cl.Key,
			rpm:     max(cl.RPM, 0),
			tpm:     max(cl.TPM, 0),
			budget:  max(cl.TokenBudget, 0),
			// Config validation refuses other values; month is the default.
			monthly:  cl.BudgetWindow != "day",
			perValue: cl.Team == "*" || cl.Project == "*" || cl.Key == "*",
		})
	}
	for i := range l.rules {
		lr := &l.rules[i]
		if lr.perValue {
			lr.counters = make(map[Subject]*counter)
			lr.sweepAt = minSweep
		} else {
			lr.single = &counter{rule: lr}
		}
	}
	return l
}

// Restore loads the tokens spent in the current budget windows from st, so
// that budgets survive a restart. Call it once, before serving: it replaces
// the spend of the counters it restores.
func (l *Limiter) Restore(ctx context.Context, st LimitsStore) error {
	return l.restore(ctx, st, false)
}

// restore loads the tokens spent in the current budget windows from st.
// With keepHigher, a counter already in the current window keeps its spend
// if that is higher (it holds reservations in flight and records not yet
// written); otherwise the store's spend replaces it.
func (l *Limiter) restore(ctx context.Context, st LimitsStore, keepHigher bool) error {
	w := windowsAt(l.now())
	for _, monthly := range []bool{false, true} {
		if !l.hasBudget(monthly) {
			continue
		}
		start := w.day
		if monthly {
			start = w.month
		}
		rows, err := st.SpentTokens(ctx, time.Unix(0, start).UTC())
		if err != nil {
			return fmt.Errorf("restore budgets: %w", err)
		}
		// Rows are per team, project and key; a counter may gather several.
		spent := make(map[*counter]int64)
		for _, row := range rows {
			for i := range l.rules {
				lr := &l.rules[i]
				if lr.budget == 0 || lr.monthly != monthly || !lr.selects(row.Subject) {
					continue
				}
				c := lr.counterFor(row.Subject, l.now)
				spent[c] = AddTokens(spent[c], max(row.Tokens, 0))
				lr.unpin(c)
			}
		}
		for c, n := range spent {
			c.mu.Lock()
			switch {
			case keepHigher && c.window == start:
				c.spent = max(c.spent, n)
			case !keepHigher || c.window < start:
				c.window = start
				c.spent = n
			}
			c.mu.Unlock()
		}
	}
	return nil
}

func (l *Limiter) hasBudget(monthly bool) bool {
	for i := range l.rules {
		if l.rules[i].budget > 0 && l.rules[i].monthly == monthly {
			return true
		}
	}
	return false
}

// maxStackRules is how many limits selecting one request Reserve tracks
// without allocating.
const maxStackRules = 8

// Reserve counts a request and reserves estimate tokens against every limit
// that selects s, all or nothing. On refusal it returns a *LimitError and
// counts nothing.
func (l *Limiter) Reserve(s Subject, estimate int64) (Reservation, error) {
	if len(l.rules) == 0 {
		return Reservation{}, nil
	}
	estimate = max(estimate, 0)
	var buf [maxStackRules]*counter
	cs := buf[:0]
	for i := range l.rules {
		if lr := &l.rules[i]; lr.selects(s) {
			cs = append(cs, lr.counterFor(s, l.now))
		}
	}
	if len(cs) == 0 {
		return Reservation{}, nil
	}
	// Counters are locked in rule order, the one order every caller uses,
	// and the clock is read under the locks, so that each counter sees time
	// move forward only.
	for _, c := range cs {
		c.mu.Lock()
	}
	w := windowsAt(l.now())
	var err error
	for _, c := range cs {
		c.roll(w)
		if err == nil {
			err = c.check(s, estimate, w)
		}
	}
	if err == nil {
		for _, c := range cs {
			c.requests++
			c.tokens += estimate
			c.spent = AddTokens(c.spent, estimate) // restored spend may be near the int64 bound
		}
	}
	for _, c := range cs {
		c.mu.Unlock()
	}
	if err != nil {
		for _, c := range cs {
			c.rule.unpin(c)
		}
		return Reservation{}, err
	}
	return Reservation{l: l, subject: s, estimate: estimate, minute: w.minute, day: w.day, month: w.month}, nil
}

// Settle replaces the reservation's estimate with the tokens actually used
// (0 when the request failed before using any).
func (l *Limiter) Settle(r Reservation, used int64) {
	if r.l == nil {
		return
	}
	delta := max(used, 0) - r.estimate
	for i := range l.rules {
		lr := &l.rules[i]
		if !lr.selects(r.subject) {
			continue
		}
		c := lr.pinned(r.subject)
		if c == nil {
			continue // unreachable: the reservation pins its counters
		}
		c.mu.Lock()
		if c.minute == r.minute {
			c.tokens = max(c.tokens+delta, 0)
		}
		if c.window == lr.windowOf(r.day, r.month) {
			c.spent = max(AddTokens(c.spent, delta), 0)
		}
		c.mu.Unlock()
		lr.unpin(c)
	}
}

// selects reports whether the rule counts requests of s.
func (lr *limitRule) selects(s Subject) bool {
	return matches(lr.team, s.Team) && matches(lr.project, s.Project) && matches(lr.key, s.Key)
}

func matches(sel, v string) bool { return sel == "" || sel == "*" || sel == v }

// keyOf is the counter key of s: its values for the "*" selectors.
func (lr *limitRule) keyOf(s Subject) Subject {
	var k Subject
	if lr.team == "*" {
		k.Team = s.Team
	}
	if lr.project == "*" {
		k.Project = s.Project
	}
	if lr.key == "*" {
		k.Key = s.Key
	}
	return k
}

// counterFor returns, pinned, the counter of s, creating it if needed. now
// is read only to sweep idle counters when the map has grown.
func (lr *limitRule) counterFor(s Subject, now func() time.Time) *counter {
	if !lr.perValue {
		return lr.single
	}
	k := lr.keyOf(s)
	lr.mu.RLock()
	c := lr.counters[k]
	if c != nil {
		c.pins.Add(1)
	}
	lr.mu.RUnlock()
	if c != nil {
		return c
	}
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if c = lr.counters[k]; c == nil {
		if len(lr.counters) >= lr.sweepAt {
			lr.sweep(windowsAt(now()))
			lr.sweepAt = max(minSweep, 2*len(lr.counters))
		}
		c = &counter{rule: lr}
		lr.counters[k] = c
	}
	c.pins.Add(1)
	return c
}

// pinned returns the counter of s, which a reservation keeps pinned.
func (lr *limitRule) pinned(s Subject) *counter {
	if !lr.perValue {
		return lr.single
	}
	lr.mu.RLock()
	c := lr.counters[lr.keyOf(s)]
	lr.mu.RUnlock()
	return c
}

func (lr *limitRule) unpin(c *counter) {
	if lr.perValue {
		c.pins.Add(-1)
	}
}

// sweep deletes the counters that hold nothing worth keeping, so that "*"
// limits over many distinct values (projects are free-form) do not grow
// without bound. The caller holds lr.mu; no lookup is in progress, and a
// counter with no pins has no reservation in flight.
func (lr *limitRule) sweep(w windows) {
	budgetStart := lr.windowOf(w.day, w.month)
	for k, c := range lr.counters {
		if c.pins.Load() != 0 {
			continue
		}
		c.mu.Lock()
		idle := (c.minute < w.minute || c.requests == 0 && c.tokens == 0) &&
			(lr.budget == 0 || c.window < budgetStart || c.spent == 0)
		c.mu.Unlock()
		if idle {
			delete(lr.counters, k)
		}
	}
}

// windowOf picks the rule's budget window among the day and month starts.
func (lr *limitRule) windowOf(day, month int64) int64 {
	if lr.monthly {
		return month
	}
	return day
}

// roll moves the counter to the current windows. Windows only move
// forward, so that a wall clock stepping back does not reset a budget.
func (c *counter) roll(w windows) {
	if w.minute > c.minute {
		c.minute, c.requests, c.tokens = w.minute, 0, 0
	}
	if start := c.rule.windowOf(w.day, w.month); start > c.window {
		c.window, c.spent = start, 0
	}
}

// check refuses the request if counting it would exceed the rule. The
// caller holds c.mu and has rolled c to w.
func (c *counter) check(s Subject, estimate int64, w windows) error {
	lr := c.rule
	switch {
	case lr.rpm > 0 && c.requests+1 > lr.rpm:
		return lr.refusal(s, capRPM, c.requests, estimate, c.minute, w.now)
	case lr.tpm > 0 && c.tokens+estimate > lr.tpm:
		return lr.refusal(s, capTPM, c.tokens, estimate, c.minute, w.now)
	case lr.budget > 0 && c.spent > lr.budget-estimate: // c.spent+estimate could overflow
		return lr.refusal(s, capBudget, c.spent, estimate, c.window, w.now)
	}
	return nil
}

// limitCap names one of the caps a rule may set.
type limitCap int8

const (
	capRPM    limitCap = iota // requests per minute
	capTPM                    // tokens per minute
	capBudget                 // tokens per budget window
)

// refusal is the error for a request of s refused by the rule's cap: count
// is what the window starting at start (unix nanoseconds) already holds,
// before the request. Both limiters build their errors here, so that
// clients see the same messages whichever counts.
func (lr *limitRule) refusal(s Subject, cp limitCap, count, estimate, start, now int64) *LimitError {
	switch cp {
	case capRPM:
		return &LimitError{
			Code:       CodeRateLimitExceeded,
			Message:    fmt.Sprintf("Rate limit reached for %s: %d requests per minute. Retry after the current minute.", lr.describe(s), lr.rpm),
			RetryAfter: retryAfter(start+int64(time.Minute), now),
			Kind:       RefusedRPM,
		}
	case capTPM:
		msg := fmt.Sprintf("Rate limit reached for %s: %d tokens per minute, %d used, this request may use up to %d.", lr.describe(s), lr.tpm, count, estimate)
		if estimate > lr.tpm {
			msg = fmt.Sprintf("Request too large for %s: it may use up to %d tokens, more than the limit of %d tokens per minute. Lower max_tokens.", lr.describe(s), estimate, lr.tpm)
		}
		return &LimitError{
			Code:       CodeRateLimitExceeded,
			Message:    msg,
			RetryAfter: retryAfter(start+int64(time.Minute), now),
			Kind:       RefusedTPM,
		}
	default:
		period := "day"
		if lr.monthly {
			period = "month"
		}
		return &LimitError{
			Code: CodeInsufficientQuota,
			Message: fmt.Sprintf("Token budget exhausted for %s: %d of %d tokens used or reserved this %s (UTC), this request may use up to %d.",
				lr.describe(s), count, lr.budget, period, estimate),
			RetryAfter: retryAfter(lr.budgetEnd(start), now),
			Kind:       RefusedBudget,
		}
	}
}

// budgetEnd is the end of the rule's budget window starting at start, both
// in unix nanoseconds.
func (lr *limitRule) budgetEnd(start int64) int64 {
	if lr.monthly {
		return time.Unix(0, start).UTC().AddDate(0, 1, 0).UnixNano()
	}
	return start + int64(24*time.Hour)
}

// describe names what the rule counts s under, for error messages.
func (lr *limitRule) describe(s Subject) string {
	var parts []string
	add := func(what, sel, v string) {
		switch sel {
		case "":
		case "*":
			parts = append(parts, fmt.Sprintf("%s %q", what, v))
		default:
			parts = append(parts, fmt.Sprintf("%s %q", what, sel))
		}
	}
	add("team", lr.team, s.Team)
	add("project", lr.project, s.Project)
	add("key", lr.key, s.Key)
	if len(parts) == 0 {
		return "all requests"
	}
	return strings.Join(parts, ", ")
}

// retryAfter is the time from now to end, rounded up to whole seconds (as
// Retry-After carries them) and at least one second.
func retryAfter(end, now int64) time.Duration {
	d := time.Duration(end - now)
	if d <= time.Second {
		return time.Second
	}
	return (d + time.Second - 1).Truncate(time.Second)
}

// windows are the starts, in unix nanoseconds, of the UTC minute, day and
// month containing now.
type windows struct {
	now, minute, day, month int64
}

func windowsAt(t time.Time) windows {
	t = t.UTC()
	y, m, d := t.Date()
	return windows{
		now:    t.UnixNano(),
		minute: t.Truncate(time.Minute).UnixNano(),
		day:    time.Date(y, m, d, 0, 0, 0, 0, time.UTC).UnixNano(),
		month:  time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).UnixNano(),
	}
}

// Derive returns a limiter enforcing limits that starts from l's counts:
// a rule counting the same selection in the same windows as one of l's
// takes over its counters' windows and counts, so that changing one limit
// does not reset the others. Reservations made on l are still settled on
// l: their estimates stay counted in the new limiter until its windows
// roll over, which errs towards refusing. Per-value ("*") rules start
// afresh.
func (l *Limiter) Derive(limits []config.Limit) *Limiter {
	n := NewLimiter(limits, l.now)
	for i := range n.rules {
		nr := &n.rules[i]
		if nr.perValue {
			continue
		}
		for j := range l.rules {
			or := &l.rules[j]
			if or.perValue || or.team != nr.team || or.project != nr.project || or.key != nr.key || or.monthly != nr.monthly {
				continue
			}
			or.single.mu.Lock()
			c := nr.single
			c.minute, c.requests, c.tokens, c.window, c.spent = or.single.minute, or.single.requests, or.single.tokens, or.single.window, or.single.spent
			or.single.mu.Unlock()
			break
		}
	}
	return n
}

// Reseed raises the budget counters of the current windows to the spend
// st holds, keeping a counter's own count where it is higher (it holds
// reservations in flight and records not yet written). Unlike Restore it
// may be called while serving.
func (l *Limiter) Reseed(ctx context.Context, st LimitsStore) error {
	return l.restore(ctx, st, true)
}
