package backends

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

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
