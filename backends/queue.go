package backends

import (
	"errors"
	"slices"
	"sync"
	"time"
)

// Why the queue hands slots over instead of waking everyone: a request
// woken to pick again races every newcomer for the slot that freed up, so
// neither priority nor fairness would hold. A release with requests
// queued takes the freed slot for the request next in line, under the
// route's queue lock, and gives it the backend; newcomers find the backend
// still full and queue behind it.
//
// The order (docs/scheduler.md, "Priority and fairness"):
//   - bands: a lower priority value first, as vLLM orders its own queue;
//   - within a band, fair across tenants by tokens: self-clocked fair
//     queueing, where each request's tag is its tenant's previous tag (or
//     the band's virtual time, whichever is later) plus its estimated
//     tokens, and the smallest tag goes first;
//   - no starvation: while a higher band keeps getting slots, one grant in
//     every lowerBandTurn goes to the longest-waiting request of the lower
//     bands.
//   - past the depth, the request last in line is shed (the lowest band,
//     and in it the latest tag: a flooding tenant's newest request) when
//     the newcomer would be served before it; otherwise the newcomer is.

// lowerBandTurn is the share of slots the lower bands are guaranteed while
// a higher band keeps waiting: one in this many. A request below the top
// band is so served within lowerBandTurn × (requests of lower bands queued
// before it + 1) grants.
const lowerBandTurn = 4

// maxClaimTokens caps the tokens a request is charged in fair queueing, so
// that a request asking for every token there is cannot overflow the tags.
const maxClaimTokens = 1 << 24

// Why a request that waited for a slot got none. ErrClientLeft and
// ErrShutdown end the wait with its request; the others are the gateway
// refusing load, which the client may retry after a moment.
var (
	ErrQueueFull    = errors.New("the model's queue is full")
	ErrQueueShed    = errors.New("shed from the model's full queue for a request served before it")
	ErrQueueTimeout = errors.New("no backend slot freed up within the model's queue wait")
	ErrClientLeft   = errors.New("the client left while its request waited for a backend slot")
	ErrShutdown     = errors.New("the gateway is shutting down")
)

// Claim is what a waiting request is ordered by.
type Claim struct {
	// Priority is the request's "priority": a lower value is served first.
	Priority int64
	// Tenant is whom the request is for (the team/project of
	// Compat-Project); the slots of a band are shared fairly among them.
	Tenant string
	// Tokens is the request's estimated tokens, what fairness charges its
	// tenant. Zero or less counts as one.
	Tokens int64
}

// WaitForSlot waits, up to the model's queue wait, for a slot on a healthy
// backend of the route not in tried, and returns that backend with the
// slot taken (as Pick does; the caller must Release it). blocks and
// opening are the request's prompt, as for Pick. Waiting requests are served in the
// order of their claims (see above). It returns nil and:
//   - ErrQueueFull at once when the queue is at its depth and the request
//     would be served after every request in it;
//   - ErrQueueShed when a request to be served earlier took its place;
//   - ErrQueueTimeout when the wait runs out;
//   - ErrClientLeft or ErrShutdown when gone or shutdown closes (nil
//     channels never close), so that a queued request holds nothing once
//     nobody waits for its answer;
//   - no error when waiting no longer helps because no healthy backend is
//     left untried: the caller picks again (fallbacks, ejected backends).
//
// On a route that counts tenants, t (which may be nil on one that does
// not) counts the slot taken against c.Tenant until t.Release, and a
// request of a tenant at or over its share is not served from the reserve
// (see fairshare.go).
//
// tried and blocks are copied, not kept.
func (r *Route) WaitForSlot(tried Tried, blocks []uint64, opening int, c Claim, t *Tenancy, gone, shutdown <-chan struct{}) (*Backend, error) {
	defer r.observeQueueWait(time.Now())
	w := &waiter{claim: c, tried: slices.Clone(tried), done: make(chan struct{}), counted: t != nil && r.CountsTenants(), opening: opening}
	if len(blocks) > 0 {
		w.blocks = slices.Clone(blocks)
	}
	if err := r.join(w); err != nil {
		return nil, err
	}
	if w.counted {
		t.heldBack = false
		// Set before the outcome is read: served, the slot is counted
		// from the moment it was granted.
		defer func() {
			if w.held {
				t.r, t.load = r, w.load
			}
		}()
	}
	timer := time.NewTimer(r.queue.Wait)
	defer timer.Stop()
	var why error
	select {
	case <-w.done:
		return w.backend, w.err
	case <-timer.C:
		why = ErrQueueTimeout
	case <-gone:
		why = ErrClientLeft
	case <-shutdown:
		why = ErrShutdown
	}
	if r.leave(w) {
		return nil, why
	}
	// Served while it was leaving: an outcome that came in time stands,
	// but a slot is not kept for a request nobody waits for any more.
	if why == ErrQueueTimeout {
		return w.backend, w.err
	}
	if w.backend != nil {
		if w.held {
			r.uncount(w.load, w.backend)
			w.held = false
		}
		w.backend.Release()
	}
	return nil, why
}

// waiter is one request in a route's queue.
type waiter struct {
	claim  Claim
	tried  Tried
	blocks []uint64
	// opening is Pick's, for the request's prompt.
	opening int
	// seq is the order it joined in; tag its fair-queueing finish tag,
	// and cost the tokens the tag charged.
	seq  uint64
	tag  int64
	cost int64
	band *band
	// skipped is the dispatch round in which no backend outside tried had
	// a slot for it, while others might.
	skipped uint64
	// counted says the route counts the request against its tenant's
	// load, and held that the slot it was given is so counted.
	counted bool
	held    bool
	load    *tenantLoad
	// backend and err are the outcome, set before done closes.
	backend *Backend
	err     error
	done    chan struct{}
}

// band holds the requests of one priority.
type band struct {
	priority int64
	// vtime is the tag of the last request served: a tenant with nothing
	// queued starts from it, so idling earns no credit.
	vtime   int64
	waiters []*waiter
	tenants map[string]*tenant
}

// tenant is the fair-queueing state of a tenant with requests in a band.
type tenant struct {
	tag     int64 // the tag of its latest queued request
	waiting int
}

// waitQueue is a route's queue of requests waiting for a slot.
type waitQueue struct {
	mu sync.Mutex
	// bands are the non-empty bands, the lowest priority value first.
	bands []*band
	seq   uint64
	round uint64
	// topStreak counts the grants in a row to the top band while a lower
	// band waited.
	topStreak int
	// loads are the tenants counted on a route that counts them
	// (fairshare.go), while they hold slots or wait.
	loads map[string]*tenantLoad
}

// join admits w (shedding the request last in line when the queue is full
// and w goes before it) and serves what a slot is free for.
func (r *Route) join(w *waiter) error {
	q := &r.waitq
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.counted {
		w.load = q.loadOf(w.claim.Tenant)
	}
	if b := r.pickAbove(w); b != nil {
		r.grant(w, b)
		close(w.done)
		return nil
	}
	if w.counted && q.forget(w.load) {
		// Forgotten until it queues below: a refused request leaves no
		// entry behind.
		w.load = nil
	}
	w.cost = min(max(w.claim.Tokens, 1), maxClaimTokens)
	if r.queued.Load() >= int64(r.queue.Depth) {
		last := q.lastInLine()
		if last == nil || !q.before(w, last) {
			return ErrQueueFull
		}
		r.finish(last, nil, ErrQueueShed)
	}
	if w.counted {
		w.load = q.loadOf(w.claim.Tenant)
		w.load.waiting++
	}
	q.seq++
	w.seq = q.seq
	b := q.bandOf(w.claim.Priority)
	tn := b.tenants[w.claim.Tenant]
	if tn == nil {
		tn = &tenant{}
		b.tenants[w.claim.Tenant] = tn
	}
	w.tag = max(b.vtime, tn.tag) + w.cost
	tn.tag = w.tag
	tn.waiting++
	w.band = b
	b.waiters = append(b.waiters, w)
	// Counted before serving: a release from now on sees it and serves it,
	// and one before is seen by the Pick below.
	r.queued.Add(1)
	r.serveLocked()
	return nil
}

// pickAbove is, for a model whose backends schedule by priority, a backend
// beyond its max_concurrency for w when every request waiting is of a
// lower band: its server preempts a running sequence of lower priority for
// w (vLLM's priority policy), so w need not wait here for one of them to
// end. A backend takes at most max_concurrency requests beyond its limit
// (as many as it can run, all of them of lower priority at most); the one
// holding most of the prompt is chosen (a cold prompt's prefill on a full
// server costs more than any wait saved), and among those the one with the
// smallest share of its limit in flight. A request of the top band waiting
// means no more are taken beyond the limits: the newcomer queues behind
// it, so the band stays fair across tenants. Nil otherwise; q.mu is held.
func (r *Route) pickAbove(w *waiter) *Backend {
	q := &r.waitq
	if !r.PriorityScheduling || len(q.bands) == 0 || w.claim.Priority >= q.bands[0].priority {
		return nil
	}
	blocks := w.blocks
	if !r.signals.prefix {
		blocks = nil
	}
	for range 4 {
		var best *Backend
		bestHeld := 0
		for _, b := range r.backends {
			if b.maxConcurrency <= 0 || !b.Healthy() || w.tried.Has(b) || b.InFlight() >= 2*b.maxConcurrency {
				continue
			}
			held := 0
			if len(blocks) > 0 && b.index != nil {
				held = b.index.held(blocks)
			}
			if best == nil || held > bestHeld ||
				held == bestHeld && b.InFlight()*best.maxConcurrency < best.InFlight()*b.maxConcurrency {
				best, bestHeld = b, held
			}
		}
		if best == nil {
			return nil
		}
		if best.tryAcquireUpTo(2 * best.maxConcurrency) {
			if best.index != nil && r.signals.prefix {
				best.index.insert(w.blocks)
			}
			r.countPlacement(placedPriority)
			return best
		}
	}
	return nil
}

// leave takes w out of the queue; false when it was served meanwhile.
func (r *Route) leave(w *waiter) bool {
	r.waitq.mu.Lock()
	defer r.waitq.mu.Unlock()
	if w.band == nil {
		return false
	}
	r.remove(w, false)
	if w.counted {
		// A tenant gone from the route grows the others' shares, which
		// may free a slot the reserve kept.
		r.serveLocked()
	}
	return true
}

// dispatch serves the requests a slot is now free for; Release calls it.
func (r *Route) dispatch() {
	r.waitq.mu.Lock()
	defer r.waitq.mu.Unlock()
	r.serveLocked()
}

// serveLocked gives each request next in line a slot, until none is free.
// A request whose tried backends hold the only free slots is passed over
// for this round; once every healthy backend is tried, the request stops
// waiting, to pick again.
func (r *Route) serveLocked() {
	q := &r.waitq
	q.round++
	for {
		w, top, lowerWaits := q.next()
		if w == nil {
			return
		}
		b, held := r.pickKeeping(w.load, 0, w.tried, w.blocks, w.opening)
		if held {
			// The free slots are the reserve, kept from this tenant's
			// requests for this round.
			w.load.blocked = q.round
			continue
		}
		if b != nil {
			switch {
			case !lowerWaits:
				q.topStreak = 0
			case top:
				q.topStreak++
			default:
				q.topStreak = 0
			}
			r.finish(w, b, nil)
			continue
		}
		switch {
		case !r.Full(w.tried):
			r.finish(w, nil, nil)
		case len(w.tried) == 0:
			return // every backend is full: nobody can be served
		default:
			w.skipped = q.round
		}
	}
}

// next is the request to serve next among those not passed over this
// round: the top band's smallest tag, or, on the lower bands' turn, the
// longest waiting of theirs. top says it came from the top band, and
// lowerWaits whether a lower band had a request to serve.
func (q *waitQueue) next() (w *waiter, top, lowerWaits bool) {
	var first, oldest *waiter
	for _, b := range q.bands {
		for _, x := range b.waiters {
			if x.skipped == q.round || x.load != nil && x.load.blocked == q.round {
				continue
			}
			switch {
			case first == nil:
				first = x
			case x.band == first.band:
				if x.tag < first.tag || x.tag == first.tag && x.seq < first.seq {
					first = x
				}
			case oldest == nil || x.seq < oldest.seq:
				oldest = x
			}
		}
		if first != nil && q.topStreak < lowerBandTurn-1 {
			// Not the lower bands' turn: the top band alone decides,
			// and a lower band waits if any request remains below.
			return first, true, q.anyBelow(first.band)
		}
	}
	if oldest != nil {
		return oldest, false, true
	}
	return first, first != nil, false
}

// anyBelow reports whether a band below b holds a request not passed over
// this round.
func (q *waitQueue) anyBelow(b *band) bool {
	below := false
	for _, x := range q.bands {
		if below {
			for _, w := range x.waiters {
				if w.skipped != q.round && (w.load == nil || w.load.blocked != q.round) {
					return true
				}
			}
		}
		below = below || x == b
	}
	return false
}

// lastInLine is the request served last: in the lowest band, the latest
// tag. Nil when the queue is empty.
func (q *waitQueue) lastInLine() *waiter {
	if len(q.bands) == 0 {
		return nil
	}
	var last *waiter
	for _, x := range q.bands[len(q.bands)-1].waiters {
		if last == nil || x.tag > last.tag || x.tag == last.tag && x.seq > last.seq {
			last = x
		}
	}
	return last
}

// before reports whether a newcomer w would be served before x: a lower
// priority value, or in the same band a smaller tag than x's.
func (q *waitQueue) before(w, x *waiter) bool {
	if w.claim.Priority != x.claim.Priority {
		return w.claim.Priority < x.claim.Priority
	}
	tag := x.band.vtime
	if tn := x.band.tenants[w.claim.Tenant]; tn != nil {
		tag = max(tag, tn.tag)
	}
	return tag+w.cost < x.tag
}

// bandOf returns the band of priority p, adding it in order if none.
func (q *waitQueue) bandOf(p int64) *band {
	i, found := slices.BinarySearchFunc(q.bands, p, func(b *band, p int64) int {
		switch {
		case b.priority < p:
			return -1
		case b.priority > p:
			return 1
		}
		return 0
	})
	if !found {
		q.bands = slices.Insert(q.bands, i, &band{priority: p, tenants: make(map[string]*tenant)})
	}
	return q.bands[i]
}

// finish ends w's wait with an outcome and wakes it.
func (r *Route) finish(w *waiter, b *Backend, err error) {
	r.remove(w, b != nil)
	if b != nil {
		r.grant(w, b)
	}
	w.backend, w.err = b, err
	close(w.done)
}

// grant gives w the slot taken on b, counting it against w's tenant on a
// route that counts them; q.mu is held.
func (r *Route) grant(w *waiter, b *Backend) {
	w.backend = b
	if w.counted {
		r.count(w.load, b)
		w.held = true
	}
}

// remove takes w out of its band. A request not served gives back the
// tokens its tag charged when it was its tenant's latest.
func (r *Route) remove(w *waiter, served bool) {
	q := &r.waitq
	b := w.band
	w.band = nil
	r.queued.Add(-1)
	i := slices.Index(b.waiters, w)
	b.waiters[i] = b.waiters[len(b.waiters)-1]
	b.waiters[len(b.waiters)-1] = nil
	b.waiters = b.waiters[:len(b.waiters)-1]
	tn := b.tenants[w.claim.Tenant]
	if served {
		b.vtime = max(b.vtime, w.tag)
	} else if tn.tag == w.tag {
		tn.tag -= w.cost
	}
	if tn.waiting--; tn.waiting == 0 {
		delete(b.tenants, w.claim.Tenant)
	}
	if w.counted {
		w.load.waiting--
		if !served {
			q.forget(w.load)
		}
	}
	if len(b.waiters) == 0 {
		q.bands = slices.DeleteFunc(q.bands, func(x *band) bool { return x == b })
	}
}
