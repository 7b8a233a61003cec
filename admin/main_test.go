package admin

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests (internal and admin_test alike) when
// a goroutine outlives them. fasthttp's once-per-process Date refresher is
// the only one allowed; the test servers set NoDefaultDate, so it should
// not even start.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}
