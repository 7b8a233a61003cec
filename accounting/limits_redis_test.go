package accounting

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate-dev/tollgate/config"
)

// redisTestAddr is the Redis the tests run against, or skips the test.
func redisTestAddr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv("TOLLGATE_TEST_REDIS_ADDR")
	if addr == "" {
		t.Skip("TOLLGATE_TEST_REDIS_ADDR is not set: skipping the tests against Redis (set it to a Redis to run them, e.g. 127.0.0.1:6379)")
	}
	return addr
}

// redisTestPrefixes makes each test's key prefix unique, across tests and
// across runs sharing one Redis.
var redisTestPrefixes atomic.Int64

// redisTestPrefix returns a key prefix of the test's own, and deletes its
// keys when the test ends.
func redisTestPrefix(t testing.TB, addr string) string {
	t.Helper()
	prefix := fmt.Sprintf("tollgate-test:%d-%d-%d:", os.Getpid(), time.Now().UnixNano(), redisTestPrefixes.Add(1))
	admin := redisTestClient(t, addr)
	t.Cleanup(func() {
		ctx := context.Background()
		keys, err := admin.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Errorf("list test keys: %v", err)
			return
		}
		if len(keys) > 0 {
			if err := admin.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("delete test keys: %v", err)
			}
		}
	})
	return prefix
}

// redisTestClient is a client for the test to inspect Redis with.
func redisTestClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// redisTestBackend is the backend configuration of the tests. Its timeout
// is generous, so that the race detector's slowness does not make the
// behavioural tests fall back; the fail-open tests shorten it.
func redisTestBackend(addr, prefix string) config.LimitsBackend {
	return config.LimitsBackend{Driver: "redis", Addr: addr, Prefix: prefix, Timeout: 2 * time.Second}
}

// newRedisTestLimiter builds a RedisLimiter closed when the test ends.
func newRedisTestLimiter(t testing.TB, limits []config.Limit, cfg config.LimitsBackend, now func() time.Time, log *zap.Logger, reg prometheus.Registerer) *RedisLimiter {
	t.Helper()
	l, err := NewRedisLimiter(limits, cfg, now, log, reg)
	if err != nil {
		t.Fatalf("NewRedisLimiter: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

// limiterUnderTest is what the conformance table drives, in both limiters.
type limiterUnderTest interface {
	Restore(ctx context.Context, st LimitsStore) error
	Reserve(s Subject, estimate int64) (Reservation, error)
	Settle(r Reservation, used int64)
}

var (
	_ limiterUnderTest = (*Limiter)(nil)
	_ limiterUnderTest = (*RedisLimiter)(nil)
)

// limiterKinds builds each limiter the conformance table runs against.
var limiterKinds = []struct {
	name string
	make func(t *testing.T, limits []config.Limit, now func() time.Time) limiterUnderTest
}{
	{name: "memory", make: func(t *testing.T, limits []config.Limit, now func() time.Time) limiterUnderTest {
		return NewLimiter(limits, now)
	}},
	{name: "redis", make: func(t *testing.T, limits []config.Limit, now func() time.Time) limiterUnderTest {
		addr := redisTestAddr(t)
		l := newRedisTestLimiter(t, limits, redisTestBackend(addr, redisTestPrefix(t, addr)), now, nil, nil)
		t.Cleanup(func() {
			if n := testutil.ToFloat64(l.redisErrors); n != 0 {
				t.Errorf("%v Redis errors: the test ran on local counters", n)
			}
		})
		return l
	}},
}

// limiterOp is one step of a conformance case.
type limiterOp struct {
	do string // reserve, refuse, settle or clock

	s   Subject
	est int64
	// name keeps an admitted reservation (reserve), or picks the one to
	// settle (settle); a reservation with no name is settled at once with
	// used.
	name string
	used int64

	code  string        // refuse: the error code
	retry time.Duration // refuse: Retry-After
	msg   string        // refuse: part of the message

	at time.Duration // clock: the time since the case's start
}

func reserveOp(s Subject, est, used int64) limiterOp {
	return limiterOp{do: "reserve", s: s, est: est, used: used}
}

func holdOp(name string, s Subject, est int64) limiterOp {
	return limiterOp{do: "reserve", s: s, est: est, name: name}
}

func settleOp(name string, used int64) limiterOp {
	return limiterOp{do: "settle", name: name, used: used}
}

func refuseOp(s Subject, est int64, code string, retry time.Duration, msg string) limiterOp {
	return limiterOp{do: "refuse", s: s, est: est, code: code, retry: retry, msg: msg}
}

func clockOp(at time.Duration) limiterOp { return limiterOp{do: "clock", at: at} }

// limiterCases are the behaviours both limiters must share.
var limiterCases = []struct {
	name   string
	start  time.Time
	limits []config.Limit
	store  *fakeLimitsStore // restored from first, when set
	ops    []limiterOp
}{
	{
		name:   "requests per minute",
		start:  time.Date(2025, 3, 14, 12, 0, 30, 0, time.UTC),
		limits: []config.Limit{{Team: "acme", RPM: 2}},
		ops: []limiterOp{
			reserveOp(acme, 10, 10),
			reserveOp(acmeOps, 10, 10),
			refuseOp(acme, 10, CodeRateLimitExceeded, 30*time.Second, `team "acme": 2 requests per minute`),
			reserveOp(beta, 10, 10), // Not selected.
			clockOp(29*time.Second + 500*time.Millisecond),
			refuseOp(acme, 10, CodeRateLimitExceeded, time.Second, ""),
			clockOp(30 * time.Second), // 12:01:00, a new window.
			reserveOp(acme, 10, 10),
		},
	},
	{
		name:   "tokens per minute with settle corrections",
		start:  time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC),
		limits: []config.Limit{{TPM: 100}},
		ops: []limiterOp{
			holdOp("r1", acme, 60),
			refuseOp(beta, 60, CodeRateLimitExceeded, time.Minute, "100 tokens per minute, 60 used"),
			settleOp("r1", 20),
			holdOp("r2", beta, 60), // 80
			refuseOp(acme, 30, CodeRateLimitExceeded, time.Minute, "80 used"),
			settleOp("r2", 90), // 110: settled counts are real, even over the limit.
			refuseOp(acme, 0, CodeRateLimitExceeded, time.Minute, "110 used"),
			refuseOp(acme, 150, CodeRateLimitExceeded, time.Minute, "too large"),
			clockOp(time.Minute),
			holdOp("r3", acme, 100),
			clockOp(2 * time.Minute),
			reserveOp(acme, 50, 50),
			// Settling a reservation of the past minute corrects nothing
			// in this one.
			settleOp("r3", 0),
			refuseOp(acme, 60, CodeRateLimitExceeded, time.Minute, "50 used"),
			// A negative count used is none.
			holdOp("r4", acme, 50), // 100
			settleOp("r4", -5),     // 50
			reserveOp(acme, 50, 50),
			refuseOp(acme, 1, CodeRateLimitExceeded, time.Minute, "100 used"),
		},
	},
	{
		name:   "daily budget",
		start:  time.Date(2025, 1, 31, 18, 0, 0, 0, time.UTC),
		limits: []config.Limit{{Team: "acme", TokenBudget: 1000, BudgetWindow: "day"}},
		ops:    budgetOps(5*time.Hour + 59*time.Minute),
	},
	{
		name:   "monthly budget",
		start:  time.Date(2025, 1, 31, 18, 0, 0, 0, time.UTC),
		limits: []config.Limit{{Team: "acme", TokenBudget: 1000, BudgetWindow: "month"}},
		ops:    budgetOps(5 * time.Hour),
	},
	{
		name:   "budget window defaults to the month",
		start:  time.Date(2025, 1, 31, 18, 0, 0, 0, time.UTC),
		limits: []config.Limit{{Team: "acme", TokenBudget: 1000}},
		ops:    budgetOps(5 * time.Hour),
	},
	{
		name:   "month outlives a day",
		start:  time.Date(2025, 2, 10, 0, 0, 0, 0, time.UTC),
		limits: []config.Limit{{Team: "acme", TokenBudget: 100, BudgetWindow: "month"}},
		ops: []limiterOp{
			reserveOp(acme, 100, 100),
			clockOp(24 * time.Hour),
			refuseOp(acme, 1, CodeInsufficientQuota, 18*24*time.Hour, "this month"),
			clockOp(19 * 24 * time.Hour), // March 1st.
			reserveOp(acme, 100, 100),
		},
	},
	{
		name:   "zero team counts all teams together",
		start:  time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC),
		limits: []config.Limit{{TokenBudget: 100}},
		ops: []limiterOp{
			reserveOp(acme, 60, 60),
			refuseOp(beta, 60, CodeInsufficientQuota, 17*24*time.Hour+12*time.Hour, "all requests"),
		},
	},
	{
		name:   "star team gives every team its own budget",
		start:  time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC),
		limits: []config.Limit{{Team: "*", TokenBudget: 100}},
		ops: []limiterOp{
			reserveOp(acme, 60, 60),
			reserveOp(beta, 60, 60),
			refuseOp(acmeOps, 60, CodeInsufficientQuota, 17*24*time.Hour+12*time.Hour, `team "acme"`),
			refuseOp(beta, 60, CodeInsufficientQuota, 17*24*time.Hour+12*time.Hour, `team "beta"`),
		},
	},
	{
		name:   "star project within a named team",
		start:  time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC),
		limits: []config.Limit{{Team: "acme", Project: "*", RPM: 1}},
		ops: []limiterOp{
			reserveOp(acme, 60, 60),
			reserveOp(acmeOps, 60, 60),
			refuseOp(acmeK2, 60, CodeRateLimitExceeded, time.Minute, `team "acme", project "chatbot"`),
			reserveOp(beta, 60, 60),
			reserveOp(beta, 60, 60),
		},
	},
	{
		name:   "star key and named key",
		start:  time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC),
		limits: []config.Limit{{Key: "*", TPM: 100}, {Key: "k2", TPM: 50}},
		ops: []limiterOp{
			reserveOp(acme, 60, 60),
			reserveOp(acmeK2, 40, 40),
			refuseOp(acmeK2, 20, CodeRateLimitExceeded, time.Minute, `key "k2": 50 tokens per minute, 40 used`),
			refuseOp(acmeOps, 60, CodeRateLimitExceeded, time.Minute, `key "k1": 100 tokens per minute, 60 used`),
			reserveOp(beta, 60, 60),
		},
	},
	{
		name:  "reserve is all or nothing",
		start: time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC),
		limits: []config.Limit{
			{Team: "acme", RPM: 1},
			{Team: "acme", Project: "chatbot", TokenBudget: 50},
		},
		ops: []limiterOp{
			// The budget refuses; the rate limit must not count the request.
			refuseOp(acme, 60, CodeInsufficientQuota, 17*24*time.Hour+12*time.Hour, `team "acme", project "chatbot"`),
			reserveOp(acmeOps, 60, 60),
			refuseOp(acmeOps, 0, CodeRateLimitExceeded, time.Minute, ""),
		},
	},
	{
		// Redis shares one counter between the two rules, which count the
		// same requests; the memory limiter keeps one each. Both must count
		// a request once in each limit.
		name:  "two limits on the same selection",
		start: time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC),
		limits: []config.Limit{
			{Team: "acme", RPM: 2},
			{Team: "*", RPM: 3, TPM: 100},
		},
		ops: []limiterOp{
			reserveOp(acme, 10, 10),
			reserveOp(acmeOps, 10, 10),
			refuseOp(acme, 10, CodeRateLimitExceeded, time.Minute, `team "acme": 2 requests`),
			reserveOp(beta, 10, 10),
			reserveOp(beta, 10, 10),
			reserveOp(beta, 10, 10),
			refuseOp(beta, 10, CodeRateLimitExceeded, time.Minute, `team "beta": 3 requests`),
		},
	},
	{
		name:  "restore",
		start: time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC),
		limits: []config.Limit{
			{Team: "*", TokenBudget: 1000, BudgetWindow: "day"},
			{Team: "acme", TokenBudget: 1000, BudgetWindow: "month"},
			{Key: "k3", RPM: 10},
		},
		store: &fakeLimitsStore{rows: []SpentRow{
			{Subject: acme, Tokens: 400},
			{Subject: acmeK2, Tokens: 300},
			{Subject: Subject{Team: "acme", Project: "old", Key: "k1"}, Tokens: 250}, // earlier this month
			{Subject: beta, Tokens: 900},
		}},
		ops: []limiterOp{
			// acme: 700 today against the daily budget, 950 this month.
			refuseOp(acme, 51, CodeInsufficientQuota, 17*24*time.Hour+12*time.Hour, "950 of 1000"),
			reserveOp(acme, 50, 50),
			refuseOp(beta, 101, CodeInsufficientQuota, 12*time.Hour, "900 of 1000"),
			reserveOp(beta, 100, 100),
		},
	},
	{
		name:   "no limit selects",
		start:  time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC),
		limits: []config.Limit{{Team: "other", RPM: 1}},
		ops: []limiterOp{
			reserveOp(acme, 10, 10),
			reserveOp(acme, 10, 10),
			settleOp("never reserved", 5), // The zero Reservation settles to nothing.
		},
	},
}

// budgetOps spend a budget of 1000 at the case's start, check it is still
// spent stillSpent later, and renewed 6 hours later.
func budgetOps(stillSpent time.Duration) []limiterOp {
	return []limiterOp{
		reserveOp(acme, 600, 700),
		holdOp("r", acmeK2, 300), // 700 + 300 fits exactly.
		refuseOp(acme, 1, CodeInsufficientQuota, 6*time.Hour, "1000 of 1000"),
		settleOp("r", 100), // 800 spent: 200 left.
		reserveOp(acme, 200, 200),
		refuseOp(acme, 1, CodeInsufficientQuota, 6*time.Hour, ""),
		clockOp(stillSpent),
		refuseOp(acme, 1, CodeInsufficientQuota, 6*time.Hour-stillSpent, ""),
		clockOp(6 * time.Hour),
		reserveOp(acme, 1000, 1000),
	}
}

// TestLimiterConformance runs the shared behaviours against the memory and
// the Redis limiter, so that the two cannot drift.
func TestLimiterConformance(t *testing.T) {
	for _, kind := range limiterKinds {
		t.Run(kind.name, func(t *testing.T) {
			for _, tc := range limiterCases {
				t.Run(tc.name, func(t *testing.T) {
					clock := newClock(tc.start)
					l := kind.make(t, tc.limits, clock.Now)
					if tc.store != nil {
						st := &fakeLimitsStore{rows: tc.store.rows}
						if err := l.Restore(context.Background(), st); err != nil {
							t.Fatalf("Restore: %v", err)
						}
					}
					held := make(map[string]Reservation)
					for i, op := range tc.ops {
						runLimiterOp(t, l, clock, tc.start, held, i, op)
					}
				})
			}
		})
	}
}

func runLimiterOp(t *testing.T, l limiterUnderTest, clock *fakeClock, start time.Time, held map[string]Reservation, i int, op limiterOp) {
	t.Helper()
	switch op.do {
	case "clock":
		clock.Set(start.Add(op.at))
	case "reserve":
		r, err := l.Reserve(op.s, op.est)
		if err != nil {
			t.Fatalf("op %d: Reserve(%v, %d) = %v, want admitted", i, op.s, op.est, err)
		}
		if op.name != "" {
			held[op.name] = r
		} else {
			l.Settle(r, op.used)
		}
	case "settle":
		l.Settle(held[op.name], op.used)
	case "refuse":
		r, err := l.Reserve(op.s, op.est)
		var le *LimitError
		if !errors.As(err, &le) {
			l.Settle(r, 0)
			t.Fatalf("op %d: Reserve(%v, %d) = %v, want a *LimitError", i, op.s, op.est, err)
		}
		if le.Code != op.code {
			t.Errorf("op %d: code = %q, want %q (message %q)", i, le.Code, op.code, le.Message)
		}
		if le.RetryAfter != op.retry {
			t.Errorf("op %d: RetryAfter = %v, want %v", i, le.RetryAfter, op.retry)
		}
		if !strings.Contains(le.Message, op.msg) {
			t.Errorf("op %d: message %q does not contain %q", i, le.Message, op.msg)
		}
	default:
		t.Fatalf("op %d: unknown op %q", i, op.do)
	}
}

func TestRedisLimiterKeys(t *testing.T) {
	addr := redisTestAddr(t)
	prefix := redisTestPrefix(t, addr)
	rdb := redisTestClient(t, addr)
	ctx := context.Background()
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 30, 0, time.UTC))
	l := newRedisTestLimiter(t, []config.Limit{
		{Team: "acme", Project: "*", RPM: 10, TPM: 1000},
		{Key: "*", TokenBudget: 5000, BudgetWindow: "day"},
		{TokenBudget: 50000},
	}, redisTestBackend(addr, prefix), clock.Now, nil, nil)

	r := mustReserveRedis(t, l, acme, 100)
	wantCounters := func(want map[string]int64) {
		t.Helper()
		for k, v := range want {
			got, err := rdb.Get(ctx, prefix+k).Int64()
			if err != nil || got != v {
				t.Errorf("%s = %d, %v; want %d", k, got, err, v)
			}
		}
	}
	wantCounters(map[string]int64{
		`requests:2025-03-14T12:00:team="acme",project="chatbot"`: 1,
		`tokens:2025-03-14T12:00:team="acme",project="chatbot"`:   100,
		`tokens:2025-03-14:key="k1"`:                              100,
		`tokens:2025-03:all`:                                      100,
	})
	l.Settle(r, 40)
	wantCounters(map[string]int64{
		`requests:2025-03-14T12:00:team="acme",project="chatbot"`: 1,
		`tokens:2025-03-14T12:00:team="acme",project="chatbot"`:   40,
		`tokens:2025-03-14:key="k1"`:                              40,
		`tokens:2025-03:all`:                                      40,
	})

	// Expiries are the window's end plus a margin, measured on the
	// limiter's clock; Redis counts them down in real time.
	for k, want := range map[string]time.Duration{
		`requests:2025-03-14T12:00:team="acme",project="chatbot"`: 30*time.Second + minuteKeyMargin,
		`tokens:2025-03-14:key="k1"`:                              12*time.Hour - 30*time.Second + budgetKeyMargin,
		`tokens:2025-03:all`:                                      17*24*time.Hour + 12*time.Hour - 30*time.Second + budgetKeyMargin,
	} {
		ttl, err := rdb.PTTL(ctx, prefix+k).Result()
		if err != nil || ttl <= want-5*time.Second || ttl > want {
			t.Errorf("TTL of %s = %v, %v; want about %v", k, ttl, err, want)
		}
	}

	// A new minute counts in counters of its own name.
	clock.Advance(time.Minute)
	r = mustReserveRedis(t, l, acmeOps, 10)
	wantCounters(map[string]int64{
		`requests:2025-03-14T12:00:team="acme",project="chatbot"`: 1,
		`requests:2025-03-14T12:01:team="acme",project="ops"`:     1,
		`tokens:2025-03-14:key="k1"`:                              50,
	})
	// A counter that expired is not made again by a late correction.
	if err := rdb.Del(ctx, prefix+`tokens:2025-03-14T12:01:team="acme",project="ops"`).Err(); err != nil {
		t.Fatal(err)
	}
	l.Settle(r, 20)
	if n, err := rdb.Exists(ctx, prefix+`tokens:2025-03-14T12:01:team="acme",project="ops"`).Result(); err != nil || n != 0 {
		t.Errorf("an expired counter was made again by Settle (%d, %v)", n, err)
	}
	wantCounters(map[string]int64{`tokens:2025-03-14:key="k1"`: 60})
}

// mustReserveRedis reserves and fails the test on refusal.
func mustReserveRedis(t *testing.T, l *RedisLimiter, s Subject, est int64) Reservation {
	t.Helper()
	r, err := l.Reserve(s, est)
	if err != nil {
		t.Fatalf("Reserve(%v, %d) = %v, want admitted", s, est, err)
	}
	if r.l != nil {
		t.Fatalf("Reserve(%v, %d) was counted locally, want in Redis", s, est)
	}
	return r
}

func TestRedisLimiterKeyNamesAreUnambiguous(t *testing.T) {
	l, err := NewRedisLimiter(nil, config.LimitsBackend{Addr: "127.0.0.1:1", Prefix: "p:", Timeout: time.Second}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC).UnixNano()
	all := &limitRule{}
	perTeamProject := &limitRule{team: "*", project: "*"}
	named := &limitRule{team: "a", key: "*"}
	seen := make(map[string]string)
	for _, tc := range []struct {
		lr   *limitRule
		s    Subject
		want string
	}{
		{all, acme, `p:tokens:2025-03:all`},
		{perTeamProject, Subject{Team: "a", Project: "b,project=c"}, `p:tokens:2025-03:team="a",project="b,project=c"`},
		{perTeamProject, Subject{Team: `a",project="b`, Project: "c"}, `p:tokens:2025-03:team="a\",project=\"b",project="c"`},
		{perTeamProject, Subject{Team: "a,project=b", Project: "c"}, `p:tokens:2025-03:team="a,project=b",project="c"`},
		{named, Subject{Team: "a", Key: ""}, `p:tokens:2025-03:team="a",key=""`},
		{named, Subject{Team: "a", Key: "k\n"}, `p:tokens:2025-03:team="a",key="k\n"`},
	} {
		got := l.key("tokens", start, monthLayout, tc.lr, tc.s)
		if got != tc.want {
			t.Errorf("key(%+v) = %s, want %s", tc.s, got, tc.want)
		}
		if prev, ok := seen[got]; ok {
			t.Errorf("%+v and %s share the key %s", tc.s, prev, got)
		}
		seen[got] = fmt.Sprintf("%+v", tc.s)
	}
}

// commandCounter counts the commands a client sends.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func TestRedisLimiterRoundTrips(t *testing.T) {
	addr := redisTestAddr(t)
	l := newRedisTestLimiter(t, []config.Limit{
		{Team: "acme", RPM: 1000, TPM: 1 << 40},
		{Team: "acme", Project: "*", TokenBudget: 1 << 40},
		{Project: "chatbot", TokenBudget: 1 << 40, BudgetWindow: "day"},
	}, redisTestBackend(addr, redisTestPrefix(t, addr)), nil, nil, nil)
	var cmds commandCounter
	l.client.AddHook(&cmds)
	// Redis may not have the scripts cached yet: the first run loads them.
	l.Settle(mustReserveRedis(t, l, acme, 10), 5)

	for _, tc := range []struct {
		name string
		s    Subject
		est  int64
		used int64
		want int64
	}{
		{name: "reserve and correct", s: acme, est: 100, used: 90, want: 2},
		{name: "used as estimated", s: acme, est: 100, used: 100, want: 1},
		{name: "no limit selects", s: Subject{Team: "beta", Project: "other"}, est: 100, used: 90, want: 0},
	} {
		before := cmds.n.Load()
		r, err := l.Reserve(tc.s, tc.est)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		l.Settle(r, tc.used)
		if got := cmds.n.Load() - before; got != tc.want {
			t.Errorf("%s: %d commands, want %d", tc.name, got, tc.want)
		}
	}
}

func TestRedisLimiterConcurrentReplicasNeverOverrun(t *testing.T) {
	addr := redisTestAddr(t)
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
			limits := []config.Limit{{Team: "*", TokenBudget: budget, BudgetWindow: "day"}}
			cfg := redisTestBackend(addr, redisTestPrefix(t, addr))
			replicas := []*RedisLimiter{
				newRedisTestLimiter(t, limits, cfg, clock.Now, nil, nil),
				newRedisTestLimiter(t, limits, cfg, clock.Now, nil, nil),
			}
			var total, admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				l := replicas[g%len(replicas)]
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
			for i, l := range replicas {
				if n := testutil.ToFloat64(l.redisErrors); n != 0 {
					t.Fatalf("replica %d: %v Redis errors: it counted locally", i, n)
				}
			}
			if total.Load() > budget+tt.overrun {
				t.Errorf("used %d tokens in %d requests, budget %d + in-flight overrun %d", total.Load(), admitted.Load(), budget, tt.overrun)
			}
			if tt.overrun == 0 && total.Load() == budget {
				for i, l := range replicas {
					if _, err := l.Reserve(acme, 1); err == nil {
						t.Errorf("replica %d admitted a request past a spent budget", i)
					}
				}
			}
			if admitted.Load() < budget/estimate/2 {
				t.Errorf("admitted only %d requests", admitted.Load())
			}
		})
	}
}

func TestRedisLimiterRestoreSeedsOnce(t *testing.T) {
	addr := redisTestAddr(t)
	rdb := redisTestClient(t, addr)
	ctx := context.Background()
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	limits := []config.Limit{
		{Team: "*", TokenBudget: 1000, BudgetWindow: "day"},
		{Team: "acme", TokenBudget: 1000, BudgetWindow: "month"},
		// The same selection as the first: its counter must not be seeded twice.
		{Team: "*", TokenBudget: 2000, BudgetWindow: "day"},
	}
	rows := []SpentRow{
		{Subject: acme, Tokens: 400},
		{Subject: acmeK2, Tokens: 300},
		{Subject: Subject{Team: "acme", Project: "old", Key: "k1"}, Tokens: 250}, // earlier this month
		{Subject: beta, Tokens: 900},
	}
	cfg := redisTestBackend(addr, redisTestPrefix(t, addr))
	a := newRedisTestLimiter(t, limits, cfg, clock.Now, nil, nil)
	b := newRedisTestLimiter(t, limits, cfg, clock.Now, nil, nil)

	// Two replicas starting together seed each counter once.
	var wg sync.WaitGroup
	for _, l := range []*RedisLimiter{a, b} {
		wg.Go(func() {
			if err := l.Restore(ctx, &fakeLimitsStore{rows: rows}); err != nil {
				t.Errorf("Restore: %v", err)
			}
		})
	}
	wg.Wait()
	want := map[string]int64{
		`tokens:2025-03-14:team="acme"`: 700,
		`tokens:2025-03-14:team="beta"`: 900,
		`tokens:2025-03:team="acme"`:    950,
	}
	wantCounters := func() {
		t.Helper()
		for k, v := range want {
			got, err := rdb.Get(ctx, cfg.Prefix+k).Int64()
			if err != nil || got != v {
				t.Errorf("%s = %d, %v; want %d", k, got, err, v)
			}
		}
	}
	wantCounters()

	// A replica starting later leaves the counters the others count in.
	a.Settle(mustReserveRedis(t, a, acme, 50), 50)
	want[`tokens:2025-03-14:team="acme"`] += 50
	want[`tokens:2025-03:team="acme"`] += 50
	c := newRedisTestLimiter(t, limits, cfg, clock.Now, nil, nil)
	if err := c.Restore(ctx, &fakeLimitsStore{rows: rows}); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	wantCounters()
	wantRefusedRedis(t, c, acme, 1, CodeInsufficientQuota)

	// A counter Redis lost is seeded again.
	if err := rdb.Del(ctx, cfg.Prefix+`tokens:2025-03-14:team="beta"`).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(ctx, &fakeLimitsStore{rows: rows}); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	wantCounters()

	t.Run("store error", func(t *testing.T) {
		l := newRedisTestLimiter(t, []config.Limit{{TokenBudget: 1}}, cfg, nil, nil, nil)
		err := l.Restore(ctx, &fakeLimitsStore{err: errors.New("boom")})
		if err == nil || !strings.Contains(err.Error(), "restore budgets: boom") {
			t.Errorf("Restore = %v, want the store's error wrapped", err)
		}
	})
}

// wantRefusedRedis checks that Reserve refuses with code.
func wantRefusedRedis(t *testing.T, l *RedisLimiter, s Subject, est int64, code string) {
	t.Helper()
	r, err := l.Reserve(s, est)
	var le *LimitError
	if !errors.As(err, &le) || le.Code != code {
		l.Settle(r, 0)
		t.Fatalf("Reserve(%v, %d) = %v, want a *LimitError %s", s, est, err, code)
	}
}

// flakyProxy forwards TCP connections to a target, until the test cuts or
// stalls them.
type flakyProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	mode  string // "pass", "cut" (connections are closed) or "stall" (bytes are dropped)
	conns map[net.Conn]struct{}

	wg sync.WaitGroup
}

func newFlakyProxy(t *testing.T, target string) *flakyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &flakyProxy{ln: ln, target: target, mode: "pass", conns: make(map[net.Conn]struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *flakyProxy) Addr() string { return p.ln.Addr().String() }

func (p *flakyProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

// track keeps c to close on a cut; it refuses c when the proxy is cut.
func (p *flakyProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == "cut" || p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *flakyProxy) serve(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(up) {
		c.Close()
		up.Close()
		return
	}
	p.wg.Go(func() { p.pipe(up, c) })
	p.pipe(c, up)
}

// pipe copies src to dst, dropping what it reads while stalled, and closes
// both when either fails.
func (p *flakyProxy) pipe(dst, src net.Conn) {
	defer func() {
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.is("stall") {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF, a reset or a cut: the connection is over.
		}
	}
}

func (p *flakyProxy) is(mode string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode == mode
}

// set changes the mode; cutting closes every connection.
func (p *flakyProxy) set(mode string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	if mode == "cut" {
		for c := range p.conns {
			c.Close()
			delete(p.conns, c)
		}
	}
}

func (p *flakyProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// closedAddr is a local address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestRedisLimiterFailsOpenWithoutRedis(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewPedanticRegistry()
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	l := newRedisTestLimiter(t, []config.Limit{{Team: "acme", RPM: 3, TokenBudget: 1000}},
		config.LimitsBackend{Addr: closedAddr(t), Prefix: "tollgate-test:", Timeout: 50 * time.Millisecond},
		clock.Now, zap.New(core), reg)
	l.probeEvery = time.Hour // Only the first request tries Redis.

	// Restore reads the store whatever Redis does, and seeds the local
	// counters with it.
	if err := l.Restore(context.Background(), &fakeLimitsStore{rows: []SpentRow{{Subject: acme, Tokens: 900}}}); err != nil {
		t.Fatalf("Restore = %v, want nil: Redis failing is not an error", err)
	}
	for i := range 3 {
		r, err := l.Reserve(acme, 10)
		if err != nil {
			t.Fatalf("request %d: %v, want admitted by the local limits", i, err)
		}
		l.Settle(r, 10)
	}
	wantRefusedRedis(t, l, acme, 10, CodeRateLimitExceeded) // rpm 3, locally
	clock.Advance(time.Minute)
	wantRefusedRedis(t, l, acme, 100, CodeInsufficientQuota) // 930 restored and spent

	if got := testutil.ToFloat64(l.fallbackActive); got != 1 {
		t.Errorf("tollgate_limits_fallback_active = %v, want 1", got)
	}
	if got := testutil.ToFloat64(l.redisErrors); got != 1 {
		t.Errorf("tollgate_limits_redis_errors_total = %v, want 1 (later requests do not try Redis)", got)
	}
	if n, err := testutil.GatherAndCount(reg, "tollgate_limits_fallback_active", "tollgate_limits_redis_errors_total"); err != nil || n != 2 {
		t.Errorf("registered series = %d, %v; want 2", n, err)
	}
	if got := logs.FilterMessageSnippet("local counters").Len(); got != 1 || logs.Len() != 1 {
		t.Errorf("logged %v, want one warning", logs.All())
	}
}

func TestRedisLimiterFailsOpenAndRecovers(t *testing.T) {
	addr := redisTestAddr(t)
	proxy := newFlakyProxy(t, addr)
	rdb := redisTestClient(t, addr)
	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewPedanticRegistry()
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	cfg := redisTestBackend(proxy.Addr(), redisTestPrefix(t, addr))
	// Long enough for a healthy call through the proxy on a loaded CI
	// machine; a stalled one pays it once.
	cfg.Timeout = 500 * time.Millisecond
	l := newRedisTestLimiter(t, []config.Limit{{Team: "acme", RPM: 4}}, cfg, clock.Now, zap.New(core), reg)
	l.probeEvery = time.Hour // The test says when to probe.
	l.remindEvery = 0        // Every failed probe reminds.
	requestsKey := cfg.Prefix + `requests:2025-03-14T12:00:team="acme"`
	wantGauge := func(want float64) {
		t.Helper()
		if got := testutil.ToFloat64(l.fallbackActive); got != want {
			t.Errorf("tollgate_limits_fallback_active = %v, want %v", got, want)
		}
	}
	probeNow := func() { l.nextProbe.Store(0) }

	mustReserveRedis(t, l, acme, 10)
	wantGauge(0)

	for _, mode := range []string{"cut", "stall"} {
		t.Run(mode, func(t *testing.T) {
			logs.TakeAll()
			errs := testutil.ToFloat64(l.redisErrors)
			proxy.set(mode)
			// Requests are still admitted, under the local limit of 4.
			var local []Reservation
			for i := range 4 {
				r, err := l.Reserve(acme, 10)
				if err != nil {
					t.Fatalf("request %d: %v, want admitted by the local limits", i, err)
				}
				if r.l == nil {
					t.Fatalf("request %d was counted in Redis, want locally", i)
				}
				local = append(local, r)
			}
			wantRefusedRedis(t, l, acme, 10, CodeRateLimitExceeded)
			wantGauge(1)
			// One error for the four requests: only the first tried Redis
			// (and, when it stalls, waited for the timeout).
			if got := testutil.ToFloat64(l.redisErrors) - errs; got != 1 {
				t.Errorf("%v Redis errors counted, want 1", got)
			}
			// A probe while Redis still fails is counted and reminded of.
			probeNow()
			if _, err := l.Reserve(acme, 10); err == nil {
				t.Error("a request past the local limit was admitted")
			}
			if got := testutil.ToFloat64(l.redisErrors) - errs; got != 2 {
				t.Errorf("%v Redis errors counted, want 2", got)
			}

			// Once Redis is back, the next probe ends the fall back.
			proxy.set("pass")
			probeNow()
			mustReserveRedis(t, l, acme, 10)
			wantGauge(0)
			if n, err := rdb.Get(context.Background(), requestsKey).Int64(); err != nil || n < 2 {
				t.Errorf("%s = %d, %v; want the probe counted in Redis", requestsKey, n, err)
			}
			for _, r := range local {
				l.Settle(r, 10) // Settled locally, after the fall back.
			}
			var msgs []string
			for _, e := range logs.All() {
				msgs = append(msgs, e.Level.String()+": "+e.Message)
			}
			if len(msgs) != 3 || !strings.Contains(msgs[0], "failed") || !strings.Contains(msgs[1], "still failing") || !strings.Contains(msgs[2], "answers again") {
				t.Errorf("logged %q, want a warning, a reminder and a recovery", msgs)
			}
			if t.Failed() {
				return
			}
			clock.Advance(time.Minute) // A fresh minute for the next mode.
			requestsKey = cfg.Prefix + "requests:" + clock.Now().Format(minuteLayout) + `:team="acme"`
			mustReserveRedis(t, l, acme, 10)
		})
	}

	t.Run("seeds written once Redis answers", func(t *testing.T) {
		ctx := context.Background()
		limits := []config.Limit{{Team: "*", TokenBudget: 1000, BudgetWindow: "day"}}
		l := newRedisTestLimiter(t, limits, cfg, clock.Now, nil, nil)
		l.probeEvery = time.Hour
		proxy.set("cut")
		if err := l.Restore(ctx, &fakeLimitsStore{rows: []SpentRow{{Subject: beta, Tokens: 600}}}); err != nil {
			t.Fatalf("Restore: %v", err)
		}
		wantRefusedRedis(t, l, beta, 500, CodeInsufficientQuota) // locally
		proxy.set("pass")
		l.nextProbe.Store(0)
		wantRefusedRedis(t, l, beta, 500, CodeInsufficientQuota) // in Redis
		key := cfg.Prefix + "tokens:" + clock.Now().Format(dayLayout) + `:team="beta"`
		if n, err := rdb.Get(ctx, key).Int64(); err != nil || n != 600 {
			t.Errorf("%s = %d, %v; want 600 seeded", key, n, err)
		}
		if got := testutil.ToFloat64(l.fallbackActive); got != 0 {
			t.Errorf("tollgate_limits_fallback_active = %v, want 0", got)
		}
	})

	t.Run("closed", func(t *testing.T) {
		cfg := cfg
		cfg.Prefix = redisTestPrefix(t, addr)
		l, err := NewRedisLimiter([]config.Limit{{Team: "acme", RPM: 1}}, cfg, clock.Now, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		mustReserveRedis(t, l, acme, 10)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		r, err := l.Reserve(acme, 10)
		if err != nil || r.l == nil {
			t.Errorf("Reserve after Close = %+v, %v; want admitted locally", r, err)
		}
		if got := testutil.ToFloat64(l.fallbackActive); got != 1 {
			t.Errorf("tollgate_limits_fallback_active = %v, want 1", got)
		}
	})
}

func TestNewRedisLimiterErrors(t *testing.T) {
	ok := config.LimitsBackend{Addr: "127.0.0.1:6379", Timeout: time.Second}
	reg := prometheus.NewPedanticRegistry()
	first, err := NewRedisLimiter(nil, ok, nil, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	for _, tc := range []struct {
		name string
		cfg  config.LimitsBackend
		reg  prometheus.Registerer
		want string
	}{
		{name: "no address", cfg: config.LimitsBackend{Timeout: time.Second}, want: "no address"},
		{name: "no timeout", cfg: config.LimitsBackend{Addr: "127.0.0.1:6379"}, want: "timeout"},
	} {
		l, err := NewRedisLimiter(nil, tc.cfg, nil, nil, tc.reg)
		if err == nil {
			l.Close()
			t.Errorf("%s: NewRedisLimiter succeeded", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not contain %q", tc.name, err, tc.want)
		}
	}
}

// TestRedisLimiterSharesMetricsAcrossReloads builds a second limiter on
// the registry of the first, as a configuration reload does: it must adopt
// the registered series rather than fail or register them twice.
func TestRedisLimiterSharesMetricsAcrossReloads(t *testing.T) {
	cfg := config.LimitsBackend{Addr: "127.0.0.1:6379", Timeout: time.Second}
	reg := prometheus.NewPedanticRegistry()
	first, err := NewRedisLimiter(nil, cfg, nil, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := NewRedisLimiter(nil, cfg, nil, nil, reg)
	if err != nil {
		t.Fatalf("second limiter on the same registry: %v", err)
	}
	defer second.Close()
	if first.redisErrors != second.redisErrors || first.fallbackActive != second.fallbackActive {
		t.Fatal("the second limiter did not adopt the first one's series")
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 2 {
		t.Fatalf("gathered %d metric families, want 2", len(families))
	}
}

// BenchmarkRedisLimiter measures Reserve plus a correcting Settle, two
// round trips to Redis, with one shared limit and one per-team limit.
func BenchmarkRedisLimiter(b *testing.B) {
	addr := redisTestAddr(b)
	for _, bc := range []struct {
		name   string
		limits []config.Limit
	}{
		{name: "shared", limits: []config.Limit{{RPM: 1 << 40, TPM: 1 << 40, TokenBudget: 1 << 40}}},
		{name: "per-team", limits: []config.Limit{{Team: "*", RPM: 1 << 40, TokenBudget: 1 << 40}}},
	} {
		for _, parallel := range []bool{false, true} {
			name := bc.name + "/serial"
			if parallel {
				name = bc.name + "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				l := newRedisTestLimiter(b, bc.limits, redisTestBackend(addr, redisTestPrefix(b, addr)), nil, nil, nil)
				step := func() bool {
					r, err := l.Reserve(acme, 1000)
					if err != nil || r.l != nil {
						b.Errorf("Reserve = %v (locally: %v)", err, r.l != nil)
						return false
					}
					l.Settle(r, 900)
					return true
				}
				step()
				b.ReportAllocs()
				b.ResetTimer()
				if !parallel {
					for b.Loop() {
						if !step() {
							return
						}
					}
					return
				}
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if !step() {
							return
						}
					}
				})
			})
		}
	}
}

// spendStore is a usage store the test writes settled spend into, as the
// Recorder would; every row is in the current windows.
type spendStore struct {
	mu    sync.Mutex
	spent map[Subject]int64
}

func (s *spendStore) add(sub Subject, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spent == nil {
		s.spent = make(map[Subject]int64)
	}
	s.spent[sub] += n
}

func (s *spendStore) SpentTokens(ctx context.Context, since time.Time) ([]SpentRow, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rows []SpentRow
	for sub, n := range s.spent {
		rows = append(rows, SpentRow{Subject: sub, Tokens: n})
	}
	return rows, nil
}

// TestRedisLimiterBudgetSurvivesRedisLoss checks that a budget holds
// through everything that can happen to the Redis counting it: Redis
// failing (the local counters start from the store, not from zero),
// coming back empty after an outage, and restarting empty while it
// answers (both seen from the missing seed marker, and seeded from the
// store before anything is counted again). Redis is cut through a proxy,
// and "emptied" by deleting the test's own keys only.
func TestRedisLimiterBudgetSurvivesRedisLoss(t *testing.T) {
	addr := redisTestAddr(t)
	proxy := newFlakyProxy(t, addr)
	rdb := redisTestClient(t, addr)
	ctx := context.Background()
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	cfg := redisTestBackend(proxy.Addr(), redisTestPrefix(t, addr))
	cfg.Timeout = 500 * time.Millisecond // a cut connection fails at once; this bounds only a slow host
	const budget, each = 1000, 100
	limits := []config.Limit{{Team: "acme", TokenBudget: budget, BudgetWindow: "day"}}
	st := &spendStore{}
	l := newRedisTestLimiter(t, limits, cfg, clock.Now, nil, nil)
	l.probeEvery = time.Hour // the test says when to probe
	if err := l.Restore(ctx, st); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	probeNow := func() { l.nextProbe.Store(0) }
	// use admits requests of each tokens until one is refused, settling
	// and storing each, and returns how many were admitted.
	use := func(wantLocal bool) int {
		t.Helper()
		n := 0
		for ; n <= budget/each; n++ {
			r, err := l.Reserve(acme, each)
			if err != nil {
				var le *LimitError
				if !errors.As(err, &le) || le.Code != CodeInsufficientQuota {
					t.Fatalf("Reserve: %v, want admitted or insufficient_quota", err)
				}
				return n
			}
			if local := r.l != nil; local != wantLocal {
				t.Fatalf("request counted locally: %v, want %v", local, wantLocal)
			}
			l.Settle(r, each)
			st.add(acme, each)
		}
		t.Fatalf("more than %d requests of %d tokens admitted on a budget of %d", n, each, budget)
		return n
	}
	emptyRedis := func() {
		t.Helper()
		keys, err := rdb.Keys(ctx, cfg.Prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	spent := func() int64 {
		rows, _ := st.SpentTokens(ctx, time.Time{})
		var n int64
		for _, r := range rows {
			n += r.Tokens
		}
		return n
	}

	// 600 of the 1000 are spent through Redis.
	for range 6 {
		r := mustReserveRedis(t, l, acme, each)
		l.Settle(r, each)
		st.add(acme, each)
	}
	// Redis fails: the local counters start from the 600 the store holds.
	proxy.set("cut")
	if n := use(true); n != 4 {
		t.Errorf("%d requests admitted locally, want the 4 the budget had left", n)
	}
	if got := spent(); got != budget {
		t.Fatalf("spent %d, want %d", got, budget)
	}

	// Redis comes back empty: the probe seeds it from the store.
	emptyRedis()
	proxy.set("pass")
	probeNow()
	if n := use(false); n != 0 {
		t.Errorf("%d requests admitted by a Redis back empty, want 0", n)
	}
	if got := testutil.ToFloat64(l.fallbackActive); got != 0 {
		t.Errorf("still falling back after Redis answered")
	}
	if got, err := rdb.Get(ctx, cfg.Prefix+`tokens:2025-03-14:team="acme"`).Int64(); err != nil || got != budget {
		t.Errorf("Redis counter = %d, %v; want %d seeded from the store", got, err, budget)
	}

	// The next day has a budget of its own; Redis restarts empty while it
	// answers: the missing marker makes the limiter seed it again.
	clock.Advance(24 * time.Hour)
	st.spent = nil
	for range 7 {
		r := mustReserveRedis(t, l, acme, each)
		l.Settle(r, each)
		st.add(acme, each)
	}
	emptyRedis()
	if n := use(false); n != 3 {
		t.Errorf("%d requests admitted after Redis restarted empty, want the 3 the budget had left", n)
	}
	if got, err := rdb.Exists(ctx, cfg.Prefix+"seeded:2025-03-15").Result(); err != nil || got != 1 {
		t.Errorf("seed marker of the day: %d, %v; want it set", got, err)
	}
}

// TestRedisLimiterReplicasFallingBackStayWithinWhatRemained checks the
// bound the README states for N replicas while Redis fails: each starts
// from the store's spend, so together they admit at most N times what
// remained, not N times the budget.
func TestRedisLimiterReplicasFallingBackStayWithinWhatRemained(t *testing.T) {
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	st := &spendStore{}
	st.add(acme, 800) // spent through Redis before it failed
	limits := []config.Limit{{Team: "acme", TokenBudget: 1000, BudgetWindow: "day"}}
	cfg := config.LimitsBackend{Addr: closedAddr(t), Prefix: "tollgate-test:", Timeout: 50 * time.Millisecond}
	const replicas, each = 3, 50
	admitted := 0
	for range replicas {
		l := newRedisTestLimiter(t, limits, cfg, clock.Now, nil, nil)
		l.probeEvery = time.Hour
		// Each replica had restored an older spend at start; the fall
		// back seeds it with what the store holds now.
		l.st = st
		for {
			r, err := l.Reserve(acme, each)
			if err != nil {
				break
			}
			l.Settle(r, each)
			admitted += each
			if admitted > replicas*1000 {
				t.Fatal("no replica stops")
			}
		}
	}
	if want := replicas * (1000 - 800); admitted != want {
		t.Errorf("replicas admitted %d tokens, want %d: %d × the 200 that remained", admitted, want, replicas)
	}
}

// TestRedisLimiterHugeSpendStaysAnInteger restores a spend near 2^63, as a
// store may hold after a backend reported absurd counts, while a
// reservation is in flight. The seeded counter must stay an integer that
// the settle and later reservations can add to: Redis refuses INCRBY on a
// float string, which would make the limiter fall back to local counters.
func TestRedisLimiterHugeSpendStaysAnInteger(t *testing.T) {
	addr := redisTestAddr(t)
	rdb := redisTestClient(t, addr)
	ctx := context.Background()
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	cfg := redisTestBackend(addr, redisTestPrefix(t, addr))
	limits := []config.Limit{
		{Team: "acme", TokenBudget: 1000, BudgetWindow: "day"},
		// A budget no spend can exhaust: its counter is added to at the bound.
		{Team: "beta", TokenBudget: math.MaxInt64, BudgetWindow: "day"},
	}
	core, logs := observer.New(zapcore.WarnLevel)
	l := newRedisTestLimiter(t, limits, cfg, clock.Now, zap.New(core), nil)
	if err := l.Restore(ctx, &fakeLimitsStore{}); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	held := mustReserveRedis(t, l, acme, 10)
	heldBeta := mustReserveRedis(t, l, beta, 10)
	rows := []SpentRow{
		{Subject: acme, Tokens: math.MaxInt64},
		{Subject: beta, Tokens: math.MaxInt64 - 5},
	}
	if err := l.Restore(ctx, &fakeLimitsStore{rows: rows}); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	for _, k := range []string{`tokens:2025-03-14:team="acme"`, `tokens:2025-03-14:team="beta"`} {
		raw, err := rdb.Get(ctx, cfg.Prefix+k).Result()
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		if _, err := strconv.ParseInt(raw, 10, 64); err != nil {
			t.Errorf("%s = %q after seeding, want an integer", k, raw)
		}
	}

	// The settles add to the seeded counters, huge usage included.
	l.Settle(held, 20)
	l.Settle(heldBeta, math.MaxInt64)
	r := mustReserveRedis(t, l, beta, math.MaxInt64/2)
	l.Settle(r, math.MaxInt64)
	if l.down.Load() {
		t.Fatalf("the limiter fell back to local counters: %v", logs.All())
	}
	for _, k := range []string{`tokens:2025-03-14:team="acme"`, `tokens:2025-03-14:team="beta"`} {
		got, err := rdb.Get(ctx, cfg.Prefix+k).Int64()
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		if got != redisCountBound {
			t.Errorf("%s = %d, want it saturated at %d", k, got, int64(redisCountBound))
		}
	}
	wantRefusedRedis(t, l, acme, 1, CodeInsufficientQuota)
	if n := logs.Len(); n != 0 {
		t.Errorf("%d warnings logged, want none: %v", n, logs.All())
	}
}
