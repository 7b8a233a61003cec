package accounting

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *fakeClock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

var (
	acme    = Subject{Team: "acme", Project: "chatbot", Key: "k1"}
	acmeK2  = Subject{Team: "acme", Project: "chatbot", Key: "k2"}
	acmeOps = Subject{Team: "acme", Project: "ops", Key: "k1"}
	beta    = Subject{Team: "beta", Project: "inference", Key: "k3"}
)

// mustReserve reserves and fails the test on refusal.
func mustReserve(t *testing.T, l *Limiter, s Subject, est int64) Reservation {
	t.Helper()
	r, err := l.Reserve(s, est)
	if err != nil {
		t.Fatalf("Reserve(%v, %d) = %v, want admitted", s, est, err)
	}
	return r
}

// wantRefused checks that Reserve refuses with code and Retry-After.
func wantRefused(t *testing.T, l *Limiter, s Subject, est int64, code string, retryAfter time.Duration) *LimitError {
	t.Helper()
	r, err := l.Reserve(s, est)
	var le *LimitError
	if !errors.As(err, &le) {
		l.Settle(r, 0)
		t.Fatalf("Reserve(%v, %d) = %v, want a *LimitError", s, est, err)
	}
	if le.Code != code {
		t.Errorf("code = %q, want %q (message %q)", le.Code, code, le.Message)
	}
	if le.RetryAfter != retryAfter {
		t.Errorf("RetryAfter = %v, want %v", le.RetryAfter, retryAfter)
	}
	return le
}

func TestLimiterRequestsPerMinute(t *testing.T) {
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 30, 0, time.UTC))
	l := NewLimiter([]config.Limit{{Team: "acme", RPM: 2}}, clock.Now)

	l.Settle(mustReserve(t, l, acme, 10), 10)
	l.Settle(mustReserve(t, l, acmeOps, 10), 10)
	le := wantRefused(t, l, acme, 10, CodeRateLimitExceeded, 30*time.Second)
	if !strings.Contains(le.Message, `team "acme"`) || !strings.Contains(le.Message, "2 requests per minute") {
		t.Errorf("message %q does not say which limit", le.Message)
	}
	mustReserve(t, l, beta, 10) // Not selected by the limit.

	clock.Advance(29*time.Second + 500*time.Millisecond)
	wantRefused(t, l, acme, 10, CodeRateLimitExceeded, time.Second)
	clock.Advance(500 * time.Millisecond) // 12:01:00, a new window.
	mustReserve(t, l, acme, 10)
}

func TestLimiterTokensPerMinute(t *testing.T) {
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	l := NewLimiter([]config.Limit{{TPM: 100}}, clock.Now)

	r1 := mustReserve(t, l, acme, 60)
	wantRefused(t, l, beta, 60, CodeRateLimitExceeded, time.Minute) // 60 + 60 > 100
	l.Settle(r1, 20)                                                // Now 20 counted, not 60.
	r2 := mustReserve(t, l, beta, 60)                               // 80
	wantRefused(t, l, acme, 30, CodeRateLimitExceeded, time.Minute) // 110 > 100
	l.Settle(r2, 90)                                                // 110: settled counts are real, even over the limit.
	wantRefused(t, l, acme, 0, CodeRateLimitExceeded, time.Minute)

	le := wantRefused(t, l, acme, 150, CodeRateLimitExceeded, time.Minute)
	if !strings.Contains(le.Message, "too large") {
		t.Errorf("message %q does not say the request is too large", le.Message)
	}

	clock.Advance(time.Minute)
	r3 := mustReserve(t, l, acme, 100)
	clock.Advance(time.Minute)
	mustReserve(t, l, acme, 50)
	// Settling a reservation of the past minute corrects nothing in this one.
	l.Settle(r3, 0)
	wantRefused(t, l, acme, 60, CodeRateLimitExceeded, time.Minute)
}

func TestLimiterBudgetWindows(t *testing.T) {
	start := time.Date(2025, 1, 31, 18, 0, 0, 0, time.UTC)
	tests := []struct {
		window string
		// retry is the Retry-After when the budget is spent at start.
		retry time.Duration
		// stillSpent and renewed are times after start when the budget is
		// still spent, and renewed.
		stillSpent, renewed time.Duration
	}{
		{window: "day", retry: 6 * time.Hour, stillSpent: 5*time.Hour + 59*time.Minute, renewed: 6 * time.Hour},
		{window: "month", retry: 6 * time.Hour, stillSpent: 5 * time.Hour, renewed: 6 * time.Hour},
		{window: "", retry: 6 * time.Hour, stillSpent: 5 * time.Hour, renewed: 6 * time.Hour},
	}
	for _, tt := range tests {
		t.Run("window="+tt.window, func(t *testing.T) {
			clock := newClock(start)
			l := NewLimiter([]config.Limit{{Team: "acme", TokenBudget: 1000, BudgetWindow: tt.window}}, clock.Now)
			l.Settle(mustReserve(t, l, acme, 600), 700)
			r := mustReserve(t, l, acmeK2, 300) // 700 + 300 fits exactly.
			le := wantRefused(t, l, acme, 1, CodeInsufficientQuota, tt.retry)
			if !strings.Contains(le.Message, "1000 of 1000") {
				t.Errorf("message %q does not give the spend", le.Message)
			}
			l.Settle(r, 100) // 800 spent: 200 left.
			l.Settle(mustReserve(t, l, acme, 200), 200)
			wantRefused(t, l, acme, 1, CodeInsufficientQuota, tt.retry)

			clock.Set(start.Add(tt.stillSpent))
			wantRefused(t, l, acme, 1, CodeInsufficientQuota, tt.retry-tt.stillSpent)
			clock.Set(start.Add(tt.renewed))
			mustReserve(t, l, acme, 1000)
		})
	}

	t.Run("month outlives a day", func(t *testing.T) {
		clock := newClock(time.Date(2025, 2, 10, 0, 0, 0, 0, time.UTC))
		l := NewLimiter([]config.Limit{{Team: "acme", TokenBudget: 100, BudgetWindow: "month"}}, clock.Now)
		l.Settle(mustReserve(t, l, acme, 100), 100)
		clock.Advance(24 * time.Hour)
		wantRefused(t, l, acme, 1, CodeInsufficientQuota, 18*24*time.Hour) // until March 1st
		clock.Set(time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC))
		mustReserve(t, l, acme, 100)
	})
}

func TestLimiterSelectors(t *testing.T) {
	// Each step reserves 60 tokens against a budget of 100 and settles them.
	tests := []struct {
		name  string
		limit config.Limit
		steps []Subject
		want  []bool // admitted
	}{
		{
			name:  "zero team counts all teams together",
			limit: config.Limit{TokenBudget: 100},
			steps: []Subject{acme, beta},
			want:  []bool{true, false},
		},
		{
			name:  "star team gives every team its own budget",
			limit: config.Limit{Team: "*", TokenBudget: 100},
			steps: []Subject{acme, beta, acmeOps, beta},
			want:  []bool{true, true, false, false},
		},
		{
			name:  "named team selects only that team",
			limit: config.Limit{Team: "acme", TokenBudget: 100},
			steps: []Subject{acme, beta, beta, acmeK2},
			want:  []bool{true, true, true, false},
		},
		{
			name:  "star project within a team",
			limit: config.Limit{Team: "acme", Project: "*", TokenBudget: 100},
			steps: []Subject{acme, acmeOps, acmeK2, beta, beta},
			want:  []bool{true, true, false, true, true},
		},
		{
			name:  "star key",
			limit: config.Limit{Key: "*", TokenBudget: 100},
			steps: []Subject{acme, acmeK2, acmeOps, beta},
			want:  []bool{true, true, false, true},
		},
		{
			name:  "named key",
			limit: config.Limit{Key: "k2", TokenBudget: 100},
			steps: []Subject{acmeK2, acme, acmeK2},
			want:  []bool{true, true, false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLimiter([]config.Limit{tt.limit}, newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)).Now)
			for i, s := range tt.steps {
				r, err := l.Reserve(s, 60)
				if got := err == nil; got != tt.want[i] {
					t.Fatalf("step %d %v: admitted = %v (%v), want %v", i, s, got, err, tt.want[i])
				}
				l.Settle(r, 60)
			}
		})
	}
}

func TestLimiterReserveIsAllOrNothing(t *testing.T) {
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	l := NewLimiter([]config.Limit{
		{Team: "acme", RPM: 1},
		{Team: "acme", Project: "chatbot", TokenBudget: 50},
	}, clock.Now)
	// The budget refuses; the rate limit must not have counted the request.
	wantRefused(t, l, acme, 60, CodeInsufficientQuota, 17*24*time.Hour+12*time.Hour)
	mustReserve(t, l, acmeOps, 60)
	wantRefused(t, l, acmeOps, 0, CodeRateLimitExceeded, time.Minute)
}

func TestLimiterSettleZeroReservation(t *testing.T) {
	l := NewLimiter(nil, nil)
	r, err := l.Reserve(acme, 100)
	if err != nil {
		t.Fatal(err)
	}
	l.Settle(r, 100)
	l.Settle(Reservation{}, 5)
}

func TestLimiterConcurrentBudgetNeverOverruns(t *testing.T) {
	const (
		goroutines = 100
		attempts   = 20
		estimate   = 10
		budget     = 5000 // a quarter of what the goroutines ask for
	)
	tests := []struct {
		name string
		used func(i int) int64
		// overrun is the most the total may exceed the budget by: what the
		// requests in flight use beyond their reservations.
		overrun int64
	}{
		{name: "used equals estimate", used: func(int) int64 { return estimate }},
		{name: "used below estimate", used: func(i int) int64 { return int64(i % (estimate + 1)) }},
		{name: "used above estimate", used: func(i int) int64 { return estimate + int64(i%3) }, overrun: goroutines * 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
			l := NewLimiter([]config.Limit{{Team: "*", TokenBudget: budget, BudgetWindow: "day"}}, clock.Now)
			var total, admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range attempts {
						r, err := l.Reserve(acme, estimate)
						if err != nil {
							continue
						}
						used := tt.used(g*attempts + i)
						admitted.Add(1)
						total.Add(used)
						l.Settle(r, used)
					}
				})
			}
			wg.Wait()
			if total.Load() > budget+tt.overrun {
				t.Errorf("used %d tokens in %d requests, budget %d + in-flight overrun %d", total.Load(), admitted.Load(), budget, tt.overrun)
			}
			if tt.overrun == 0 && total.Load() == budget {
				// Exactly spent: nothing more may be admitted.
				if _, err := l.Reserve(acme, 1); err == nil {
					t.Error("admitted a request past a spent budget")
				}
			}
			if admitted.Load() < budget/estimate/2 {
				t.Errorf("admitted only %d requests", admitted.Load())
			}
		})
	}
}

type fakeLimitsStore struct {
	rows   []SpentRow
	err    error
	sinces []time.Time
}

func (s *fakeLimitsStore) SpentTokens(ctx context.Context, since time.Time) ([]SpentRow, error) {
	s.sinces = append(s.sinces, since)
	var out []SpentRow
	// The fake pretends rows older than the day started today belong to
	// the month only.
	for _, r := range s.rows {
		if since.Day() == 1 || r.Subject.Project != "old" {
			out = append(out, r)
		}
	}
	return out, s.err
}

func TestLimiterRestore(t *testing.T) {
	now := time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)
	st := &fakeLimitsStore{rows: []SpentRow{
		{Subject: acme, Tokens: 400},
		{Subject: acmeK2, Tokens: 300},
		{Subject: Subject{Team: "acme", Project: "old", Key: "k1"}, Tokens: 250}, // earlier this month
		{Subject: beta, Tokens: 900},
	}}
	l := NewLimiter([]config.Limit{
		{Team: "*", TokenBudget: 1000, BudgetWindow: "day"},
		{Team: "acme", TokenBudget: 1000, BudgetWindow: "month"},
		{Key: "k3", RPM: 10}, // no budget: nothing to restore
	}, newClock(now).Now)
	if err := l.Restore(context.Background(), st); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	wantSinces := []time.Time{
		time.Date(2025, 3, 14, 0, 0, 0, 0, time.UTC),
		time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC),
	}
	if len(st.sinces) != 2 || !st.sinces[0].Equal(wantSinces[0]) || !st.sinces[1].Equal(wantSinces[1]) {
		t.Errorf("SpentTokens since %v, want %v", st.sinces, wantSinces)
	}
	// acme: 700 today against the daily budget, 950 this month.
	wantRefused(t, l, acme, 51, CodeInsufficientQuota, 17*24*time.Hour+12*time.Hour) // the month's budget, ending April 1st
	r := mustReserve(t, l, acme, 50)
	l.Settle(r, 50)
	// beta: 900 today.
	wantRefused(t, l, beta, 101, CodeInsufficientQuota, 12*time.Hour)
	mustReserve(t, l, beta, 100)

	t.Run("store error", func(t *testing.T) {
		l := NewLimiter([]config.Limit{{TokenBudget: 1}}, nil)
		err := l.Restore(context.Background(), &fakeLimitsStore{err: errors.New("boom")})
		if err == nil || !strings.Contains(err.Error(), "restore budgets: boom") {
			t.Errorf("Restore = %v, want the store's error wrapped", err)
		}
	})
}

func TestLimiterSweepsIdlePerValueCounters(t *testing.T) {
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	l := NewLimiter([]config.Limit{{Project: "*", RPM: 5}}, clock.Now)
	lr := &l.rules[0]
	held := mustReserve(t, l, Subject{Team: "t", Project: "held"}, 1)
	// With "held", the map reaches minSweep counters, the size at which the
	// next new counter sweeps.
	for i := range minSweep - 1 {
		l.Settle(mustReserve(t, l, Subject{Team: "t", Project: fmt.Sprint("p", i)}, 1), 1)
	}
	clock.Advance(time.Minute)
	l.Settle(mustReserve(t, l, Subject{Team: "t", Project: "new"}, 1), 1)
	lr.mu.RLock()
	n := len(lr.counters)
	_, heldKept := lr.counters[Subject{Project: "held"}]
	lr.mu.RUnlock()
	if n != 2 {
		t.Errorf("%d counters kept after the minute ended, want 2 (held and new)", n)
	}
	if !heldKept {
		t.Error("the counter of a reservation in flight was swept")
	}
	l.Settle(held, 1)
}

func TestLimiterFastPathDoesNotAllocate(t *testing.T) {
	tests := []struct {
		name   string
		limits []config.Limit
	}{
		{name: "no limits"},
		{name: "no limit selects the subject", limits: []config.Limit{{Team: "other", RPM: 1}}},
		{name: "one shared limit", limits: []config.Limit{{TPM: 1 << 40, TokenBudget: 1 << 40}}},
		{name: "one per-team limit", limits: []config.Limit{{Team: "*", TokenBudget: 1 << 40}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLimiter(tt.limits, nil)
			allocs := testing.AllocsPerRun(100, func() {
				r, err := l.Reserve(acme, 10)
				if err != nil {
					t.Fatal(err)
				}
				l.Settle(r, 10)
			})
			if allocs != 0 {
				t.Errorf("allocs per Reserve+Settle = %v, want 0", allocs)
			}
		})
	}
}

// BenchmarkLimiter measures Reserve plus Settle, the limiter's cost per
// request, with no limit, one shared limit and one per-team limit.
func BenchmarkLimiter(b *testing.B) {
	for _, bc := range []struct {
		name   string
		limits []config.Limit
	}{
		{name: "none"},
		{name: "shared", limits: []config.Limit{{RPM: 1 << 40, TPM: 1 << 40, TokenBudget: 1 << 40}}},
		{name: "per-team", limits: []config.Limit{{Team: "*", RPM: 1 << 40, TokenBudget: 1 << 40}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := NewLimiter(bc.limits, nil)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r, err := l.Reserve(acme, 1000)
					if err != nil {
						b.Error(err)
						return
					}
					l.Settle(r, 900)
				}
			})
		})
	}
}
