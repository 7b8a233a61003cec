package accounting

import (
	"math"

	"github.com/tollgate-dev/tollgate/config"
)

// Cost is what tokens cost at a model's prices, in US dollars, split as
// OpenAI's costs API splits it into line items, with the prompt tokens
// written to the cache apart.
type Cost struct {
	Input, CachedInput, CacheWriteInput, Output float64
}

// PriceTokens is PriceUsage of a usage that wrote nothing to the prompt
// cache, or whose cache writes are priced as the rest of its prompt.
func PriceTokens(p config.Pricing, prompt, completion, cached int64) Cost {
	return PriceUsage(p, prompt, completion, cached, 0)
}

// PriceUsage prices prompt tokens (cached ones and cache writes included,
// as OpenAI counts cached ones), completion tokens, and the parts of the
// prompt read from the cache (cached) and written to it (cacheWrite) at p:
// cached tokens at p.CachedPromptPrice, cache writes at
// p.CacheWritePrice, the rest of the prompt at the prompt price. The parts
// are at most the prompt, the cached ones first.
func PriceUsage(p config.Pricing, prompt, completion, cached, cacheWrite int64) Cost {
	prompt = max(prompt, 0)
	cached = min(max(cached, 0), prompt)
	cacheWrite = min(max(cacheWrite, 0), prompt-cached)
	return Cost{
		Input:           float64(prompt-cached-cacheWrite) * p.PromptPerMTok / 1e6,
		CachedInput:     float64(cached) * p.CachedPromptPrice() / 1e6,
		CacheWriteInput: float64(cacheWrite) * p.CacheWritePrice() / 1e6,
		Output:          float64(max(completion, 0)) * p.CompletionPerMTok / 1e6,
	}
}

// Total is the cost's sum in dollars.
func (c Cost) Total() float64 { return c.Input + c.CachedInput + c.CacheWriteInput + c.Output }

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
