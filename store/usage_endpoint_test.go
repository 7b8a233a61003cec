package store_test

import (
	"context"
	"math"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// endpointRec is usageRec for endpoint.
func endpointRec(call, endpoint string, prompt, completion int64) accounting.Record {
	r := usageRec(call, "acme", "bot", "m", "k", usageT0, prompt, completion, 0)
	r.Endpoint = endpoint
	return r
}

// TestUsageByEndpoint stores records of every endpoint (and one that names
// none, as records made before endpoints were told apart) and checks the
// sums per endpoint, the endpoints filter, and the op each call is
// recorded under.
func TestUsageByEndpoint(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		recs := []accounting.Record{
			endpointRec("chat-1", "chat.completions", 10, 1),
			endpointRec("chat-old", "", 20, 2),
			endpointRec("text-1", "completions", 30, 3),
			endpointRec("emb-1", "embeddings", 40, 0),
			endpointRec("emb-2", "embeddings", 50, 0),
			endpointRec("resp-1", "responses", 60, 6),
		}
		if err := d.InsertRecords(ctx, recs); err != nil {
			t.Fatal(err)
		}
		q := accounting.UsageQuery{Start: usageT0, End: usageT0.Add(time.Hour), BucketWidth: time.Hour, GroupByEndpoint: true}
		got, err := d.UsageBuckets(ctx, q)
		if err != nil {
			t.Fatalf("UsageBuckets: %v", err)
		}
		want := []accounting.UsageRow{
			{BucketStart: usageT0, Endpoint: "chat.completions", InputTokens: 30, OutputTokens: 3, Requests: 2, Records: 2},
			{BucketStart: usageT0, Endpoint: "completions", InputTokens: 30, OutputTokens: 3, Requests: 1, Records: 1},
			{BucketStart: usageT0, Endpoint: "embeddings", InputTokens: 90, Requests: 2, Records: 2},
			{BucketStart: usageT0, Endpoint: "responses", InputTokens: 60, OutputTokens: 6, Requests: 1, Records: 1},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("by endpoint =\n%+v\nwant\n%+v", got, want)
		}

		q.GroupByEndpoint = false
		q.Endpoints = []string{"chat.completions", "responses"}
		got, err = d.UsageBuckets(ctx, q)
		if err != nil {
			t.Fatalf("UsageBuckets: %v", err)
		}
		want = []accounting.UsageRow{{BucketStart: usageT0, InputTokens: 90, OutputTokens: 9, Requests: 3, Records: 3}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("chat and responses =\n%+v\nwant\n%+v", got, want)
		}

		wantOps := map[string]string{
			"chat-1":   "openai.chat.completions.create",
			"chat-old": "openai.chat.completions.create",
			"text-1":   "openai.completions.create",
			"emb-1":    "openai.embeddings.create",
			"resp-1":   "openai.responses.create",
		}
		for call, op := range wantOps {
			var got string
			if err := d.QueryRow(ctx, `SELECT op_name FROM calls WHERE id = ?`, call).Scan(&got); err != nil {
				t.Fatalf("call %s: %v", call, err)
			}
			if got != op {
				t.Errorf("call %s: op %q, want %q", call, got, op)
			}
		}
	})
}

// rewindAndReopen takes the store cfg, open as d, back to before a
// migration by running stmts in one transaction, closes d and returns the
// store reopened, which applies the migration again.
func rewindAndReopen(t *testing.T, d *store.DB, cfg config.Store, stmts ...string) *store.DB {
	t.Helper()
	ctx := context.Background()
	tx, err := d.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range stmts {
		if err := d.TxExec(ctx, tx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d, err = store.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	return d
}

// TestUsageEndpointMigration takes a store back to usage version 1 (no
// endpoint column) with a record in it, and reopens it: version 2 applies
// again and files the old record under chat completions.
func TestUsageEndpointMigration(t *testing.T) {
	forEachStoreConfig(t, func(t *testing.T, cfg config.Store) {
		ctx := context.Background()
		d, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		insertOldRecords(t, d, []accounting.Record{endpointRec("old", "embeddings", 5, 0)})
		d = rewindAndReopen(t, d, cfg,
			`ALTER TABLE usage_records DROP COLUMN endpoint`,
			`DELETE FROM schema_migrations WHERE component = 'usage' AND version = 2`,
		)
		defer d.Close()
		var endpoint string
		if err := d.QueryRow(ctx, `SELECT endpoint FROM usage_records WHERE call_id = 'old'`).Scan(&endpoint); err != nil {
			t.Fatal(err)
		}
		if endpoint != "chat.completions" {
			t.Errorf("a record from before the migration: endpoint %q, want chat.completions", endpoint)
		}
	})
}

// TestUsageSumsSaturate stores token counts a hostile backend could have
// reported (2^62 twice, 2^63-1, negative) and checks that every sum reads
// without an error, saturates at 2^63-1 instead of wrapping, and counts
// negative counts as 0, on both engines. (Sums past 2^53 that do not
// saturate are exact on PostgreSQL only, see sumTokens; the values here
// are exact in float64 too.)
func TestUsageSumsSaturate(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		rec := func(call, project string, prompt, completion, total, cached int64) accounting.Record {
			r := usageRec(call, "acme", project, "m", "k", usageT0, 0, 0, 0)
			r.PromptTokens, r.CompletionTokens, r.TotalTokens, r.CachedTokens = prompt, completion, total, cached
			return r
		}
		const half = int64(1) << 62
		if err := d.InsertRecords(ctx, []accounting.Record{
			rec("two-halves-a", "halves", half, half, half, half),
			rec("two-halves-b", "halves", half, half, half, half),
			rec("max", "max", math.MaxInt64, 3, math.MaxInt64, 0),
			rec("one-half", "one-half", half, 1, half, 0),
			rec("negative", "negative", -50, -7, -57, -1),
			rec("positive", "negative", 20, 2, 22, 0),
			// No total, and prompt + completion beyond int64: the budget
			// sum must not add them row by row.
			rec("no-total", "no-total", math.MaxInt64, math.MaxInt64, 0, 0),
		}); err != nil {
			t.Fatal(err)
		}
		got, err := d.UsageBuckets(ctx, accounting.UsageQuery{Start: usageT0, End: usageT0.Add(time.Hour), BucketWidth: time.Hour, GroupByProject: true})
		if err != nil {
			t.Fatalf("UsageBuckets: %v", err)
		}
		want := []accounting.UsageRow{
			{BucketStart: usageT0, Team: "acme", Project: "halves", InputTokens: math.MaxInt64, OutputTokens: math.MaxInt64, CachedTokens: math.MaxInt64, Requests: 2, Records: 2},
			{BucketStart: usageT0, Team: "acme", Project: "max", InputTokens: math.MaxInt64, OutputTokens: 3, Requests: 1, Records: 1},
			{BucketStart: usageT0, Team: "acme", Project: "negative", InputTokens: 20, OutputTokens: 2, Requests: 2, Records: 2},
			{BucketStart: usageT0, Team: "acme", Project: "no-total", InputTokens: math.MaxInt64, OutputTokens: math.MaxInt64, Requests: 1, Records: 1},
			{BucketStart: usageT0, Team: "acme", Project: "one-half", InputTokens: half, OutputTokens: 1, Requests: 1, Records: 1},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("UsageBuckets =\n%+v\nwant\n%+v", got, want)
		}
		// Without grouping every row meets in one sum.
		all, err := d.UsageBuckets(ctx, accounting.UsageQuery{Start: usageT0, End: usageT0.Add(time.Hour), BucketWidth: time.Hour})
		if err != nil {
			t.Fatalf("UsageBuckets: %v", err)
		}
		if len(all) != 1 || all[0].InputTokens != math.MaxInt64 || all[0].OutputTokens != math.MaxInt64 || all[0].Requests != 7 {
			t.Errorf("ungrouped = %+v, want one row saturated at 2^63-1 with 7 requests", all)
		}

		spent, err := d.SpentTokens(ctx, usageT0)
		if err != nil {
			t.Fatalf("SpentTokens: %v", err)
		}
		gotSpent := map[string]int64{}
		for _, r := range spent {
			gotSpent[r.Subject.Project] = r.Tokens
		}
		wantSpent := map[string]int64{
			"halves": math.MaxInt64, "max": math.MaxInt64, "one-half": half,
			"negative": 22, "no-total": math.MaxInt64,
		}
		if !reflect.DeepEqual(gotSpent, wantSpent) {
			t.Errorf("SpentTokens = %v, want %v", gotSpent, wantSpent)
		}
	})
}

// TestUsageSumsSaturateSQLiteReals stores what only SQLite lets another
// writer put in an INTEGER column, REALs beyond int64 (1e300, and a number
// that overflows to infinity), in a store from before usage version 3: the
// roll-up the migration fills saturates instead of failing to scan.
func TestUsageSumsSaturateSQLiteReals(t *testing.T) {
	cfg := storetest.Config(t, storetest.SQLite)
	ctx := context.Background()
	d, err := store.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	insertOldRecords(t, d, []accounting.Record{usageRec("small", "acme", "bot", "m", "k", usageT0, 5, 5, 0)})
	tx, err := d.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for i, tokens := range []string{"1e300", "9e999"} {
		if err := d.TxExec(ctx, tx, `INSERT INTO usage_records (call_id, request_id, trace_id, key_name, team, project, model, backend, status,
			prompt_tokens, completion_tokens, total_tokens, cached_tokens, started, ended)
			VALUES (?, 'r', 't', 'k', 'acme', 'bot', 'm', 'b', 200, `+tokens+`, 1, `+tokens+`, 0, ?, ?)`,
			"real-"+strconv.Itoa(i), usageT0.UnixNano(), usageT0.UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	d = rewindRollup(t, d, cfg)
	defer d.Close()
	got, err := d.UsageBuckets(ctx, accounting.UsageQuery{Start: usageT0, End: usageT0.Add(time.Hour), BucketWidth: time.Hour})
	if err != nil {
		t.Fatalf("UsageBuckets: %v", err)
	}
	want := []accounting.UsageRow{{BucketStart: usageT0, InputTokens: math.MaxInt64, OutputTokens: 7, Requests: 3, Records: 3}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("UsageBuckets = %+v, want %+v", got, want)
	}
	spent, err := d.SpentTokens(ctx, usageT0)
	if err != nil {
		t.Fatalf("SpentTokens: %v", err)
	}
	if len(spent) != 1 || spent[0].Tokens != math.MaxInt64 {
		t.Errorf("SpentTokens = %+v, want one row of 2^63-1", spent)
	}
}
