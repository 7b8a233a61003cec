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
		e := newEnvStore(t, db, cs)
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
