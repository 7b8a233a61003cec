package store_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
)

// cacheWriteRecords are two Messages API records that wrote to the prompt
// cache and a chat completion that did not, in one second, key and model.
func cacheWriteRecords() []accounting.Record {
	a := usageRec("cw-a", "acme", "bot", "m", "k", usageT0, 100, 10, 30)
	a.Endpoint, a.CacheWriteTokens = "messages", 50
	b := usageRec("cw-b", "acme", "bot", "m", "k", usageT0, 40, 5, 0)
	b.Endpoint, b.CacheWriteTokens = "messages", 20
	c := usageRec("cw-c", "acme", "bot", "m", "k", usageT0, 7, 3, 2)
	c.Endpoint = "chat.completions"
	return []accounting.Record{a, b, c}
}

// cacheWriteSums reads usage_rollup's cache writes and prompt tokens by
// endpoint, of the endpoints it has a row of.
func cacheWriteSums(t *testing.T, d *store.DB) map[string][2]int64 {
	t.Helper()
	out := map[string][2]int64{}
	for _, ep := range []string{"messages", "chat.completions"} {
		var w, p int64
		err := d.QueryRow(context.Background(), `SELECT cache_write_tokens, prompt_tokens FROM usage_rollup WHERE endpoint = ?`, ep).Scan(&w, &p)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			t.Fatalf("roll-up of %s: %v", ep, err)
		}
		out[ep] = [2]int64{w, p}
	}
	return out
}

// TestCacheWriteTokens records the prompt tokens a request wrote to the
// backend's prompt cache apart from the rest of its prompt, which still
// counts them: in its gateway call's summary (cache_creation_input_tokens,
// only when there were some), the roll-up and the usage API's rows.
func TestCacheWriteTokens(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		recs := cacheWriteRecords()
		if err := d.InsertRecords(ctx, recs); err != nil {
			t.Fatal(err)
		}
		for _, w := range recs {
			if got := gatewayCallRecord(t, d, w.CallID); got.CacheWriteTokens != w.CacheWriteTokens || got.PromptTokens != w.PromptTokens {
				t.Errorf("call %s: cache writes %d of %d prompt tokens, want %d of %d", w.CallID,
					got.CacheWriteTokens, got.PromptTokens, w.CacheWriteTokens, w.PromptTokens)
			}
		}
		var sum string
		if err := d.QueryRow(ctx, `SELECT summary FROM calls WHERE id = 'cw-c'`).Scan(&sum); err != nil {
			t.Fatal(err)
		}
		if gjson.Get(sum, "usage.m.cache_creation_input_tokens").Exists() {
			t.Errorf("a call without cache writes has summary %s", sum)
		}
		if got := cacheWriteSums(t, d); got["messages"] != [2]int64{70, 140} || got["chat.completions"] != [2]int64{0, 7} {
			t.Errorf("roll-up (cache writes, prompt) by endpoint = %v", got)
		}
		rows, err := d.UsageBuckets(ctx, accounting.UsageQuery{Start: usageT0, End: usageT0.Add(time.Hour),
			BucketWidth: time.Hour, GroupByEndpoint: true})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][3]int64{"chat.completions": {7, 2, 0}, "messages": {140, 30, 70}}
		if len(rows) != len(want) {
			t.Fatalf("UsageBuckets = %+v", rows)
		}
		for _, r := range rows {
			if got := [3]int64{r.InputTokens, r.CachedTokens, r.CacheWriteTokens}; got != want[r.Endpoint] {
				t.Errorf("%s: input, cached, cache write tokens %v, want %v", r.Endpoint, got, want[r.Endpoint])
			}
		}
	})
}

// TestUsageCacheWriteMigration takes a store with a roll-up back to usage
// version 5 (no cache_write_tokens) and reopens it: version 6 adds the
// column, the rows summed before it keep their sums with no cache writes,
// and records written after add theirs.
func TestUsageCacheWriteMigration(t *testing.T) {
	forEachStoreConfig(t, func(t *testing.T, cfg config.Store) {
		ctx := context.Background()
		d, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		recs := cacheWriteRecords()
		if err := d.InsertRecords(ctx, recs[:1]); err != nil {
			t.Fatal(err)
		}
		d = rewindAndReopen(t, d, cfg, `ALTER TABLE usage_rollup DROP COLUMN cache_write_tokens`,
			`DELETE FROM schema_migrations WHERE component = 'usage' AND version = 6`)
		defer d.Close()
		if got := cacheWriteSums(t, d)["messages"]; got != [2]int64{0, 100} {
			t.Errorf("after the migration, (cache writes, prompt) = %v, want [0 100]", got)
		}
		if err := d.InsertRecords(ctx, recs[1:]); err != nil {
			t.Fatal(err)
		}
		if got := cacheWriteSums(t, d)["messages"]; got != [2]int64{20, 140} {
			t.Errorf("after a new record, (cache writes, prompt) = %v, want [20 140]", got)
		}
	})
}
