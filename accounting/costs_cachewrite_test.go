package accounting

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

// oneRowSource answers every usage query with its one row and no price
// history, so the current prices apply.
type oneRowSource struct{ row UsageRow }

func (s oneRowSource) UsageBuckets(_ context.Context, q UsageQuery) ([]UsageRow, error) {
	r := s.row
	r.BucketStart = q.Start
	return []UsageRow{r}, nil
}

func (oneRowSource) PriceHistory(context.Context) ([]PriceChange, error) { return nil, nil }

// TestReadCostsPricesCacheWrites checks that costs price the prompt tokens
// written to the cache at the model's cache-write price, as spend limits
// and the trace service do, and keep them out of the plain input.
func TestReadCostsPricesCacheWrites(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	src := oneRowSource{UsageRow{Model: "m", InputTokens: 1_000_000, CachedTokens: 200_000, CacheWriteTokens: 300_000, OutputTokens: 100_000}}
	prices := map[string]config.Pricing{"m": {PromptPerMTok: 1, CachedPromptPerMTok: 0.1, CacheWritePerMTok: 1.25, CompletionPerMTok: 4}}
	rows, err := ReadCosts(context.Background(), src, prices, UsageQuery{Start: start, End: start.Add(24 * time.Hour), BucketWidth: 24 * time.Hour})
	if err != nil || len(rows) != 1 {
		t.Fatalf("ReadCosts = %+v, %v; want one row", rows, err)
	}
	c := rows[0].Cost
	want := Cost{Input: 0.5, CachedInput: 0.02, CacheWriteInput: 0.375, Output: 0.4}
	for _, f := range []struct {
		name      string
		got, want float64
	}{{"input", c.Input, want.Input}, {"cached input", c.CachedInput, want.CachedInput}, {"cache write", c.CacheWriteInput, want.CacheWriteInput}, {"output", c.Output, want.Output}} {
		if math.Abs(f.got-f.want) > 1e-9 {
			t.Errorf("%s costs %v, want %v (all: %+v)", f.name, f.got, f.want, c)
		}
	}
}
