package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/trace"
)

// TestCallEndsPurged keeps 150 ends whose start never comes, dates them
// 25 hours back, and checks that each later batch keeping an end purges at
// most 100 of them, oldest first, while a recent end still waits for its
// start and applies when it comes.
func TestCallEndsPurged(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "purge")
		if err != nil {
			t.Fatal(err)
		}
		end := func(id string) trace.CallWrite {
			return trace.CallWrite{End: &trace.CallEnd{ProjectID: p.ID, ID: id, EndedAt: callT0.Add(time.Second),
				Output: json.RawMessage(`"done"`)}}
		}
		start := func(id string) trace.CallWrite {
			return trace.CallWrite{Start: &trace.CallStart{ProjectID: p.ID, ID: id, OpName: "op", TraceID: "tr", StartedAt: callT0}}
		}
		waiting := func() (old, recent int) {
			t.Helper()
			if err := db.QueryRow(ctx, `SELECT
				COALESCE(SUM(CASE WHEN id LIKE 'old-%' THEN 1 ELSE 0 END), 0),
				COALESCE(SUM(CASE WHEN id LIKE 'old-%' THEN 0 ELSE 1 END), 0)
				FROM call_ends WHERE project_id = ?`, p.ID).Scan(&old, &recent); err != nil {
				t.Fatal(err)
			}
			return old, recent
		}

		var lost []trace.CallWrite
		for i := range 150 {
			lost = append(lost, end(fmt.Sprintf("old-%03d", i)))
		}
		if _, err := db.WriteCalls(ctx, lost); err != nil {
			t.Fatal(err)
		}
		if old, _ := waiting(); old != 150 {
			t.Fatalf("%d ends kept, want 150: none has expired yet", old)
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.TxExec(ctx, tx, `UPDATE call_ends SET kept_at = ? WHERE project_id = ?`,
			time.Now().Add(-25*time.Hour).UnixNano(), p.ID); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}

		// A batch that only starts calls keeps no end and purges nothing.
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{start("other")}); err != nil {
			t.Fatal(err)
		}
		if old, _ := waiting(); old != 150 {
			t.Fatalf("%d old ends after a batch of starts, want 150", old)
		}
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{end("recent-1")}); err != nil {
			t.Fatal(err)
		}
		if old, recent := waiting(); old != 50 || recent != 1 {
			t.Fatalf("after one batch: %d old and %d recent ends, want 50 and 1", old, recent)
		}
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{end("recent-2")}); err != nil {
			t.Fatal(err)
		}
		if old, recent := waiting(); old != 0 || recent != 2 {
			t.Fatalf("after two batches: %d old and %d recent ends, want 0 and 2", old, recent)
		}

		// A start whose end was purged makes a call not ended; a recent
		// end still applies to its start.
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{start("old-000"), start("recent-1")}); err != nil {
			t.Fatal(err)
		}
		if c, err := db.ReadCall(ctx, p.ID, "old-000"); err != nil || c.EndedAt != nil {
			t.Fatalf("old-000 = %+v, %v; want a call not ended", c, err)
		}
		if c, err := db.ReadCall(ctx, p.ID, "recent-1"); err != nil || c.EndedAt == nil || string(c.Output) != `"done"` {
			t.Fatalf("recent-1 = %+v, %v; want it ended with its kept end", c, err)
		}
	})
}
