package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

func TestResponseOwners(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		later := time.Now().Add(time.Hour)
		claim := func(id, backend, team, project string, expires time.Time) (string, string, string) {
			t.Helper()
			b, tm, p, err := d.ClaimResponseOwner(ctx, id, backend, team, project, expires)
			if err != nil {
				t.Fatalf("ClaimResponseOwner(%s): %v", id, err)
			}
			return b, tm, p
		}
		claim("resp_a", "vllm-a", "acme", "web", later)
		claim("resp_b", "vllm-b", "rival", "", later)
		claim("resp_unknown_team", "vllm-a", "", "", later)
		claim("resp_gone", "vllm-a", "acme", "web", time.Now().Add(-time.Second))
		claim("resp_expired", "vllm-a", "acme", "web", time.Now().Add(-time.Second))
		claim("resp_expired", "vllm-b", "rival", "ops", later) // an expired row is no owner
		claim("resp_taken", "vllm-a", "acme", "web", later)
		// Claims by anyone but the owner of record change nothing, and
		// answer with that owner.
		for _, other := range [][3]string{{"vllm-b", "rival", "ops"}, {"vllm-a", "rival", "web"}, {"vllm-b", "acme", "web"}, {"vllm-a", "", ""}} {
			if b, tm, p := claim("resp_taken", other[0], other[1], other[2], later); b != "vllm-a" || tm != "acme" || p != "web" {
				t.Errorf("a claim by %v answered owner %q, %q, %q; want the first, vllm-a, acme, web", other, b, tm, p)
			}
		}
		if b, tm, _ := claim("resp_unknown_team", "vllm-a", "acme", "web", later); b != "vllm-a" || tm != "" {
			t.Errorf("a response of no known team was taken over: owner %q, %q", b, tm)
		}

		tests := []struct {
			id                            string
			wantBackend, wantTeam, wantPj string
			wantFound                     bool
		}{
			{"resp_a", "vllm-a", "acme", "web", true},
			{"resp_b", "vllm-b", "rival", "", true},
			{"resp_unknown_team", "vllm-a", "", "", true},
			{"resp_taken", "vllm-a", "acme", "web", true},
			{"resp_expired", "vllm-b", "rival", "ops", true},
			{"resp_gone", "", "", "", false}, // expired: ignored even before a purge
			{"resp_never", "", "", "", false},
		}
		for _, tt := range tests {
			t.Run(tt.id, func(t *testing.T) {
				backend, team, project, found, err := d.ResponseOwner(ctx, tt.id)
				if err != nil || backend != tt.wantBackend || team != tt.wantTeam || project != tt.wantPj || found != tt.wantFound {
					t.Errorf("ResponseOwner = %q, %q, %q, %v, %v; want %q, %q, %q, %v, nil",
						backend, team, project, found, err, tt.wantBackend, tt.wantTeam, tt.wantPj, tt.wantFound)
				}
			})
		}

		for _, bad := range [][2]string{{"", "vllm-a"}, {"resp_c", ""}} {
			if _, _, _, err := d.ClaimResponseOwner(ctx, bad[0], bad[1], "acme", "web", later); err == nil {
				t.Errorf("ClaimResponseOwner(%q, %q) = nil, want an error", bad[0], bad[1])
			}
		}
	})
}

// TestResponseOwnersRenew checks that the owner's own claim extends its
// expiry, and another's does not.
func TestResponseOwnersRenew(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		expiresOf := func() (n int64) {
			t.Helper()
			if err := d.QueryRow(ctx, `SELECT expires FROM response_owners WHERE response_id = 'resp_r'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		soon, later := time.Now().Add(time.Minute), time.Now().Add(time.Hour)
		for _, c := range []struct {
			team string
			at   time.Time
			want time.Time
		}{{"acme", soon, soon}, {"rival", later, soon}, {"acme", later, later}} {
			if _, _, _, err := d.ClaimResponseOwner(ctx, "resp_r", "vllm-a", c.team, "web", c.at); err != nil {
				t.Fatal(err)
			}
			if got := expiresOf(); got != c.want.UnixNano() {
				t.Errorf("after a claim by %s: expires %d, want %d", c.team, got, c.want.UnixNano())
			}
		}
	})
}

// TestResponseOwnersFirstClaimWins has many claimants race for the same ids
// on one store: each id ends with exactly one owner, and every claimant is
// told that same owner.
func TestResponseOwnersFirstClaimWins(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		raceClaims(t, []*store.DB{d, d, d, d})
	})
}

// raceClaims has one claimant per store in dbs claim the same ids at once,
// each for its own team, and checks that every claimant learns the same
// owner of each id, which is one of them, and that the store says so too.
func raceClaims(t *testing.T, dbs []*store.DB) {
	t.Helper()
	ctx := context.Background()
	const ids = 50
	later := time.Now().Add(time.Hour)
	told := make([][ids]string, len(dbs))
	var wg sync.WaitGroup
	errs := make(chan error, len(dbs)*ids)
	for r, d := range dbs {
		wg.Go(func() {
			for i := range ids {
				_, team, _, err := d.ClaimResponseOwner(ctx, fmt.Sprint("resp-race-", i), fmt.Sprint("backend-", r), fmt.Sprint("team-", r), "p", later)
				if err != nil {
					errs <- err
					continue
				}
				told[r][i] = team
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("claim: %v", err)
	}
	for i := range ids {
		backend, team, _, found, err := dbs[0].ResponseOwner(ctx, fmt.Sprint("resp-race-", i))
		if err != nil || !found || backend != "backend-"+strings.TrimPrefix(team, "team-") {
			t.Fatalf("resp-race-%d: owner %q, %q, %v, %v; want one claimant's backend and team", i, backend, team, found, err)
		}
		for r := range dbs {
			if told[r][i] != team {
				t.Errorf("resp-race-%d: claimant %d was told owner %q, the store holds %q", i, r, told[r][i], team)
			}
		}
	}
}

// TestResponseOwnersTeamMigration takes a store back to responses version
// 1 (no team or project) with a row in it, and reopens it: version 2
// applies again and leaves the old row's team empty, which the gateway
// reads as not known.
func TestResponseOwnersTeamMigration(t *testing.T) {
	forEachStoreConfig(t, func(t *testing.T, cfg config.Store) {
		ctx := context.Background()
		d, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		d = rewindAndReopen(t, d, cfg,
			`ALTER TABLE response_owners DROP COLUMN team`,
			`ALTER TABLE response_owners DROP COLUMN project`,
			`DELETE FROM schema_migrations WHERE component = 'responses' AND version = 2`,
			fmt.Sprintf(`INSERT INTO response_owners (response_id, backend, expires) VALUES ('resp_old', 'vllm-a', %d)`,
				time.Now().Add(time.Hour).UnixNano()),
		)
		defer d.Close()
		backend, team, project, found, err := d.ResponseOwner(ctx, "resp_old")
		if err != nil || !found || backend != "vllm-a" || team != "" || project != "" {
			t.Errorf("a row from before the migration = %q, %q, %q, %v, %v; want vllm-a with no team or project",
				backend, team, project, found, err)
		}
		// A team's claim does not take over a response of no known team.
		if _, _, _, err := d.ClaimResponseOwner(ctx, "resp_old", "vllm-a", "acme", "web", time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if _, team, project, _, err := d.ResponseOwner(ctx, "resp_old"); err != nil || team != "" || project != "" {
			t.Errorf("after a claim: team %q, project %q (%v), want still none", team, project, err)
		}
	})
}

// TestResponseOwnersPurge fills the table with expired rows and checks that
// each claim deletes a bounded batch of them, the oldest first, and leaves
// live rows alone.
func TestResponseOwnersPurge(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		count := func() (expired, live int) {
			t.Helper()
			now := time.Now().UnixNano()
			if err := d.QueryRow(ctx, `SELECT
				COALESCE(SUM(CASE WHEN expires <= ? THEN 1 ELSE 0 END), 0),
				COALESCE(SUM(CASE WHEN expires > ? THEN 1 ELSE 0 END), 0)
				FROM response_owners`, now, now).Scan(&expired, &live); err != nil {
				t.Fatal(err)
			}
			return expired, live
		}
		// 250 expired rows, written straight into the table (a claim would
		// purge as it goes).
		tx, err := d.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck // a no-op after Commit
		past := time.Now().Add(-time.Hour)
		for i := range 250 {
			if err := d.TxExec(ctx, tx, `INSERT INTO response_owners (response_id, backend, expires) VALUES (?, 'b', ?)`,
				fmt.Sprint("old-", i), past.Add(time.Duration(i)*time.Second).UnixNano()); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}

		later := time.Now().Add(time.Hour)
		for i, wantExpired := range []int{150, 50, 0, 0} {
			if _, _, _, err := d.ClaimResponseOwner(ctx, fmt.Sprint("new-", i), "b", "acme", "web", later); err != nil {
				t.Fatalf("claim %d: %v", i, err)
			}
			if expired, live := count(); expired != wantExpired || live != i+1 {
				t.Errorf("after claim %d: %d expired, %d live rows; want %d, %d", i, expired, live, wantExpired, i+1)
			}
			if i == 0 {
				// The oldest went first: rows 100 to 249 are left.
				var oldest string
				if err := d.QueryRow(ctx, `SELECT response_id FROM response_owners WHERE response_id LIKE 'old-%' ORDER BY expires LIMIT 1`).Scan(&oldest); err != nil || oldest != "old-100" {
					t.Errorf("oldest expired row left = %q (%v), want old-100", oldest, err)
				}
			}
		}
	})
}

// TestResponseOwnersShared is two replicas on one PostgreSQL: what one
// claims, the other reads, while both claim and purge at once; and when
// both claim the same ids at once, the first claim of each wins for both.
func TestResponseOwnersShared(t *testing.T) {
	cfg := storetest.Config(t, storetest.Postgres)
	ctx := context.Background()
	var replicas [2]*store.DB
	for i := range replicas {
		d, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		replicas[i] = d
	}
	const perReplica = 200
	var wg sync.WaitGroup
	errs := make(chan error, 2*perReplica)
	for r, d := range replicas {
		wg.Go(func() {
			for i := range perReplica {
				// Every fourth row expires at once, so that both purge.
				expires := time.Now().Add(time.Hour)
				if i%4 == 0 {
					expires = time.Now().Add(-time.Second)
				}
				if _, _, _, err := d.ClaimResponseOwner(ctx, fmt.Sprintf("resp-%d-%d", r, i), fmt.Sprint("backend-", r), fmt.Sprint("team-", r), "p", expires); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("claim: %v", err)
	}
	for r := range replicas {
		other := replicas[1-r]
		for i := range perReplica {
			backend, team, _, found, err := other.ResponseOwner(ctx, fmt.Sprintf("resp-%d-%d", r, i))
			wantFound := i%4 != 0
			if err != nil || found != wantFound || (found && (backend != fmt.Sprint("backend-", r) || team != fmt.Sprint("team-", r))) {
				t.Fatalf("replica %d reads resp-%d-%d = %q, %q, %v, %v; want found %v", 1-r, r, i, backend, team, found, err, wantFound)
			}
		}
	}
	raceClaims(t, replicas[:])
}
