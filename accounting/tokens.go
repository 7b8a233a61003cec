package accounting

import "math"

// AddTokens returns a + b saturated to the int64 range, for sums of token
// counts read from a store: each may be as large as a backend claimed, and
// a sum that wrapped negative would make a budget look unspent.
func AddTokens(a, b int64) int64 {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}
