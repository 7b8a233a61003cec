package store

import (
	"fmt"
	"math/bits"
	"sync"
	"testing"
)

// allNumberedInserts are the package's numberedInserts: the gateway call
// shapes and the completion link shapes.
func allNumberedInserts() map[string]*numberedInsert {
	all := make(map[string]*numberedInsert)
	for flags, n := range gatewayCallShapes {
		all[fmt.Sprintf("gateway call flags %04b", flags)] = n
	}
	for shared := range linkShapes {
		for created, n := range linkShapes[shared] {
			all[fmt.Sprintf("link shared %d created %d", shared, created)] = n
		}
	}
	return all
}

// eagerSQLs writes n's statements as newNumberedInsert did before they
// were written on first use: every count of rows at once.
func eagerSQLs(n *numberedInsert) []string {
	var sqls []string
	for rows := 1; rows <= rowsPerInsert; rows *= 2 {
		sqls = append(sqls, n.row.sql(n.m.head, rows, n.m.tail))
	}
	return sqls
}

func TestNumberedInsertCountsCoverRowsPerInsert(t *testing.T) {
	if got := bits.Len(rowsPerInsert); got != numberedCounts {
		t.Fatalf("rowsPerInsert %d needs %d statements, numberedCounts is %d", rowsPerInsert, got, numberedCounts)
	}
}

// TestNumberedInsertSQLOnFirstUse compares the statements written on
// first use, by goroutines racing for each, with the ones written at once
// for every count of rows, and checks that a second call returns the
// text the first stored.
func TestNumberedInsertSQLOnFirstUse(t *testing.T) {
	for name, shape := range allNumberedInserts() {
		t.Run(name, func(t *testing.T) {
			lazy := newNumberedInsert(shape.m, shape.row)
			want := eagerSQLs(shape)
			var wg sync.WaitGroup
			got := make([][]string, 4)
			for g := range got {
				wg.Go(func() {
					for i := range want {
						got[g] = append(got[g], lazy.sql(1<<i))
					}
				})
			}
			wg.Wait()
			for g := range got {
				for i := range want {
					if got[g][i] != want[i] {
						t.Errorf("goroutine %d, %d rows: got %q, want %q", g, 1<<i, got[g][i], want[i])
					}
				}
			}
			for i := range want {
				if again := lazy.sql(1 << i); again != want[i] {
					t.Errorf("%d rows again: got %q, want %q", 1<<i, again, want[i])
				}
			}
		})
	}
}
