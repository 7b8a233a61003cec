package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/weave"
)

// tableBytesStored is what the project's tables take in the store: their
// lists of row digests and the chunks those lists are kept in (a store
// without chunks counts none).
func tableBytesStored(t *testing.T, db *store.DB, projectID int64) int64 {
	t.Helper()
	ctx := context.Background()
	var lists, chunks int64
	if err := db.QueryRow(ctx, `SELECT COALESCE(SUM(LENGTH(row_digests)), 0) FROM weave_tables WHERE project_id = ?`,
		projectID).Scan(&lists); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT COALESCE(SUM(LENGTH(items)), 0) FROM weave_table_chunks WHERE project_id = ?`,
		projectID).Scan(&chunks); err != nil {
		t.Logf("no chunks counted: %v", err)
		chunks = 0
	}
	return lists + chunks
}

// TestTableUpdateStoresOnlyWhatChanges: a one-row edit of a large table
// stores a new version whose digests are Weave's, in a number of bytes
// that does not grow with the table (the table's own list of row digests
// is far larger than the bound).
func TestTableUpdateStoresOnlyWhatChanges(t *testing.T) {
	const n = 20000
	const bound = 32 << 10
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "big-table")
		if err != nil {
			t.Fatal(err)
		}
		rows := make([]map[string]any, n)
		for i := range rows {
			rows[i] = map[string]any{"i": json.Number(strconv.Itoa(i)), "text": fmt.Sprintf("row %d", i)}
		}
		digest, rowDigests, stored, err := weave.NewTable(rows)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.PutTable(ctx, p.ID, digest, rowDigests, stored); err != nil {
			t.Fatal(err)
		}
		got, err := db.TableRowDigests(ctx, p.ID, digest)
		if err != nil || !slices.Equal(got, rowDigests) {
			t.Fatalf("row digests read back: %d digests, %v; want the %d stored", len(got), err, n)
		}
		listBytes := 0
		for _, d := range rowDigests {
			listBytes += len(d) + 3
		}
		if listBytes < 20*bound {
			t.Fatalf("test table too small: its list is %d bytes", listBytes)
		}

		edits := []struct {
			name   string
			update weave.TableUpdate
			apply  func([]map[string]any) []map[string]any
		}{
			{"append", weave.TableUpdate{Append: true, Row: map[string]any{"new": "last"}},
				func(r []map[string]any) []map[string]any { return append(r, map[string]any{"new": "last"}) }},
			{"insert at the front", weave.TableUpdate{Insert: true, Index: 0, Row: map[string]any{"new": "first"}},
				func(r []map[string]any) []map[string]any { return slices.Insert(r, 0, map[string]any{"new": "first"}) }},
			{"pop in the middle", weave.TableUpdate{Pop: true, Index: n / 2},
				func(r []map[string]any) []map[string]any { return slices.Delete(r, n/2, n/2+1) }},
		}
		base, baseDigests := digest, rowDigests
		want := rows
		for _, ed := range edits {
			t.Run(ed.name, func(t *testing.T) {
				res, err := weave.ApplyTableUpdates(baseDigests, []weave.TableUpdate{ed.update})
				if err != nil {
					t.Fatal(err)
				}
				before := tableBytesStored(t, db, p.ID)
				if err := db.PutTable(ctx, p.ID, res.Digest, res.RowDigests, res.NewRows); err != nil {
					t.Fatal(err)
				}
				written := tableBytesStored(t, db, p.ID) - before
				if written > bound {
					t.Errorf("a one-row %s stored %d bytes of table lists; want at most %d", ed.name, written, bound)
				}
				want = ed.apply(want)
				wantDigest, wantRows, _, err := weave.NewTable(want)
				if err != nil {
					t.Fatal(err)
				}
				if res.Digest != wantDigest {
					t.Errorf("updated digest %s, want Weave's %s for the same rows", res.Digest, wantDigest)
				}
				got, err := db.TableRowDigests(ctx, p.ID, res.Digest)
				if err != nil || !slices.Equal(got, wantRows) {
					t.Fatalf("updated row digests: %d digests, %v; want %d equal to Weave's", len(got), err, len(wantRows))
				}
				// The base version reads as it was.
				if got, err := db.TableRowDigests(ctx, p.ID, base); err != nil || !slices.Equal(got, baseDigests) {
					t.Fatalf("base version changed: %d digests, %v", len(got), err)
				}
				base, baseDigests = res.Digest, res.RowDigests
			})
		}
	})
}
