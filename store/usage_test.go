package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/tidwall/gjson"

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

// gatewayCallRecord reads back the record the gateway call callID holds:
// its ids and times from the call's columns, its team and project from
// its project, its endpoint from its op, its error from its exception,
// the rest from its attributes and its summary's one model. Times are
// the call's, to the microsecond.
func gatewayCallRecord(t *testing.T, d *store.DB, callID string) accounting.Record {
	t.Helper()
	var (
		r                              accounting.Record
		op, started, ended, attrs, sum string
		parent, exception, user        sql.NullString
	)
	err := d.QueryRow(context.Background(), `SELECT c.id, c.trace_id, c.parent_id, c.op_name, c.started_at, c.ended_at,
		c.exception, c.attributes, c.summary, c.svc_user_id, p.entity, p.name
		FROM calls c JOIN projects p ON p.id = c.project_id WHERE c.id = ?`, callID).Scan(
		&r.CallID, &r.TraceID, &parent, &op, &started, &ended, &exception, &attrs, &sum, &user, &r.Team, &r.Project)
	if err != nil {
		t.Fatalf("call %s: %v", callID, err)
	}
	r.ParentID, r.Error = parent.String, exception.String
	r.Endpoint = strings.TrimSuffix(strings.TrimPrefix(op, "openai."), ".create")
	for _, ts := range []struct {
		text string
		to   *time.Time
	}{{started, &r.Started}, {ended, &r.Ended}} {
		if *ts.to, err = time.Parse(time.RFC3339Nano, ts.text); err != nil {
			t.Fatalf("call %s: %v", callID, err)
		}
	}
	if !gjson.Valid(attrs) || !gjson.Valid(sum) {
		t.Fatalf("call %s: attributes %s, summary %s: not JSON", callID, attrs, sum)
	}
	a := gjson.Parse(attrs)
	r.RequestID, r.KeyName, r.Backend = a.Get("request_id").Str, a.Get("key_name").Str, a.Get("backend").Str
	r.Status, r.Stream, r.Incomplete = int(a.Get("status").Int()), a.Get("stream").Bool(), a.Get("incomplete").Bool()
	r.ServedModel, r.CompletionID = a.Get("served_model").Str, a.Get("completion_id").Str
	if user.String != r.KeyName {
		t.Errorf("call %s: user %q, key %q", callID, user.String, r.KeyName)
	}
	usage := gjson.Get(sum, "usage").Map()
	if len(usage) != 1 {
		t.Fatalf("call %s: summary %s, want one model's usage", callID, sum)
	}
	for model, u := range usage {
		if u.Get("requests").Int() != 1 {
			t.Errorf("call %s: summary %s, want 1 request", callID, sum)
		}
		r.Model, r.PromptTokens, r.CompletionTokens = model, u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int()
		r.TotalTokens, r.CachedTokens = u.Get("total_tokens").Int(), u.Get("cache_read_input_tokens").Int()
		r.CacheWriteTokens = u.Get("cache_creation_input_tokens").Int()
	}
	return r
}

// countRows runs query, which selects one integer.
func countRows(t *testing.T, d *store.DB, query string) int64 {
	t.Helper()
	var n sql.NullInt64
	if err := d.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n.Int64
}

// TestInsertRecordsStoresEveryField reads every field of a record but its
// payloads where it is stored: in its gateway call (see
// gatewayCallRecord), and summed in the roll-up. Nothing writes
// usage_records any more.
func TestInsertRecordsStoresEveryField(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		want := []accounting.Record{
			{
				RequestID: "same-request", CallID: "c1", TraceID: "t1", ParentID: "p0",
				KeyName: "ci", Team: "acme", Project: "chatbot", Model: "small", ServedModel: "big", Backend: "gpu-2",
				Endpoint: "responses", Status: 200, Error: "stream broke", Stream: true, Incomplete: true,
				PromptTokens: 11, CompletionTokens: 7, TotalTokens: 18, CachedTokens: 3,
				Started: usageT0.Add(123 * time.Microsecond), Ended: usageT0.Add(2*time.Second + 456*time.Microsecond),
				CompletionID: "resp_1",
				Input:        []byte("the request"), Output: []byte("the reply"),
			},
			// A client reusing its X-Request-Id: a second call, not a conflict.
			{RequestID: "same-request", CallID: "c2", TraceID: "t2", KeyName: "ci", Team: "acme", Project: "chatbot", Model: "small",
				Endpoint: "embeddings", Status: 502, Started: usageT0, Ended: usageT0},
		}
		if err := d.InsertRecords(ctx, want); err != nil {
			t.Fatalf("InsertRecords: %v", err)
		}
		for _, w := range want {
			t.Run(w.CallID, func(t *testing.T) {
				got := gatewayCallRecord(t, d, w.CallID)
				w.Input, w.Output = nil, nil
				if !reflect.DeepEqual(got, w) {
					t.Errorf("stored\n%+v\nwant\n%+v", got, w)
				}
			})
		}
		sec := usageT0.Unix()
		wantRollup := []rollupRow{
			{sec, "acme", "chatbot", "ci", "small", "embeddings", "server_error", 0, 0, 0, 0, 0, 0, 1},
			{sec, "acme", "chatbot", "ci", "small", "responses", "stream_broken", 11, 7, 3, 18, 18, 1, 1},
		}
		if got := rollupRows(t, d); !reflect.DeepEqual(got, wantRollup) {
			t.Errorf("usage_rollup =\n%+v\nwant\n%+v", got, wantRollup)
		}
		if n := countRows(t, d, `SELECT COUNT(*) FROM usage_records`); n != 0 {
			t.Errorf("usage_records: %d rows, want none", n)
		}
	})
}

// TestInsertRecordsIsIdempotentPerBatch writes a batch twice, as the
// recorder does when a commit was reported failed (and had succeeded):
// its calls are stored once, its usage counts once, and one marker stands
// for it.
func TestInsertRecordsIsIdempotentPerBatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		batch := []accounting.Record{
			usageRec("c1", "acme", "bot", "m", "k", usageT0, 1, 2, 0),
			usageRec("c2", "acme", "bot", "m", "k", usageT0, 3, 4, 0),
		}
		for range 2 {
			if err := d.InsertRecords(ctx, batch); err != nil {
				t.Fatalf("InsertRecords: %v", err)
			}
		}
		if n := countRows(t, d, `SELECT COUNT(*) FROM calls`); n != 2 {
			t.Errorf("%d calls, want 2", n)
		}
		spent, err := d.SpentTokens(ctx, usageT0)
		if want := []accounting.SpentRow{{Subject: accounting.Subject{Team: "acme", Project: "bot", Key: "k"}, Tokens: 10}}; err != nil || !reflect.DeepEqual(spent, want) {
			t.Errorf("SpentTokens = %+v, %v; want %+v", spent, err, want)
		}
		if n := countRows(t, d, `SELECT COUNT(*) FROM usage_batches WHERE first_call_id = 'c1' AND records = 2`); n != 1 {
			t.Errorf("%d markers of the batch, want 1", n)
		}
	})
}

// TestInsertRecordsManyRows writes a batch longer than one INSERT
// statement carries (two full statements and a shorter last one), twice,
// and checks that every gateway call is stored once and every record
// counted once.
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
		records := countRows(t, d, `SELECT SUM(records) FROM usage_rollup`)
		tokens := countRows(t, d, `SELECT SUM(total_tokens) FROM usage_rollup`)
		if records != n || tokens != wantTokens {
			t.Errorf("usage_rollup: %d records, %d tokens; want %d, %d", records, tokens, n, wantTokens)
		}
		calls := countRows(t, d, `SELECT COUNT(*) FROM calls`)
		distinct := countRows(t, d, `SELECT COUNT(DISTINCT id) FROM calls`)
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
		for _, table := range []string{"calls", "usage_rollup", "usage_batches"} {
			if n := countRows(t, d, `SELECT COUNT(*) FROM `+table); n != 0 {
				t.Errorf("%s: %d rows, want 0", table, n)
			}
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
		versions := countRows(t, d2, `SELECT COUNT(*) FROM schema_migrations WHERE component = 'usage'`)
		records := countRows(t, d2, `SELECT SUM(records) FROM usage_rollup`)
		if want := store.Migrations()["usage"]; versions != int64(want) || records != 1 {
			t.Errorf("after reopening: %d usage versions (want %d), %d records (want 1)", versions, want, records)
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

// TestUsageBatchMarkersPurged writes batches dated more than
// store.UsageBatchTTL ago, then new ones: each new batch deletes at most
// store.UsageBatchPurge expired markers, the oldest first, and none that
// is not expired.
func TestUsageBatchMarkersPurged(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		now := usageT0.Add(72 * time.Hour)
		old := store.UsageBatchPurge + 2
		for i := range old {
			rec := usageRec(fmt.Sprint("old-", i), "acme", "bot", "m", "k", usageT0, 1, 0, 0)
			at := now.Add(-store.UsageBatchTTL - time.Duration(old-i)*time.Second)
			if err := d.InsertRecordsAt(ctx, []accounting.Record{rec}, at); err != nil {
				t.Fatal(err)
			}
		}
		recent := usageRec("recent", "acme", "bot", "m", "k", usageT0, 1, 0, 0)
		if err := d.InsertRecordsAt(ctx, []accounting.Record{recent}, now.Add(-store.UsageBatchTTL+time.Second)); err != nil {
			t.Fatal(err)
		}
		// None was expired when the batches after it were written.
		if n := countRows(t, d, `SELECT COUNT(*) FROM usage_batches`); n != int64(old)+1 {
			t.Fatalf("%d markers before the purge, want %d", n, old+1)
		}
		if err := d.InsertRecordsAt(ctx, []accounting.Record{usageRec("new-1", "acme", "bot", "m", "k", usageT0, 1, 0, 0)}, now); err != nil {
			t.Fatal(err)
		}
		left := countRows(t, d, `SELECT COUNT(*) FROM usage_batches WHERE first_call_id LIKE 'old-%'`)
		if left != 2 {
			t.Errorf("%d expired markers left after one purge, want 2", left)
		}
		if oldest := countRows(t, d, `SELECT COUNT(*) FROM usage_batches WHERE first_call_id IN ('old-0', 'old-1')`); oldest != 0 {
			t.Errorf("%d of the two oldest markers left, want none: the oldest go first", oldest)
		}
		if err := d.InsertRecordsAt(ctx, []accounting.Record{usageRec("new-2", "acme", "bot", "m", "k", usageT0, 1, 0, 0)}, now); err != nil {
			t.Fatal(err)
		}
		var kept []string
		for _, id := range []string{"recent", "new-1", "new-2"} {
			if countRows(t, d, `SELECT COUNT(*) FROM usage_batches WHERE first_call_id = '`+id+`'`) == 1 {
				kept = append(kept, id)
			}
		}
		if n := countRows(t, d, `SELECT COUNT(*) FROM usage_batches`); n != 3 || len(kept) != 3 {
			t.Errorf("%d markers, of which %v; want recent, new-1 and new-2", n, kept)
		}
		// Purging markers leaves the usage alone.
		if records := countRows(t, d, `SELECT SUM(records) FROM usage_rollup`); records != int64(old)+3 {
			t.Errorf("%d records in the roll-up, want %d", records, old+3)
		}
	})
}

// TestForeignKeysAfterUsageWriter: the usage writer's connection skips the
// foreign-key checks its own rows cannot fail, and no other statement
// does: once batches are written, a call naming no project is still
// refused, in a transaction and outside one.
func TestForeignKeysAfterUsageWriter(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		for i := range 3 {
			rec := usageRec(fmt.Sprint("fk-", i), "acme", "bot", "m", "k", usageT0, 1, 0, 0)
			if err := d.InsertRecords(ctx, []accounting.Record{rec}); err != nil {
				t.Fatal(err)
			}
		}
		const orphan = `INSERT INTO calls (project_id, id, op_name, trace_id, started_at) VALUES (?, ?, 'op', 't', '2026-11-21T10:00:00.000000Z')`
		for _, tc := range []struct {
			name string
			run  func(id string) error
		}{
			{"pool", func(id string) error {
				return d.QueryRow(ctx, orphan+` RETURNING id`, 987654321, id).Scan(new(string))
			}},
			{"transaction", func(id string) error {
				tx, err := d.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback() //nolint:errcheck // the test only reads its error
				return d.TxExec(ctx, tx, orphan, 987654321, id)
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := tc.run("orphan-" + tc.name); err == nil {
					t.Fatal("a call naming no project was stored")
				}
			})
		}
	})
}
