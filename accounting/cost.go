package accounting

import (
	"math"

	"github.com/tollgate-dev/tollgate/config"
)

// Cost is what tokens cost at a model's prices, in US dollars, split as
// OpenAI's costs API splits it into line items.
type Cost struct {
	Input, CachedInput, Output float64
}

// PriceTokens prices prompt tokens (cached ones included, as OpenAI counts
// them), completion tokens and the cached part of the prompt at p. Cached
// tokens cost the prompt price when p sets no cached price, as the trace
// service's costs count them.
func PriceTokens(p config.Pricing, prompt, completion, cached int64) Cost {
	cachedPrice := p.PromptPerMTok
	if p.CachedPromptPerMTok > 0 {
		cachedPrice = p.CachedPromptPerMTok
	}
	cached = min(max(cached, 0), max(prompt, 0))
	return Cost{
		Input:       float64(max(prompt, 0)-cached) * p.PromptPerMTok / 1e6,
		CachedInput: float64(cached) * cachedPrice / 1e6,
		Output:      float64(max(completion, 0)) * p.CompletionPerMTok / 1e6,
	}
}

// Total is the cost's sum in dollars.
func (c Cost) Total() float64 { return c.Input + c.CachedInput + c.Output }

// NanoUSDPerCent converts a spend limit's cents into the spend counters'
// unit, billionths of a dollar: whole numbers for any price a config
// writes to a thousandth of a cent per million tokens.
const NanoUSDPerCent = 10_000_000

// NanoUSD is dollars in billionths of a dollar, rounded up and saturated
// at the largest int64, for the limiter's integer counters.
func NanoUSD(usd float64) int64 {
	// The small offset keeps float noise (4e-5 * 1e9 = 40000.000000001)
	// from rounding a whole number up.
	n := math.Ceil(usd*1e9 - 1e-3)
	if n >= math.MaxInt64 || math.IsNaN(n) {
		return math.MaxInt64
	}
	return max(int64(n), 0)
}
