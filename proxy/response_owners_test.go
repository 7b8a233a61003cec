package proxy

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
)

// fakeOwnerStore is a ResponseOwnerStore in a map, with a switch to fail.
type fakeOwnerStore struct {
	mu     sync.Mutex
	owners map[string]responseOwner
	fail   bool
}

// ClaimResponseOwner keeps the first owner of each id, as the store does.
func (f *fakeOwnerStore) ClaimResponseOwner(_ context.Context, id, backend, team, project string, _ time.Time) (string, string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return "", "", "", errors.New("store down")
	}
	o, ok := f.owners[id]
	if !ok {
		o = responseOwner{backend: backend, team: team, project: project}
		f.owners[id] = o
	}
	return o.backend, o.team, o.project, nil
}

func (f *fakeOwnerStore) ResponseOwner(_ context.Context, id string) (backend, team, project string, found bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return "", "", "", false, errors.New("store down")
	}
	o, ok := f.owners[id]
	return o.backend, o.team, o.project, ok, nil
}

// on is an owner on backend of team acme.
func on(backend string) responseOwner {
	return responseOwner{backend: backend, team: "acme", project: "web"}
}

// backendOf is the backend o knows for id, "" when unknown.
func backendOf(o *responseOwners, id string) string {
	owner, _ := o.owner(id)
	return owner.backend
}

func TestResponseOwnersBoundedLRU(t *testing.T) {
	o := newResponseOwners(3, time.Hour, nil, zap.NewNop())
	for _, id := range []string{"r1", "r2", "r3"} {
		o.claim(id, on("b-"+id))
	}
	if got := backendOf(o, "r1"); got != "b-r1" { // r1 becomes the most recent
		t.Fatalf("owner(r1) = %q, want b-r1", got)
	}
	o.claim("r4", on("b-r4")) // evicts r2, the least recently used
	if got := backendOf(o, "r2"); got != "" {
		t.Errorf("owner(r2) = %q after eviction, want unknown", got)
	}
	for _, id := range []string{"r1", "r3", "r4"} {
		if got := backendOf(o, id); got != "b-"+id {
			t.Errorf("owner(%s) = %q, want b-%s", id, got, id)
		}
	}
	if n := o.len(); n != 3 {
		t.Errorf("holds %d entries, want at most 3", n)
	}
	o.claim("", on("b")) // a reply without an id is not remembered
	if n := o.len(); n != 3 {
		t.Errorf("holds %d entries after an empty id, want 3", n)
	}
}

func TestResponseOwnersExpire(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := newResponseOwners(10, time.Minute, nil, zap.NewNop())
	o.now = func() time.Time { return now }
	o.claim("r1", on("a"))
	now = now.Add(59 * time.Second)
	if got := backendOf(o, "r1"); got != "a" {
		t.Fatalf("owner before expiry = %q, want a", got)
	}
	now = now.Add(time.Second)
	if got := backendOf(o, "r1"); got != "" {
		t.Errorf("owner at expiry = %q, want unknown", got)
	}
	if n := o.len(); n != 0 {
		t.Errorf("an expired entry is still held (%d entries)", n)
	}
}

func TestResponseOwnersShared(t *testing.T) {
	store := &fakeOwnerStore{owners: map[string]responseOwner{}}
	a := newResponseOwners(10, time.Hour, store, zap.NewNop())
	b := newResponseOwners(10, time.Hour, store, zap.NewNop())
	a.claim("r1", on("backend-a"))
	if got := backendOf(b, "r1"); got != "backend-a" {
		t.Fatalf("the other replica's owner(r1) = %q, want backend-a", got)
	}
	store.fail = true
	if got := backendOf(b, "r1"); got != "backend-a" {
		t.Errorf("owner(r1) with the store down = %q, want backend-a from memory", got)
	}
	if got := backendOf(b, "r2"); got != "" {
		t.Errorf("owner(r2) with the store down = %q, want unknown", got)
	}
	a.claim("r3", on("backend-a")) // logged, not fatal
	if got := backendOf(a, "r3"); got != "backend-a" {
		t.Errorf("owner(r3) after a failed share = %q, want backend-a", got)
	}
}

// TestResponseOwnerFor checks who may use a stored response: keys of its
// team, and keys of every team (admin keys among them), which alone may use
// a response whose team, or which, is not known.
func TestResponseOwnerFor(t *testing.T) {
	kr, err := auth.NewKeyring(config.Auth{Keys: []config.Key{
		{Name: "acme", Key: "k-acme", Teams: []string{"acme"}, DefaultTeam: "acme"},
		{Name: "rival", Key: "k-rival", Teams: []string{"rival"}, DefaultTeam: "rival"},
		{Name: "both", Key: "k-both", Teams: []string{"rival", "acme"}, DefaultTeam: "rival"},
		{Name: "any", Key: "k-any", Teams: []string{"*"}, DefaultTeam: "ops"},
		{Name: "admin", Key: "k-admin", Teams: []string{"ops"}, DefaultTeam: "ops", Admin: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	store := &fakeOwnerStore{owners: map[string]responseOwner{
		// Remembered by a replica before the gateway kept teams.
		"resp_old": {backend: "a"},
	}}
	o := newResponseOwners(10, time.Hour, store, zap.NewNop())
	o.claim("resp_acme", on("a"))
	o.claim("resp_learned", responseOwner{backend: "b"}) // learned by asking the backends

	tests := []struct {
		key, id     string
		wantBackend string
		wantAllowed bool
	}{
		{"acme", "resp_acme", "a", true},
		{"both", "resp_acme", "a", true},
		{"any", "resp_acme", "a", true},
		{"admin", "resp_acme", "a", true},
		{"rival", "resp_acme", "", false},
		{"acme", "resp_old", "", false},
		{"acme", "resp_learned", "", false},
		{"any", "resp_old", "a", true},
		{"admin", "resp_learned", "b", true},
		// Unknown: keys of every team may have the backends asked.
		{"acme", "resp_unknown", "", false},
		{"any", "resp_unknown", "", true},
		{"admin", "resp_unknown", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.key+"/"+tt.id, func(t *testing.T) {
			key := kr.Lookup([]byte("k-" + tt.key))
			backend, allowed := o.ownerFor(tt.id, key)
			if backend != tt.wantBackend || allowed != tt.wantAllowed {
				t.Errorf("ownerFor = %q, %v; want %q, %v", backend, allowed, tt.wantBackend, tt.wantAllowed)
			}
		})
	}

	// The team and project reach the shared store, and another replica
	// enforces them.
	if got := store.owners["resp_acme"]; got != on("a") {
		t.Errorf("shared %+v, want %+v", got, on("a"))
	}
	other := newResponseOwners(10, time.Hour, store, zap.NewNop())
	if _, allowed := other.ownerFor("resp_acme", kr.Lookup([]byte("k-rival"))); allowed {
		t.Error("another replica let team rival use team acme's response")
	}
	if backend, allowed := other.ownerFor("resp_acme", kr.Lookup([]byte("k-acme"))); backend != "a" || !allowed {
		t.Errorf("another replica: ownerFor = %q, %v; want a, true", backend, allowed)
	}
}

// TestResponseOwnersFirstClaimWins checks that a response's owner is the
// first to claim it: a later claim by another team or backend, in memory
// or through the store shared with another replica, is refused and changes
// nothing, while the owner's own claim is accepted.
func TestResponseOwnersFirstClaimWins(t *testing.T) {
	rival := responseOwner{backend: "a", team: "rival", project: "web"}
	store := &fakeOwnerStore{owners: map[string]responseOwner{}}
	a := newResponseOwners(10, time.Hour, store, zap.NewNop())
	b := newResponseOwners(10, time.Hour, store, zap.NewNop())
	if !a.claim("r1", on("a")) {
		t.Fatal("the first claim of r1 was refused")
	}
	for _, tt := range []struct {
		name  string
		o     *responseOwners
		owner responseOwner
		want  bool
	}{
		{"same replica, other team", a, rival, false},
		{"same replica, other backend", a, on("b"), false},
		{"same replica, team not known", a, responseOwner{backend: "a"}, false},
		{"same replica, the owner again", a, on("a"), true},
		{"other replica, other team", b, rival, false},
		{"other replica, the owner", b, on("a"), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.o.claim("r1", tt.owner); got != tt.want {
				t.Errorf("claim = %v, want %v", got, tt.want)
			}
			for name, o := range map[string]*responseOwners{"a": a, "b": b} {
				if got, _ := o.owner("r1"); got != on("a") {
					t.Errorf("replica %s: owner %+v, want the first, %+v", name, got, on("a"))
				}
			}
		})
	}
	// Once it expires, a response is forgotten: its id may be claimed anew.
	now := time.Now().Add(2 * time.Hour)
	a.now = func() time.Time { return now }
	delete(store.owners, "r1") // the store's row expired too
	if !a.claim("r1", rival) {
		t.Error("the claim of an expired response was refused")
	}
}
