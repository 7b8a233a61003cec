package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/weave"
)

var weaveT0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

func putObj(t *testing.T, db *store.DB, projectID int64, id, val string, at time.Time) weave.Object {
	t.Helper()
	o, err := db.PutObject(context.Background(), weave.ObjectWrite{
		ProjectID: projectID, ObjectID: id, Digest: weave.BytesDigest([]byte(val)), Kind: weave.KindObject,
		Val: json.RawMessage(val), At: at,
	})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestObjectVersions(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "objs")
		if err != nil {
			t.Fatal(err)
		}
		v0 := putObj(t, db, p.ID, "cfg", `{"a":1}`, weaveT0)
		again := putObj(t, db, p.ID, "cfg", `{"a":1}`, weaveT0.Add(time.Second))
		v1 := putObj(t, db, p.ID, "cfg", `{"a":2}`, weaveT0.Add(2*time.Second))
		if v0.VersionIndex != 0 || again.VersionIndex != 0 || v1.VersionIndex != 1 {
			t.Fatalf("versions %d, %d, %d; want 0, 0, 1", v0.VersionIndex, again.VersionIndex, v1.VersionIndex)
		}
		if !again.CreatedAt.Equal(weaveT0) {
			t.Errorf("the same value again changed created_at to %v", again.CreatedAt)
		}
		for _, sel := range []string{weave.Latest, "v1", v1.Digest} {
			o, err := db.ReadObject(ctx, p.ID, "cfg", sel)
			if err != nil || o.Digest != v1.Digest || !o.IsLatest || string(o.Val) != `{"a":2}` {
				t.Fatalf("read %s = %+v, %v", sel, o, err)
			}
		}
		if o, err := db.ReadObject(ctx, p.ID, "cfg", "v0"); err != nil || o.IsLatest || o.Digest != v0.Digest {
			t.Fatalf("read v0 = %+v, %v", o, err)
		}
		if _, err := db.ReadObject(ctx, p.ID, "cfg", "v7"); !errors.Is(err, weave.ErrNotFound) {
			t.Fatalf("read v7: %v, want ErrNotFound", err)
		}
		// Deleting the latest makes v0 latest again and hides v1.
		if n, err := db.DeleteObjects(ctx, p.ID, "cfg", []string{weave.Latest}, weaveT0.Add(3*time.Second)); err != nil || n != 1 {
			t.Fatalf("delete latest = %d, %v", n, err)
		}
		if _, err := db.ReadObject(ctx, p.ID, "cfg", v1.Digest); !errors.Is(err, weave.ErrDeleted) {
			t.Fatalf("read deleted: %v, want ErrDeleted", err)
		}
		if o, err := db.ReadObject(ctx, p.ID, "cfg", weave.Latest); err != nil || o.Digest != v0.Digest {
			t.Fatalf("latest after delete = %+v, %v", o, err)
		}
		objs, err := queryObjects(ctx, db, p.ID, weave.ObjectQuery{Limit: -1})
		if err != nil || len(objs) != 1 || objs[0].Digest != v0.Digest || !objs[0].IsLatest {
			t.Fatalf("query after delete = %+v, %v", objs, err)
		}
		if _, err := db.DeleteObjects(ctx, p.ID, "cfg", []string{v1.Digest}, weaveT0); !errors.Is(err, weave.ErrNotFound) {
			t.Fatalf("deleting a deleted version: %v, want ErrNotFound", err)
		}
		// Putting the deleted value again restores it as the newest version.
		back := putObj(t, db, p.ID, "cfg", `{"a":2}`, weaveT0.Add(4*time.Second))
		if back.VersionIndex != 2 || !back.IsLatest || back.DeletedAt != nil {
			t.Fatalf("restored = %+v", back)
		}
	})
}

func TestQueryObjects(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "q")
		if err != nil {
			t.Fatal(err)
		}
		other, err := db.EnsureProject(ctx, "acme", "other")
		if err != nil {
			t.Fatal(err)
		}
		ds, ev := "Dataset", "Evaluation"
		mustPut := func(w weave.ObjectWrite) {
			t.Helper()
			w.Digest = weave.BytesDigest(append([]byte(w.ObjectID), w.Val...))
			if _, err := db.PutObject(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		mustPut(weave.ObjectWrite{ProjectID: p.ID, ObjectID: "b-ds", Kind: weave.KindObject, BaseObjectClass: &ds, LeafObjectClass: &ds, Val: json.RawMessage(`{"v":1}`), At: weaveT0})
		mustPut(weave.ObjectWrite{ProjectID: p.ID, ObjectID: "b-ds", Kind: weave.KindObject, BaseObjectClass: &ds, LeafObjectClass: &ds, Val: json.RawMessage(`{"v":2}`), At: weaveT0.Add(time.Second)})
		mustPut(weave.ObjectWrite{ProjectID: p.ID, ObjectID: "a-ev", Kind: weave.KindObject, BaseObjectClass: &ev, LeafObjectClass: &ev, Val: json.RawMessage(`{}`), At: weaveT0.Add(2 * time.Second)})
		mustPut(weave.ObjectWrite{ProjectID: p.ID, ObjectID: "c-op", Kind: weave.KindOp, Val: json.RawMessage(`{"files":{}}`), At: weaveT0.Add(3 * time.Second)})
		mustPut(weave.ObjectWrite{ProjectID: other.ID, ObjectID: "z", Kind: weave.KindObject, Val: json.RawMessage(`{}`), At: weaveT0})
		yes, no := true, false
		tests := []struct {
			name string
			q    weave.ObjectQuery
			want []string
		}{
			{"all, by object then version", weave.ObjectQuery{Limit: -1}, []string{"a-ev:0", "b-ds:0", "b-ds:1", "c-op:0"}},
			{"ops", weave.ObjectQuery{Limit: -1, IsOp: &yes}, []string{"c-op:0"}},
			{"non-ops, latest", weave.ObjectQuery{Limit: -1, IsOp: &no, LatestOnly: true}, []string{"a-ev:0", "b-ds:1"}},
			{"base class", weave.ObjectQuery{Limit: -1, BaseObjectClasses: []string{"Dataset"}}, []string{"b-ds:0", "b-ds:1"}},
			{"excluded base class keeps classless", weave.ObjectQuery{Limit: -1, ExcludeBaseObjectClasses: []string{"Dataset"}}, []string{"a-ev:0", "c-op:0"}},
			{"ids, newest first, paged", weave.ObjectQuery{Limit: 1, Offset: 1, ObjectIDs: []string{"b-ds", "a-ev"},
				SortBy: []weave.ObjectSort{{Field: "created_at", Desc: true}}}, []string{"b-ds:1"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				objs, err := queryObjects(ctx, db, p.ID, tt.q)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]string, len(objs))
				for i, o := range objs {
					got[i] = fmt.Sprintf("%s:%d", o.ObjectID, o.VersionIndex)
				}
				if fmt.Sprint(got) != fmt.Sprint(tt.want) {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			})
		}
	})
}

// TestOpObjectsAreListedAsOps: an op created as an object lands in the op
// listing with its code, under the object's digest, and leaves it when
// deleted.
func TestOpObjectsAreListedAsOps(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "ops")
		if err != nil {
			t.Fatal(err)
		}
		code := []byte("function add(a, b) { return a + b; }")
		file := weave.File{Digest: weave.BytesDigest(code), Content: code}
		if err := db.PutFile(ctx, p.ID, file); err != nil {
			t.Fatal(err)
		}
		o, err := db.PutObject(ctx, weave.ObjectWrite{ProjectID: p.ID, ObjectID: "add", Digest: "D0", Kind: weave.KindOp,
			Val: json.RawMessage(`{"_type":"CustomWeaveType"}`), OpCodeDigest: file.Digest, At: weaveT0})
		if err != nil || o.Kind != weave.KindOp {
			t.Fatalf("put op = %+v, %v", o, err)
		}
		ops, err := db.ListOpVersions(ctx, p.ID, -1, 0)
		if err != nil || len(ops) != 1 || ops[0].ObjectID != "add" || ops[0].Digest != "D0" || ops[0].Code != string(code) {
			t.Fatalf("ops = %+v, %v", ops, err)
		}
		if _, err := db.DeleteObjects(ctx, p.ID, "add", nil, weaveT0); err != nil {
			t.Fatal(err)
		}
		if ops, err := db.ListOpVersions(ctx, p.ID, -1, 0); err != nil || len(ops) != 0 {
			t.Fatalf("ops after delete = %+v, %v", ops, err)
		}
	})
}

// TestPutObjectConcurrent: publishers racing on one object get distinct,
// consecutive version indexes; the same value, one version.
func TestPutObjectConcurrent(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "race")
		if err != nil {
			t.Fatal(err)
		}
		const n = 8
		var wg sync.WaitGroup
		idx := make([]int, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				val := fmt.Sprintf(`{"i":%d}`, i)
				o, err := db.PutObject(ctx, weave.ObjectWrite{ProjectID: p.ID, ObjectID: "o", Digest: weave.BytesDigest([]byte(val)),
					Kind: weave.KindObject, Val: json.RawMessage(val), At: weaveT0})
				idx[i], errs[i] = o.VersionIndex, err
			})
		}
		wg.Wait()
		seen := map[int]bool{}
		for i := range n {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			seen[idx[i]] = true
		}
		for i := range n {
			if !seen[i] {
				t.Fatalf("indexes %v, want 0..%d each once", idx, n-1)
			}
		}
	})
}

func TestTablesFilesFeedbackCosts(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "data")
		if err != nil {
			t.Fatal(err)
		}
		q, err := db.EnsureProject(ctx, "acme", "elsewhere")
		if err != nil {
			t.Fatal(err)
		}

		rows := []weave.TableRow{{Digest: "r1", Val: json.RawMessage(`{"x":1}`)}, {Digest: "r2", Val: json.RawMessage(`{"x":2}`)}}
		if err := db.PutTable(ctx, p.ID, "T", []string{"r1", "r2", "r1"}, rows); err != nil {
			t.Fatal(err)
		}
		if err := db.PutTable(ctx, p.ID, "T", []string{"r1", "r2", "r1"}, rows); err != nil {
			t.Fatalf("putting a table again: %v", err)
		}
		got, err := db.TableRowDigests(ctx, p.ID, "T")
		if err != nil || fmt.Sprint(got) != "[r1 r2 r1]" {
			t.Fatalf("row digests = %v, %v", got, err)
		}
		vals, err := db.TableRows(ctx, p.ID, []string{"r2", "r1", "nope"})
		if err != nil || len(vals) != 2 || string(vals["r2"]) != `{"x":2}` {
			t.Fatalf("rows = %v, %v", vals, err)
		}
		if _, err := db.TableRowDigests(ctx, q.ID, "T"); !errors.Is(err, weave.ErrNotFound) {
			t.Fatalf("another project's table: %v, want ErrNotFound", err)
		}
		if n, err := db.TableRowCount(ctx, p.ID, "T"); err != nil || n != 3 {
			t.Fatalf("row count = %d, %v; want 3", n, err)
		}
		if _, err := db.TableRowCount(ctx, q.ID, "T"); !errors.Is(err, weave.ErrNotFound) {
			t.Fatalf("another project's row count: %v, want ErrNotFound", err)
		}
		stop := errors.New("stop")
		seen := 0
		if err := db.EachTableRow(ctx, p.ID, []string{"r1", "r2", "nope"}, func(string, json.RawMessage) error {
			seen++
			return stop
		}); !errors.Is(err, stop) || seen != 1 {
			t.Fatalf("EachTableRow ended by its callback: %v after %d rows, want stop after 1", err, seen)
		}

		content := []byte{0, 1, 2, 0xff, 'x'}
		f := weave.File{Digest: weave.BytesDigest(content), Content: content}
		for range 2 {
			if err := db.PutFile(ctx, p.ID, f); err != nil {
				t.Fatal(err)
			}
		}
		if b, err := db.ReadFile(ctx, p.ID, f.Digest); err != nil || string(b) != string(content) {
			t.Fatalf("file = %v, %v", b, err)
		}
		if _, err := db.ReadFile(ctx, q.ID, f.Digest); !errors.Is(err, weave.ErrNotFound) {
			t.Fatalf("another project's file: %v", err)
		}

		fb := weave.Feedback{ProjectID: p.ID, ID: "f1", WeaveRef: "weave:///acme/data/call/c1", WBUserID: "u",
			CreatedAt: weaveT0, FeedbackType: "score", Payload: json.RawMessage(`{"s":1}`)}
		if err := db.PutFeedback(ctx, fb); err != nil {
			t.Fatal(err)
		}
		fb2 := fb
		fb2.ID, fb2.Payload, fb2.CreatedAt = "f2", json.RawMessage(`{"s":2}`), weaveT0.Add(time.Second)
		if err := db.ReplaceFeedback(ctx, "f1", fb2); err != nil {
			t.Fatal(err)
		}
		if err := db.ReplaceFeedback(ctx, "f1", fb2); !errors.Is(err, weave.ErrNotFound) {
			t.Fatalf("replacing a replaced item: %v, want ErrNotFound", err)
		}
		items, err := listFeedback(ctx, db, p.ID, nil)
		if err != nil || len(items) != 1 || items[0].ID != "f2" || string(items[0].Payload) != `{"s":2}` {
			t.Fatalf("feedback = %+v, %v", items, err)
		}
		other := fb
		other.ID, other.WeaveRef = "f3", "weave:///acme/data/call/c2"
		if err := db.PutFeedback(ctx, other); err != nil {
			t.Fatal(err)
		}
		if byRef, err := listFeedback(ctx, db, p.ID, []string{"weave:///acme/data/call/c2", "weave:///acme/data/call/none"}); err != nil || len(byRef) != 1 || byRef[0].ID != "f3" {
			t.Fatalf("feedback on c2 = %+v, %v", byRef, err)
		}
		if none, err := listFeedback(ctx, db, p.ID, []string{}); err != nil || len(none) != 0 {
			t.Fatalf("feedback on no ref = %+v, %v", none, err)
		}
		if n, err := db.DeleteFeedback(ctx, p.ID, []string{"f3"}); err != nil || n != 1 {
			t.Fatalf("delete f3 = %d, %v", n, err)
		}
		if n, err := db.DeleteFeedback(ctx, p.ID, []string{"f2", "f9"}); err != nil || n != 1 {
			t.Fatalf("delete feedback = %d, %v", n, err)
		}

		costs := []weave.Cost{
			{ProjectID: p.ID, ID: "c1", LLMID: "m", PromptTokenCost: 1, CompletionTokenCost: 2, EffectiveDate: weaveT0, CreatedAt: weaveT0},
			{ProjectID: p.ID, ID: "c2", LLMID: "m", PromptTokenCost: 3, CompletionTokenCost: 4, EffectiveDate: weaveT0.Add(time.Hour), CreatedAt: weaveT0},
			{ProjectID: p.ID, ID: "c3", LLMID: "n", PromptTokenCost: 5, CompletionTokenCost: 6, EffectiveDate: weaveT0.Add(48 * time.Hour), CreatedAt: weaveT0},
		}
		for i := range costs {
			costs[i].PromptTokenCostUnit, costs[i].CompletionTokenCostUnit, costs[i].ProviderID, costs[i].CreatedBy = "USD", "USD", "default", "u"
		}
		if err := db.PutCosts(ctx, costs); err != nil {
			t.Fatal(err)
		}
		prices, err := db.ProjectPrices(ctx, p.ID, weaveT0.Add(2*time.Hour))
		if err != nil || len(prices) != 1 || prices["m"] != (weave.Price{PromptTokenCost: 3, CompletionTokenCost: 4}) {
			t.Fatalf("prices = %v, %v", prices, err)
		}
		if prices, err := db.ProjectPrices(ctx, q.ID, weaveT0.Add(72*time.Hour)); err != nil || len(prices) != 0 {
			t.Fatalf("another project's prices = %v, %v", prices, err)
		}
		if n, err := db.DeleteCosts(ctx, p.ID, []string{"c2"}); err != nil || n != 1 {
			t.Fatalf("delete cost = %d, %v", n, err)
		}
		prices, err = db.ProjectPrices(ctx, p.ID, weaveT0.Add(72*time.Hour))
		if err != nil || prices["m"].PromptTokenCost != 1 || prices["n"].CompletionTokenCost != 6 {
			t.Fatalf("prices after purge = %v, %v", prices, err)
		}
		listed, err := db.ListCosts(ctx, p.ID)
		if err != nil || len(listed) != 2 || listed[0].ID != "c1" || !listed[0].EffectiveDate.Equal(weaveT0) {
			t.Fatalf("costs = %+v, %v", listed, err)
		}
	})
}

// listFeedback reads all the feedback on refs (nil: all of it).
func listFeedback(ctx context.Context, db *store.DB, projectID int64, refs []string) ([]weave.Feedback, error) {
	var out []weave.Feedback
	err := db.QueryFeedback(ctx, projectID, weave.FeedbackQuery{Refs: refs, Limit: -1}, func(f *weave.Feedback) error {
		out = append(out, *f)
		return nil
	})
	return out, err
}

// queryObjects reads all the object versions q selects.
func queryObjects(ctx context.Context, db *store.DB, projectID int64, q weave.ObjectQuery) ([]weave.Object, error) {
	var out []weave.Object
	err := db.QueryObjects(ctx, projectID, q, func(o *weave.Object) error {
		out = append(out, *o)
		return nil
	})
	return out, err
}
