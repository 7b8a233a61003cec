package accounting

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/config"
)

// The Redis scripts are package-level values because they are immutable
// after init: NewScript computes each script's SHA-1 once, and Run only
// reads it (EVALSHA, then EVAL once if Redis lost its script cache).
var (
	// reserveScript checks every counter of a request and, only if all of
	// them fit, counts the request in all of them, so that a refusal by one
	// limit counts nothing anywhere.
	reserveScript = redis.NewScript(`
-- KEYS are the counters one request counts in, each named once, then the
-- seed markers of the budget windows it counts in. ARGV[1] is how many
-- markers there are; then, for each counter, its increment and its time to
-- live in milliseconds; then, for each check in rule order, the index of
-- its counter and its cap. The reply is {0, 0} when the request was
-- counted, {-1, 0} when a marker is missing (Redis lost or never had the
-- budgets: they must be seeded from the usage store first), else
-- {check, count}: the first check that refused it (from 1) and what its
-- counter held.
-- Counters saturate at 2^53 (redisCountBound): Lua numbers are doubles,
-- and INCRBY refuses to overflow.
local m = tonumber(ARGV[1])
local n = #KEYS - m
for i = n + 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    return {-1, 0}
  end
end
local raw = redis.call('MGET', unpack(KEYS, 1, n))
local counts = {}
for i = 1, n do
  counts[i] = tonumber(raw[i] or '0')
end
for j = 2 * n + 2, #ARGV, 2 do
  local i = tonumber(ARGV[j])
  if counts[i] + tonumber(ARGV[2 * i]) > tonumber(ARGV[j + 1]) then
    return {(j - 2 * n) / 2, counts[i]}
  end
end
for i = 1, n do
  if counts[i] + tonumber(ARGV[2 * i]) >= 9007199254740992 then
    redis.call('SET', KEYS[i], '9007199254740992', 'KEEPTTL')
  else
    redis.call('INCRBY', KEYS[i], ARGV[2 * i])
  end
  if not raw[i] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i + 1])
  end
end
return {0, 0}
`)

	// seedScript raises budget counters to the spend the usage store holds
	// and sets the seed markers of their windows, in one step, so that no
	// reservation sees a window marked seeded whose counters are not.
	seedScript = redis.NewScript(`
-- KEYS are budget counters, then seed markers. ARGV[1] is how many
-- counters there are; then, for each counter, the spend to raise it to
-- and its time to live in milliseconds; then, for each marker, its time to
-- live. A counter already higher keeps its count: it holds what the store
-- has plus reservations in flight and records not yet written. The
-- spend is an integer no higher than 2^53, and is set as given: a Lua
-- number this large would be written as a float, which INCRBY refuses.
local n = tonumber(ARGV[1])
for i = 1, n do
  local want = tonumber(ARGV[2 * i])
  local cur = tonumber(redis.call('GET', KEYS[i]) or '-1')
  if cur < want then
    redis.call('SET', KEYS[i], ARGV[2 * i], 'PX', ARGV[2 * i + 1])
  end
end
for i = n + 1, #KEYS do
  redis.call('SET', KEYS[i], 1, 'PX', ARGV[2 * n + 1 + (i - n)])
end
return 0
`)

	// settleScript applies the correction of a settled request to the
	// token counters its reservation counted in.
	settleScript = redis.NewScript(`
-- KEYS are the token counters of one reservation, ARGV[1] the correction:
-- the tokens used minus the estimate reserved. A counter that is gone
-- expired with its window, which no correction can change any more, so it
-- is not made again; no count goes below zero, as in the local limiter,
-- nor above 2^53, where the counters saturate.
local d = tonumber(ARGV[1])
for i = 1, #KEYS do
  local cur = redis.call('GET', KEYS[i])
  if cur then
    local v = tonumber(cur) + d
    if v >= 9007199254740992 then
      redis.call('SET', KEYS[i], '9007199254740992', 'KEEPTTL')
    elseif v < 0 then
      redis.call('SET', KEYS[i], '0', 'KEEPTTL')
    else
      redis.call('INCRBY', KEYS[i], ARGV[1])
    end
  end
end
return 0
`)
)

const (
	// redisCountBound is where the Redis counters saturate: 2^53, the
	// largest integer every Lua number (a double) holds exactly, and far
	// enough below 2^63 that adding one request's tokens cannot overflow
	// INCRBY. A counter this high refuses every request of its budget.
	redisCountBound = 1 << 53

	// minuteKeyMargin and budgetKeyMargin keep counters past the end of
	// their window, so that a replica whose clock lags a little still finds
	// the counter the others count in.
	minuteKeyMargin = time.Minute
	budgetKeyMargin = time.Hour

	// defaultProbeEvery paces the attempts to reach Redis again while
	// falling back, so that an outage costs one request per interval a
	// timeout, not every request.
	defaultProbeEvery = time.Second
	// defaultRemindEvery paces the warnings repeated while falling back.
	defaultRemindEvery = time.Minute
	// seedTimeout bounds writing budget seeds, a pipeline of one command
	// per budget counter, which may take longer than a request's Timeout.
	seedTimeout = time.Second
)

// RedisLimiter enforces the same rate limits and token budgets as Limiter,
// with the counters kept in Redis so that every gateway replica counts
// against the same limits.
//
// Each Reserve is one Redis round trip, a script that checks every counter
// selecting the request and, only if all fit, counts the request in all of
// them; each Settle whose tokens differ from the estimate is one more, a
// script applying the correction. A request no limit selects costs nothing.
// Counters are named by what they count and their window, e.g.
// "tollgate:tokens:2025-03:team="acme"", and expire a while after their
// window ends. Budgets survive restarts with the counters themselves, and
// a Redis that lost them is seeded from the usage store: a seed marker per
// budget window says Redis holds the window as seeded, and a reservation
// that finds it missing seeds the window's counters (raising each to the
// store's spend, in one script) before anything is counted.
//
// Fail-open policy: when Redis is unreachable, answers with an error, or
// is slower than limits_backend.timeout, the gateway keeps serving and
// enforces the same limits with counters local to each replica. During an
// outage each replica enforces the full limit on its own, so the traffic
// admitted may reach N replicas times the limit. Local budgets start from
// the usage store's spend in the window, read when the fall back begins
// (each counter keeps the higher of that and its own count), so that N
// replicas admit at most N times what remained of a budget, and a single
// replica no more than the budget, short of the records not yet written
// and the reservations in flight when Redis failed. When Redis answers
// again it is seeded from the store before it counts, so that what the
// replicas admitted on their own is not forgotten. The fall back is
// logged once as a warning, repeated every minute while it lasts, and its
// end once; tollgate_limits_fallback_active is 1 meanwhile, and
// tollgate_limits_redis_errors_total counts the failed calls. While falling
// back, one request per second tries Redis again, paying at most the
// timeout, and the first that succeeds ends the fall back. Requests admitted
// locally are settled locally. Requests reserved in Redis and settled while
// it fails keep their estimate counted there, and a call that timed out may
// have counted its request in Redis as well as locally.
type RedisLimiter struct {
	local   *Limiter // the rules, and the counters used while Redis fails
	client  *redis.Client
	addr    string
	prefix  string
	timeout time.Duration
	now     func() time.Time
	log     *zap.Logger

	redisErrors    prometheus.Counter
	fallbackActive prometheus.Gauge

	// probeEvery and remindEvery are real time, not the limits' clock:
	// they pace talking to Redis, not windows.
	probeEvery, remindEvery time.Duration

	down      atomic.Bool  // Redis failed: local counters enforce the limits
	nextProbe atomic.Int64 // unix nanoseconds, when the next request tries Redis

	// st is the usage store Restore was given: budgets are seeded from it
	// into the local counters when Redis fails, and into Redis when Redis
	// lost them or comes back. Nil until Restore.
	st LimitsStore
	// seeding is held for writing while the local counters are seeded
	// from the store at the start of a fall back, and for reading by every
	// local reservation, so that none is admitted on counters not seeded.
	seeding sync.RWMutex

	mu         sync.Mutex // guards what follows, and the transitions of down
	downSince  time.Time
	downErrs   int64
	nextRemind time.Time
}

// NewRedisLimiter returns a limiter whose counters live in Redis, falling
// back to local counters when Redis fails. now is the clock of the windows
// (nil means time.Now). Its metrics are registered on reg (nil registers
// nothing). It does not contact Redis; Restore does. Close releases its
// connections.
func NewRedisLimiter(limits []config.Limit, cfg config.LimitsBackend, now func() time.Time, log *zap.Logger, reg prometheus.Registerer) (*RedisLimiter, error) {
	if cfg.Addr == "" {
		return nil, errors.New("redis limiter: no address")
	}
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("redis limiter: timeout %v is not positive", cfg.Timeout)
	}
	if log == nil {
		log = zap.NewNop()
	}
	local := NewLimiter(limits, now)
	l := &RedisLimiter{
		local:   local,
		addr:    cfg.Addr,
		prefix:  cfg.Prefix,
		timeout: cfg.Timeout,
		now:     local.now,
		log:     log,
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_limits_redis_errors_total",
			Help: "Calls to the Redis limits backend that failed or timed out; the gateway then enforces limits with local counters.",
		}),
		fallbackActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_limits_fallback_active",
			Help: "1 while Redis fails and limits are enforced by each replica's local counters, else 0.",
		}),
		probeEvery:  defaultProbeEvery,
		remindEvery: defaultRemindEvery,
	}
	if reg != nil {
		// A configuration reload builds a new limiter on the same registry:
		// it adopts the series the previous one registered, so they
		// continue rather than clash.
		var err error
		if l.redisErrors, err = registerOrAdopt(reg, l.redisErrors); err != nil {
			return nil, fmt.Errorf("redis limiter metrics: %w", err)
		}
		if l.fallbackActive, err = registerOrAdopt(reg, l.fallbackActive); err != nil {
			return nil, fmt.Errorf("redis limiter metrics: %w", err)
		}
		l.fallbackActive.Set(0)
	}
	l.client = redis.NewClient(&redis.Options{
		Addr:     cfg.Addr,
		Password: cfg.Password,
		DB:       cfg.DB,
		// Every call carries a deadline, Timeout on the request path.
		ContextTimeoutEnabled: true,
		// A retry would have to fit in the same Timeout, and could count a
		// request twice when only the reply was lost.
		MaxRetries: -1,
		// One dial attempt per connection: the limiter paces its own
		// attempts while Redis is down, and a dial outlives the request
		// that started it.
		DialerRetries: 1,
		DialTimeout:   max(cfg.Timeout, time.Second),
		// No extra commands at connect, nor push notifications to handle:
		// the limiter uses plain commands on one node.
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	return l, nil
}

// Close releases the connections to Redis. Reservations made before may
// still be settled; they are settled locally or not at all.
func (l *RedisLimiter) Close() error {
	if err := l.client.Close(); err != nil {
		return fmt.Errorf("close redis limiter: %w", err)
	}
	return nil
}

// Restore loads the tokens spent in the current budget windows from st into
// the local counters, and raises each budget counter in Redis to the same
// spend, marking the windows seeded. A counter already higher is left
// alone, so that replicas starting together, or one starting while others
// count, lose nothing. Call it once, before serving. It fails only if st
// does: when Redis fails, the limiter falls back to its local counters and
// seeds Redis from st once it answers again.
//
// The limiter keeps st: whenever Redis fails, the local counters are seeded
// from it again (each keeps the higher of its own count and the store's),
// and whenever Redis answers again, or answers without the seed marker of
// a budget window (it restarted empty, or lost its data), Redis is seeded
// from it before any reservation counts there.
func (l *RedisLimiter) Restore(ctx context.Context, st LimitsStore) error {
	if len(l.local.rules) == 0 {
		return nil // Nothing is limited: Redis is never used.
	}
	l.st = st
	cache := &spentCache{st: st}
	if err := l.local.Restore(ctx, cache); err != nil {
		return err // Already wrapped by Limiter.Restore.
	}
	// The local Restore has read the store: the cache answers.
	seeds, err := l.budgetSeeds(ctx, cache)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, seedTimeout)
	defer cancel()
	if err := l.writeSeeds(sctx, seeds); err != nil {
		l.fallBack(fmt.Errorf("restore: %w", err))
	}
	return nil
}

// redisSeed is the spend a budget counter is raised to.
type redisSeed struct {
	key    string
	tokens int64
	end    int64 // the end of the counter's window, unix nanoseconds
}

// redisSeeds are the budget counters of the current windows with their
// spend in the store, and the seed markers of those windows.
type redisSeeds struct {
	counters []redisSeed
	markers  []redisSeed // tokens unused
}

// budgetSeeds reads the spend of the current budget windows from st, as
// the seeds of their Redis counters. Rules of the same selection share a
// counter: each row is counted once in it.
func (l *RedisLimiter) budgetSeeds(ctx context.Context, st LimitsStore) (redisSeeds, error) {
	var seeds redisSeeds
	w := windowsAt(l.now())
	bySeedKey := make(map[string]int)
	for _, monthly := range []bool{false, true} {
		if !l.local.hasBudget(monthly) {
			continue
		}
		start := w.day
		if monthly {
			start = w.month
		}
		var end int64
		for i := range l.local.rules {
			if lr := &l.local.rules[i]; lr.budget > 0 && lr.monthly == monthly {
				end = lr.budgetEnd(start)
				break
			}
		}
		seeds.markers = append(seeds.markers, redisSeed{key: l.markerKey(start, monthly), end: end})
		rows, err := st.SpentTokens(ctx, time.Unix(0, start).UTC())
		if err != nil {
			return redisSeeds{}, fmt.Errorf("restore budgets: %w", err)
		}
		for _, row := range rows {
			var counted []string
			for i := range l.local.rules {
				lr := &l.local.rules[i]
				if lr.budget == 0 || lr.monthly != monthly || !lr.selects(row.Subject) {
					continue
				}
				key := l.budgetKey(lr, row.Subject, start)
				if slices.Contains(counted, key) {
					continue
				}
				counted = append(counted, key)
				j, ok := bySeedKey[key]
				if !ok {
					j = len(seeds.counters)
					bySeedKey[key] = j
					seeds.counters = append(seeds.counters, redisSeed{key: key, end: lr.budgetEnd(start)})
				}
				seeds.counters[j].tokens += row.Tokens
			}
		}
	}
	return seeds, nil
}

// writeSeeds raises the seeds' counters and sets their windows' markers,
// in one script. Seeds of windows that have ended are dropped.
func (l *RedisLimiter) writeSeeds(ctx context.Context, seeds redisSeeds) error {
	now := l.now().UnixNano()
	keys := make([]string, 0, len(seeds.counters)+len(seeds.markers))
	args := make([]any, 1, 1+2*len(seeds.counters)+len(seeds.markers))
	for _, sd := range seeds.counters {
		if sd.tokens > 0 && sd.end > now {
			keys = append(keys, sd.key)
			args = append(args, min(sd.tokens, redisCountBound), (time.Duration(sd.end-now) + budgetKeyMargin).Milliseconds())
		}
	}
	args[0] = len(keys)
	for _, m := range seeds.markers {
		if m.end > now {
			keys = append(keys, m.key)
			args = append(args, (time.Duration(m.end-now) + budgetKeyMargin).Milliseconds())
		}
	}
	if len(keys) == 0 {
		// Nothing to seed: check Redis anyway, so that a wrong address
		// shows at start rather than at the first request.
		if err := l.client.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("seed budgets: %w", err)
		}
		return nil
	}
	if err := seedScript.Run(ctx, l.client, keys, args...).Err(); err != nil {
		return fmt.Errorf("seed budgets: %w", err)
	}
	return nil
}

// seedRedis seeds Redis from the store Restore was given, if any.
func (l *RedisLimiter) seedRedis() error {
	ctx, cancel := context.WithTimeout(context.Background(), seedTimeout)
	defer cancel()
	var seeds redisSeeds
	if l.st != nil {
		var err error
		if seeds, err = l.budgetSeeds(ctx, l.st); err != nil {
			return err
		}
	} else {
		// No store: mark the windows seeded with nothing.
		seeds, _ = l.budgetSeeds(ctx, emptyStore{})
	}
	return l.writeSeeds(ctx, seeds)
}

// emptyStore is a LimitsStore with no usage.
type emptyStore struct{}

func (emptyStore) SpentTokens(context.Context, time.Time) ([]SpentRow, error) { return nil, nil }

// markerKey names the seed marker of the budget window starting at start,
// e.g. tollgate:seeded:2025-03 for a month: it exists while Redis holds the
// window's budget counters as seeded from the store.
func (l *RedisLimiter) markerKey(start int64, monthly bool) string {
	layout := dayLayout
	if monthly {
		layout = monthLayout
	}
	return l.prefix + "seeded:" + time.Unix(0, start).UTC().Format(layout)
}

// spentCache answers SpentTokens once per since, so that Restore reads the
// store once for the local counters and Redis both.
type spentCache struct {
	st   LimitsStore
	rows map[int64][]SpentRow
}

func (c *spentCache) SpentTokens(ctx context.Context, since time.Time) ([]SpentRow, error) {
	if rows, ok := c.rows[since.UnixNano()]; ok {
		return rows, nil
	}
	rows, err := c.st.SpentTokens(ctx, since)
	if err != nil {
		return nil, err // Restore wraps it.
	}
	if c.rows == nil {
		c.rows = make(map[int64][]SpentRow)
	}
	c.rows[since.UnixNano()] = rows
	return rows, nil
}

// Reserve counts a request and reserves estimate tokens against every limit
// that selects s, all or nothing, in one Redis round trip. On refusal it
// returns a *LimitError and counts nothing. When Redis fails it reserves
// against the local counters instead, and never returns Redis's error.
func (l *RedisLimiter) Reserve(s Subject, estimate int64) (Reservation, error) {
	estimate = max(estimate, 0)
	if !l.selectsAny(s) {
		return Reservation{}, nil
	}
	probe := l.down.Load()
	if probe && !l.probeDue() {
		return l.localReserve(s, estimate)
	}
	if probe {
		// Redis may be back empty, or may lack what the replicas admitted
		// on their own meanwhile: it is seeded from the store before it
		// counts again.
		if err := l.seedRedis(); err != nil {
			l.fallBack(fmt.Errorf("probe: %w", err))
			return l.localReserve(s, estimate)
		}
	}
	w := windowsAt(l.now())
	p := l.plan(s, estimate, w)
	res, err := l.reserve(p)
	if err == nil && res[0] == -1 {
		// A budget window is not marked seeded: Redis restarted empty or
		// lost its data. Seed it from the store, then count.
		if err = l.seedRedis(); err == nil {
			res, err = l.reserve(p)
			if err == nil && res[0] == -1 {
				err = errors.New("seed markers missing right after seeding")
			}
		}
	}
	if err != nil {
		l.fallBack(fmt.Errorf("reserve: %w", err))
		return l.localReserve(s, estimate)
	}
	if probe {
		l.recovered()
	}
	if i := res[0]; i > 0 {
		c := p.checks[i-1]
		return Reservation{}, c.rule.refusal(s, c.cap, res[1], estimate, c.start, w.now)
	}
	return Reservation{
		subject:  s,
		estimate: estimate,
		minute:   w.minute,
		day:      w.day,
		month:    w.month,
		keys:     p.keys[p.requestKeys:p.counterKeys],
	}, nil
}

// reserve runs reserveScript for p and checks the shape of its reply.
func (l *RedisLimiter) reserve(p redisPlan) ([]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	res, err := reserveScript.Run(ctx, l.client, p.keys, p.args...).Int64Slice()
	if err == nil && (len(res) != 2 || res[0] < -1 || res[0] > int64(len(p.checks))) {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	return res, err
}

// localReserve reserves against the local counters, once they are seeded.
func (l *RedisLimiter) localReserve(s Subject, estimate int64) (Reservation, error) {
	l.seeding.RLock()
	defer l.seeding.RUnlock()
	return l.local.Reserve(s, estimate)
}

// fallBack handles a failed Redis call. When it starts a fall back, the
// local counters are seeded from the store first, so that they start from
// what was spent in the window (by every replica, as far as the store
// knows) rather than from what this replica counted locally.
func (l *RedisLimiter) fallBack(err error) {
	if !l.failed(err) || l.st == nil {
		return
	}
	l.seeding.Lock()
	defer l.seeding.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), seedTimeout)
	defer cancel()
	if err := l.local.restore(ctx, l.st, true); err != nil {
		l.log.Error("seeding the local limit counters from the usage store failed: budgets count from this replica's own spend",
			zap.Error(err))
	}
}

// Settle replaces the reservation's estimate with the tokens actually used
// (0 when the request failed before using any): in Redis, one round trip
// unless they are equal, or locally if the request was reserved locally.
func (l *RedisLimiter) Settle(r Reservation, used int64) {
	if r.l != nil {
		r.l.Settle(r, used)
		return
	}
	delta := max(used, 0) - r.estimate
	// While Redis fails the correction is dropped rather than paying a
	// timeout for it: the fail-open policy errs towards counting too much
	// or too little by the corrections of the requests in flight.
	if delta == 0 || len(r.keys) == 0 || l.down.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	if err := settleScript.Run(ctx, l.client, r.keys, delta).Err(); err != nil {
		l.fallBack(fmt.Errorf("settle: %w", err))
	}
}

// selectsAny reports whether some limit selects s.
func (l *RedisLimiter) selectsAny(s Subject) bool {
	for i := range l.local.rules {
		if l.local.rules[i].selects(s) {
			return true
		}
	}
	return false
}

// redisPlan is what one Reserve sends to reserveScript.
type redisPlan struct {
	keys        []string // request counters, then token counters, each once, then seed markers
	requestKeys int      // how many of keys count requests
	counterKeys int      // how many of keys are counters
	args        []any
	checks      []redisCheck // in the order the local limiter checks
}

// redisCheck is one cap of one rule, as the script checks it.
type redisCheck struct {
	rule  *limitRule
	cap   limitCap
	key   string
	start int64 // the start of the counter's window, unix nanoseconds
}

// plan lists the counters and checks of a request of s in the windows w.
// Rules with the same selection share their counters (a counter is named by
// what it counts), so each counter is counted once however many rules
// check it.
func (l *RedisLimiter) plan(s Subject, estimate int64, w windows) redisPlan {
	// Each rule checks at most three caps.
	p := redisPlan{checks: make([]redisCheck, 0, 3*len(l.local.rules))}
	for i := range l.local.rules {
		lr := &l.local.rules[i]
		if !lr.selects(s) {
			continue
		}
		if lr.rpm > 0 {
			p.checks = append(p.checks, redisCheck{rule: lr, cap: capRPM, start: w.minute,
				key: l.key("requests", w.minute, minuteLayout, lr, s)})
		}
		if lr.tpm > 0 {
			p.checks = append(p.checks, redisCheck{rule: lr, cap: capTPM, start: w.minute,
				key: l.key("tokens", w.minute, minuteLayout, lr, s)})
		}
		if lr.budget > 0 {
			start := lr.windowOf(w.day, w.month)
			p.checks = append(p.checks, redisCheck{rule: lr, cap: capBudget, start: start,
				key: l.budgetKey(lr, s, start)})
		}
	}
	// Request counters go first, so that the reservation keeps the token
	// counters as a tail of keys.
	p.keys = make([]string, 0, len(p.checks))
	for _, c := range p.checks {
		if c.cap == capRPM && !slices.Contains(p.keys, c.key) {
			p.keys = append(p.keys, c.key)
		}
	}
	p.requestKeys = len(p.keys)
	for _, c := range p.checks {
		if c.cap != capRPM && !slices.Contains(p.keys, c.key) {
			p.keys = append(p.keys, c.key)
		}
	}
	p.counterKeys = len(p.keys)
	// The budget windows counted in must be marked seeded.
	for _, c := range p.checks {
		if c.cap == capBudget {
			if m := l.markerKey(c.start, c.rule.monthly); !slices.Contains(p.keys[p.counterKeys:], m) {
				p.keys = append(p.keys, m)
			}
		}
	}
	p.args = make([]any, 0, 1+2*p.counterKeys+2*len(p.checks))
	p.args = append(p.args, len(p.keys)-p.counterKeys)
	for i, k := range p.keys[:p.counterKeys] {
		// The name says what a counter counts and its window: any check
		// of it gives its increment and expiry.
		c := p.checks[slices.IndexFunc(p.checks, func(c redisCheck) bool { return c.key == k })]
		incr, end, margin := estimate, c.start+int64(time.Minute), minuteKeyMargin
		if i < p.requestKeys {
			incr = 1
		}
		if c.cap == capBudget {
			end, margin = c.rule.budgetEnd(c.start), budgetKeyMargin
		}
		p.args = append(p.args, incr, (time.Duration(end-w.now) + margin).Milliseconds())
	}
	for _, c := range p.checks {
		limit := c.rule.budget
		switch c.cap {
		case capRPM:
			limit = c.rule.rpm
		case capTPM:
			limit = c.rule.tpm
		}
		p.args = append(p.args, slices.Index(p.keys, c.key)+1, limit)
	}
	return p
}

// Window ids in counter names: UTC minute, day and month.
const (
	minuteLayout = "2006-01-02T15:04"
	dayLayout    = "2006-01-02"
	monthLayout  = "2006-01"
)

// budgetKey names the budget counter of the rule for s in the window
// starting at start.
func (l *RedisLimiter) budgetKey(lr *limitRule, s Subject, start int64) string {
	layout := dayLayout
	if lr.monthly {
		layout = monthLayout
	}
	return l.key("tokens", start, layout, lr, s)
}

// key names a counter: the prefix, what it counts, its window, and the
// subject values the rule selects by (quoted, so that no value can make
// two names equal), e.g. tollgate:requests:2025-03-14T12:00:team="acme".
// A limit on everything counts in ...:all. The name says what is counted,
// not which rule counts it, so rules of the same selection share counters
// and reordering the configuration loses no count.
func (l *RedisLimiter) key(what string, start int64, layout string, lr *limitRule, s Subject) string {
	var buf [128]byte
	b := append(buf[:0], l.prefix...)
	b = append(b, what...)
	b = append(b, ':')
	b = time.Unix(0, start).UTC().AppendFormat(b, layout)
	b = append(b, ':')
	n := len(b)
	for _, f := range [...]struct{ name, sel, v string }{
		{"team", lr.team, s.Team},
		{"project", lr.project, s.Project},
		{"key", lr.key, s.Key},
	} {
		if f.sel == "" {
			continue
		}
		if len(b) > n {
			b = append(b, ',')
		}
		b = append(b, f.name...)
		b = append(b, '=')
		b = strconv.AppendQuote(b, f.v)
	}
	if len(b) == n {
		b = append(b, "all"...)
	}
	return string(b)
}

// probeDue reports whether this request, while Redis is down, is the one
// of its interval that tries Redis again.
func (l *RedisLimiter) probeDue() bool {
	next := l.nextProbe.Load()
	now := time.Now().UnixNano()
	return now >= next && l.nextProbe.CompareAndSwap(next, now+int64(l.probeEvery))
}

// failed handles a failed Redis call: it is counted, and either starts the
// fall back to local counters, logged once, or extends it, with a reminder
// logged now and then. It reports whether it started the fall back.
func (l *RedisLimiter) failed(err error) bool {
	l.redisErrors.Inc()
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down.Load() {
		l.nextProbe.Store(now.Add(l.probeEvery).UnixNano())
		l.down.Store(true)
		l.fallbackActive.Set(1)
		l.downSince, l.downErrs, l.nextRemind = now, 1, now.Add(l.remindEvery)
		l.log.Warn("Redis limits backend failed: enforcing limits with local counters, each replica on its own, until it answers again",
			zap.String("addr", l.addr), zap.Error(err))
		return true
	}
	l.downErrs++
	if now.Before(l.nextRemind) {
		return false
	}
	l.nextRemind = now.Add(l.remindEvery)
	l.log.Warn("Redis limits backend still failing: enforcing limits with local counters",
		zap.String("addr", l.addr), zap.Duration("for", now.Sub(l.downSince)),
		zap.Int64("errors", l.downErrs), zap.Error(err))
	return false
}

// recovered ends the fall back after a probe reached Redis. Only probes
// end it, so that calls begun before a failure cannot make the state flap.
func (l *RedisLimiter) recovered() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down.Load() {
		return
	}
	l.down.Store(false)
	l.fallbackActive.Set(0)
	l.log.Info("Redis limits backend answers again: limits are shared by all replicas",
		zap.String("addr", l.addr), zap.Duration("after", time.Since(l.downSince)),
		zap.Int64("errors", l.downErrs))
}

// registerOrAdopt registers c, or returns the collector of the same
// description already registered.
func registerOrAdopt[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// Derive returns a limiter enforcing limits with l's Redis connections,
// counters and settings, seeded from the store l was restored with: a
// limit that selects what l's did counts on in the same Redis counters.
// Its fall back to local counters is its own. Close only the limiter
// NewRedisLimiter returned: it closes the connections of every one derived.
func (l *RedisLimiter) Derive(ctx context.Context, limits []config.Limit) *RedisLimiter {
	n := &RedisLimiter{
		local: NewLimiter(limits, l.now), client: l.client, addr: l.addr, prefix: l.prefix, timeout: l.timeout,
		now: l.now, log: l.log, redisErrors: l.redisErrors, fallbackActive: l.fallbackActive,
		probeEvery: l.probeEvery, remindEvery: l.remindEvery,
	}
	if l.st != nil {
		// Restore fails only when the store does; the limiter then seeds
		// Redis from the store at its first reservation.
		if err := n.Restore(ctx, l.st); err != nil {
			n.st = l.st
			n.log.Warn("seeding derived limits from the usage store failed", zap.Error(err))
		}
	}
	return n
}

// SetStore makes st the store the limiter seeds budgets from, without
// reading it: for a limiter with no budget yet, whose derived limiters
// will have some.
func (l *RedisLimiter) SetStore(st LimitsStore) { l.st = st }
