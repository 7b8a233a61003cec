package proxy

import (
	"container/list"
	"context"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/auth"
)

// ResponseOwnerStore remembers, for replicas, which backend made a
// response and the team and project it was made for. ClaimResponseOwner
// records an owner only when the response has none (or its own claim
// renews it), and returns the owner of record after the claim: the first
// claim wins across every replica sharing the store.
type ResponseOwnerStore interface {
	ClaimResponseOwner(ctx context.Context, responseID, backend, team, project string, expires time.Time) (ownerBackend, ownerTeam, ownerProject string, err error)
	ResponseOwner(ctx context.Context, responseID string) (backend, team, project string, found bool, err error)
}

// responseOwner is what the gateway remembers of a stored response: the
// backend holding it, and the team and project it was charged to. Only
// keys that may use that team may read, change or continue it. An empty
// team is a response whose team is not known (the gateway learned of it by
// asking the backends, or remembered it before it kept teams).
type responseOwner struct {
	backend, team, project string
}

// allows reports whether key may use the response. Keys of every team
// (admin keys among them) read every team's usage and traces, and so
// every team's responses, including those whose team is not known.
func (o responseOwner) allows(key *auth.Key) bool {
	if key.AllowsAnyTeam() {
		return true
	}
	return o.team != "" && key.AllowsTeam(o.team)
}

const (
	// responseOwnerCapacity bounds the responses remembered in memory;
	// past it the least recently used is forgotten. An entry is a few
	// dozen bytes plus the ids, so the bound is a few MiB.
	responseOwnerCapacity = 100_000
	// responseOwnerTTL is how long a response's backend is remembered
	// after it was made or last used: a conversation continued later
	// than that is routed as a new one.
	responseOwnerTTL = 24 * time.Hour
	// responseOwnerStoreTimeout bounds a call to the shared store, so a
	// slow store delays a request by at most this much; the request then
	// goes on with what this replica knows.
	responseOwnerStoreTimeout = 500 * time.Millisecond
)

// responseOwners remembers which backend made each Responses API response,
// and for which team, so that requests about it (GET, DELETE, cancel,
// input_items, previous_response_id) reach the backend where it lives, and
// only from keys of that team. It is an LRU bounded in entries, whose
// entries also expire, in front of an optional store shared by replicas.
// It belongs to the Server, so it survives reloads; entries name backends,
// which a reload keeps by name.
type responseOwners struct {
	capacity int
	ttl      time.Duration
	shared   ResponseOwnerStore // nil: memory only
	log      *zap.Logger
	now      func() time.Time

	mu      sync.Mutex
	entries map[string]*list.Element // of *ownerEntry
	lru     *list.List               // most recently used first
}

type ownerEntry struct {
	id      string
	owner   responseOwner
	expires time.Time
}

func newResponseOwners(capacity int, ttl time.Duration, shared ResponseOwnerStore, log *zap.Logger) *responseOwners {
	return &responseOwners{capacity: capacity, ttl: ttl, shared: shared, log: log, now: time.Now,
		entries: make(map[string]*list.Element), lru: list.New()}
}

// claim records owner as the owner of response id, in memory and in the
// shared store, unless the response already has another owner: ownership
// is written once, by the request that made the response, and never taken
// over. It reports whether owner holds the response now. A reply whose id
// another team owns (a client can make vLLM name its response after a
// request_id of its choosing) thus gives its team no access to it. A
// failure of the store is logged, not returned: this replica still routes
// the response by what it holds in memory.
func (o *responseOwners) claim(id string, owner responseOwner) bool {
	if id == "" || owner.backend == "" {
		return false
	}
	// The id is often a slice of a pooled reply buffer that fasthttp
	// reuses: what is kept must be a copy.
	id = strings.Clone(id)
	expires, won := o.putIfAbsent(id, owner)
	if !won || o.shared == nil {
		return won
	}
	ctx, cancel := context.WithTimeout(context.Background(), responseOwnerStoreTimeout)
	defer cancel()
	backend, team, project, err := o.shared.ClaimResponseOwner(ctx, id, owner.backend, owner.team, owner.project, expires)
	if err != nil {
		o.log.Warn("could not share a response's owner", zap.String("response_id", id), zap.Error(err))
		return true
	}
	if stored := (responseOwner{backend: backend, team: team, project: project}); stored != owner {
		// Another replica's claim came first: its owner is the owner here too.
		o.replace(id, stored)
		return false
	}
	return true
}

// ownerFor is where key's requests about response id must go: the backend
// holding it, or "" when the gateway does not know it (never seen,
// forgotten or expired), so that the backends are asked. allowed is false
// when key may not use the response: it belongs to a team the key may not
// use, or it is not known and the key is limited to some teams, so the
// gateway cannot tell whose it is. Such a request is answered as for an id
// no backend knows, so that a key cannot probe for other teams' responses.
func (o *responseOwners) ownerFor(id string, key *auth.Key) (backend string, allowed bool) {
	owner, found := o.owner(id)
	if !found {
		return "", key.AllowsAnyTeam()
	}
	if !owner.allows(key) {
		return "", false
	}
	return owner.backend, true
}

// owner returns the owner of response id, if it is known.
func (o *responseOwners) owner(id string) (responseOwner, bool) {
	if owner, ok := o.get(id); ok {
		return owner, true
	}
	if o.shared == nil {
		return responseOwner{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), responseOwnerStoreTimeout)
	defer cancel()
	backend, team, project, found, err := o.shared.ResponseOwner(ctx, id)
	if err != nil {
		o.log.Warn("could not look up a response's backend", zap.String("response_id", id), zap.Error(err))
		return responseOwner{}, false
	}
	if !found || backend == "" {
		return responseOwner{}, false
	}
	owner := responseOwner{backend: backend, team: team, project: project}
	o.replace(id, owner)
	return owner, true
}

// putIfAbsent makes owner the owner of id, as the most recent entry,
// unless id has another owner that has not expired; it evicts the least
// recently used past capacity. It returns when the entry expires, and
// whether owner holds it. The owner's own claim renews its expiry.
func (o *responseOwners) putIfAbsent(id string, owner responseOwner) (time.Time, bool) {
	now := o.now()
	expires := now.Add(o.ttl)
	o.mu.Lock()
	defer o.mu.Unlock()
	if el, ok := o.entries[id]; ok {
		e := el.Value.(*ownerEntry)
		if e.owner != owner && now.Before(e.expires) {
			return e.expires, false
		}
		e.owner, e.expires = owner, expires
		o.lru.MoveToFront(el)
		return expires, true
	}
	o.insert(id, owner, expires)
	return expires, true
}

// replace makes owner, read from the shared store, the owner of id in
// memory, whatever this replica held.
func (o *responseOwners) replace(id string, owner responseOwner) {
	expires := o.now().Add(o.ttl)
	o.mu.Lock()
	defer o.mu.Unlock()
	if el, ok := o.entries[id]; ok {
		e := el.Value.(*ownerEntry)
		e.owner, e.expires = owner, expires
		o.lru.MoveToFront(el)
		return
	}
	o.insert(id, owner, expires)
}

// insert adds a new entry for id as the most recent, evicting the least
// recently used past capacity. o.mu is held.
func (o *responseOwners) insert(id string, owner responseOwner, expires time.Time) {
	o.entries[id] = o.lru.PushFront(&ownerEntry{id: id, owner: owner, expires: expires})
	for o.lru.Len() > o.capacity {
		oldest := o.lru.Back()
		o.lru.Remove(oldest)
		delete(o.entries, oldest.Value.(*ownerEntry).id)
	}
}

// get returns id's owner unless unknown or expired; a hit becomes the most
// recently used entry.
func (o *responseOwners) get(id string) (responseOwner, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	el, ok := o.entries[id]
	if !ok {
		return responseOwner{}, false
	}
	e := el.Value.(*ownerEntry)
	if !o.now().Before(e.expires) {
		o.lru.Remove(el)
		delete(o.entries, id)
		return responseOwner{}, false
	}
	o.lru.MoveToFront(el)
	return e.owner, true
}

// len is the number of entries held, expired ones not yet dropped included.
func (o *responseOwners) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lru.Len()
}
