package admin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
	"github.com/tollgate-dev/tollgate/trace"
	"github.com/tollgate-dev/tollgate/weave"
)

// TestRefsReadBatchIsBounded: a small batch naming one large object many
// times is refused with a 413 before its answer is built, instead of a
// reply a thousand times the object; a batch within the bound answers
// every ref, a repeated one with the same value.
func TestRefsReadBatchIsBounded(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		a := bearer(aliceKey)
		big := strings.Repeat("x", 100<<10)
		digest := e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"big","val":{"blob":"`+big+`"}}}`).object(t)["digest"].(string)
		ref := "weave:///team-a/p/object/big:" + digest
		small := e.ok("POST", "/obj/create", a, `{"obj":{"project_id":"team-a/p","object_id":"small","val":{"k":"v"}}}`).object(t)["digest"].(string)
		sref := "weave:///team-a/p/object/small:" + small

		refs := make([]string, 1000)
		for i := range refs {
			refs[i] = ref
		}
		body := `{"refs":["` + strings.Join(refs, `","`) + `"]}`
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := e.do("POST", "/refs/read_batch", a, body)
		runtime.ReadMemStats(&after)
		if r.status != fasthttp.StatusRequestEntityTooLarge {
			t.Fatalf("1000 refs to a 100 KiB object (a %d-byte request): status %d, %d bytes of answer; want 413",
				len(body), r.status, len(r.body))
		}
		if d := r.object(t)["detail"].(string); !strings.Contains(d, "read fewer refs per batch") {
			t.Errorf("detail %q does not say what to do", d)
		}
		// The whole reply would be 100 MB; what the request allocated
		// stays within a few times the bound.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
			t.Errorf("the refused batch allocated %d bytes", alloc)
		}

		vals := e.ok("POST", "/refs/read_batch", a, `{"refs":["`+sref+`","`+ref+`","`+sref+`","`+ref+`/key/blob"]}`).object(t)["vals"].([]any)
		want := []string{`{"k":"v"}`, `{"blob":"` + big + `"}`, `{"k":"v"}`, `"` + big + `"`}
		if len(vals) != len(want) {
			t.Fatalf("%d vals, want %d", len(vals), len(want))
		}
		for i, w := range want {
			if got := compact(t, vals[i]); got != w {
				t.Errorf("val %d = %.80s, want %.80s", i, got, w)
			}
		}
	})
}

// countingStore counts the calls it has read from the store, through a
// cursor or a callback.
type countingStore struct {
	*store.DB
	read atomic.Int64
}

func (s *countingStore) QueryCalls(ctx context.Context, projectID int64, q trace.CallsQuery, fn func(*trace.Call) error) error {
	return s.DB.QueryCalls(ctx, projectID, q, func(c *trace.Call) error {
		s.read.Add(1)
		return fn(c)
	})
}

func (s *countingStore) OpenCalls(ctx context.Context, projectID int64, q trace.CallsQuery) (trace.CallCursor, error) {
	cur, err := s.DB.OpenCalls(ctx, projectID, q)
	if err != nil {
		return nil, err
	}
	return &countingCursor{CallCursor: cur, s: s}, nil
}

type countingCursor struct {
	trace.CallCursor
	s *countingStore
}

func (c *countingCursor) Next(out *trace.Call) (bool, error) {
	ok, err := c.CallCursor.Next(out)
	if ok {
		c.s.read.Add(1)
	}
	return ok, err
}

// TestCallsStreamQueryStreams: /calls/stream_query sends its first line
// before it has read the calls after it, as Weave streams it, so that
// what it holds does not grow with the answer; the whole stream then
// holds every call in order.
func TestCallsStreamQueryStreams(t *testing.T) {
	const n = 60
	storetest.ForEach(t, func(t *testing.T, db *store.DB) {
		cs := &countingStore{DB: db}
		e := newEnvStores(t, db, cs, db)
		a := bearer(aliceKey)
		blob := strings.Repeat("y", 64<<10)
		var batch []string
		for i := range n {
			batch = append(batch, fmt.Sprintf(`{"mode":"start","req":{"start":{"project_id":"team-a/s","id":"c%03d","trace_id":"t","op_name":"op",`+
				`"started_at":"2026-11-21T10:00:%02dZ","inputs":{"blob":"%s"}}}}`, i, i, blob))
		}
		e.ok("POST", "/call/upsert_batch", a, `{"batch":[`+strings.Join(batch, ",")+`]}`)

		conn, err := e.ln.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var req fasthttp.Request
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://tollgate/calls/stream_query")
		req.Header.Set(fasthttp.HeaderAuthorization, a)
		req.Header.SetContentType("application/json")
		req.SetBodyString(`{"project_id":"team-a/s"}`)
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
		lines := bufio.NewReaderSize(resp.BodyStream(), 1<<20)
		first, err := lines.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if got := cs.read.Load(); got > n/4 {
			t.Errorf("the first line came after %d of %d calls were read: the answer is buffered, not streamed", got, n)
		}
		for i := 0; ; i++ {
			var c map[string]any
			if err := json.Unmarshal([]byte(first), &c); err != nil {
				t.Fatalf("line %d: %v", i, err)
			}
			if want := fmt.Sprintf("c%03d", i); c["id"] != want || c["inputs"].(map[string]any)["blob"] != blob {
				t.Fatalf("line %d is call %v, want %s with its inputs", i, c["id"], want)
			}
			if first, err = lines.ReadString('\n'); err == io.EOF && first == "" {
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

// countingFeedback counts the feedback items the store hands the service.
type countingFeedback struct {
	*store.DB
	read atomic.Int64
}

func (s *countingFeedback) QueryFeedback(ctx context.Context, projectID int64, q weave.FeedbackQuery, fn func(*weave.Feedback) error) error {
	return s.DB.QueryFeedback(ctx, projectID, q, func(f *weave.Feedback) error {
		s.read.Add(1)
		return fn(f)
	})
}

// ListFeedback counts what a store that lists all of a project's feedback
// hands over.
func (s *countingFeedback) ListFeedback(ctx context.Context, projectID int64, refs []string) ([]weave.Feedback, error) {
	var out []weave.Feedback
	err := s.DB.QueryFeedback(ctx, projectID, weave.FeedbackQuery{Refs: refs, Limit: -1}, func(f *weave.Feedback) error {
		out = append(out, *f)
		return nil
	})
	s.read.Add(int64(len(out)))
	return out, err
}

// TestFeedbackQueryReadsItsPage: /feedback/query reads from the store the
// page it answers, not every item of the project, with or without a query
// to match; a limit past the page size is refused.
func TestFeedbackQueryReadsItsPage(t *testing.T) {
	const n = 200
	storetest.ForEach(t, func(t *testing.T, db *store.DB) {
		fs := &countingFeedback{DB: db}
		e := newEnvStores(t, db, db, fs)
		a := bearer(aliceKey)
		for i := range n {
			e.ok("POST", "/feedback/create", a, fmt.Sprintf(`{"project_id":"team-a/f","weave_ref":"weave:///team-a/f/call/c%d",`+
				`"feedback_type":"note","payload":{"note":"n%03d"}}`, i%2, i))
		}
		tests := []struct {
			name, body string
			want       []string
			maxRead    int64
		}{
			{"a page", `{"project_id":"team-a/f","limit":3,"offset":10}`, []string{"n010", "n011", "n012"}, 3},
			{"a page of a query", `{"project_id":"team-a/f","query":{"$expr":{"$eq":[{"$getField":"weave_ref"},{"$literal":"weave:///team-a/f/call/c1"}]}},"limit":2,"offset":1}`,
				[]string{"n003", "n005"}, 4},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				fs.read.Store(0)
				res := e.ok("POST", "/feedback/query", a, tt.body).object(t)["result"].([]any)
				var got []string
				for _, r := range res {
					got = append(got, r.(map[string]any)["payload"].(map[string]any)["note"].(string))
				}
				if fmt.Sprint(got) != fmt.Sprint(tt.want) {
					t.Fatalf("result %v, want %v", got, tt.want)
				}
				if read := fs.read.Load(); read > tt.maxRead {
					t.Errorf("the store handed over %d of %d items for a page of %d", read, n, len(tt.want))
				}
			})
		}
		e.expect422(t, "/feedback/query", `{"project_id":"team-a/f","limit":10001}`, `["body","limit"]`, "less_than_equal")
	})
}
