package accounting

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

func TestAddTokens(t *testing.T) {
	tests := []struct {
		name string
		a, b int64
		want int64
	}{
		{"small", 2, 3, 5},
		{"negative", 2, -3, -1},
		{"at the bound", math.MaxInt64 - 1, 1, math.MaxInt64},
		{"past the bound", math.MaxInt64, 1, math.MaxInt64},
		{"two halves and more", 1 << 62, 1 << 62, math.MaxInt64},
		{"past the lower bound", math.MinInt64, -1, math.MinInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AddTokens(tt.a, tt.b); got != tt.want {
				t.Errorf("AddTokens(%d, %d) = %d, want %d", tt.a, tt.b, got, tt.want)
			}
		})
	}
}

// TestLimiterRestoreSaturates restores spend rows a store may hold after a
// backend reported absurd counts: two rows of 2^62 and one of 2^63-1 for
// one budget, and a negative row for another. The sums saturate instead
// of wrapping negative, so the first budget refuses everything and the
// second is not made larger than it is.
func TestLimiterRestoreSaturates(t *testing.T) {
	now := time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)
	st := &fakeLimitsStore{rows: []SpentRow{
		{Subject: Subject{Team: "acme", Project: "a", Key: "k1"}, Tokens: 1 << 62},
		{Subject: Subject{Team: "acme", Project: "b", Key: "k1"}, Tokens: 1 << 62},
		{Subject: Subject{Team: "acme", Project: "c", Key: "k1"}, Tokens: math.MaxInt64},
		{Subject: Subject{Team: "beta", Project: "a", Key: "k2"}, Tokens: -1000},
		{Subject: Subject{Team: "beta", Project: "b", Key: "k2"}, Tokens: 60},
	}}
	l := NewLimiter([]config.Limit{{Team: "*", TokenBudget: 100, BudgetWindow: "day"}}, newClock(now).Now)
	if err := l.Restore(context.Background(), st); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	huge := Subject{Team: "acme", Project: "a", Key: "k1"}
	wantRefused(t, l, huge, 1, CodeInsufficientQuota, 12*time.Hour)
	wantRefused(t, l, huge, math.MaxInt64, CodeInsufficientQuota, 12*time.Hour)
	spent60 := Subject{Team: "beta", Project: "a", Key: "k2"}
	wantRefused(t, l, spent60, 41, CodeInsufficientQuota, 12*time.Hour) // 60 spent, the negative row counts 0
	r := mustReserve(t, l, spent60, 40)
	l.Settle(r, 40)
}
