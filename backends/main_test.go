package backends

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/leakcheck"
)

// TestMain checks that no test leaves a goroutine behind: health checkers must be stopped and
// in-process simulated backends shut down. fasthttp's own background goroutines are not ours and
// are ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.IgnoreFasthttp()...)
}

// testHealth is the health configuration of the backends built by newTestBackend.
var testHealth = config.Health{FailuresToEject: 3, Cooldown: time.Second, MaxCooldown: 5 * time.Second, Interval: time.Hour}

// newTestBackend returns a backend with no connection to anything, enough for the selection,
// health and queue logic, which never send a request.
func newTestBackend(name string, weight, maxConcurrency int) *Backend {
	b := &Backend{Name: name, weight: int64(max(weight, 1)), maxConcurrency: int64(maxConcurrency)}
	b.health.init(testHealth)
	return b
}

// newTestRoute puts backends in a route whose queue their releases serve, as NewRegistry wires
// them.
func newTestRoute(q config.Queue, bs ...*Backend) *Route {
	r := &Route{Name: "m", Upstream: "m", backends: bs, queue: q,
		signals: signalsOf(&config.Model{Routing: config.Routing{QueueCostTokens: testQueueCostTokens}})}
	for _, b := range bs {
		r.totalWeight += b.weight
		b.routes = append(b.routes, r)
	}
	return r
}

// testQueueCostTokens is the routing.queue_cost_tokens of newTestRoute's routes.
const testQueueCostTokens = 2048

// eject takes b out as passive ejection does, with enough failures.
func eject(b *Backend) {
	for range b.health.cfg.FailuresToEject {
		b.ReportFailure()
	}
}
