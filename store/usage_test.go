package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

var usageT0 = time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)

func usageRec(call, team, project, model, key string, started time.Time, prompt, completion, cached int64) accounting.Record {
	return accounting.Record{
		RequestID: "req-" + call, CallID: call, TraceID: "trace-" + call,
		KeyName: key, Team: team, Project: project, Model: model, ServedModel: model, Backend: "b1",
		Status: 200, PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion, CachedTokens: cached,
		Started: started, Ended: started.Add(time.Second),
	}
}

func TestInsertRecordsStoresEveryField(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		want := []accounting.Record{
			{
				RequestID: "same-request", CallID: "c1", TraceID: "t1", ParentID: "p0",
				KeyName: "ci", Team: "acme", Project: "chatbot", Model: "small", ServedModel: "big", Backend: "gpu-2",
				Endpoint: "responses", Status: 200, Error: "stream broke", Stream: true, Incomplete: true,
				PromptTokens: 11, CompletionTokens: 7, TotalTokens: 18, CachedTokens: 3,
				Started: usageT0.Add(123 * time.Nanosecond), Ended: usageT0.Add(2*time.Second + 456*time.Nanosecond),
				Input: []byte("not stored here"), Output: []byte("nor this"),
			},
			// A client reusing its X-Request-Id: a second row, not a conflict.
			{RequestID: "same-request", CallID: "c2", TraceID: "t2", KeyName: "ci", Team: "acme", Project: "chatbot", Model: "small",
				Endpoint: "embeddings", Status: 502, Started: usageT0, Ended: usageT0},
		}
		if err := d.InsertRecords(ctx, want); err != nil {
			t.Fatalf("InsertRecords: %v", err)
		}
		for _, w := range want {
			t.Run(w.CallID, func(t *testing.T) {
				var got accounting.Record
				var started, ended int64
				err := d.QueryRow(ctx, `SELECT request_id, call_id, trace_id, parent_id, key_name, team, project,
					model, served_model, backend, endpoint, status, error, stream, incomplete,
					prompt_tokens, completion_tokens, total_tokens, cached_tokens, started, ended
					FROM usage_records WHERE call_id = ?`, w.CallID).Scan(
					&got.RequestID, &got.CallID, &got.TraceID, &got.ParentID, &got.KeyName, &got.Team, &got.Project,
					&got.Model, &got.ServedModel, &got.Backend, &got.Endpoint, &got.Status, &got.Error, &got.Stream, &got.Incomplete,
					&got.PromptTokens, &got.CompletionTokens, &got.TotalTokens, &got.CachedTokens, &started, &ended)
				if err != nil {
					t.Fatalf("select: %v", err)
				}
				got.Started, got.Ended = time.Unix(0, started).UTC(), time.Unix(0, ended).UTC()
				w.Input, w.Output = nil, nil
				if !reflect.DeepEqual(got, w) {
					t.Errorf("stored\n%+v\nwant\n%+v", got, w)
				}
			})
		}
	})
}

func TestInsertRecordsIsIdempotentPerCallID(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		batch := []accounting.Record{
			usageRec("c1", "acme", "bot", "m", "k", usageT0, 1, 1, 0),
			usageRec("c2", "acme", "bot", "m", "k", usageT0, 1, 1, 0),
		}
		for range 2 { // as the recorder retries a batch whose commit was reported failed
			if err := d.InsertRecords(ctx, batch); err != nil {
				t.Fatalf("InsertRecords: %v", err)
			}
		}
		var n int
		if err := d.QueryRow(ctx, `SELECT COUNT(*) FROM usage_records`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Errorf("%d rows, want 2", n)
		}
	})
}

// TestInsertRecordsManyRows writes a batch longer than one INSERT
// statement carries (two full statements and a shorter last one), twice,
// and checks that every record and every gateway call is stored once.
func TestInsertRecordsManyRows(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		const n = 150
		batch := make([]accounting.Record, n)
		var wantTokens int64
		for i := range batch {
			batch[i] = usageRec(fmt.Sprint("call-", i), "acme", fmt.Sprint("p", i%3), "m", "k", usageT0.Add(time.Duration(i)*time.Millisecond), int64(i), 1, 0)
			wantTokens += int64(i) + 1
		}
		for range 2 {
			if err := d.InsertRecords(ctx, batch); err != nil {
				t.Fatalf("InsertRecords: %v", err)
			}
		}
		var rows, tokens int64
		if err := d.QueryRow(ctx, `SELECT COUNT(*), SUM(total_tokens) FROM usage_records`).Scan(&rows, &tokens); err != nil {
			t.Fatal(err)
		}
		if rows != n || tokens != wantTokens {
			t.Errorf("usage_records: %d rows, %d tokens; want %d, %d", rows, tokens, n, wantTokens)
		}
		var calls, distinct int64
		if err := d.QueryRow(ctx, `SELECT COUNT(*), COUNT(DISTINCT id) FROM calls`).Scan(&calls, &distinct); err != nil {
			t.Fatal(err)
		}
		if calls != n || distinct != n {
			t.Errorf("calls: %d rows, %d distinct ids; want %d of each", calls, distinct, n)
		}
	})
}

func TestInsertRecordsFailsWholeBatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := d.InsertRecords(ctx, []accounting.Record{usageRec("c1", "acme", "bot", "m", "k", usageT0, 1, 1, 0)})
		if err == nil {
			t.Fatal("InsertRecords with a cancelled context = nil, want an error")
		}
		var n int
		if err := d.QueryRow(context.Background(), `SELECT COUNT(*) FROM usage_records`).Scan(&n); err != nil || n != 0 {
			t.Errorf("rows = %d (err %v), want 0", n, err)
		}
		if err := d.InsertRecords(context.Background(), nil); err != nil {
			t.Errorf("InsertRecords(nil) = %v", err)
		}
	})
}

func TestMigrationsApplyOnce(t *testing.T) {
	forEachStoreConfig(t, func(t *testing.T, cfg config.Store) {
		d, err := store.Open(context.Background(), cfg)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if err := d.InsertRecords(context.Background(), []accounting.Record{usageRec("c1", "acme", "bot", "m", "k", usageT0, 1, 1, 0)}); err != nil {
			t.Fatal(err)
		}
		d.Close()
		d2, err := store.Open(context.Background(), cfg)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer d2.Close()
		ctx := context.Background()
		var versions, rows int
		if err := d2.QueryRow(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE component = 'usage'`).Scan(&versions); err != nil {
			t.Fatal(err)
		}
		if err := d2.QueryRow(ctx, `SELECT COUNT(*) FROM usage_records`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if want := store.Migrations()["usage"]; versions != want || rows != 1 {
			t.Errorf("after reopening: %d usage versions (want %d), %d rows (want 1)", versions, want, rows)
		}
	})
}

func TestSpentTokens(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		noTotal := usageRec("c5", "acme", "bot", "m", "k1", usageT0, 4, 6, 0)
		noTotal.TotalTokens = 0
		if err := d.InsertRecords(ctx, []accounting.Record{
			usageRec("c1", "acme", "bot", "m", "k1", usageT0.Add(-time.Hour), 100, 100, 0), // before since
			usageRec("c2", "acme", "bot", "m", "k1", usageT0, 10, 5, 0),
			usageRec("c3", "acme", "bot", "other", "k1", usageT0.Add(time.Minute), 1, 1, 0),
			usageRec("c4", "acme", "bot", "m", "k2", usageT0, 7, 0, 0),
			usageRec("c6", "beta", "inference", "m", "k3", usageT0, 20, 0, 0),
			noTotal,
		}); err != nil {
			t.Fatal(err)
		}
		rows, err := d.SpentTokens(ctx, usageT0)
		if err != nil {
			t.Fatalf("SpentTokens: %v", err)
		}
		got := map[accounting.Subject]int64{}
		for _, r := range rows {
			got[r.Subject] = r.Tokens
		}
		want := map[accounting.Subject]int64{
			{Team: "acme", Project: "bot", Key: "k1"}:       15 + 2 + 10,
			{Team: "acme", Project: "bot", Key: "k2"}:       7,
			{Team: "beta", Project: "inference", Key: "k3"}: 20,
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("SpentTokens = %v, want %v", got, want)
		}
	})
}

func TestUsageBuckets(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		if err := d.InsertRecords(ctx, []accounting.Record{
			usageRec("a", "acme", "bot", "m1", "k1", usageT0, 10, 1, 5),
			usageRec("b", "acme", "bot", "m2", "k1", usageT0.Add(30*time.Minute), 20, 2, 0),
			usageRec("c", "acme", "ops", "m1", "k2", usageT0.Add(90*time.Minute), 30, 3, 0),
			usageRec("d", "beta", "inference", "m1", "k3", usageT0.Add(59*time.Minute+59*time.Second), 40, 4, 1),
			usageRec("e", "beta", "inference", "m1", "k3", usageT0.Add(-time.Nanosecond), 1000, 0, 0), // before the range
			usageRec("f", "beta", "inference", "m1", "k3", usageT0.Add(2*time.Hour), 1000, 0, 0),      // at its end
		}); err != nil {
			t.Fatal(err)
		}
		h0, h1 := usageT0, usageT0.Add(time.Hour)
		base := accounting.UsageQuery{Start: usageT0, End: usageT0.Add(2 * time.Hour), BucketWidth: time.Hour}
		with := func(f func(q *accounting.UsageQuery)) accounting.UsageQuery {
			q := base
			f(&q)
			return q
		}
		tests := []struct {
			name string
			q    accounting.UsageQuery
			want []accounting.UsageRow
		}{
			{
				name: "no grouping",
				q:    base,
				want: []accounting.UsageRow{
					{BucketStart: h0, InputTokens: 70, OutputTokens: 7, CachedTokens: 6, Requests: 3, Records: 3},
					{BucketStart: h1, InputTokens: 30, OutputTokens: 3, Requests: 1, Records: 1},
				},
			},
			{
				name: "by project",
				q:    with(func(q *accounting.UsageQuery) { q.GroupByProject = true }),
				want: []accounting.UsageRow{
					{BucketStart: h0, Team: "acme", Project: "bot", InputTokens: 30, OutputTokens: 3, CachedTokens: 5, Requests: 2, Records: 2},
					{BucketStart: h0, Team: "beta", Project: "inference", InputTokens: 40, OutputTokens: 4, CachedTokens: 1, Requests: 1, Records: 1},
					{BucketStart: h1, Team: "acme", Project: "ops", InputTokens: 30, OutputTokens: 3, Requests: 1, Records: 1},
				},
			},
			{
				name: "by model and key",
				q:    with(func(q *accounting.UsageQuery) { q.GroupByModel, q.GroupByKey = true, true }),
				want: []accounting.UsageRow{
					{BucketStart: h0, Model: "m1", KeyName: "k1", InputTokens: 10, OutputTokens: 1, CachedTokens: 5, Requests: 1, Records: 1},
					{BucketStart: h0, Model: "m1", KeyName: "k3", InputTokens: 40, OutputTokens: 4, CachedTokens: 1, Requests: 1, Records: 1},
					{BucketStart: h0, Model: "m2", KeyName: "k1", InputTokens: 20, OutputTokens: 2, Requests: 1, Records: 1},
					{BucketStart: h1, Model: "m1", KeyName: "k2", InputTokens: 30, OutputTokens: 3, Requests: 1, Records: 1},
				},
			},
			{
				name: "teams restrict",
				q:    with(func(q *accounting.UsageQuery) { q.Teams = []string{"beta"} }),
				want: []accounting.UsageRow{{BucketStart: h0, InputTokens: 40, OutputTokens: 4, CachedTokens: 1, Requests: 1, Records: 1}},
			},
			{
				name: "no teams select nothing",
				q:    with(func(q *accounting.UsageQuery) { q.Teams = []string{} }),
			},
			{
				name: "projects filter",
				q: with(func(q *accounting.UsageQuery) {
					q.Projects = []accounting.UsageProject{{Team: "acme", Project: "ops"}, {Team: "beta", Project: "bot"}}
				}),
				want: []accounting.UsageRow{{BucketStart: h1, InputTokens: 30, OutputTokens: 3, Requests: 1, Records: 1}},
			},
			{
				name: "models filter",
				q:    with(func(q *accounting.UsageQuery) { q.Models = []string{"m2", "nope"} }),
				want: []accounting.UsageRow{{BucketStart: h0, InputTokens: 20, OutputTokens: 2, Requests: 1, Records: 1}},
			},
			{
				name: "one bucket over the range, as the CLI asks",
				q: with(func(q *accounting.UsageQuery) {
					q.BucketWidth = 2 * time.Hour
					q.GroupByProject = true
					q.Teams = []string{"acme"}
				}),
				want: []accounting.UsageRow{
					{BucketStart: h0, Team: "acme", Project: "bot", InputTokens: 30, OutputTokens: 3, CachedTokens: 5, Requests: 2, Records: 2},
					{BucketStart: h0, Team: "acme", Project: "ops", InputTokens: 30, OutputTokens: 3, Requests: 1, Records: 1},
				},
			},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got, err := d.UsageBuckets(ctx, tt.q)
				if err != nil {
					t.Fatalf("UsageBuckets: %v", err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("UsageBuckets =\n%+v\nwant\n%+v", got, tt.want)
				}
			})
		}
	})
}

// TestSecondHandleReadsWhileWriting opens the store twice, as `tollgate
// usage` does while the gateway runs: the file on SQLite, a second pool on
// PostgreSQL.
func TestSecondHandleReadsWhileWriting(t *testing.T) {
	forEachStoreConfig(t, func(t *testing.T, cfg config.Store) {
		ctx := context.Background()
		d, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer d.Close()
		reader, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatalf("second Open: %v", err)
		}
		defer reader.Close()
		tx, err := d.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck // a no-op after Commit
		if err := d.TxExec(ctx, tx, `INSERT INTO usage_rollup (started_sec, team, project, key_name, model, endpoint, status_class,
			prompt_tokens, completion_tokens, cached_tokens, total_tokens, spent_tokens, requests, records)
			VALUES (?, 'acme', 'bot', 'k', 'm', 'chat.completions', 'complete', 1, 1, 0, 2, 2, 1, 1)`, usageT0.Unix()); err != nil {
			t.Fatal(err)
		}
		// The writer holds its transaction open; the reader is not blocked.
		rows, err := reader.UsageBuckets(ctx, accounting.UsageQuery{Start: usageT0, End: usageT0.Add(time.Hour), BucketWidth: time.Hour})
		if err != nil || len(rows) != 0 {
			t.Errorf("read during write = %v, %v; want no rows, no error", rows, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		rows, err = reader.UsageBuckets(ctx, accounting.UsageQuery{Start: usageT0, End: usageT0.Add(time.Hour), BucketWidth: time.Hour})
		if err != nil || len(rows) != 1 {
			t.Errorf("read after commit = %v, %v; want one row", rows, err)
		}
	})
}

// BenchmarkInsertRecords measures the writer's side: how many records per
// second one store takes in batches of the default size, per engine, and
// the CPU time of this process per record (cpu-ns/record, from getrusage),
// which is what the writer costs the gateway: with SQLite most of the wall
// time is waiting for the disk, which costs no CPU. The recorder's queue
// absorbs bursts; this is the rate it drains at.
func BenchmarkInsertRecords(b *testing.B) {
	for _, s := range storetest.Open(b) {
		b.Run(s.Name, func(b *testing.B) {
			d := s.DB
			ctx := context.Background()
			const batchSize = 512
			batch := make([]accounting.Record, batchSize)
			n := 0
			b.ReportAllocs()
			cpu0 := processCPU(b)
			for b.Loop() {
				for i := range batch {
					n++
					batch[i] = proxyLikeRec(b, n)
				}
				if err := d.InsertRecords(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batchSize)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N*batchSize), "cpu-ns/record")
		})
	}
}

// proxyLikeRec is record n of a gateway serving 1,000 requests/s, as the
// proxy makes it for a chat completion: UUIDv7 call id, request and trace
// ids equal to it, and the backend's random completion id with its
// created second, which the Weave fold links.
func proxyLikeRec(tb testing.TB, n int) accounting.Record {
	id, err := uuid.NewV7()
	if err != nil {
		tb.Fatal(err)
	}
	started := usageT0.Add(time.Duration(n) * time.Millisecond)
	r := usageRec(id.String(), "acme", "bot", "m", "k", started, 800, 200, 0)
	r.RequestID, r.TraceID = r.CallID, r.CallID
	r.Endpoint = "chat.completions"
	r.CompletionID = fmt.Sprintf("chatcmpl-%016x%016x", rand.Uint64(), rand.Uint64())
	r.CompletionCreated = started.Unix()
	return r
}

// processCPU is the user and system CPU time this process has used.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
