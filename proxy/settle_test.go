package proxy

import (
	"testing"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/openai"
)

// TestTokenBoundsAgree: the largest count openai reads from a backend is
// the largest a usage record carries, so that every count served is
// recorded as it is (see recordUsage).
func TestTokenBoundsAgree(t *testing.T) {
	if openai.MaxTokenCount != accounting.MaxRecordTokens {
		t.Errorf("openai.MaxTokenCount = %d, accounting.MaxRecordTokens = %d; want them equal",
			int64(openai.MaxTokenCount), int64(accounting.MaxRecordTokens))
	}
}
