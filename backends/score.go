package backends

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/tollgate-dev/tollgate/config"
)

// signals are the scheduler's signals a route uses (models[].routing).
type signals struct {
	prefix, queue, kv, lora, spread bool
	// queueCostTokens is routing.queue_cost_tokens: the cached prefix, in
	// tokens, that pays for each request ahead on a queueing backend.
	queueCostTokens int64
}

func signalsOf(m *config.Model) signals {
	return signals{
		prefix:          m.PrefixSignal(),
		queue:           m.Routing.Queue.On(),
		kv:              m.Routing.KV.On(),
		lora:            m.Routing.LoRA.On(),
		spread:          m.Routing.Spread == config.SignalOn,
		queueCostTokens: int64(max(m.Routing.QueueCostTokens, 1)),
	}
}

// readsServer reports whether a signal reads the backends' own metrics.
func (s signals) readsServer() bool { return s.queue || s.kv || s.lora }

// The weights of the score of a backend with free capacity. The prefix
// term is the prefill the backend saves the request, in units of
// routing.queue_cost_tokens (the cached prompt that pays for a whole wait
// in a queue), so that a long prompt's miss weighs more than a short
// one's. The running term is the share of its sequence slots in use, the
// KV term the share of its KV cache in use, the LoRA term one when it has
// the request's adapter loaded. A backend with every slot in use but a
// free one slows a request's prefill and tokens (vLLM batches it with the
// rest) without making it wait, so all its slots in use count as half a
// wait: the prefix term's weight is twice the running term's.
const (
	weightPrefix  = 2
	weightRunning = 1
	weightKV      = 0.5
	weightLoRA    = 1
)

// assumedRunning is the sequences per unit of weight a backend is taken to
// run at once while neither its metrics (a queue seen) nor max_concurrency
// say: it only scales the running term, so that in-flight counts compare
// across backends of different weights.
const assumedRunning = 16

// candidateSlots is how many requests fewer a backend holding as much of
// the prompt as the best one may need to score as well and still be drawn.
const candidateSlots = 2

// scoreTie absorbs rounding when scores are compared.
const scoreTie = 1e-9

// assessment is what the scheduler knows of one backend for one request.
type assessment struct {
	// held is how many leading blocks of the request the backend holds,
	// and tokens what the score counts them as (heldTokens).
	held   int
	tokens int64
	// ahead is how many requests must leave the backend before this one
	// runs: zero when it has a free sequence slot.
	ahead int64
	// runShare is the share of its sequence slots in use, and slot the
	// share of one slot.
	runShare, slot float64
	// kvUsage is the share of its KV cache in use (zero when unknown or
	// the signal is off).
	kvUsage float64
	// adapter says it has the request's LoRA adapter loaded.
	adapter bool
	// usable says schedule may choose it: it is not full, unhealthy, or
	// tried already for the request. assess leaves it to schedule.
	usable bool
}

// assess reads a backend's load: its last fresh metrics reading, brought up
// to date with the requests the gateway sent or finished since (so that
// requests between two readings do not all pile onto the backend that
// looked idle), or, without one, the gateway's own in-flight count.
// It reads atomics only.
func (r *Route) assess(b *Backend, blocks []uint64) assessment {
	var a assessment
	if len(blocks) > 0 && b.index != nil {
		a.held = b.index.held(blocks)
		a.tokens = heldTokens(a.held)
	}
	inflight := b.InFlight()
	load, capacity := inflight, b.maxConcurrency
	if s := b.server.Load(); s != nil {
		if r.signals.queue {
			since := inflight - s.inflightAtRead
			load = max(s.running+s.waiting+since, 0)
			switch {
			case s.maxRunning > 0:
				capacity = s.maxRunning
			case s.waiting > 0:
				// Queueing, though how many it runs at once is not known
				// yet: the reading's queue and what was sent since are ahead.
				a.ahead = s.waiting + max(since, 0)
			}
		}
		if r.signals.kv && s.kvUsage > 0 {
			a.kvUsage = s.kvUsage
		}
		if r.signals.lora {
			a.adapter = s.hasAdapter(r.adapter)
		}
	}
	if capacity <= 0 {
		capacity = assumedRunning * b.weight
	} else if a.ahead == 0 && load >= capacity {
		a.ahead = load - capacity + 1
	}
	a.runShare = float64(load) / float64(capacity)
	a.slot = 1 / float64(capacity)
	return a
}

// score ranks a backend with free capacity for a request; higher is
// better. queueCostTokens is routing.queue_cost_tokens.
func (a *assessment) score(queueCostTokens int64) float64 {
	s := weightPrefix*float64(a.tokens)/float64(queueCostTokens) -
		weightRunning*a.runShare - weightKV*a.kvUsage
	if a.adapter {
		s += weightLoRA
	}
	return s
}

// placement is why schedule chose a backend: tollgate_placements_total
// counts each by its name (placementNames), so that an operator sees how
// often conversations stay on their servers and what the rest cost.
type placement uint8

const (
	// placedScore: the score decided (prefix held, load, KV, LoRA).
	placedScore placement = iota
	// placedKept: a continuing conversation, on a free backend holding
	// the most of its prompt.
	placedKept
	// placedMoved: a continuing conversation whose server was full, on a
	// free backend holding less of it, which prefills the rest again.
	placedMoved
	// placedSpread: an opening sent to a server without its instructions
	// (spreadTarget).
	placedSpread
	// placedQueued: a backend where it waits in the server's own queue.
	placedQueued
	// placedPriority: a band above every request waiting, past a
	// backend's max_concurrency for its server to preempt (pickAbove).
	placedPriority
	numPlacements
)

// placementNames are the label values of tollgate_placements_total.
var placementNames = [numPlacements]string{"score", "kept", "moved", "spread", "queued", "priority"}

// schedule chooses among the route's usable backends for a request whose
// prompt is the block chain blocks (nil without the prefix signal). For a
// request that opens a conversation, opening is how many leading blocks
// are its instructions (system and developer messages), which the app's
// other conversations share; zero for any other request.
//
// The rule: a backend where the request would queue is never chosen over
// one with a free sequence slot, unless the prefix it holds beyond the
// free one's pays for the wait: more than routing.queue_cost_tokens tokens
// per request ahead of it. Among backends with free slots:
//   - a request continuing a conversation (a backend holds more of its
//     prompt than an opening's instructions and the block after them)
//     goes to one holding the most of it, so a conversation stays on its
//     server while that has a free slot;
//   - a request opening one may be spread (spreadTarget) to a backend
//     without its instructions;
//   - otherwise the score decides (prefix held, slots and KV cache in use,
//     LoRA adapter loaded), and among queueing backends the least wait net
//     of its prefix.
//
// The best score does not win outright: every free backend that holds as
// much of the prompt as the best one and would score as well with
// candidateSlots requests fewer is a candidate, and one is drawn by weight.
// So backends that differ by a request or two share the traffic in
// proportion to their weights (at idle, exactly), rather than each request
// piling onto whichever looked least loaded, which also keeps gateway
// replicas from herding onto one backend.
//
// It also says why it chose the backend it returns.
func (r *Route) schedule(tried Tried, blocks []uint64, opening int) (*Backend, placement) {
	if !r.signals.prefix {
		blocks, opening = nil, 0
	}
	// Each usable backend is assessed once, and every pass reads that one
	// assessment: the draw then sees the loads the best score was taken
	// from, and the index is searched once per backend. A route of more
	// backends than the stack keeps has them assessed again for each pass
	// rather than allocate.
	var kept [scheduleBackendsOnStack]assessment
	keep := len(r.backends) <= len(kept)
	assessed := func(i int) assessment {
		if keep {
			return kept[i]
		}
		var a assessment
		if b := r.backends[i]; usable(b, tried) {
			a = r.assess(b, blocks)
			a.usable = true
		}
		return a
	}
	// The most of the prompt any backend holds, and any free one.
	maxHeld, freeHeld := 0, 0
	for i, b := range r.backends {
		if !usable(b, tried) {
			continue // kept[i] stays unusable
		}
		a := r.assess(b, blocks)
		a.usable = true
		if keep {
			kept[i] = a
		}
		maxHeld = max(maxHeld, a.held)
		if a.ahead == 0 {
			freeHeld = max(freeHeld, a.held)
		}
	}
	// The block after the instructions holds the start of the next
	// message, which every conversation of an app may share.
	continuing := maxHeld > opening+1
	if !continuing && opening > 0 && r.signals.spread {
		if b := r.spreadTarget(assessed, opening); b != nil {
			return b, placedSpread
		}
	}
	var queued, best *Backend
	bestScore := math.Inf(-1)
	var bestHeld int
	var bestTokens, queuedTokens, queuedAhead, queuedCost int64
	for i, b := range r.backends {
		a := assessed(i)
		if !a.usable {
			continue
		}
		if a.ahead > 0 {
			cost := a.ahead*r.signals.queueCostTokens - a.tokens
			if queued == nil || cost < queuedCost {
				queued, queuedCost, queuedAhead, queuedTokens = b, cost, a.ahead, a.tokens
			}
			continue
		}
		if continuing && a.held < freeHeld {
			continue
		}
		if s := a.score(r.signals.queueCostTokens); s > bestScore {
			best, bestScore, bestHeld, bestTokens = b, s, a.held, a.tokens
		}
	}
	if best == nil {
		return queued, placedQueued
	}
	// The draw among the candidates (weighted reservoir sampling); best is
	// always one, but when the loads moved before a second assessment. The
	// tolerance is for load only: a backend holding less of the prompt is
	// not drawn, or a conversation would drift off the server holding its
	// turns whenever they are a small part of its prompt.
	free, freeTokens := best, bestTokens
	var drawn int64
	for i, b := range r.backends {
		a := assessed(i)
		if !a.usable || a.ahead > 0 || a.held < bestHeld ||
			a.score(r.signals.queueCostTokens)+weightRunning*candidateSlots*a.slot < bestScore-scoreTie {
			continue
		}
		drawn += b.weight
		if rand.Int64N(drawn) < b.weight {
			free, freeTokens = b, a.tokens
		}
	}
	if queued != nil && queuedTokens-freeTokens > queuedAhead*r.signals.queueCostTokens {
		return queued, placedQueued
	}
	switch {
	case !continuing:
		return free, placedScore
	case freeHeld < maxHeld:
		return free, placedMoved
	}
	return free, placedKept
}

// spreadKVLimit is the share of its KV cache in use past which a backend
// is not sent instructions it does not hold: a cache that full would make
// room for them by evicting what its running conversations will read.
const spreadKVLimit = 0.5

// spreadTarget is where a request opening a conversation goes to spread
// its instructions (the first opening blocks of its prompt) to a server
// without them: the least busy free backend not holding them whose KV
// cache is under spreadKVLimit and whose prefix cache has room for them
// (prefixIndex.roomFor), when it is no busier than the least busy free
// backend holding them by more than one request (or none is free). Nil
// otherwise, and the score decides.
//
// Holding an app's instructions, a server saves each of its conversations
// a cold prefill, so the score alone keeps an app on the servers that
// first ran it, and spreads it only once those are full: then every
// choice is a cold prefill on a busy server or a wait in a full one's
// queue. Spreading while a server without them is as free costs one cold
// prefill per server early, after which the app's new conversations are
// balanced by load across the fleet, and a turn whose server is full moves
// to one holding its instructions, paying only for its own messages.
func (r *Route) spreadTarget(assessed func(int) assessment, opening int) *Backend {
	var target *Backend
	targetShare, targetSlot, holderShare := math.Inf(1), 0.0, math.Inf(1)
	for i, b := range r.backends {
		a := assessed(i)
		switch {
		case !a.usable || a.ahead > 0:
		case a.held >= opening:
			holderShare = min(holderShare, a.runShare)
		case a.kvUsage < spreadKVLimit && a.runShare < targetShare && b.index != nil && b.index.roomFor(opening):
			target, targetShare, targetSlot = b, a.runShare, a.slot
		}
	}
	if target == nil || targetShare > holderShare+targetSlot+scoreTie {
		return nil
	}
	return target
}

// scheduleBackendsOnStack is how many backends' assessments schedule keeps
// on the stack; a route with more has them assessed again for each pass.
const scheduleBackendsOnStack = 16

// startPolling gives every backend of a model with several backends what
// the model's signals need: a prefix index, and a metrics poller unless
// its metrics are off. The pollers run until Close.
func (r *Registry) startPolling(cfg *config.Config) error {
	polled := make([]bool, len(r.backends))
	for _, rt := range r.ordered {
		if len(rt.backends) < 2 {
			continue
		}
		for _, b := range rt.backends {
			if rt.signals.prefix && b.index == nil {
				b.index = new(prefixIndex)
			}
			if rt.signals.readsServer() {
				polled[slices.Index(r.backends, b)] = true
			}
		}
	}
	for i, b := range r.backends {
		mc := cfg.Backends[i].Metrics
		// An interval of zero is a configuration that was not provisioned
		// (a test's): it reads no metrics rather than spin.
		if !polled[i] || mc.Path == string(config.SignalOff) || mc.Interval <= 0 {
			continue
		}
		p, err := newMetricsPoller(b, mc)
		if err != nil {
			return err
		}
		if r.metrics != nil {
			p.failures = r.metrics.serverFailures.WithLabelValues(b.Name)
		}
		r.pollers = append(r.pollers, p)
	}
	if len(r.pollers) == 0 {
		return nil
	}
	r.stopPolls = make(chan struct{})
	r.polling.Add(len(r.pollers))
	for _, p := range r.pollers {
		go p.run(r.stopPolls, &r.polling)
	}
	return nil
}
