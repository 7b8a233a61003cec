package proxy

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

// fakeOwnerStore is a ResponseOwnerStore in a map, with a switch to fail.
type fakeOwnerStore struct {
	mu     sync.Mutex
	owners map[string]string
	fail   bool
	puts   int
}

func (f *fakeOwnerStore) PutResponseOwner(_ context.Context, id, backend string, _ time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("store down")
	}
	f.puts++
	f.owners[id] = backend
	return nil
}

func (f *fakeOwnerStore) ResponseOwner(_ context.Context, id string) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return "", false, errors.New("store down")
	}
	b, ok := f.owners[id]
	return b, ok, nil
}

func TestResponseOwnersBoundedLRU(t *testing.T) {
	o := newResponseOwners(3, time.Hour, nil, zap.NewNop())
	for _, id := range []string{"r1", "r2", "r3"} {
		o.remember(id, "b-"+id)
	}
	if got := o.owner("r1"); got != "b-r1" { // r1 becomes the most recent
		t.Fatalf("owner(r1) = %q, want b-r1", got)
	}
	o.remember("r4", "b-r4") // evicts r2, the least recently used
	if got := o.owner("r2"); got != "" {
		t.Errorf("owner(r2) = %q after eviction, want unknown", got)
	}
	for _, id := range []string{"r1", "r3", "r4"} {
		if got := o.owner(id); got != "b-"+id {
			t.Errorf("owner(%s) = %q, want b-%s", id, got, id)
		}
	}
	if n := o.len(); n != 3 {
		t.Errorf("holds %d entries, want at most 3", n)
	}
	o.remember("", "b") // a reply without an id is not remembered
	if n := o.len(); n != 3 {
		t.Errorf("holds %d entries after an empty id, want 3", n)
	}
}

func TestResponseOwnersExpire(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := newResponseOwners(10, time.Minute, nil, zap.NewNop())
	o.now = func() time.Time { return now }
	o.remember("r1", "a")
	now = now.Add(59 * time.Second)
	if got := o.owner("r1"); got != "a" {
		t.Fatalf("owner before expiry = %q, want a", got)
	}
	now = now.Add(time.Second)
	if got := o.owner("r1"); got != "" {
		t.Errorf("owner at expiry = %q, want unknown", got)
	}
	if n := o.len(); n != 0 {
		t.Errorf("an expired entry is still held (%d entries)", n)
	}
}

func TestResponseOwnersShared(t *testing.T) {
	store := &fakeOwnerStore{owners: map[string]string{}}
	a := newResponseOwners(10, time.Hour, store, zap.NewNop())
	b := newResponseOwners(10, time.Hour, store, zap.NewNop())
	a.remember("r1", "backend-a")
	if got := b.owner("r1"); got != "backend-a" {
		t.Fatalf("the other replica's owner(r1) = %q, want backend-a", got)
	}
	store.fail = true
	if got := b.owner("r1"); got != "backend-a" {
		t.Errorf("owner(r1) with the store down = %q, want backend-a from memory", got)
	}
	if got := b.owner("r2"); got != "" {
		t.Errorf("owner(r2) with the store down = %q, want unknown", got)
	}
	a.remember("r3", "backend-a") // logged, not fatal
	if got := a.owner("r3"); got != "backend-a" {
		t.Errorf("owner(r3) after a failed share = %q, want backend-a", got)
	}
}
