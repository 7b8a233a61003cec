package store_test

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// rewindRollup takes the store cfg, open as d, back to usage version 2 (no
// roll-up, the four indexes of usage_records) and returns it reopened, so
// that version 3 fills the roll-up again from usage_records.
func rewindRollup(t *testing.T, d *store.DB, cfg config.Store) *store.DB {
	t.Helper()
	return rewindAndReopen(t, d, cfg,
		`DROP TABLE usage_rollup`,
		`CREATE INDEX usage_records_started ON usage_records (started)`,
		`CREATE INDEX usage_records_team_project_started ON usage_records (team, project, started)`,
		`CREATE INDEX usage_records_model_started ON usage_records (model, started)`,
		`CREATE INDEX usage_records_request_id ON usage_records (request_id)`,
		`DELETE FROM schema_migrations WHERE component = 'usage' AND version IN (3, 6)`,
	)
}

// insertOldRecords writes recs to usage_records as InsertRecords did
// before usage version 4, for the migrations that read that table.
func insertOldRecords(t *testing.T, d *store.DB, recs []accounting.Record) {
	t.Helper()
	ctx := context.Background()
	tx, err := d.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	unixNano := func(t time.Time) int64 {
		if t.IsZero() {
			return 0
		}
		return t.UnixNano()
	}
	for _, r := range recs {
		endpoint := r.Endpoint
		if endpoint == "" {
			endpoint = "chat.completions"
		}
		if err := d.TxExec(ctx, tx, `INSERT INTO usage_records (
			call_id, request_id, trace_id, parent_id, key_name, team, project,
			model, served_model, backend, endpoint, status, error, stream, incomplete,
			prompt_tokens, completion_tokens, total_tokens, cached_tokens, started, ended
		) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.CallID, r.RequestID, r.TraceID, r.ParentID, r.KeyName, r.Team, r.Project,
			r.Model, r.ServedModel, r.Backend, endpoint, r.Status, r.Error, r.Stream, r.Incomplete,
			r.PromptTokens, r.CompletionTokens, r.TotalTokens, r.CachedTokens,
			unixNano(r.Started), unixNano(r.Ended)); err != nil {
			t.Fatalf("record %s: %v", r.CallID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// rollupRow is a usage_rollup row.
type rollupRow struct {
	Sec                                                int64
	Team, Project, Key, Model, Endpoint, Status        string
	Prompt, Completion, Cached, Total, Spent, Requests int64
	Records                                            int64
}

// rollupRows reads usage_rollup in key order.
func rollupRows(t *testing.T, d *store.DB) []rollupRow {
	t.Helper()
	ctx := context.Background()
	var n int
	if err := d.QueryRow(ctx, `SELECT COUNT(*) FROM usage_rollup`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	out := make([]rollupRow, 0, n)
	for i := range n {
		var r rollupRow
		if err := d.QueryRow(ctx, `SELECT started_sec, team, project, key_name, model, endpoint, status_class,
			prompt_tokens, completion_tokens, cached_tokens, total_tokens, spent_tokens, requests, records
			FROM usage_rollup ORDER BY started_sec, team, project, key_name, model, endpoint, status_class
			LIMIT 1 OFFSET ?`, i).Scan(&r.Sec, &r.Team, &r.Project, &r.Key, &r.Model, &r.Endpoint, &r.Status,
			&r.Prompt, &r.Completion, &r.Cached, &r.Total, &r.Spent, &r.Requests, &r.Records); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		out = append(out, r)
	}
	return out
}

// rollupRecords are records of every status class, of token counts that
// saturate, and of start times on and off whole seconds, before 1970 and
// unset. Counts beyond 2^53 each have a project of their own, where
// SQLite's float sums (see sumTokens) are exact.
func rollupRecords() []accounting.Record {
	rec := func(call, project string, started time.Time, status int, errText string, incomplete bool, backend string, prompt, completion, total int64) accounting.Record {
		r := usageRec(call, "acme", project, "m", "k", started, prompt, completion, 3)
		r.Status, r.Error, r.Incomplete, r.Backend, r.TotalTokens = status, errText, incomplete, backend, total
		return r
	}
	const half = int64(1) << 62
	recs := []accounting.Record{
		rec("ok", "bot", usageT0, 200, "", false, "b1", 10, 5, 15),
		rec("ok-later", "bot", usageT0.Add(999*time.Millisecond), 201, "", false, "b1", 1, 1, 2),
		rec("next-second", "bot", usageT0.Add(time.Second), 200, "", false, "b1", 2, 2, 4),
		rec("before", "bot", usageT0.Add(-time.Nanosecond), 200, "", false, "b1", 4, 4, 8),
		rec("closed-stream", "bot", usageT0, 200, "client closed the stream: broken pipe", true, "b1", 12, 3, 15),
		rec("closed-waiting", "bot", usageT0, 499, "client closed the connection", false, "b1", 0, 0, 0),
		rec("closed-odd-case", "bot", usageT0, 200, "Client closed", true, "b1", 1, 0, 1),
		rec("broken", "bot", usageT0, 200, "upstream stream broken: unexpected EOF", true, "b2", 7, 2, 9),
		rec("bad-request", "bot", usageT0, 400, "invalid request", false, "", 0, 0, 0),
		rec("upstream-500", "bot", usageT0, 502, "backend b1: status 500", false, "b1", 0, 0, 0),
		rec("in-band", "bot", usageT0, 200, "in-band stream error: overloaded", false, "b1", 4, 0, 4),
		rec("odd", "bot", usageT0, 0, "", false, "", 0, 0, 0),
		rec("no-total", "bot", usageT0, 200, "", false, "b1", 6, 4, 0),
		rec("negative", "bot", usageT0, 200, "", false, "b1", -50, -7, -57),
		rec("pre-1970", "old", time.Unix(-1, 5e8), 200, "", false, "b1", 1, 1, 2),
		rec("pre-1970-whole", "old", time.Unix(-2, 0), 200, "", false, "b1", 1, 1, 2),
		rec("unset-start", "old", time.Time{}, 200, "", false, "b1", 1, 1, 2),
		rec("halves-a", "halves", usageT0, 200, "", false, "b1", half, half, half),
		rec("halves-b", "halves", usageT0, 200, "", false, "b1", half, half, half),
		rec("max", "max", usageT0, 200, "", false, "b1", math.MaxInt64, 3, math.MaxInt64),
		rec("max-no-total", "max-no-total", usageT0, 200, "", false, "b1", math.MaxInt64, math.MaxInt64, 0),
	}
	recs[1].Endpoint, recs[2].Model, recs[3].KeyName = "embeddings", "m2", "k2"
	return recs
}

// usageReads are the reads of every kind a store answers from the roll-up.
type usageReads struct {
	Buckets map[string][]accounting.UsageRow
	Spent   map[string][]accounting.SpentRow
}

func readUsage(t *testing.T, d *store.DB) usageReads {
	t.Helper()
	ctx := context.Background()
	all := accounting.UsageQuery{Start: time.Unix(-10, 0), End: usageT0.Add(time.Hour), BucketWidth: time.Second,
		GroupByProject: true, GroupByModel: true, GroupByKey: true, GroupByEndpoint: true, GroupByStatus: true}
	queries := map[string]accounting.UsageQuery{
		"every group, per second": all,
		"by status, per minute": {Start: usageT0.Add(-time.Minute), End: usageT0.Add(time.Hour), BucketWidth: time.Minute,
			GroupByStatus: true},
		"ungrouped, from t0": {Start: usageT0, End: usageT0.Add(time.Hour), BucketWidth: time.Hour},
	}
	out := usageReads{Buckets: map[string][]accounting.UsageRow{}, Spent: map[string][]accounting.SpentRow{}}
	for name, q := range queries {
		rows, err := d.UsageBuckets(ctx, q)
		if err != nil {
			t.Fatalf("UsageBuckets %s: %v", name, err)
		}
		if len(rows) == 0 {
			t.Fatalf("UsageBuckets %s: no rows", name)
		}
		out.Buckets[name] = rows
	}
	for name, since := range map[string]time.Time{"since 1969": time.Unix(-10, 0), "since t0": usageT0} {
		rows, err := d.SpentTokens(ctx, since)
		if err != nil {
			t.Fatalf("SpentTokens %s: %v", name, err)
		}
		out.Spent[name] = rows
	}
	return out
}

// TestUsageRollupMigration writes records, whose roll-up InsertRecords
// keeps, and the same records to usage_records as stores before version 4
// held them, then takes the store back before usage version 3 and
// reopens it: the migration's roll-up, made in SQL from usage_records, is
// the one InsertRecords made in Go, row for row, and every read answers
// the same.
func TestUsageRollupMigration(t *testing.T) {
	forEachStoreConfig(t, func(t *testing.T, cfg config.Store) {
		ctx := context.Background()
		d, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.InsertRecords(ctx, rollupRecords()); err != nil {
			t.Fatal(err)
		}
		insertOldRecords(t, d, rollupRecords())
		wantRows, wantReads := rollupRows(t, d), readUsage(t, d)
		d = rewindRollup(t, d, cfg)
		defer d.Close()
		if got := rollupRows(t, d); !reflect.DeepEqual(got, wantRows) {
			t.Errorf("roll-up after the migration =\n%+v\nwritten by InsertRecords\n%+v", got, wantRows)
		}
		if got := readUsage(t, d); !reflect.DeepEqual(got, wantReads) {
			t.Errorf("reads after the migration =\n%+v\nbefore\n%+v", got, wantReads)
		}
		// Records written after the migration add to the rows it filled.
		if err := d.InsertRecords(ctx, []accounting.Record{usageRec("after", "acme", "bot", "m", "k", usageT0.Add(time.Minute), 1, 2, 0)}); err != nil {
			t.Fatal(err)
		}
		spent, err := d.SpentTokens(ctx, usageT0.Add(time.Minute))
		if err != nil || len(spent) != 1 || spent[0].Tokens != 3 {
			t.Errorf("SpentTokens after a new record = %+v, %v; want one row of 3", spent, err)
		}
	})
}

// TestUsageRollupValues checks the roll-up rows of records of every
// status class, time and saturating count (TestUsageRollupMigration
// checks the migration against them).
func TestUsageRollupValues(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		if err := d.InsertRecords(ctx, rollupRecords()); err != nil {
			t.Fatal(err)
		}
		t0 := usageT0.Unix()
		row := func(sec int64, project, model, key, endpoint, status string, prompt, completion, cached, total, spent, requests, records int64) rollupRow {
			return rollupRow{sec, "acme", project, key, model, endpoint, status, prompt, completion, cached, total, spent, requests, records}
		}
		const cc, max = "chat.completions", math.MaxInt64
		want := []rollupRow{
			row(-2, "old", "m", "k", cc, "complete", 1, 1, 3, 2, 2, 1, 1),
			row(-1, "old", "m", "k", cc, "complete", 1, 1, 3, 2, 2, 1, 1), // -0.5 s
			row(0, "old", "m", "k", cc, "complete", 1, 1, 3, 2, 2, 1, 1),  // unset
			row(t0-1, "bot", "m", "k2", cc, "complete", 4, 4, 3, 8, 8, 1, 1),
			row(t0, "bot", "m", "k", cc, "client_closed", 12, 3, 6, 15, 15, 2, 2),
			row(t0, "bot", "m", "k", cc, "client_error", 0, 0, 3, 0, 0, 0, 1),
			// Spent is the total (15) where there is one, else prompt and
			// completion (10); negative counts add 0.
			row(t0, "bot", "m", "k", cc, "complete", 16, 9, 9, 15, 25, 3, 3),
			row(t0, "bot", "m", "k", cc, "server_error", 4, 0, 9, 4, 4, 2, 3),
			row(t0, "bot", "m", "k", cc, "stream_broken", 8, 2, 6, 10, 10, 2, 2),
			row(t0, "bot", "m", "k", "embeddings", "complete", 1, 1, 3, 2, 2, 1, 1), // 0.999 s in
			row(t0, "halves", "m", "k", cc, "complete", max, max, 6, max, max, 2, 2),
			row(t0, "max", "m", "k", cc, "complete", max, 3, 3, max, max, 1, 1),
			row(t0, "max-no-total", "m", "k", cc, "complete", max, max, 3, 0, max, 1, 1),
			row(t0+1, "bot", "m2", "k", cc, "complete", 2, 2, 3, 4, 4, 1, 1),
		}
		if got := rollupRows(t, d); !reflect.DeepEqual(got, want) {
			t.Errorf("usage_rollup =\n%+v\nwant\n%+v", got, want)
		}
	})
}

// TestInsertRecordsRollupCountsOnce writes batches as the recorder does
// when they fail: a batch again after a commit that was reported failed
// (statements of 64, 32 and 4 rows), and, after a batch that failed whole
// (the recorder's writeEach after a store panic), its records one at a
// time, each of them twice. Each record counts once in the roll-up and
// has one call.
func TestInsertRecordsRollupCountsOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		batch := make([]accounting.Record, 100)
		for i := range batch {
			batch[i] = usageRec(fmt.Sprint("call-", i), "acme", "bot", "m", "k", usageT0.Add(time.Duration(i)*time.Millisecond), 1, 0, 0)
		}
		for range 2 {
			if err := d.InsertRecords(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
		each := []accounting.Record{
			usageRec("each-0", "acme", "bot", "m", "k", usageT0, 10, 0, 0),
			usageRec("each-1", "acme", "bot", "m", "k", usageT0, 100, 0, 0),
		}
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if err := d.InsertRecords(cancelled, each); err == nil {
			t.Fatal("InsertRecords with a cancelled context = nil, want an error")
		}
		for i := range each {
			for range 2 {
				if err := d.InsertRecords(ctx, each[i:i+1]); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := d.UsageBuckets(ctx, accounting.UsageQuery{Start: usageT0, End: usageT0.Add(time.Hour), BucketWidth: time.Hour})
		if err != nil {
			t.Fatalf("UsageBuckets: %v", err)
		}
		want := []accounting.UsageRow{{BucketStart: usageT0, InputTokens: 210, Requests: 102, Records: 102}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("UsageBuckets = %+v, want %+v", got, want)
		}
		if calls := countRows(t, d, `SELECT COUNT(*) FROM calls`); calls != 102 {
			t.Errorf("%d calls, want 102", calls)
		}
		if markers := countRows(t, d, `SELECT COUNT(*) FROM usage_batches`); markers != 3 {
			t.Errorf("%d batch markers, want 3", markers)
		}
	})
}

// TestUsageSubSecondBounds shows the roll-up's resolution: a record counts
// as started at the start of its second, for bounds off whole seconds as
// `tollgate usage` passes (now - since, now).
func TestUsageSubSecondBounds(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		if err := d.InsertRecords(ctx, []accounting.Record{
			usageRec("in-start-second", "acme", "bot", "m", "k", usageT0.Add(700*time.Millisecond), 1, 0, 0),
			usageRec("inside", "acme", "bot", "m", "k", usageT0.Add(1500*time.Millisecond), 10, 0, 0),
			usageRec("in-end-second", "acme", "bot", "m", "k", usageT0.Add(2700*time.Millisecond), 100, 0, 0),
			usageRec("after", "acme", "bot", "m", "k", usageT0.Add(3*time.Second), 1000, 0, 0),
		}); err != nil {
			t.Fatal(err)
		}
		// [t0+0.5s, t0+2.5s): the record of second t0 (at t0+0.7s) is
		// before it, the one of second t0+2 (at t0+2.7s) inside.
		start := usageT0.Add(500 * time.Millisecond)
		got, err := d.UsageBuckets(ctx, accounting.UsageQuery{Start: start, End: start.Add(2 * time.Second), BucketWidth: 2 * time.Second})
		if err != nil {
			t.Fatalf("UsageBuckets: %v", err)
		}
		want := []accounting.UsageRow{{BucketStart: start, InputTokens: 110, OutputTokens: 0, Requests: 2, Records: 2}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("UsageBuckets = %+v, want %+v", got, want)
		}
		spent, err := d.SpentTokens(ctx, start)
		if err != nil || len(spent) != 1 || spent[0].Tokens != 1110 {
			t.Errorf("SpentTokens(t0+0.5s) = %+v, %v; want one row of 1110", spent, err)
		}
	})
}

// BenchmarkInsertRecordsManyGroups is BenchmarkInsertRecords with every
// record of a batch in a roll-up row of its own (512 keys, all in one
// second, so that each batch after the first updates 512 rows), near the
// roll-up's worst case: a row upserted per record. Set beside
// BenchmarkInsertRecords, it shows what a roll-up row of its own costs a
// record.
func BenchmarkInsertRecordsManyGroups(b *testing.B) {
	for _, s := range storetest.Open(b) {
		b.Run(s.Name, func(b *testing.B) {
			ctx := context.Background()
			const batchSize = 512
			batch := make([]accounting.Record, batchSize)
			n := 0
			cpu0 := processCPU(b)
			for b.Loop() {
				for i := range batch {
					n++
					batch[i] = proxyLikeRec(b, n)
					batch[i].KeyName = fmt.Sprint("key-", i)
				}
				if err := s.DB.InsertRecords(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N*batchSize), "cpu-ns/record")
		})
	}
}
