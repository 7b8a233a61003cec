package proxy_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind. Ignored
// are fasthttp's own background goroutines, which outlive any one server
// or client (leakcheck.IgnoreFasthttp).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.IgnoreFasthttp()...)
}
