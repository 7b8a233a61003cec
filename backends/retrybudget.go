package backends

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

// milli is one token of the retry budget in the thousandths it is counted
// in: integers, so that ten requests at a ratio of 0.2 make exactly two
// retries, which float sums do not.
const milli = 1000

// RetryBudget caps retries at a fraction of requests, so that when
// backends melt down the gateway does not multiply the load on them. It is
// a token bucket: each request adds BudgetRatio tokens, time adds
// BudgetMin tokens a second (so light traffic can still retry), and each
// retry takes one. The bucket holds at most ten seconds' worth.
type RetryBudget struct {
	perRequest int64        // thousandths of a token each request adds
	perSecond  int64        // thousandths of a token each second adds
	capacity   atomic.Int64 // read by Request without mu

	mu sync.Mutex
	// tokens is written under mu, and read without it by Request, which
	// writes nothing while the bucket is full.
	tokens atomic.Int64 // thousandths
	last   time.Time
}

// NewRetryBudget builds a budget from the retries configuration.
func NewRetryBudget(cfg config.Retries) *RetryBudget {
	b := &RetryBudget{last: time.Now()}
	b.configure(cfg)
	b.tokens.Store(b.capacity.Load())
	return b
}

// Configure takes a reloaded budget_ratio and budget_min. The budget lives
// across reloads, so the tokens it holds are kept, up to the new capacity.
func (b *RetryBudget) Configure(cfg config.Retries) {
	b.mu.Lock()
	b.configure(cfg)
	b.tokens.Store(min(b.tokens.Load(), b.capacity.Load()))
	b.mu.Unlock()
}

func (b *RetryBudget) configure(cfg config.Retries) {
	b.perRequest = int64(cfg.BudgetRatio*milli + 0.5)
	b.perSecond = int64(cfg.BudgetMin) * milli
	b.capacity.Store(max(10*b.perSecond, milli))
}

// Request counts one request into the budget. Every request calls it, on
// whichever core it runs: a full bucket, as it is whenever retries are
// rare, is only read, so that the cache line is not written back and forth
// between cores. Nothing is lost: at the instant of that read, adding to
// the full bucket would have left it as it was, and a Retry after it takes
// its token from the full bucket, as it would have after the add.
func (b *RetryBudget) Request() {
	if b.tokens.Load() >= b.capacity.Load() {
		return
	}
	b.mu.Lock()
	b.tokens.Store(min(b.tokens.Load()+b.perRequest, b.capacity.Load()))
	b.mu.Unlock()
}

// Retry takes a token for one retry, reporting false when the budget is
// spent.
func (b *RetryBudget) Retry(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if dt := now.Sub(b.last); dt > 0 {
		// Past a minute the bucket is full anyway; the bound keeps the
		// product below overflow however long the gateway sat idle.
		dt = min(dt, time.Minute)
		b.tokens.Store(min(b.tokens.Load()+int64(dt)*b.perSecond/int64(time.Second), b.capacity.Load()))
		b.last = now
	}
	if b.tokens.Load() < milli {
		return false
	}
	b.tokens.Add(-milli)
	return true
}
