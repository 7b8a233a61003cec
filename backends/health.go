package backends

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/config"
)

// health is a backend's standing: the verdict of its last active probe, and
// its passive ejection after consecutive failures of real requests.
//
// An ejected backend gets no traffic until its cooldown has passed and a
// probe succeeds; each failed return doubles the cooldown, up to the
// maximum. One success clears everything.
type health struct {
	cfg config.Health

	probeOK      atomic.Bool
	failures     atomic.Int64
	ejected      atomic.Bool
	ejectedUntil atomic.Int64 // unix nanoseconds
	cooldown     atomic.Int64 // the next ejection's length, nanoseconds
	// ttft is a moving average of time to first byte (first event for
	// streams), in nanoseconds; zero until the first sample.
	ttft atomic.Int64

	// ejections and probeFailures count those events; nil when the
	// registry has no Metrics.
	ejections, probeFailures prometheus.Counter
}

func (h *health) init(cfg config.Health) {
	h.cfg = cfg
	h.probeOK.Store(true)
	h.cooldown.Store(int64(cfg.Cooldown))
}

// State names a backend's standing for /readyz and metrics.
type State string

// The states a backend can be in.
const (
	StateHealthy   State = "healthy"
	StateEjected   State = "ejected"
	StateUnhealthy State = "unhealthy" // its active probe fails
)

func (h *health) state() State {
	switch {
	case h.ejected.Load():
		return StateEjected
	case !h.probeOK.Load():
		return StateUnhealthy
	}
	return StateHealthy
}

func (h *health) usable() bool { return h.probeOK.Load() && !h.ejected.Load() }

// success records a request the backend answered well, and how long its
// first byte took.
func (h *health) success(ttft time.Duration) {
	if h.failures.Load() != 0 {
		h.failures.Store(0)
	}
	if ttft > 0 {
		h.observeTTFT(ttft)
	}
}

// observeTTFT folds one sample into the moving average with weight 1/8:
// recent enough to follow a backend slowing down, smooth enough that one
// slow prompt does not swing selection.
func (h *health) observeTTFT(d time.Duration) {
	for {
		old := h.ttft.Load()
		next := int64(d)
		if old != 0 {
			next = old + (int64(d)-old)/8
		}
		if h.ttft.CompareAndSwap(old, next) {
			return
		}
	}
}

// failure records a connection failure or a 5xx; it ejects the backend
// when the consecutive failures reach the threshold.
func (h *health) failure(now time.Time) {
	if n := h.failures.Add(1); n >= int64(h.cfg.FailuresToEject) && !h.ejected.Load() {
		h.eject(now)
	}
}

// eject takes the backend out for the current cooldown and doubles the
// next one.
func (h *health) eject(now time.Time) {
	cd := h.cooldown.Load()
	h.ejectedUntil.Store(now.Add(time.Duration(cd)).UnixNano())
	h.ejected.Store(true)
	h.cooldown.Store(min(2*cd, int64(h.cfg.MaxCooldown)))
	if h.ejections != nil {
		h.ejections.Inc()
	}
}

// dueForProbe reports whether an ejected backend's cooldown has passed.
func (h *health) dueForProbe(now time.Time) bool {
	return h.ejected.Load() && now.UnixNano() >= h.ejectedUntil.Load()
}

// probed records an active probe's outcome. A successful probe brings an
// ejected backend back and resets its cooldown; a failed one keeps it out
// for the next, longer cooldown.
func (h *health) probed(ok bool, now time.Time) {
	h.probeOK.Store(ok)
	if !ok && h.probeFailures != nil {
		h.probeFailures.Inc()
	}
	if !h.ejected.Load() || now.UnixNano() < h.ejectedUntil.Load() {
		// A probe that lands during the cooldown (one started just before
		// the ejection) neither ends it early nor lengthens it.
		return
	}
	if ok {
		h.failures.Store(0)
		h.cooldown.Store(int64(h.cfg.Cooldown))
		h.ejected.Store(false)
		return
	}
	h.eject(now)
}
