package backends

import "math/rand/v2"

// Tried is the set of backends a request was already sent to, so a retry
// goes elsewhere. Requests try a handful of backends at most, so a short
// list beats a map.
type Tried []*Backend

// Has reports whether b was tried.
func (t Tried) Has(b *Backend) bool {
	for _, x := range t {
		if x == b {
			return true
		}
	}
	return false
}

// Pick chooses a backend for one request and takes one of its slots (the
// caller must Release it when done), skipping those in tried, those at
// max_concurrency and unhealthy ones. It returns nil when none is usable;
// Full then tells whether waiting could help.
//
// With an affinity key (prefix affinity) the backend is chosen by
// rendezvous hashing, so requests sharing a prompt prefix land where its
// KV cache is warm, unless that backend is loaded well above the least
// loaded one. Otherwise it is weighted power-of-two-choices: draw two
// backends with probability proportional to weight and keep the one with
// the lower load — requests in flight scaled by the backend's moving
// average time to first token, per unit of weight — or the first drawn
// when they tie, unless one of them is much faster. At idle every load is
// zero, so traffic follows the weights exactly among backends of similar
// speed; under load, P2C drives in-flight requests towards the weights,
// and the TTFT factor steers traffic away from a backend that has become
// slow before its queue shows it. P2C avoids both the herd
// behaviour of plain least-loaded (every replica of the gateway piling
// onto the one idle backend) and the blindness of random choice.
func (r *Route) Pick(tried Tried, affinityKey uint64) *Backend {
	// The choice and the slot are two steps; when another request took the
	// last slot in between, choose again.
	for range 4 {
		b := r.choose(tried, affinityKey)
		if b == nil || b.tryAcquire() {
			return b
		}
	}
	return nil
}

func (r *Route) choose(tried Tried, affinityKey uint64) *Backend {
	switch len(r.backends) {
	case 0:
		return nil
	case 1:
		if b := r.backends[0]; usable(b, tried) {
			return b
		}
		return nil
	}
	if affinityKey != 0 {
		if b := r.pickAffine(tried, affinityKey); b != nil {
			return b
		}
	}
	a, b := r.draw(), r.draw()
	if better(b, a, tried) {
		a = b
	}
	if usable(a, tried) {
		return a
	}
	// The draws were unusable: take the least loaded usable backend.
	var best *Backend
	for _, c := range r.backends {
		if usable(c, tried) && (best == nil || loadOf(c) < loadOf(best)) {
			best = c
		}
	}
	return best
}

// PickEjected is Pick's last resort: the least loaded backend that was
// only ejected (passively, for failed requests) while its probe still
// succeeds, with one of its slots taken as Pick does. Passive ejection must shift traffic to healthy backends, not
// cause an outage of its own: when a model has nothing else left — no
// healthy backend and no fallback — trying an ejected backend beats
// refusing outright (Envoy calls this the panic threshold). Nil when none.
func (r *Route) PickEjected(tried Tried) *Backend {
	var best *Backend
	for _, b := range r.backends {
		if tried.Has(b) || b.full() || !b.health.probeOK.Load() {
			continue
		}
		if best == nil || loadOf(b) < loadOf(best) {
			best = b
		}
	}
	if best == nil || !best.tryAcquire() {
		return nil
	}
	return best
}

// Full reports whether every healthy backend not yet tried is at its
// max_concurrency, so that a request may wait for a slot.
func (r *Route) Full(tried Tried) bool {
	anyHealthy := false
	for _, b := range r.backends {
		if tried.Has(b) || !b.Healthy() {
			continue
		}
		anyHealthy = true
		if !b.full() {
			return false
		}
	}
	return anyHealthy
}

// affinityOverload is how much busier than the least loaded backend an
// affine backend may be before affinity gives way to load balancing.
const affinityOverload = 2

// pickAffine returns the usable backend with the highest rendezvous score
// for key, or nil when it is overloaded.
func (r *Route) pickAffine(tried Tried, key uint64) *Backend {
	var best, least *Backend
	var bestScore uint64
	for _, b := range r.backends {
		if !usable(b, tried) {
			continue
		}
		if s := rendezvous(key, b.seed); best == nil || s > bestScore {
			best, bestScore = b, s
		}
		if least == nil || b.InFlight() < least.InFlight() {
			least = b
		}
	}
	if best == nil || best.InFlight() > affinityOverload*least.InFlight()+1 {
		return nil
	}
	return best
}

// rendezvous mixes an affinity key with a backend's seed (highest random
// weight hashing): removing a backend moves only its own keys.
func rendezvous(key, seed uint64) uint64 {
	x := key ^ seed
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// AffinityKey hashes a prompt prefix into a key for Pick; zero means no
// affinity, so it never returns zero for a prefix. The hash is fixed (not
// seeded per process), so that every gateway replica sends a prefix to the
// same backend.
func AffinityKey(prefix []byte) uint64 {
	if len(prefix) == 0 {
		return 0
	}
	return fnv1a(prefix) | 1
}

// draw returns a backend with probability proportional to its weight.
func (r *Route) draw() *Backend {
	n := rand.Int64N(r.totalWeight)
	for _, b := range r.backends {
		if n < b.weight {
			return b
		}
		n -= b.weight
	}
	return r.backends[len(r.backends)-1]
}

func usable(b *Backend, tried Tried) bool {
	return b != nil && !b.full() && b.Healthy() && !tried.Has(b)
}

// slowerFactor is how much slower, in time to first token, one of two
// equally loaded backends must be for the faster to win regardless of the
// draw. Below it, backends count as equally fast and weights decide.
const slowerFactor = 2

// better reports whether x is a better choice than y.
func better(x, y *Backend, tried Tried) bool {
	xu, yu := usable(x, tried), usable(y, tried)
	if xu != yu {
		return xu
	}
	if lx, ly := loadOf(x), loadOf(y); lx != ly {
		return lx < ly
	}
	// Equally loaded (typically both idle): the draw stands, so traffic
	// follows the weights, unless one backend answers much faster.
	return slowerFactor*max(float64(x.TTFT()), minTTFT) < max(float64(y.TTFT()), minTTFT)
}

// minTTFT keeps a backend that has not yet reported, or is very fast,
// from looking free however many requests it holds.
const minTTFT = 1e6 // 1 ms, in nanoseconds

// loadOf is in-flight × time to first token ÷ weight: the work queued on
// the backend relative to its share. It is zero for every idle backend, so
// that at idle the weighted draw alone decides.
func loadOf(b *Backend) float64 {
	ttft := max(float64(b.TTFT()), minTTFT)
	return float64(b.InFlight()) * ttft / float64(b.weight)
}
