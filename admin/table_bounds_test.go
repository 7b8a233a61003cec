package admin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
	"github.com/tollgate-dev/tollgate/weave"
)

// countingTables counts what the store hands the service of tables: row
// values, and reads of a table's whole list of row digests.
type countingTables struct {
	*store.DB
	rows    atomic.Int64 // row values handed over
	digests atomic.Int64 // TableRowDigests calls
}

func (s *countingTables) TableRowDigests(ctx context.Context, projectID int64, digest string) ([]string, error) {
	s.digests.Add(1)
	return s.DB.TableRowDigests(ctx, projectID, digest)
}

func (s *countingTables) TableRows(ctx context.Context, projectID int64, rowDigests []string) (map[string]json.RawMessage, error) {
	out, err := s.DB.TableRows(ctx, projectID, rowDigests)
	s.rows.Add(int64(len(out)))
	return out, err
}

func (s *countingTables) EachTableRow(ctx context.Context, projectID int64, rowDigests []string, fn func(string, json.RawMessage) error) error {
	return s.DB.EachTableRow(ctx, projectID, rowDigests, func(d string, v json.RawMessage) error {
		s.rows.Add(1)
		return fn(d, v)
	})
}

// putBigTable stores, under team-a/<project>, a table of n rows
// {"i": i, "blob": <size bytes>} whose blobs all differ, straight into the
// store (the HTTP body bound is below what it takes), and returns its
// digest.
func putBigTable(t *testing.T, db *store.DB, project string, n, size int) string {
	t.Helper()
	ctx := context.Background()
	p, err := db.EnsureProject(ctx, "team-a", project)
	if err != nil {
		t.Fatal(err)
	}
	rows := make([]map[string]any, n)
	for i := range rows {
		rows[i] = map[string]any{"i": json.Number(fmt.Sprint(i)), "blob": blobOf(i, size)}
	}
	digest, rowDigests, stored, err := weave.NewTable(rows)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.PutTable(ctx, p.ID, digest, rowDigests, stored); err != nil {
		t.Fatal(err)
	}
	return digest
}

// blobOf is row i's blob.
func blobOf(i, size int) string {
	prefix := fmt.Sprintf("%06d", i)
	return prefix + strings.Repeat("z", size-len(prefix))
}

// heapPeak runs fn and returns by how much the heap grew over what it was
// before, at most, sampled while fn runs. The collector runs often
// meanwhile, so that the peak is what fn holds rather than its garbage.
func heapPeak(fn func()) (peak uint64) {
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > base.HeapAlloc {
				peak = max(peak, m.HeapAlloc-base.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	fn()
	close(stop)
	wg.Wait()
	return peak
}

// TestTableQueryIsBounded: /table/query of a table larger than the read
// bound, without a limit, is refused with a 413 naming the pages and the
// stream, before the answer is built; a sorted page of it is answered
// holding the sort keys, not every row's value.
func TestTableQueryIsBounded(t *testing.T) {
	const n, size = 200, 100 << 10 // 20 MiB of rows
	storetest.ForEach(t, func(t *testing.T, db *store.DB) {
		e := newEnvStores(t, db, db, &countingTables{DB: db})
		a := bearer(aliceKey)
		digest := putBigTable(t, db, "big", n, size)

		t.Run("no limit", func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r := e.do("POST", "/table/query", a, `{"project_id":"team-a/big","digest":"`+digest+`"}`)
			runtime.ReadMemStats(&after)
			if r.status != fasthttp.StatusRequestEntityTooLarge {
				t.Fatalf("a 20 MiB table without a limit: status %d, %d bytes of answer; want 413", r.status, len(r.body))
			}
			if d := r.object(t)["detail"].(string); !strings.Contains(d, "limit and offset") || !strings.Contains(d, "/table/query_stream") {
				t.Errorf("detail %q does not say what to do", d)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("the refused query allocated %d bytes", alloc)
			if alloc > 64<<20 {
				t.Errorf("the refused query allocated %d bytes", alloc)
			}
		})

		t.Run("sorted page", func(t *testing.T) {
			var r response
			peak := heapPeak(func() {
				r = e.do("POST", "/table/query", a, `{"project_id":"team-a/big","digest":"`+digest+`",`+
					`"sort_by":[{"field":"i","direction":"desc"}],"limit":3,"offset":1}`)
			})
			if r.status != fasthttp.StatusOK {
				t.Fatalf("status %d: %.200s", r.status, r.body)
			}
			rows := r.object(t)["rows"].([]any)
			if len(rows) != 3 {
				t.Fatalf("%d rows, want 3", len(rows))
			}
			for k, row := range rows {
				m := row.(map[string]any)
				want := n - 2 - k
				val := m["val"].(map[string]any)
				if m["original_index"] != float64(want) || val["i"] != float64(want) || val["blob"] != blobOf(want, size) {
					t.Fatalf("row %d is %v (i %v), want row %d with its value", k, m["original_index"], val["i"], want)
				}
			}
			// Holding every row's value (20 MiB), as sorting them whole
			// does, goes far past this.
			t.Logf("the sorted page held up to %d bytes", peak)
			if peak > 12<<20 {
				t.Errorf("the sorted page of 3 rows held up to %d bytes", peak)
			}
		})

		t.Run("sort past the bound", func(t *testing.T) {
			// Sorting by the blobs themselves would hold 20 MiB of keys.
			r := e.do("POST", "/table/query", a, `{"project_id":"team-a/big","digest":"`+digest+`","sort_by":[{"field":"blob","direction":"asc"}],"limit":1}`)
			if r.status != fasthttp.StatusRequestEntityTooLarge {
				t.Fatalf("sorting by 20 MiB of keys: status %d, %d bytes; want 413", r.status, len(r.body))
			}
			if d := r.object(t)["detail"].(string); !strings.Contains(d, "sort fewer rows") {
				t.Errorf("detail %q does not say what to do", d)
			}
		})
	})
}

// TestTableQueryStreamStreams: /table/query_stream sends its first line
// before it has read the rows far after it, as Weave streams it, so that
// what it holds does not grow with the table; the whole stream then holds
// every row in order with its value.
func TestTableQueryStreamStreams(t *testing.T) {
	const n, size = 1000, 4 << 10
	storetest.ForEach(t, func(t *testing.T, db *store.DB) {
		ct := &countingTables{DB: db}
		e := newEnvStores(t, db, db, ct)
		a := bearer(aliceKey)
		digest := putBigTable(t, db, "s", n, size)

		conn, err := e.ln.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var req fasthttp.Request
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://tollgate/table/query_stream")
		req.Header.Set(fasthttp.HeaderAuthorization, a)
		req.Header.SetContentType("application/json")
		req.SetBodyString(`{"project_id":"team-a/s","digest":"` + digest + `"}`)
		req.SetConnectionClose()
		bw := bufio.NewWriter(conn)
		if err := req.Write(bw); err != nil {
			t.Fatal(err)
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		resp := fasthttp.Response{StreamBody: true}
		if err := resp.Read(bufio.NewReader(conn)); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != fasthttp.StatusOK || string(resp.Header.ContentType()) != "application/jsonl" {
			t.Fatalf("status %d, %s", resp.StatusCode(), resp.Header.ContentType())
		}
		lines := bufio.NewReaderSize(resp.BodyStream(), 64<<10)
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the first line came after %d of %d rows were read", ct.rows.Load(), n)
		if got := ct.rows.Load(); got > n*3/10 {
			t.Errorf("the first line came after %d of %d rows were read: the answer is buffered, not streamed", got, n)
		}
		for i := 0; ; i++ {
			var row struct {
				Digest        string
				Val           map[string]any
				OriginalIndex int `json:"original_index"`
			}
			if err := json.Unmarshal([]byte(line), &row); err != nil {
				t.Fatalf("line %d: %v", i, err)
			}
			if row.OriginalIndex != i || row.Val["i"] != float64(i) || row.Val["blob"] != blobOf(i, size) || row.Digest == "" {
				t.Fatalf("line %d is row %d (i %v), want row %d with its value", i, row.OriginalIndex, row.Val["i"], i)
			}
			if line, err = lines.ReadString('\n'); err == io.EOF && line == "" {
				if i+1 != n {
					t.Fatalf("%d lines, want %d", i+1, n)
				}
				break
			} else if err != nil {
				t.Fatal(err)
			}
		}
		if err := resp.CloseBodyStream(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestTableQueryStatsReadNoDigests: /table/query_stats and its batch count
// from what the store keeps with a table, not by reading its list of row
// digests, and the counts are the tables' lengths.
func TestTableQueryStatsReadNoDigests(t *testing.T) {
	storetest.ForEach(t, func(t *testing.T, db *store.DB) {
		ct := &countingTables{DB: db}
		e := newEnvStores(t, db, db, ct)
		a := bearer(aliceKey)
		big := putBigTable(t, db, "st", 3000, 16) // kept in chunks
		small := e.ok("POST", "/table/create", a, `{"table":{"project_id":"team-a/st","rows":[{"a":1},{"a":2},{"a":1}]}}`).object(t)["digest"].(string)
		ct.digests.Store(0)

		if got := e.ok("POST", "/table/query_stats", a, `{"project_id":"team-a/st","digest":"`+big+`"}`).object(t)["count"]; got != float64(3000) {
			t.Errorf("count of the large table = %v, want 3000", got)
		}
		stats := e.ok("POST", "/table/query_stats_batch", a, `{"project_id":"team-a/st","digests":["`+small+`","nope","`+big+`"]}`).object(t)["tables"]
		if got := compact(t, stats); got != `[{"count":3,"digest":"`+small+`"},{"count":3000,"digest":"`+big+`"}]` {
			t.Errorf("stats batch = %s", got)
		}
		if r := e.do("POST", "/table/query_stats", a, `{"project_id":"team-a/st","digest":"nope"}`); r.status != fasthttp.StatusNotFound {
			t.Errorf("stats of a table that does not exist: status %d", r.status)
		}
		if got := ct.digests.Load(); got != 0 {
			t.Errorf("the stats read a table's row digests %d times", got)
		}
	})
}

// TestObjsQueryIsBounded: /objs/query refuses a limit over 10000 as
// FastAPI refuses a field over its bound, and an answer past the read
// bound with a 413, which metadata_only avoids.
func TestObjsQueryIsBounded(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		a := bearer(aliceKey)
		e.expect422(t, "/objs/query", `{"project_id":"team-a/o","limit":10001}`, `["body","limit"]`, "less_than_equal")
		r := e.do("POST", "/objs/query", a, `{"project_id":"team-a/o","limit":10001}`)
		if d := compact(t, r.object(t)["detail"]); !strings.Contains(d, `"ctx":{"le":10000}`) {
			t.Errorf("detail %s does not give the bound", d)
		}

		const count, size = 6, 3 << 20 // 18 MiB of values
		for i := range count {
			e.ok("POST", "/obj/create", a, fmt.Sprintf(`{"obj":{"project_id":"team-a/o","object_id":"o%d","val":{"blob":"%s"}}}`, i, blobOf(i, size)))
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r = e.do("POST", "/objs/query", a, `{"project_id":"team-a/o","limit":10000}`)
		runtime.ReadMemStats(&after)
		if r.status != fasthttp.StatusRequestEntityTooLarge {
			t.Fatalf("18 MiB of objects: status %d, %d bytes of answer; want 413", r.status, len(r.body))
		}
		if d := r.object(t)["detail"].(string); !strings.Contains(d, "metadata_only") {
			t.Errorf("detail %q does not say what to do", d)
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("the refused query allocated %d bytes", alloc)
		if alloc > 64<<20 {
			t.Errorf("the refused query allocated %d bytes", alloc)
		}

		objs := e.ok("POST", "/objs/query", a, `{"project_id":"team-a/o","metadata_only":true}`).object(t)["objs"].([]any)
		if len(objs) != count {
			t.Fatalf("%d objects listed, want %d", len(objs), count)
		}
		for i, o := range objs {
			if m := o.(map[string]any); m["object_id"] != fmt.Sprintf("o%d", i) || compact(t, m["val"]) != `{}` {
				t.Errorf("object %d = %v %s", i, m["object_id"], compact(t, m["val"]))
			}
		}
		page := e.ok("POST", "/objs/query", a, `{"project_id":"team-a/o","limit":2,"offset":4}`).object(t)["objs"].([]any)
		if len(page) != 2 || page[1].(map[string]any)["val"].(map[string]any)["blob"] != blobOf(5, size) {
			t.Errorf("a page within the bound: %d objects", len(page))
		}
	})
}
