package proxy

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestFormatUUIDMatchesUUIDString compares formatUUID with uuid.UUID's
// String on random and edge-case values.
func TestFormatUUIDMatchesUUIDString(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	values := [][16]byte{{}, {0: 0xff, 15: 0xff}}
	all := [16]byte{}
	for i := range all {
		all[i] = 0xff
	}
	values = append(values, all)
	for range 10000 {
		var u [16]byte
		for i := range u {
			u[i] = byte(r.Uint32())
		}
		values = append(values, u)
	}
	for _, u := range values {
		if got, want := formatUUID(&u), uuid.UUID(u).String(); got != want {
			t.Fatalf("formatUUID(%x) = %q, want %q", u, got, want)
		}
	}
}

// checkCallID checks that id is a UUIDv7 in canonical form whose time
// prefix is from floor to ceil ms.
func checkCallID(t *testing.T, id string, floor, ceil int64) {
	t.Helper()
	u, err := uuid.Parse(id)
	if err != nil {
		t.Fatalf("call id %q does not parse: %v", id, err)
	}
	if u.String() != id {
		t.Fatalf("call id %q is not in canonical form %q", id, u.String())
	}
	if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		t.Fatalf("call id %q has version %d, variant %v; want 7, RFC 4122", id, u.Version(), u.Variant())
	}
	prefix := int64(u[0])<<40 | int64(u[1])<<32 | int64(u[2])<<24 | int64(u[3])<<16 | int64(u[4])<<8 | int64(u[5])
	if prefix < floor || prefix > ceil {
		t.Fatalf("call id %q has time prefix %d, not within [%d, %d]", id, prefix, floor, ceil)
	}
}

// TestCallIDs: ids are valid UUIDv7s that carry the call's start time,
// each goroutine sees its ids strictly increase, and no id repeats across
// goroutines, including when thousands fall in one millisecond.
func TestCallIDs(t *testing.T) {
	tests := []struct {
		name string
		// clock gives the start time of the i-th call of a goroutine.
		clock func(i int) time.Time
	}{
		{"wall clock", func(int) time.Time { return time.Now() }},
		{"one millisecond", func(int) time.Time { return time.UnixMilli(1_700_000_000_000) }},
		{"clock stepping back", func(i int) time.Time { return time.UnixMilli(1_700_000_000_000 - int64(i)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var g callIDs
			if err := g.seedFromRand(); err != nil {
				t.Fatal(err)
			}
			const goroutines, perGoroutine = 8, 3000
			// The earliest start time any call has.
			floor := tt.clock(perGoroutine - 1).UnixMilli()
			ids := make([][]string, goroutines)
			var wg sync.WaitGroup
			for w := range goroutines {
				wg.Go(func() {
					for i := range perGoroutine {
						ids[w] = append(ids[w], g.next(tt.clock(i)))
					}
				})
			}
			wg.Wait()
			// The latest start time any call had, and the milliseconds
			// the counter may have carried into past it.
			ceil := tt.clock(0).UnixMilli() + goroutines*perGoroutine/4096 + 1
			seen := make(map[string]bool, goroutines*perGoroutine)
			for w := range ids {
				for i, id := range ids[w] {
					checkCallID(t, id, floor, ceil)
					if i > 0 && id <= ids[w][i-1] {
						t.Fatalf("goroutine %d: id %q after %q", w, id, ids[w][i-1])
					}
					if seen[id] {
						t.Fatalf("id %q made twice", id)
					}
					seen[id] = true
				}
			}
		})
	}
}

// TestCallIDTime: the time prefix is the call's start in unix ms, as
// uuid.UUID.Time reads it, while fewer than 4,096 ids fall in a
// millisecond.
func TestCallIDTime(t *testing.T) {
	var g callIDs
	start := time.UnixMilli(1_700_000_123_456)
	for i := range 100 {
		now := start.Add(time.Duration(i) * 7 * time.Millisecond)
		id := g.next(now)
		u := uuid.MustParse(id)
		sec, nsec := u.Time().UnixTime()
		if got := sec*1000 + nsec/1e6; got != now.UnixMilli() {
			t.Fatalf("id %q has time %d ms, want %d", id, got, now.UnixMilli())
		}
	}
}

// TestCallIDReplicas: two servers (replicas writing one store) making ids
// at the same instants never make the same id, and their ids differ in
// the random bits, not only by chance in one.
func TestCallIDReplicas(t *testing.T) {
	var a, b callIDs
	if err := a.seedFromRand(); err != nil {
		t.Fatal(err)
	}
	if err := b.seedFromRand(); err != nil {
		t.Fatal(err)
	}
	if a.seed == b.seed {
		t.Fatal("two seeds from crypto/rand are equal")
	}
	now := time.UnixMilli(1_700_000_000_000)
	for range 10000 {
		x, y := a.next(now), b.next(now)
		if x == y {
			t.Fatalf("replicas both made %q", x)
		}
		// Same time and counter: only rand_b (after the variant) differs.
		if x[:19] != y[:19] {
			t.Fatalf("replicas in step made %q and %q, which differ before rand_b", x, y)
		}
	}
	// One server's ids do not share their random tail.
	if x, y := a.next(now), a.next(now); x[24:] == y[24:] {
		t.Fatalf("consecutive ids %q and %q share their last 12 digits", x, y)
	}
}
