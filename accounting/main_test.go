package accounting

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// Recorder a test starts must be closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
