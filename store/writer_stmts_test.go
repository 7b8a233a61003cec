package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"modernc.org/sqlite"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
)

// writerTestRecords are n records of batch k, as the proxy makes them.
func writerTestRecords(k, n int) []accounting.Record {
	t0 := time.Date(2026, 11, 25, 3, 0, 0, 0, time.UTC)
	recs := make([]accounting.Record, n)
	for i := range recs {
		started := t0.Add(time.Duration(k*n+i) * time.Millisecond)
		id := fmt.Sprintf("writer-%03d-%04d", k, i)
		recs[i] = accounting.Record{
			RequestID: id, CallID: id, TraceID: id, KeyName: "k", Team: "acme", Project: "bot",
			Model: "m", ServedModel: "m", Backend: "b1", Endpoint: "chat.completions", Status: 200,
			PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12, Started: started, Ended: started.Add(time.Second),
			CompletionID: "chatcmpl-" + id, CompletionCreated: started.Unix(),
		}
	}
	return recs
}

func openWriterTestDB(t *testing.T) *DB {
	t.Helper()
	d, err := openSQLite(context.Background(), config.SQLiteInMemory)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// writerCalls is how many calls of batch k the store holds.
func writerCalls(t *testing.T, d *DB, k int) int {
	t.Helper()
	var n int
	if err := d.conn().queryRow(context.Background(), `SELECT COUNT(*) FROM calls WHERE id LIKE ?`,
		fmt.Sprintf("writer-%03d-%%", k)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// stmtMemory is the heap SQLite's prepared statements of the writer's
// connection use.
func stmtMemory(t *testing.T, w *usageWriter) int {
	t.Helper()
	var used int
	err := w.conn.Raw(func(dc any) error {
		var err error
		used, _, err = dc.(sqlite.DBStatus).Status(sqlite.DBStatusStmtUsed, false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return used
}

// TestWriterStmtsPreparedOncePerConnection: the writer prepares each
// statement on its connection once, reuses it for every batch after, and
// closes it when it closes its statements; a connection it opens after a
// failed begin prepares its own.
func TestWriterStmtsPreparedOncePerConnection(t *testing.T) {
	d := openWriterTestDB(t)
	ctx := context.Background()
	if err := d.InsertRecords(ctx, writerTestRecords(0, 100)); err != nil {
		t.Fatal(err)
	}
	w := d.writer
	first := make(map[string]writerStmt)
	for q, s := range w.stmts.stmts {
		first[q] = s
	}
	// 100 rows are statements of 64, 32 and 4 rows: calls, links, and the
	// batch marker and roll-up.
	if len(first) < 6 {
		t.Fatalf("%d statements prepared, want those of every table", len(first))
	}
	if err := d.InsertRecords(ctx, writerTestRecords(1, 100)); err != nil {
		t.Fatal(err)
	}
	for q, s := range w.stmts.stmts {
		if was, ok := first[q]; !ok || was != s {
			t.Errorf("statement prepared again for the second batch: %.60s", q)
		}
	}
	if n := writerCalls(t, d, 1); n != 100 {
		t.Fatalf("%d calls of the second batch, want 100", n)
	}

	t.Run("close finalizes", func(t *testing.T) {
		before := stmtMemory(t, w)
		err := w.conn.Raw(func(any) error { return w.stmts.close() })
		if err != nil {
			t.Fatal(err)
		}
		if after := stmtMemory(t, w); after >= before {
			t.Errorf("statements use %d bytes after closing, %d before", after, before)
		}
		if len(w.stmts.stmts) != 0 {
			t.Errorf("%d statements kept after closing", len(w.stmts.stmts))
		}
		if err := d.InsertRecords(ctx, writerTestRecords(2, 100)); err != nil {
			t.Fatal(err)
		}
		if len(w.stmts.stmts) != len(first) {
			t.Errorf("%d statements prepared again, want %d", len(w.stmts.stmts), len(first))
		}
	})

	t.Run("new connection after a failed begin", func(t *testing.T) {
		canceled, cancel := context.WithCancel(ctx)
		cancel()
		if err := d.InsertRecords(canceled, writerTestRecords(3, 100)); err == nil {
			t.Fatal("InsertRecords with a canceled context = nil error")
		}
		if w.conn != nil || len(w.stmts.stmts) != 0 {
			t.Fatalf("writer kept its connection (%v) or %d statements after a failed begin", w.conn != nil, len(w.stmts.stmts))
		}
		if err := d.InsertRecords(ctx, writerTestRecords(4, 100)); err != nil {
			t.Fatal(err)
		}
		if n := writerCalls(t, d, 4); n != 100 {
			t.Errorf("%d calls of the batch after, want 100", n)
		}
		for q, s := range w.stmts.stmts {
			if was := first[q]; was == s {
				t.Errorf("statement of the closed connection reused: %.60s", q)
			}
		}
	})

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if w.conn != nil || len(w.stmts.stmts) != 0 {
		t.Errorf("Close left the writer's connection (%v) or %d statements", w.conn != nil, len(w.stmts.stmts))
	}
}

// endingContext ends after its Err has been asked a number of times,
// partway through a batch.
type endingContext struct {
	context.Context
	cancel context.CancelFunc
	left   atomic.Int32
}

func (c *endingContext) Err() error {
	if c.left.Add(-1) == 0 {
		c.cancel()
	}
	return c.Context.Err()
}

// TestWriterBatchEndingMidway: a batch whose context ends while its
// statements run (in its marker, its calls, its links) stores none of its
// rows, and the writer's next batch is stored whole.
// After a batch the writer's arguments hold none of its values, so that
// the batch's rows are not kept reachable until the next one.
func TestWriterForgetsBatchValues(t *testing.T) {
	d := openWriterTestDB(t)
	if err := d.InsertRecords(context.Background(), writerTestRecords(0, 100)); err != nil {
		t.Fatal(err)
	}
	args := d.writer.stmts.args
	if len(args) == 0 {
		t.Fatal("the writer bound no arguments")
	}
	for i, a := range args {
		if a.Value != nil {
			t.Fatalf("argument %d still holds %T %.40v after the batch", a.Ordinal, a.Value, a.Value)
		}
		if a.Ordinal != i+1 {
			t.Fatalf("argument %d numbered %d", i, a.Ordinal)
		}
	}
}

func TestWriterBatchEndingMidway(t *testing.T) {
	d := openWriterTestDB(t)
	failed := 0
	for k, left := 0, int32(1); left < 16; k, left = k+2, left+1 {
		parent, cancel := context.WithCancel(context.Background())
		ctx := &endingContext{Context: parent, cancel: cancel}
		ctx.left.Store(left)
		err := d.InsertRecords(ctx, writerTestRecords(k, 100))
		cancel()
		n := writerCalls(t, d, k)
		switch {
		case err != nil && n != 0:
			t.Errorf("context ending at its Err %d: batch failed (%v) with %d calls stored", left, err, n)
		case err == nil && n != 100:
			t.Errorf("context ending at its Err %d: batch stored %d calls, want 100", left, n)
		case err != nil:
			failed++
		}
		if err := d.InsertRecords(context.Background(), writerTestRecords(k+1, 100)); err != nil {
			t.Fatalf("batch after context ending at its Err %d: %v", left, err)
		}
		if n := writerCalls(t, d, k+1); n != 100 {
			t.Errorf("batch after context ending at its Err %d: %d calls, want 100", left, n)
		}
	}
	if failed == 0 {
		t.Error("no batch failed: the test ended no context in time")
	}
	var records int64
	if err := d.conn().queryRow(context.Background(), `SELECT SUM(records) FROM usage_rollup`).Scan(&records); err != nil {
		t.Fatal(err)
	}
	var stored int64
	if err := d.conn().queryRow(context.Background(), `SELECT COUNT(*) FROM calls`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if records != stored {
		t.Errorf("roll-up counts %d records, %d calls stored", records, stored)
	}
}
