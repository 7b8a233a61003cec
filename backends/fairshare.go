package backends

import "slices"

// Why a reserve: fair queueing orders who gets the next slot, but under a
// flood every slot is taken the moment it frees, so a well-behaved
// tenant's request still waits for one to free and then runs in a full
// batch. Keeping a few slots free while a tenant over its equal share
// wants more gives the others a slot the moment they ask
// (docs/scheduler.md, "Priority and fairness").
//
// The rule, for a route that counts tenants (its reserve is not zero and
// every backend has a max_concurrency):
//   - a tenant's share is the route's slots divided by the tenants with a
//     request holding a slot or waiting for one (rounded down);
//   - a request of a tenant holding fewer slots than its share may take
//     any free slot, and so may one of a tenant over it that is not
//     flooding: with fewer of its other requests waiting than it holds
//     slots, while another tenant floods or holds as many slots (see
//     flooding). A well-behaved tenant's burst past the equal share is
//     not the flood the reserve is kept from, and capping it would queue
//     it behind its own requests while the reserve stays free;
//   - a request of a flooding tenant at or over its share takes a slot
//     only while more stay free than the reserve: the configured one, but
//     never more than the other tenants under their share leave unused of
//     it;
//   - and only on a backend keeping more free than its part of the
//     reserve, rounded down: the reserve is shared among the backends as
//     the unused shares it stands for are, each tenant's in proportion to
//     the slots it holds on each backend (by max_concurrency when it holds
//     none). A tenant's prompt is cached on the servers that run its
//     requests, and a free slot elsewhere would cost it a cold prefill.
//
// The cap makes the rule starve nobody: a tenant over its share may always
// hold the slots the others are not entitled to, which is at least its
// share, and with one tenant alone there is no reserve at all.

// tenantLoad is what a route counts of one tenant: the slots its requests
// hold and its requests waiting. It lives, in the route's waitQueue under
// its lock, while either is above zero.
type tenantLoad struct {
	name     string
	inflight int
	waiting  int
	// on counts the slots it holds on each of the route's backends, in
	// the route's order; nil until it holds one.
	on []int32
	// blocked is the dispatch round in which the reserve held the
	// tenant's requests back.
	blocked uint64
}

// Tenancy is a request's count in its tenant's slots on a route: PickFor
// or WaitForSlot set it when they take a slot on a route that counts
// tenants, and Release ends it with the slot. The zero value counts
// nothing: Release then frees the slot alone.
type Tenancy struct {
	r    *Route
	load *tenantLoad
	// heldBack says the last PickFor found a free slot the reserve keeps
	// for other tenants: the request is to wait, though the route is not
	// full.
	heldBack bool
}

// HeldBack reports whether the last PickFor returned nil because the free
// slots are kept for tenants under their share, so the request is to wait
// in the queue.
func (t *Tenancy) HeldBack() bool { return t.heldBack }

// Release frees b's slot, which the request holds, uncounting it from its
// tenant first, so that the slot's next holder is chosen on the new
// counts.
func (t *Tenancy) Release(b *Backend) {
	if t.load != nil {
		t.r.uncount(t.load, b)
		t.load = nil
	}
	b.Release()
}

// CountsTenants reports whether the route counts each tenant's slots, so
// that PickFor and WaitForSlot need the request's tenant.
func (r *Route) CountsTenants() bool { return r.reserve > 0 }

// PickFor is Pick for a request of c.Tenant, counting the slot it takes
// against the tenant until t.Release. On a route that does not count
// tenants it is Pick. It returns nil with t.HeldBack() true when the free
// slots are the reserve and the tenant is at or over its share. A request
// of a band above every request waiting goes where it would from the
// queue (pickAbove): to the backend holding most of its prompt, past its
// limit when full, rather than to a free slot on a server without it.
func (r *Route) PickFor(t *Tenancy, c Claim, tried Tried, blocks []uint64, opening int) *Backend {
	t.heldBack = false
	if !r.CountsTenants() {
		return r.Pick(tried, blocks, opening)
	}
	q := &r.waitq
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.loadOf(c.Tenant)
	defer q.forget(l)
	if above := r.pickAbove(&waiter{claim: c, tried: tried, blocks: blocks, opening: opening}); above != nil {
		r.count(l, above)
		t.r, t.load = r, l
		return above
	}
	b, held := r.pickKeeping(l, 1, tried, blocks, opening)
	if b != nil {
		r.count(l, b)
		t.r, t.load = r, l
	}
	t.heldBack = held
	return b
}

// pickKeeping is Pick for a request of l, keeping the reserve free: nil
// and true when a slot is free but kept. pending is 1 when the request is
// not counted among l's waiting ones, 0 when it is. q.mu is held.
func (r *Route) pickKeeping(l *tenantLoad, pending int, tried Tried, blocks []uint64, opening int) (*Backend, bool) {
	var parts [maxReserveParts]int64
	keep, ok := r.reserveFor(l, pending, &parts)
	if !ok {
		return nil, true
	}
	if keep == 0 {
		return r.Pick(tried, blocks, opening), false
	}
	// The backends keeping no more than their part free count as tried.
	var buf [16]*Backend
	kept := append(Tried(buf[:0]), tried...)
	for i, b := range r.backends {
		if b.maxConcurrency-b.InFlight() <= parts[min(i, maxReserveParts-1)] && !tried.Has(b) {
			kept = append(kept, b)
		}
	}
	if b := r.Pick(kept, blocks, opening); b != nil {
		return b, false
	}
	return nil, !r.Full(tried)
}

// loadOf returns tenant's entry, adding it if none; q.mu is held. The
// caller counts something in it or forgets it.
func (q *waitQueue) loadOf(tenant string) *tenantLoad {
	if q.loads == nil {
		q.loads = make(map[string]*tenantLoad)
	}
	l := q.loads[tenant]
	if l == nil {
		l = &tenantLoad{name: tenant}
		q.loads[tenant] = l
	}
	return l
}

// forget drops l once it counts nothing, and says whether it did; q.mu is
// held.
func (q *waitQueue) forget(l *tenantLoad) bool {
	if l.inflight != 0 || l.waiting != 0 {
		return false
	}
	delete(q.loads, l.name)
	return true
}

// maxReserveParts bounds the backends the reserve is shared among by
// where tenants hold slots; past it, the last part stands for the rest.
const maxReserveParts = 16

// count counts a slot l's request took on b; q.mu is held.
func (r *Route) count(l *tenantLoad, b *Backend) {
	l.inflight++
	if i := slices.Index(r.backends, b); i >= 0 {
		if l.on == nil {
			l.on = make([]int32, len(r.backends))
		}
		l.on[i]++
	}
}

// uncount ends l's slot on b.
func (r *Route) uncount(l *tenantLoad, b *Backend) {
	q := &r.waitq
	q.mu.Lock()
	l.inflight--
	if i := slices.Index(r.backends, b); i >= 0 && l.on != nil {
		l.on[i]--
	}
	q.forget(l)
	q.mu.Unlock()
}

// reserveFor is the reserve a request of l must leave free (see the rule
// above), and false when the free slots are no more than it; parts gets
// each backend's part of it. pending is as for pickKeeping. q.mu is held
// and l is in q.loads. A nil l (a request not counted) leaves none.
func (r *Route) reserveFor(l *tenantLoad, pending int, parts *[maxReserveParts]int64) (int64, bool) {
	if l == nil || r.reserve <= 0 {
		return 0, true
	}
	q := &r.waitq
	slots, free := r.slots()
	share := slots / int64(len(q.loads))
	if int64(l.inflight) < share || !q.flooding(l, pending, share) {
		return 0, true
	}
	// unused is what the others under their share may still take, and
	// on where: each one's unused share goes to the backends it holds
	// slots on, in proportion, or by max_concurrency when it holds none.
	var unused int64
	var on [maxReserveParts]float64
	for _, o := range q.loads {
		if o == l || int64(o.inflight) >= share {
			continue
		}
		u := share - int64(o.inflight)
		unused += u
		for i, b := range r.backends {
			j := min(i, maxReserveParts-1)
			if o.inflight > 0 {
				on[j] += float64(u) * float64(o.on[i]) / float64(o.inflight)
			} else {
				on[j] += float64(u) * float64(b.maxConcurrency) / float64(slots)
			}
		}
	}
	keep := min(r.reserve, unused)
	for i := range min(len(r.backends), maxReserveParts) {
		parts[i] = int64(float64(keep) * on[i] / float64(max(unused, 1)))
	}
	if n := len(r.backends) - maxReserveParts + 1; n > 1 {
		parts[maxReserveParts-1] /= int64(n) // the rest share the last part
	}
	return keep, free > keep
}

// flooding reports whether l, at or over its equal share, is what the
// reserve is kept from: it has at least as many requests waiting besides
// this one (pending is 1 when this one is not among them) as it holds
// slots, or no other tenant floods and it holds more slots than any
// other. A queue shorter than the requests a tenant runs drains within
// about one request's time, as those end: a burst. A flood's queue grows
// past what it runs and stays there. A tenant bursting past its share
// while another floods is not held to the reserve: that would queue it
// behind its own requests while the reserve stays free. q.mu is held.
func (q *waitQueue) flooding(l *tenantLoad, pending int, share int64) bool {
	if queued := l.waiting + pending - 1; queued > 0 && queued >= l.inflight {
		return true
	}
	for _, o := range q.loads {
		if o == l {
			continue
		}
		if o.inflight >= l.inflight || int64(o.inflight) >= share && o.waiting > 0 && o.waiting >= o.inflight {
			return false
		}
	}
	return true
}

// slots is the route's slots on healthy backends, and how many of them are
// free.
func (r *Route) slots() (slots, free int64) {
	for _, b := range r.backends {
		if !b.Healthy() {
			continue
		}
		slots += b.maxConcurrency
		free += max(0, b.maxConcurrency-b.InFlight())
	}
	return slots, free
}

// defaultReserve is the reserve of a route whose queue.reserve is zero:
// a quarter of its slots, rounded up, or none when a backend has no
// max_concurrency (the route then never queues, and has no slots to
// share).
func defaultReserve(reserve int, bs []*Backend) int64 {
	var slots int64
	for _, b := range bs {
		if b.maxConcurrency <= 0 {
			return 0
		}
		slots += b.maxConcurrency
	}
	switch {
	case reserve < 0:
		return 0
	case reserve == 0:
		return (slots + 3) / 4
	}
	return int64(reserve)
}

// TenantLoad is what the route counts of tenant: the slots its requests
// hold and its requests waiting; zeros on a route that does not count.
func (r *Route) TenantLoad(tenant string) (slots, waiting int) {
	q := &r.waitq
	q.mu.Lock()
	defer q.mu.Unlock()
	if l := q.loads[tenant]; l != nil {
		return l.inflight, l.waiting
	}
	return 0, 0
}

// TenantsCounted is how many tenants the route counts: those with a
// request holding one of its slots or waiting for one.
func (r *Route) TenantsCounted() int {
	q := &r.waitq
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.loads)
}
