package store_test

import (
	"context"
	"fmt"
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
		mustPut := func(id, backend, team, project string, expires time.Time) {
			t.Helper()
			if err := d.PutResponseOwner(ctx, id, backend, team, project, expires); err != nil {
				t.Fatalf("PutResponseOwner(%s): %v", id, err)
			}
		}
		mustPut("resp_a", "vllm-a", "acme", "web", later)
		mustPut("resp_b", "vllm-b", "rival", "", later)
		mustPut("resp_unknown_team", "vllm-a", "", "", later)
		mustPut("resp_gone", "vllm-a", "acme", "web", time.Now().Add(-time.Second))
		mustPut("resp_moved", "vllm-a", "acme", "web", later)
		mustPut("resp_moved", "vllm-b", "rival", "ops", later) // put again: the last put wins

		tests := []struct {
			id                            string
			wantBackend, wantTeam, wantPj string
			wantFound                     bool
		}{
			{"resp_a", "vllm-a", "acme", "web", true},
			{"resp_b", "vllm-b", "rival", "", true},
			{"resp_unknown_team", "vllm-a", "", "", true},
			{"resp_moved", "vllm-b", "rival", "ops", true},
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
			if err := d.PutResponseOwner(ctx, bad[0], bad[1], "acme", "web", later); err == nil {
				t.Errorf("PutResponseOwner(%q, %q) = nil, want an error", bad[0], bad[1])
			}
		}
	})
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
		if err := d.PutResponseOwner(ctx, "resp_old", "vllm-a", "acme", "web", time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if _, team, project, _, err := d.ResponseOwner(ctx, "resp_old"); err != nil || team != "acme" || project != "web" {
			t.Errorf("after a put: team %q, project %q (%v), want acme/web", team, project, err)
		}
	})
}

// TestResponseOwnersPurge fills the table with expired rows and checks that
// each put deletes a bounded batch of them, the oldest first, and leaves
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
		// 250 expired rows, written straight into the table (a put would
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
			if err := d.PutResponseOwner(ctx, fmt.Sprint("new-", i), "b", "acme", "web", later); err != nil {
				t.Fatalf("put %d: %v", i, err)
			}
			if expired, live := count(); expired != wantExpired || live != i+1 {
				t.Errorf("after put %d: %d expired, %d live rows; want %d, %d", i, expired, live, wantExpired, i+1)
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
// puts, the other reads, while both put and purge at once.
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
				if err := d.PutResponseOwner(ctx, fmt.Sprintf("resp-%d-%d", r, i), fmt.Sprint("backend-", r), fmt.Sprint("team-", r), "p", expires); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("put: %v", err)
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
}
