package backends

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
// blocks is the request's prompt as a block hash chain (AppendBlockChain),
// or nil; opening, for a request that opens a conversation, how many of
// its leading blocks are its instructions (zero otherwise). Among several
// backends the scheduler scores each on the signals the model uses
// (schedule, docs/scheduler.md); the chosen backend's index then records
// the blocks as sent to it. Pick reads atomics only and does
// not allocate.
func (r *Route) Pick(tried Tried, blocks []uint64, opening int) *Backend {
	// The choice and the slot are two steps; when another request took the
	// last slot in between, choose again.
	for range 4 {
		b, why := r.choose(tried, blocks, opening)
		if b == nil {
			return nil
		}
		if !b.tryAcquire() {
			continue
		}
		if b.index != nil && r.signals.prefix {
			b.index.insert(blocks)
		}
		r.countPlacement(why)
		return b
	}
	return nil
}

// WantsBlocks reports whether Pick uses a request's block chain: the model
// has several backends and the prefix signal on. Otherwise the caller need
// not compute it.
func (r *Route) WantsBlocks() bool { return r.signals.prefix && len(r.backends) > 1 }

// choose is the backend Pick tries to take a slot on, and why; a model of
// one backend is not scheduled, and counts no placement.
func (r *Route) choose(tried Tried, blocks []uint64, opening int) (*Backend, placement) {
	switch len(r.backends) {
	case 0:
		return nil, numPlacements
	case 1:
		if b := r.backends[0]; usable(b, tried) {
			return b, numPlacements
		}
		return nil, numPlacements
	}
	return r.schedule(tried, blocks, opening)
}

// countPlacement counts a request placed for why, on a route whose
// placements are counted (numPlacements counts nothing).
func (r *Route) countPlacement(why placement) {
	if why < numPlacements && r.placements[why] != nil {
		r.placements[why].Inc()
	}
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

func usable(b *Backend, tried Tried) bool {
	return b != nil && !b.full() && b.Healthy() && !tried.Has(b)
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
