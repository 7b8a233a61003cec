package accounting

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

// TestLimiterDeriveCarriesCounts: a limiter derived with one limit changed
// and one added keeps the counts of the limits that select the same, so
// that a change to one project's limits resets nobody's window.
func TestLimiterDeriveCarriesCounts(t *testing.T) {
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 30, 0, time.UTC))
	l := NewLimiter([]config.Limit{{Team: "acme", RPM: 2}, {Team: "beta", TokenBudget: 100}}, clock.Now)
	l.Settle(mustReserve(t, l, acme, 10), 10)
	l.Settle(mustReserve(t, l, acme, 10), 10)
	l.Settle(mustReserve(t, l, beta, 60), 60)

	d := l.Derive([]config.Limit{{Team: "acme", RPM: 3}, {Team: "beta", TokenBudget: 100}, {Team: "gamma", RPM: 1}})
	l.Settle(mustReserve(t, d, acme, 10), 10) // the third of 3
	wantRefused(t, d, acme, 10, CodeRateLimitExceeded, 30*time.Second)
	wantRefused(t, d, beta, 50, CodeInsufficientQuota, wantMonthEnd(clock))
	d.Settle(mustReserve(t, d, beta, 40), 40)
	mustReserve(t, d, Subject{Team: "gamma"}, 1)
}

func wantMonthEnd(c *fakeClock) time.Duration {
	return time.Date(2025, 4, 1, 0, 0, 0, 0, time.UTC).Sub(c.Now())
}

// TestLimiterReseedKeepsHigher: reseeding raises a budget counter to the
// store's spend but keeps a higher count of its own.
func TestLimiterReseedKeepsHigher(t *testing.T) {
	clock := newClock(time.Date(2025, 3, 14, 12, 0, 30, 0, time.UTC))
	l := NewLimiter([]config.Limit{{Team: "acme", TokenBudget: 100}, {Team: "beta", TokenBudget: 100}}, clock.Now)
	mustReserve(t, l, acme, 70) // in flight: not in the store
	st := spentRows{{Subject: acme, Tokens: 20}, {Subject: beta, Tokens: 90}}
	if err := l.Reseed(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, l, acme, 30)
	wantRefused(t, l, acme, 1, CodeInsufficientQuota, wantMonthEnd(clock))
	mustReserve(t, l, beta, 10)
	wantRefused(t, l, beta, 1, CodeInsufficientQuota, wantMonthEnd(clock))
}

type spentRows []SpentRow

func (s spentRows) SpentTokens(context.Context, time.Time) ([]SpentRow, error) { return s, nil }

func TestPriceTokens(t *testing.T) {
	p := config.Pricing{PromptPerMTok: 0.2, CompletionPerMTok: 0.6, CachedPromptPerMTok: 0.05}
	tests := []struct {
		name                       string
		p                          config.Pricing
		prompt, completion, cached int64
		want                       Cost
		nano                       int64
	}{
		{"split", p, 1000, 500, 400, Cost{Input: 600 * 0.2 / 1e6, CachedInput: 400 * 0.05 / 1e6, Output: 500 * 0.6 / 1e6}, 440_000},
		{"no cached price: the prompt's", config.Pricing{PromptPerMTok: 1}, 10, 0, 5, Cost{Input: 5e-6, CachedInput: 5e-6}, 10_000},
		{"cached beyond prompt", p, 10, 0, 50, Cost{CachedInput: 10 * 0.05 / 1e6}, 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PriceTokens(tt.p, tt.prompt, tt.completion, tt.cached)
			if got != tt.want {
				t.Fatalf("PriceTokens = %+v, want %+v", got, tt.want)
			}
			if n := NanoUSD(got.Total()); n != tt.nano {
				t.Fatalf("NanoUSD(%v) = %d, want %d", got.Total(), n, tt.nano)
			}
		})
	}
}

// TestPriceUsage prices the prompt tokens written to the cache at
// cache_write_per_mtok, or at the prompt price when that is zero, apart
// from the rest of the prompt, which counts them.
func TestPriceUsage(t *testing.T) {
	p := config.Pricing{PromptPerMTok: 3, CompletionPerMTok: 15, CachedPromptPerMTok: 0.3, CacheWritePerMTok: 3.75}
	tests := []struct {
		name                                   string
		p                                      config.Pricing
		prompt, completion, cached, cacheWrite int64
		want                                   Cost
	}{
		{"split", p, 1000, 100, 200, 500, Cost{Input: 300 * 3 / 1e6, CachedInput: 200 * 0.3 / 1e6, CacheWriteInput: 500 * 3.75 / 1e6, Output: 100 * 15 / 1e6}},
		{"no cache write price: the prompt's", config.Pricing{PromptPerMTok: 2}, 10, 0, 0, 4, Cost{Input: 6 * 2 / 1e6, CacheWriteInput: 4 * 2 / 1e6}},
		{"writes beyond the uncached prompt", p, 10, 0, 6, 50, Cost{CachedInput: 6 * 0.3 / 1e6, CacheWriteInput: 4 * 3.75 / 1e6}},
		{"negative writes count nothing", p, 10, 0, 0, -5, Cost{Input: 10 * 3 / 1e6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PriceUsage(tt.p, tt.prompt, tt.completion, tt.cached, tt.cacheWrite)
			if got != tt.want {
				t.Fatalf("PriceUsage = %+v, want %+v", got, tt.want)
			}
			if want := tt.want.Input + tt.want.CachedInput + tt.want.CacheWriteInput + tt.want.Output; got.Total() != want {
				t.Fatalf("Total = %v, want %v", got.Total(), want)
			}
		})
	}
}
