package store_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
)

// A ":memory:" store is one database for every connection of the pool: the
// usage writer's batches and the usage API's reads, running at once, see
// the same rows, and Close leaves no file behind.
func TestInMemoryStoreIsOneDatabase(t *testing.T) {
	ctx := context.Background()
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "tollgate-store-*"))
	d, err := store.Open(ctx, config.Store{Driver: "sqlite", Path: config.SQLiteInMemory})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	const batches, perBatch = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, batches+1)
	for b := range batches {
		wg.Go(func() {
			recs := make([]accounting.Record, perBatch)
			for i := range recs {
				recs[i] = proxyLikeRec(t, b*perBatch+i)
			}
			errs <- d.InsertRecords(ctx, recs)
		})
	}
	// Reads overlapping the writes take connections of their own.
	wg.Go(func() {
		_, err := d.SpentTokens(ctx, usageT0)
		errs <- err
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("write or read: %v", err)
		}
	}
	spent, err := d.SpentTokens(ctx, usageT0.Add(-time.Hour))
	if err != nil {
		t.Fatalf("spent tokens: %v", err)
	}
	var total int64
	for _, r := range spent {
		total += r.Tokens
	}
	// proxyLikeRec records 800 prompt and 200 completion tokens.
	if want := int64(batches * perBatch * 1000); total != want {
		t.Errorf("spent %d tokens, want %d", total, want)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	after, _ := filepath.Glob(filepath.Join(os.TempDir(), "tollgate-store-*"))
	if len(after) > len(before) {
		t.Errorf("Close left the store's files behind: %v (before: %v)", after, before)
	}
}
