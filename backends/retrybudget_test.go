package backends

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

func TestRetryBudget(t *testing.T) {
	t.Run("starts full, then only the ratio refills it", func(t *testing.T) {
		// A ratio exact in binary, so that the sums below are exact.
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.25, BudgetMin: 10})
		now := b.last // no time passes: no refill by time
		if n := drain(b, now); n != 100 {
			t.Fatalf("a fresh budget allowed %d retries, want ten seconds of budget_min = 100", n)
		}
		for range 8 {
			b.Request()
		}
		if n := drain(b, now); n != 2 {
			t.Fatalf("8 requests at ratio 0.25 allowed %d retries, want 2", n)
		}
		for range 3 {
			b.Request()
		}
		if n := drain(b, now); n != 0 {
			t.Fatalf("0.75 of a token allowed %d retries", n)
		}
		b.Request()
		if n := drain(b, now); n != 1 {
			t.Fatalf("the fourth request completed a token, yet %d retries", n)
		}
	})
	t.Run("a decimal ratio adds up", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.2, BudgetMin: 10})
		now := b.last
		drain(b, now)
		for range 10 {
			b.Request()
		}
		if n := drain(b, now); n != 2 {
			t.Errorf("10 requests at ratio 0.2 allowed %d retries, want 2", n)
		}
	})
	t.Run("time refills budget_min a second", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.2, BudgetMin: 10})
		now := b.last
		drain(b, now)
		now = now.Add(time.Second)
		if n := drain(b, now); n != 10 {
			t.Fatalf("one second refilled %d retries, want 10", n)
		}
		// A clock going backwards refills nothing.
		if n := drain(b, now.Add(-time.Minute)); n != 0 {
			t.Fatalf("a clock going backwards refilled %d", n)
		}
	})
	t.Run("capped at ten seconds' worth", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 1, BudgetMin: 10})
		now := b.last
		for range 1000 {
			b.Request()
		}
		if n := drain(b, now); n != 100 {
			t.Fatalf("1000 requests at ratio 1 allowed %d retries, want the cap of 100", n)
		}
		if n := drain(b, now.Add(time.Hour)); n != 100 {
			t.Fatalf("an hour allowed %d retries, want the cap of 100", n)
		}
	})
	t.Run("no minimum", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.5, BudgetMin: 0})
		now := b.last
		if n := drain(b, now.Add(time.Hour)); n != 1 {
			t.Fatalf("budget_min 0 allowed %d retries, want a bucket of 1", n)
		}
		b.Request()
		b.Request()
		if n := drain(b, now.Add(time.Hour)); n != 1 {
			t.Fatalf("two requests at ratio 0.5 allowed %d retries, want 1", n)
		}
	})
}

// drain takes retries from b at now until it refuses, and returns how many it allowed.
func drain(b *RetryBudget, now time.Time) int {
	n := 0
	for b.Retry(now) {
		n++
		if n > 1e6 {
			panic("the retry budget never runs out")
		}
	}
	return n
}

func TestRetryBudgetConfigure(t *testing.T) {
	t.Run("a smaller capacity caps the tokens held", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.25, BudgetMin: 10})
		now := b.last
		b.Configure(config.Retries{BudgetRatio: 0.25, BudgetMin: 2})
		if n := drain(b, now); n != 20 {
			t.Fatalf("a full budget reconfigured to budget_min 2 allowed %d retries, want its new cap of 20", n)
		}
	})
	t.Run("a larger capacity keeps the tokens held", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.25, BudgetMin: 10})
		now := b.last
		for range 90 {
			b.Retry(now)
		}
		b.Configure(config.Retries{BudgetRatio: 0.25, BudgetMin: 100})
		if n := drain(b, now); n != 10 {
			t.Fatalf("10 tokens left, reconfigured to a larger cap, allowed %d retries, want the 10 held", n)
		}
	})
	t.Run("the new ratio counts from then on", func(t *testing.T) {
		b := NewRetryBudget(config.Retries{BudgetRatio: 0.25, BudgetMin: 10})
		now := b.last
		drain(b, now)
		b.Configure(config.Retries{BudgetRatio: 0.5, BudgetMin: 10})
		for range 4 {
			b.Request()
		}
		if n := drain(b, now); n != 2 {
			t.Errorf("4 requests at the reloaded ratio 0.5 allowed %d retries, want 2", n)
		}
		if n := drain(b, now.Add(time.Second)); n != 10 {
			t.Errorf("one second refilled %d retries, want budget_min 10", n)
		}
	})
}

// Requests counted on many goroutines at once, while others take retries,
// add up exactly: every request's share is counted until the bucket is
// full, and a full bucket stays at its cap.
func TestRetryBudgetConcurrent(t *testing.T) {
	const workers, perWorker = 8, 500
	b := NewRetryBudget(config.Retries{BudgetRatio: 0.25, BudgetMin: 100}) // cap 1,000 retries
	now := b.last
	drain(b, now)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range perWorker {
				b.Request()
			}
		})
	}
	wg.Wait()
	// 4,000 requests at 0.25: 1,000 retries, exactly the cap.
	if n := drain(b, now); n != workers*perWorker/4 {
		t.Fatalf("%d concurrent requests at ratio 0.25 allowed %d retries, want %d", workers*perWorker, n, workers*perWorker/4)
	}

	// With the bucket full, concurrent requests leave it at its cap while
	// concurrent retries take from it: every retry allowed took a token.
	for range 4 * workers * perWorker {
		b.Request()
	}
	var allowed atomic.Int64
	for i := range workers {
		wg.Go(func() {
			for range perWorker {
				if i%2 == 0 {
					b.Request()
				} else if b.Retry(now) {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	left := drain(b, now)
	// The retries took allowed tokens from a full bucket of 1,000, and the
	// requests added at most 2,000 × 0.25 = 500 back, capped at 1,000.
	if got := allowed.Load() + int64(left); got < 1000 || got > 1500 || left > 1000 {
		t.Fatalf("allowed %d, left %d: want a total of 1,000 to 1,500 and at most 1,000 left", allowed.Load(), left)
	}
}
