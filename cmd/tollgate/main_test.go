package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// gateway a test starts must be stopped, which also ends the keep-alive
// connections of the tests' HTTP client. Only fasthttp's own background
// goroutines are ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.IgnoreFasthttp()...)
}
