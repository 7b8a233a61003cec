package accounting

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

// PriceChange is a model's prices from a time on: one entry of the price
// history the store keeps, appended whenever the configured prices change,
// so that a price change applies from its time on and never rewrites past
// costs.
type PriceChange struct {
	Model   string
	Pricing config.Pricing
	// From is a whole second: usage from this second on costs Pricing.
	From time.Time
}

// Prices is an effective-dated price history: what every model cost at
// any second. Costs in the costs API, `tollgate usage`, the dashboard and
// spend limits are all priced by it.
type Prices struct {
	// byModel holds each model's changes, oldest first.
	byModel map[string][]PriceChange
	// current prices a model the history does not know.
	current map[string]config.Pricing
}

// NewPrices returns the history of changes; a model without any change is
// priced at current throughout.
func NewPrices(changes []PriceChange, current map[string]config.Pricing) *Prices {
	p := &Prices{byModel: map[string][]PriceChange{}, current: current}
	for _, c := range changes {
		p.byModel[c.Model] = append(p.byModel[c.Model], c)
	}
	for _, cs := range p.byModel {
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].From.Before(cs[j].From) })
	}
	return p
}

// At is model's price in force at t: the latest change from t or before,
// or, for usage older than the history, its first price (the one in force
// when the history began).
func (p *Prices) At(model string, t time.Time) config.Pricing {
	cs := p.byModel[model]
	if len(cs) == 0 {
		return p.current[model]
	}
	i := sort.Search(len(cs), func(i int) bool { return cs[i].From.After(t) })
	return cs[max(i-1, 0)].Pricing
}

// changesWithin lists the times a price changes in (start, end), sorted.
func (p *Prices) changesWithin(start, end time.Time) []time.Time {
	seen := map[time.Time]bool{}
	for _, cs := range p.byModel {
		for _, c := range cs {
			if c.From.After(start) && c.From.Before(end) {
				seen[c.From.UTC()] = true
			}
		}
	}
	out := slices.Collect(maps.Keys(seen))
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// PriceUpdates returns the changes to append to a history whose latest
// prices are latest so that configured is in force from `from` on: one
// per model whose price differs (or that the history lacks). from is
// rounded up to a whole second, so a change never reprices usage already
// recorded.
func PriceUpdates(latest []PriceChange, configured map[string]config.Pricing, from time.Time) []PriceChange {
	last := make(map[string]PriceChange, len(latest))
	for _, c := range latest {
		if prev, ok := last[c.Model]; !ok || !c.From.Before(prev.From) {
			last[c.Model] = c
		}
	}
	at := from.Truncate(time.Second)
	if at.Before(from) {
		at = at.Add(time.Second)
	}
	var out []PriceChange
	for _, m := range slices.Sorted(maps.Keys(configured)) {
		if prev, ok := last[m]; ok && prev.Pricing == configured[m] {
			continue
		}
		out = append(out, PriceChange{Model: m, Pricing: configured[m], From: at.UTC()})
	}
	return out
}

// UsageSource sums usage records: the store.
type UsageSource interface {
	UsageBuckets(ctx context.Context, q UsageQuery) ([]UsageRow, error)
}

// CostRow is one model's usage in one bucket and group, and what it cost.
type CostRow struct {
	UsageRow
	Cost Cost
}

// UsageCosts sums the usage q selects as UsageBuckets does, always split
// by model as well, and prices each row at the prices in force at its
// seconds: the range is cut at every price change, each piece is summed on
// its own and priced at its prices, and the pieces of one bucket are added
// up. Rows come in bucket order.
func UsageCosts(ctx context.Context, src UsageSource, prices *Prices, q UsageQuery) ([]CostRow, error) {
	if q.BucketWidth <= 0 {
		return nil, fmt.Errorf("usage costs: bucket width %v is not positive", q.BucketWidth)
	}
	q.GroupByModel = true
	bucketOf := func(t time.Time) time.Time {
		return q.Start.Add(t.Sub(q.Start) / q.BucketWidth * q.BucketWidth)
	}
	type groupKey struct {
		bucket                                   int64
		team, project, model, key, endpoint, sts string
	}
	byGroup := map[groupKey]int{}
	var out []CostRow
	addPiece := func(start, end time.Time, width time.Duration) error {
		pq := q
		pq.Start, pq.End, pq.BucketWidth = start, end, width
		rows, err := src.UsageBuckets(ctx, pq)
		if err != nil {
			return fmt.Errorf("usage costs: %w", err)
		}
		for _, r := range rows {
			r.BucketStart = bucketOf(r.BucketStart)
			c := PriceUsage(prices.At(r.Model, start), r.InputTokens, r.OutputTokens, r.CachedTokens, r.CacheWriteTokens)
			k := groupKey{r.BucketStart.UnixNano(), r.Team, r.Project, r.Model, r.KeyName, r.Endpoint, r.Status}
			i, ok := byGroup[k]
			if !ok {
				byGroup[k] = len(out)
				out = append(out, CostRow{UsageRow: r, Cost: c})
				continue
			}
			o := &out[i]
			o.InputTokens = AddTokens(o.InputTokens, r.InputTokens)
			o.OutputTokens = AddTokens(o.OutputTokens, r.OutputTokens)
			o.CachedTokens = AddTokens(o.CachedTokens, r.CachedTokens)
			o.CacheWriteTokens = AddTokens(o.CacheWriteTokens, r.CacheWriteTokens)
			o.Requests += r.Requests
			o.Records += r.Records
			o.Cost.Input += c.Input
			o.Cost.CachedInput += c.CachedInput
			o.Cost.CacheWriteInput += c.CacheWriteInput
			o.Cost.Output += c.Output
		}
		return nil
	}
	// Every piece lies in one price segment; a segment's whole buckets are
	// summed in one query, its partial first and last buckets in one each.
	bounds := append(append([]time.Time{q.Start}, prices.changesWithin(q.Start, q.End)...), q.End)
	for i := 0; i+1 < len(bounds); i++ {
		a, b := bounds[i], bounds[i+1]
		if !a.Before(b) {
			continue
		}
		first := bucketOf(a)
		if first.Before(a) {
			first = first.Add(q.BucketWidth)
		}
		last := bucketOf(b)
		if !first.Before(last) {
			if err := addPiece(a, b, b.Sub(a)); err != nil {
				return nil, err
			}
			continue
		}
		if a.Before(first) {
			if err := addPiece(a, first, first.Sub(a)); err != nil {
				return nil, err
			}
		}
		if err := addPiece(first, last, q.BucketWidth); err != nil {
			return nil, err
		}
		if last.Before(b) {
			if err := addPiece(last, b, b.Sub(last)); err != nil {
				return nil, err
			}
		}
	}
	slices.SortStableFunc(out, func(x, y CostRow) int { return x.BucketStart.Compare(y.BucketStart) })
	return out, nil
}

// CostSource is what costs are read from: usage sums and the price
// history (the store).
type CostSource interface {
	UsageSource
	PriceHistory(ctx context.Context) ([]PriceChange, error)
}

// ReadCosts prices the usage q selects by src's price history (current for
// a model the history lacks): the one reading of costs behind the costs
// API, spend limits and alerts, `tollgate usage` and the dashboard.
func ReadCosts(ctx context.Context, src CostSource, current map[string]config.Pricing, q UsageQuery) ([]CostRow, error) {
	if !q.Start.Before(q.End) {
		return nil, nil
	}
	history, err := src.PriceHistory(ctx)
	if err != nil {
		return nil, fmt.Errorf("usage costs: %w", err)
	}
	return UsageCosts(ctx, src, NewPrices(history, current), q)
}
