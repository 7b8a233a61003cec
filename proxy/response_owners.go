package proxy

import (
	"container/list"
	"context"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// ResponseOwnerStore remembers which backend made a response, for replicas.
type ResponseOwnerStore interface {
	PutResponseOwner(ctx context.Context, responseID, backend string, expires time.Time) error
	ResponseOwner(ctx context.Context, responseID string) (backend string, found bool, err error)
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
// so that requests about it (GET, DELETE, cancel, previous_response_id)
// reach the backend where it lives. It is an LRU bounded in entries, whose
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
	id, backend string
	expires     time.Time
}

func newResponseOwners(capacity int, ttl time.Duration, shared ResponseOwnerStore, log *zap.Logger) *responseOwners {
	return &responseOwners{capacity: capacity, ttl: ttl, shared: shared, log: log, now: time.Now,
		entries: make(map[string]*list.Element), lru: list.New()}
}

// remember records that backend made response id, in memory and in the
// shared store. A failure of the store is logged, not returned: this
// replica still routes the response correctly.
func (o *responseOwners) remember(id, backend string) {
	if id == "" || backend == "" {
		return
	}
	// The id is often a slice of a pooled reply buffer that fasthttp
	// reuses: what is kept must be a copy.
	id = strings.Clone(id)
	expires := o.put(id, backend)
	if o.shared == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), responseOwnerStoreTimeout)
	defer cancel()
	if err := o.shared.PutResponseOwner(ctx, id, backend, expires); err != nil {
		o.log.Warn("could not share a response's backend", zap.String("response_id", id), zap.Error(err))
	}
}

// owner returns the backend that made response id, or "" when it is not
// known (never seen, forgotten or expired).
func (o *responseOwners) owner(id string) string {
	if backend, ok := o.get(id); ok {
		return backend
	}
	if o.shared == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), responseOwnerStoreTimeout)
	defer cancel()
	backend, found, err := o.shared.ResponseOwner(ctx, id)
	if err != nil {
		o.log.Warn("could not look up a response's backend", zap.String("response_id", id), zap.Error(err))
		return ""
	}
	if !found {
		return ""
	}
	o.put(id, backend)
	return backend
}

// put stores id's backend as the most recent entry, evicting the least
// recently used past capacity, and returns when it expires.
func (o *responseOwners) put(id, backend string) time.Time {
	expires := o.now().Add(o.ttl)
	o.mu.Lock()
	defer o.mu.Unlock()
	if el, ok := o.entries[id]; ok {
		e := el.Value.(*ownerEntry)
		e.backend, e.expires = backend, expires
		o.lru.MoveToFront(el)
		return expires
	}
	o.entries[id] = o.lru.PushFront(&ownerEntry{id: id, backend: backend, expires: expires})
	for o.lru.Len() > o.capacity {
		oldest := o.lru.Back()
		o.lru.Remove(oldest)
		delete(o.entries, oldest.Value.(*ownerEntry).id)
	}
	return expires
}

// get returns id's backend unless unknown or expired; a hit becomes the
// most recently used entry.
func (o *responseOwners) get(id string) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	el, ok := o.entries[id]
	if !ok {
		return "", false
	}
	e := el.Value.(*ownerEntry)
	if !o.now().Before(e.expires) {
		o.lru.Remove(el)
		delete(o.entries, id)
		return "", false
	}
	o.lru.MoveToFront(el)
	return e.backend, true
}

// len is the number of entries held, expired ones not yet dropped included.
func (o *responseOwners) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lru.Len()
}
