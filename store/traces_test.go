package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/admin"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/route"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
	"github.com/tollgate-dev/tollgate/trace"
)

func sp(s string) *string { return &s }

var callT0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

func TestProjects(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		if _, err := db.FindProject(ctx, "acme", "p"); !errors.Is(err, trace.ErrNotFound) {
			t.Fatalf("FindProject before creation: %v", err)
		}
		p1, err := db.EnsureProject(ctx, "acme", "p")
		if err != nil {
			t.Fatal(err)
		}
		p2, err := db.EnsureProject(ctx, "acme", "p")
		if err != nil || p2 != p1 {
			t.Fatalf("EnsureProject again = %+v, %v; want %+v", p2, err, p1)
		}
		other, err := db.EnsureProject(ctx, "beta", "p")
		if err != nil || other.ID == p1.ID {
			t.Fatalf("another entity's project = %+v, %v", other, err)
		}
		if got, err := db.FindProject(ctx, "acme", "p"); err != nil || got != p1 {
			t.Fatalf("FindProject = %+v, %v", got, err)
		}
		if got, err := db.ProjectByID(ctx, p1.ID); err != nil || got != p1 {
			t.Fatalf("ProjectByID = %+v, %v", got, err)
		}
		if _, err := db.ProjectByID(ctx, 999); !errors.Is(err, trace.ErrNotFound) {
			t.Fatalf("ProjectByID(999): %v", err)
		}
	})
}

func TestOpVersions(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "p")
		if err != nil {
			t.Fatal(err)
		}
		put := func(name, code string) trace.OpVersion {
			t.Helper()
			op, err := db.PutOpVersion(ctx, p.ID, name, code, callT0)
			if err != nil {
				t.Fatal(err)
			}
			return op
		}
		v0 := put("b", "def f(): return 1")
		again := put("b", "def f(): return 1")
		if again.Digest != v0.Digest || again.VersionIndex != 0 {
			t.Fatalf("same code = %+v, want version 0 with digest %s", again, v0.Digest)
		}
		v1 := put("b", "def f(): return 2")
		if v1.VersionIndex != 1 || v1.Digest == v0.Digest {
			t.Fatalf("new code = %+v", v1)
		}
		put("a", "def g(): pass")
		put("c", "def h(): pass")

		list := func(limit, offset int) []string {
			t.Helper()
			ops, err := db.ListOpVersions(ctx, p.ID, limit, offset)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, op := range ops {
				out = append(out, op.ObjectID+":"+strconv.Itoa(op.VersionIndex))
			}
			return out
		}
		if got, want := list(-1, 0), []string{"a:0", "b:1", "b:0", "c:0"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("list = %v, want %v", got, want)
		}
		if got, want := list(2, 1), []string{"b:1", "b:0"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("page = %v, want %v", got, want)
		}
		if n, err := db.DeleteOp(ctx, p.ID, "b", callT0); err != nil || n != 2 {
			t.Fatalf("DeleteOp = %d, %v", n, err)
		}
		if got, want := list(-1, 0), []string{"a:0", "c:0"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("after delete = %v, want %v", got, want)
		}
		if n, err := db.DeleteOp(ctx, p.ID, "b", callT0); err != nil || n != 0 {
			t.Fatalf("DeleteOp again = %d, %v", n, err)
		}
		// New code after a delete continues the numbering; old code comes back.
		if v2 := put("b", "def f(): return 3"); v2.VersionIndex != 2 {
			t.Fatalf("version after delete = %+v", v2)
		}
		if back := put("b", "def f(): return 1"); back.VersionIndex != 0 {
			t.Fatalf("restored version = %+v", back)
		}
		if got, want := list(-1, 0), []string{"a:0", "b:2", "b:0", "c:0"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("after re-publish = %v, want %v", got, want)
		}
	})
}

func TestWriteCalls(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "p")
		if err != nil {
			t.Fatal(err)
		}
		start := func(id, traceID string, parent *string) *trace.CallStart {
			return &trace.CallStart{ProjectID: p.ID, ID: id, OpName: "op", TraceID: traceID, ParentID: parent, StartedAt: callT0}
		}
		traces, err := db.WriteCalls(ctx, []trace.CallWrite{
			{Start: start("root", "tr", nil)},
			{Start: start("child", "", sp("root"))},
			{End: &trace.CallEnd{ProjectID: p.ID, ID: "child", EndedAt: callT0.Add(time.Second), Output: json.RawMessage(`"done"`),
				Summary: json.RawMessage(`{"usage":{"m":{"prompt_tokens":1}}}`), Exception: sp("oops")}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"tr", "tr", ""}; !reflect.DeepEqual(traces, want) {
			t.Fatalf("traces = %v, want %v", traces, want)
		}
		c, err := db.ReadCall(ctx, p.ID, "child")
		if err != nil {
			t.Fatal(err)
		}
		if c.TraceID != "tr" || *c.ParentID != "root" || c.EndedAt == nil || !c.EndedAt.Equal(callT0.Add(time.Second)) ||
			string(c.Output) != `"done"` || *c.Exception != "oops" || string(c.Inputs) != "{}" {
			t.Fatalf("child = %+v", c)
		}

		// A retried start keeps the stored call and answers its trace id.
		traces, err = db.WriteCalls(ctx, []trace.CallWrite{{Start: start("child", "", sp("root"))}})
		if err != nil || traces[0] != "tr" {
			t.Fatalf("retried start = %v, %v", traces, err)
		}
		if c2, _ := db.ReadCall(ctx, p.ID, "child"); c2.EndedAt == nil {
			t.Fatal("a retried start must not reset the call")
		}

		// Failures name the item, and roll the whole batch back.
		_, err = db.WriteCalls(ctx, []trace.CallWrite{
			{Start: start("fresh", "tr2", nil)},
			{Start: start("orphan", "", sp("nobody"))},
		})
		var we *trace.CallWriteError
		if !errors.As(err, &we) || we.Index != 1 || !errors.Is(err, trace.ErrParentNotFound) {
			t.Fatalf("unknown parent: %v", err)
		}
		if _, err := db.ReadCall(ctx, p.ID, "fresh"); !errors.Is(err, trace.ErrNotFound) {
			t.Fatalf("batch not rolled back: %v", err)
		}
	})
}

// TestEndBeforeStart: an end that arrives before its start, in an earlier
// batch or earlier in the same batch, is kept and merged when the start
// arrives; the call reads as if they had come in order.
func TestEndBeforeStart(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "p")
		if err != nil {
			t.Fatal(err)
		}
		end := func(id string) *trace.CallEnd {
			return &trace.CallEnd{ProjectID: p.ID, ID: id, EndedAt: callT0.Add(time.Second), Output: json.RawMessage(`{"a":1}`),
				Summary: json.RawMessage(`{"usage":{"m":{"prompt_tokens":3}}}`), Exception: sp("late"), DisplayName: sp("renamed")}
		}
		start := func(id string) *trace.CallStart {
			return &trace.CallStart{ProjectID: p.ID, ID: id, OpName: "op", TraceID: "tr", StartedAt: callT0, DisplayName: sp("first")}
		}
		// Separate requests: the end alone is accepted and not yet a call.
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{{End: end("apart")}}); err != nil {
			t.Fatalf("early end: %v", err)
		}
		if _, err := db.ReadCall(ctx, p.ID, "apart"); !errors.Is(err, trace.ErrNotFound) {
			t.Fatalf("an end alone is not a call: %v", err)
		}
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{{Start: start("apart")}}); err != nil {
			t.Fatal(err)
		}
		// Same batch, end first.
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{{End: end("batch")}, {Start: start("batch")}}); err != nil {
			t.Fatalf("end then start in one batch: %v", err)
		}
		for _, id := range []string{"apart", "batch"} {
			c, err := db.ReadCall(ctx, p.ID, id)
			if err != nil {
				t.Fatal(err)
			}
			if c.EndedAt == nil || !c.EndedAt.Equal(callT0.Add(time.Second)) || string(c.Output) != `{"a":1}` ||
				*c.Exception != "late" || *c.DisplayName != "renamed" || string(c.Summary) != `{"usage":{"m":{"prompt_tokens":3}}}` ||
				c.TraceID != "tr" || c.OpName != "op" {
				t.Fatalf("%s = %+v", id, c)
			}
		}
		// The pending end was consumed: a retried start changes nothing,
		// and a later end still applies as usual.
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{{Start: start("batch")}}); err != nil {
			t.Fatal(err)
		}
		later := end("batch")
		later.Output = json.RawMessage(`"second"`)
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{{End: later}}); err != nil {
			t.Fatal(err)
		}
		if c, _ := db.ReadCall(ctx, p.ID, "batch"); string(c.Output) != `"second"` {
			t.Fatalf("later end = %s", c.Output)
		}
		// Two ends before the start: the last one wins, as it would on a
		// started call.
		first, second := end("twice"), end("twice")
		second.Output = json.RawMessage(`"last"`)
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{{End: first}}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{{End: second}, {Start: start("twice")}}); err != nil {
			t.Fatal(err)
		}
		if c, _ := db.ReadCall(ctx, p.ID, "twice"); string(c.Output) != `"last"` {
			t.Fatalf("twice = %s", c.Output)
		}
	})
}

// fixture ingests three calls (and a decoy in another project) for the
// filter and query tests.
func fixture(t *testing.T, db *store.DB) trace.Project {
	t.Helper()
	ctx := context.Background()
	p, err := db.EnsureProject(ctx, "acme", "p")
	if err != nil {
		t.Fatal(err)
	}
	other, err := db.EnsureProject(ctx, "acme", "other")
	if err != nil {
		t.Fatal(err)
	}
	writes := []trace.CallWrite{
		{Start: &trace.CallStart{
			ProjectID: p.ID, ID: "c1", OpName: "openai.chat.completions.create", TraceID: "t1",
			ThreadID: sp("th1"), TurnID: sp("tu1"), StartedAt: callT0,
			Attributes: json.RawMessage(`{"n":3,"flag":true,"name":"Alpha"}`),
			Inputs:     json.RawMessage(`{"ref":"weave:///acme/p/object/ds:abc","msg":"Hello World"}`),
			SvcUserID:  sp("u1"), SvcRunID: sp("r1"),
		}},
		{End: &trace.CallEnd{
			ProjectID: p.ID, ID: "c1", EndedAt: callT0.Add(time.Second),
			Output:  json.RawMessage(`{"r":["weave:///acme/p/object/out:1"]}`),
			Summary: json.RawMessage(`{"usage":{"gpt-4.1":{"total_tokens":30}}}`),
		}},
		{Start: &trace.CallStart{
			ProjectID: p.ID, ID: "c2", OpName: "Evaluation.evaluate", TraceID: "t1", ParentID: sp("c1"),
			ThreadID: sp("th2"), TurnID: sp("tu2"), StartedAt: callT0.Add(2 * time.Second),
			Attributes: json.RawMessage(`{"n":10,"flag":false}`),
			Inputs:     json.RawMessage(`{"nested":{"list":["weave:///x"]}}`),
			SvcUserID:  sp("u2"),
		}},
		{Start: &trace.CallStart{
			ProjectID: p.ID, ID: "c3", OpName: "weave:///acme/p/op/predict:v1", TraceID: "t2",
			DisplayName: sp("Predict"), StartedAt: callT0.Add(3 * time.Second),
			Attributes: json.RawMessage(`{"n":"7"}`),
		}},
		{End: &trace.CallEnd{
			ProjectID: p.ID, ID: "c3", EndedAt: callT0.Add(4 * time.Second), Exception: sp("boom"),
			Output: json.RawMessage(`"plain"`), Summary: json.RawMessage(`{"usage":{"m":{"total_tokens":5}}}`),
		}},
		{Start: &trace.CallStart{ProjectID: other.ID, ID: "decoy", OpName: "Evaluation.evaluate", TraceID: "t1", StartedAt: callT0}},
	}
	if _, err := db.WriteCalls(ctx, writes); err != nil {
		t.Fatal(err)
	}
	return p
}

func selectIDs(t *testing.T, db *store.DB, p trace.Project, q trace.CallsQuery) []string {
	t.Helper()
	ids := []string{}
	err := db.QueryCalls(context.Background(), p.ID, q, func(c *trace.Call) error {
		ids = append(ids, c.ID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestCallsFilterFields(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		p := fixture(t, db)
		tests := []struct {
			name   string
			filter trace.CallsFilter
			want   []string
		}{
			{"no condition", trace.CallsFilter{}, []string{"c1", "c2", "c3"}},
			{"empty lists set no condition", trace.CallsFilter{TraceIDs: []string{}, OpNames: []string{}}, []string{"c1", "c2", "c3"}},
			{"op_names", trace.CallsFilter{OpNames: []string{"Evaluation.evaluate"}}, []string{"c2"}},
			{"op_names any version", trace.CallsFilter{OpNames: []string{"weave:///acme/p/op/predict:*"}}, []string{"c3"}},
			{"input_refs at the top", trace.CallsFilter{InputRefs: []string{"weave:///acme/p/object/ds:abc"}}, []string{"c1"}},
			{"input_refs nested in a list", trace.CallsFilter{InputRefs: []string{"weave:///x", "weave:///none"}}, []string{"c2"}},
			{"output_refs", trace.CallsFilter{OutputRefs: []string{"weave:///acme/p/object/out:1"}}, []string{"c1"}},
			{"output_refs match values, not keys", trace.CallsFilter{OutputRefs: []string{"r"}}, []string{}},
			{"parent_ids", trace.CallsFilter{ParentIDs: []string{"c1"}}, []string{"c2"}},
			{"trace_ids", trace.CallsFilter{TraceIDs: []string{"t2"}}, []string{"c3"}},
			{"call_ids", trace.CallsFilter{CallIDs: []string{"c3", "c1", "decoy"}}, []string{"c1", "c3"}},
			{"thread_ids", trace.CallsFilter{ThreadIDs: []string{"th2"}}, []string{"c2"}},
			{"turn_ids", trace.CallsFilter{TurnIDs: []string{"tu1"}}, []string{"c1"}},
			{"trace_roots_only", trace.CallsFilter{TraceRootsOnly: true}, []string{"c1", "c3"}},
			{"svc_user_ids", trace.CallsFilter{SvcUserIDs: []string{"u2"}}, []string{"c2"}},
			{"svc_run_ids", trace.CallsFilter{SvcRunIDs: []string{"r1"}}, []string{"c1"}},
			{"fields are ANDed", trace.CallsFilter{TraceIDs: []string{"t1"}, TraceRootsOnly: true}, []string{"c1"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				f := tt.filter
				if got := selectIDs(t, db, p, trace.CallsQuery{Filter: &f, Limit: -1}); !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			})
		}
	})
}

func lit(v any) trace.Literal { return trace.Literal{Value: v} }

func field(col string, path ...string) trace.GetField {
	if len(path) == 0 {
		path = nil
	}
	return trace.GetField{Column: col, Path: path}
}

func cmp(op trace.Comparison, l, r trace.Operand) trace.CompareOp {
	return trace.CompareOp{Op: op, Left: l, Right: r}
}

func TestQueryOperators(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		p := fixture(t, db)
		tests := []struct {
			name string
			expr trace.Operand
			want []string
		}{
			{"$eq on a column", cmp(trace.OpEq, field("op_name"), lit("Evaluation.evaluate")), []string{"c2"}},
			{"$eq null is IS NULL", cmp(trace.OpEq, field("parent_id"), lit(nil)), []string{"c1", "c3"}},
			{"$eq on display_name", cmp(trace.OpEq, lit("Predict"), field("display_name")), []string{"c3"}},
			{"$eq on exception", cmp(trace.OpEq, field("exception"), lit("boom")), []string{"c3"}},
			{"$eq on a JSON bool", cmp(trace.OpEq, field("attributes", "flag"), lit(true)), []string{"c1"}},
			{"$eq on a JSON scalar output", cmp(trace.OpEq, field("output"), lit("plain")), []string{"c3"}},
			{"$eq with a composite literal", cmp(trace.OpEq, field("inputs", "nested"), lit(json.RawMessage(`{"list":["weave:///x"]}`))), []string{"c2"}},
			{"$gt on usage with a dotted model", cmp(trace.OpGt, field("summary", "usage", "gpt-4.1", "total_tokens"), lit(int64(10))), []string{"c1"}},
			{"$gte compares numbers with numbers only", cmp(trace.OpGte, field("attributes", "n"), lit(int64(3))), []string{"c1", "c2"}},
			{"$lt on started_at with RFC 3339", cmp(trace.OpLt, field("started_at"), lit("2026-11-21T10:00:02Z")), []string{"c1"}},
			{"$lte on started_at with Unix seconds", cmp(trace.OpLte, field("started_at"), lit(callT0.Add(2*time.Second).Unix())), []string{"c1", "c2"}},
			{"$gt on ended_at, unfinished excluded", cmp(trace.OpGt, field("ended_at"), lit(float64(callT0.Unix())+0.5)), []string{"c1", "c3"}},
			{"$in", trace.InOp{Left: field("trace_id"), Values: []trace.Operand{lit("t2"), lit("zzz")}}, []string{"c3"}},
			{"$in empty", trace.InOp{Left: field("trace_id")}, []string{}},
			{"$contains", trace.ContainsOp{Input: field("inputs", "msg"), Substr: lit("World")}, []string{"c1"}},
			{"$contains is case sensitive", trace.ContainsOp{Input: field("inputs", "msg"), Substr: lit("world")}, []string{}},
			{"$contains case_insensitive", trace.ContainsOp{Input: field("inputs", "msg"), Substr: lit("WORLD"), CaseInsensitive: true}, []string{"c1"}},
			{"$and", trace.AndOp{Operands: []trace.Operand{
				cmp(trace.OpEq, field("trace_id"), lit("t1")), cmp(trace.OpEq, field("parent_id"), lit(nil)),
			}}, []string{"c1"}},
			{"$and empty is true", trace.AndOp{}, []string{"c1", "c2", "c3"}},
			{"$or", trace.OrOp{Operands: []trace.Operand{
				cmp(trace.OpEq, field("id"), lit("c1")), cmp(trace.OpEq, field("id"), lit("c3")),
			}}, []string{"c1", "c3"}},
			{"$or empty is false", trace.OrOp{}, []string{}},
			{"$not, a missing field counts as not equal", trace.NotOp{Operand: cmp(trace.OpEq, field("thread_id"), lit("th1"))}, []string{"c2", "c3"}},
			{"$literal strings as conditions (the spec's shape)", trace.AndOp{Operands: []trace.Operand{lit("x"), lit("y")}}, []string{"c1", "c2", "c3"}},
			{"an empty literal is false", trace.AndOp{Operands: []trace.Operand{lit("")}}, []string{}},
			{"$convert double", cmp(trace.OpGte, trace.Convert{Input: field("attributes", "n"), To: trace.ToDouble}, lit(int64(7))), []string{"c2", "c3"}},
			{"$convert int", cmp(trace.OpEq, trace.Convert{Input: field("attributes", "n"), To: trace.ToInt}, lit(int64(7))), []string{"c3"}},
			{"$convert string", cmp(trace.OpEq, trace.Convert{Input: field("attributes", "n"), To: trace.ToString}, lit("10")), []string{"c2"}},
			{"$convert bool", cmp(trace.OpEq, trace.Convert{Input: field("attributes", "flag"), To: trace.ToBool}, lit(false)), []string{"c2"}},
			{"$convert exists on a JSON key", trace.Convert{Input: field("attributes", "flag"), To: trace.ToExists}, []string{"c1", "c2"}},
			{"$convert exists on output", trace.Convert{Input: field("output"), To: trace.ToExists}, []string{"c1", "c3"}},
			{"$getField as a condition", field("attributes", "flag"), []string{"c1"}},
			{"nested operations", trace.AndOp{Operands: []trace.Operand{
				trace.OrOp{Operands: []trace.Operand{
					trace.ContainsOp{Input: field("op_name"), Substr: lit("predict")},
					cmp(trace.OpEq, field("svc_user_id"), lit("u2")),
				}},
				trace.NotOp{Operand: trace.InOp{Left: field("id"), Values: []trace.Operand{lit("c2")}}},
			}}, []string{"c3"}},
			{"a comparison as an operand", cmp(trace.OpEq, cmp(trace.OpGt, field("attributes", "n"), lit(int64(5))), lit(true)), []string{"c2"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				q := trace.CallsQuery{Query: &trace.Query{Expr: tt.expr}, Limit: -1}
				if got := selectIDs(t, db, p, q); !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			})
		}
	})
}

func TestQueryCallsSortAndPage(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		p := fixture(t, db)
		tests := []struct {
			name string
			q    trace.CallsQuery
			want []string
		}{
			{"default order", trace.CallsQuery{Limit: -1}, []string{"c1", "c2", "c3"}},
			{"descending started_at", trace.CallsQuery{Limit: -1, SortBy: []trace.SortBy{{Field: field("started_at"), Desc: true}}}, []string{"c3", "c2", "c1"}},
			{"by a JSON field", trace.CallsQuery{Limit: -1, SortBy: []trace.SortBy{{Field: field("attributes", "n"), Desc: true}}}, []string{"c3", "c2", "c1"}},
			{"limit", trace.CallsQuery{Limit: 2}, []string{"c1", "c2"}},
			{"offset without limit", trace.CallsQuery{Limit: -1, Offset: 2}, []string{"c3"}},
			{"limit 0", trace.CallsQuery{Limit: 0}, []string{}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if got := selectIDs(t, db, p, tt.q); !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			})
		}
	})
}

func TestFinishCall(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "p")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{{Start: &trace.CallStart{
			ProjectID: p.ID, ID: "run", OpName: admin.EvaluationOpName, TraceID: "run", StartedAt: callT0,
		}}}); err != nil {
			t.Fatal(err)
		}
		if err := db.FinishCall(ctx, p.ID, "run", "other.op", callT0, nil, nil); !errors.Is(err, trace.ErrNotFound) {
			t.Fatalf("finish with the wrong op: %v", err)
		}
		if err := db.FinishCall(ctx, p.ID, "run", admin.EvaluationOpName, callT0.Add(time.Second), json.RawMessage(`{"a":1}`), nil); err != nil {
			t.Fatal(err)
		}
		if err := db.FinishCall(ctx, p.ID, "run", admin.EvaluationOpName, callT0.Add(time.Hour), json.RawMessage(`{"b":2}`), sp("late")); err != nil {
			t.Fatal(err)
		}
		c, err := db.ReadCall(ctx, p.ID, "run")
		if err != nil {
			t.Fatal(err)
		}
		if !c.EndedAt.Equal(callT0.Add(time.Second)) || string(c.Summary) != `{"a":1,"b":2}` || *c.Exception != "late" {
			t.Fatalf("finished run = ended %v summary %s exception %v", c.EndedAt, c.Summary, c.Exception)
		}
	})
}

// serveTraceUsage runs POST /trace/usage through the admin service, as the
// gateway does, against db.
func serveTraceUsage(t testing.TB, db *store.DB, pricing map[string]config.Pricing, body string) map[string]any {
	t.Helper()
	kr, err := auth.NewKeyring(config.Auth{Keys: []config.Key{{Name: "k", Key: "sk-test", Teams: []string{"acme"}}}})
	if err != nil {
		t.Fatal(err)
	}
	svc := admin.New(admin.Options{Keys: kr, Store: db, Pricing: pricing})
	var req fasthttp.Request
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/trace/usage")
	req.Header.Set("Authorization", "Bearer sk-test")
	req.SetBodyString(body)
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil)
	serveService(t, svc)(&ctx)
	if ctx.Response.StatusCode() != fasthttp.StatusOK {
		t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	var out map[string]any
	if err := json.Unmarshal(ctx.Response.Body(), &out); err != nil {
		t.Fatalf("decode %s: %v", ctx.Response.Body(), err)
	}
	return out
}

func insertRecords(t *testing.T, db *store.DB, recs []accounting.Record) {
	t.Helper()
	if err := db.InsertGatewayCalls(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
}

func TestGatewayCallsRollUpWithIngestedCalls(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		recs := []accounting.Record{
			{
				RequestID: "req-1", CallID: "gw-root", TraceID: "tr", KeyName: "k", Team: "acme", Project: "chat",
				Model: "gpt-4.1", ServedModel: "gpt-4.1", Backend: "b1", Status: 200,
				PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15, CachedTokens: 4,
				Started: callT0, Ended: callT0.Add(time.Second),
			},
			{
				RequestID: "req-2", CallID: "gw-child", TraceID: "tr", ParentID: "gw-root", KeyName: "k", Team: "acme", Project: "chat",
				Model: "small", ServedModel: "small-fallback", Backend: "b2", Status: 200, Error: "stream broke", Stream: true, Incomplete: true,
				PromptTokens: 3, CompletionTokens: 2, TotalTokens: 5,
				Started: callT0.Add(time.Second), Ended: callT0.Add(2 * time.Second),
				Input: []byte(`{"model":"small","messages":[{"role":"user","content":"hi"}]}`), Output: []byte("streamed text"),
			},
		}
		insertRecords(t, db, recs)
		// A retried batch inserts nothing twice and does not fail.
		insertRecords(t, db, recs)

		p, err := db.FindProject(ctx, "acme", "chat")
		if err != nil {
			t.Fatal(err)
		}
		root, err := db.ReadCall(ctx, p.ID, "gw-root")
		if err != nil {
			t.Fatal(err)
		}
		if root.OpName != "openai.chat.completions.create" || root.ParentID != nil || root.Exception != nil ||
			string(root.Inputs) != "{}" || root.Output != nil || *root.SvcUserID != "k" {
			t.Fatalf("root call = %+v", root)
		}
		var attrs map[string]any
		if err := json.Unmarshal(root.Attributes, &attrs); err != nil {
			t.Fatal(err)
		}
		wantAttrs := map[string]any{"request_id": "req-1", "key_name": "k", "backend": "b1", "status": float64(200),
			"stream": false, "incomplete": false, "served_model": "gpt-4.1"}
		if !reflect.DeepEqual(attrs, wantAttrs) {
			t.Fatalf("attributes = %v", attrs)
		}
		if want := `{"usage":{"gpt-4.1":{"requests":1,"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"cache_read_input_tokens":4}}}`; string(root.Summary) != want {
			t.Fatalf("summary = %s", root.Summary)
		}
		child, err := db.ReadCall(ctx, p.ID, "gw-child")
		if err != nil {
			t.Fatal(err)
		}
		if *child.ParentID != "gw-root" || *child.Exception != "stream broke" || string(child.Output) != `"streamed text"` ||
			!strings.HasPrefix(string(child.Inputs), `{"model":"small"`) {
			t.Fatalf("child call = %+v (inputs %s, output %s)", child, child.Inputs, child.Output)
		}

		// A tool call the client ingests under the gateway child, taking its
		// trace id from the parent, and an unfinished one under the root.
		if _, err := db.WriteCalls(ctx, []trace.CallWrite{
			{Start: &trace.CallStart{ProjectID: p.ID, ID: "tool", OpName: "tool", ParentID: sp("gw-child"), StartedAt: callT0.Add(1500 * time.Millisecond)}},
			{End: &trace.CallEnd{ProjectID: p.ID, ID: "tool", EndedAt: callT0.Add(1600 * time.Millisecond),
				Summary: json.RawMessage(`{"usage":{"small":{"input_tokens":1,"output_tokens":1}}}`)}},
			{Start: &trace.CallStart{ProjectID: p.ID, ID: "pending", OpName: "agent.step", TraceID: "tr", ParentID: sp("gw-root"), StartedAt: callT0.Add(3 * time.Second)}},
		}); err != nil {
			t.Fatal(err)
		}

		got := serveTraceUsage(t, db, nil, `{"project_id":"acme/chat","filter":{"trace_ids":["tr"]}}`)
		usage := func(id, model string) map[string]any {
			t.Helper()
			m, _ := got["call_usage"].(map[string]any)[id].(map[string]any)
			u, _ := m[model].(map[string]any)
			return u
		}
		expect := func(id, model string, requests, prompt, completion, total, cached float64) {
			t.Helper()
			u := usage(id, model)
			want := map[string]any{
				"requests": requests, "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total,
				"cache_read_input_tokens": cached, "cache_creation_input_tokens": float64(0),
				"prompt_tokens_total_cost": nil, "completion_tokens_total_cost": nil,
				"cache_read_input_tokens_total_cost": nil, "cache_creation_input_tokens_total_cost": nil,
			}
			if !reflect.DeepEqual(u, want) {
				t.Errorf("%s/%s = %v\nwant %v", id, model, u, want)
			}
		}
		expect("gw-root", "gpt-4.1", 1, 10, 5, 15, 4)
		expect("gw-root", "small", 1, 4, 3, 7, 0)
		expect("gw-child", "small", 1, 4, 3, 7, 0)
		expect("tool", "small", 0, 1, 1, 2, 0)
		if len(got["call_usage"].(map[string]any)) != 4 {
			t.Fatalf("call_usage = %v", got["call_usage"])
		}
		if pending := got["call_usage"].(map[string]any)["pending"]; !reflect.DeepEqual(pending, map[string]any{}) {
			t.Fatalf("pending = %v, want {}", pending)
		}
		if !reflect.DeepEqual(got["unfinished_call_ids"], []any{"pending"}) {
			t.Fatalf("unfinished = %v", got["unfinished_call_ids"])
		}

		// Costs come from the configured prices.
		got = serveTraceUsage(t, db, map[string]config.Pricing{"gpt-4.1": {PromptPerMTok: 2e6, CompletionPerMTok: 8e6, CachedPromptPerMTok: 1e6}},
			`{"project_id":"acme/chat","filter":{"call_ids":["gw-root"]},"include_costs":true}`)
		u := usage("gw-root", "gpt-4.1")
		if u["prompt_tokens_total_cost"] != float64(6*2+4*1) || u["completion_tokens_total_cost"] != float64(40) ||
			u["cache_read_input_tokens_total_cost"] != float64(4) || u["cache_creation_input_tokens_total_cost"] != float64(0) {
			t.Fatalf("costs = %v", u)
		}
	})
}

func TestTraceUsageCallsLimit(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "p")
		if err != nil {
			t.Fatal(err)
		}
		var writes []trace.CallWrite
		for i := range 5 {
			writes = append(writes, trace.CallWrite{Start: &trace.CallStart{
				ProjectID: p.ID, ID: fmt.Sprintf("c%d", i), OpName: "op", TraceID: "t", StartedAt: callT0.Add(time.Duration(i) * time.Second),
			}})
		}
		if _, err := db.WriteCalls(ctx, writes); err != nil {
			t.Fatal(err)
		}
		calls, err := db.TraceUsageCalls(ctx, p.ID, &trace.CallsFilter{TraceIDs: []string{"t"}}, nil, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(calls) != 3 || calls[0].ID != "c0" || calls[2].ID != "c2" || !calls[0].Unfinished {
			t.Fatalf("calls = %+v", calls)
		}
		got := serveTraceUsage(t, db, nil, `{"project_id":"acme/p","limit":2}`)
		if n := len(got["call_usage"].(map[string]any)); n != 2 {
			t.Fatalf("limit 2 gave %d calls", n)
		}
	})
}

// BenchmarkTraceUsageStore10k measures /trace/usage end to end over a trace
// of 10,000 calls, per engine: selection, roll-up and encoding.
func BenchmarkTraceUsageStore10k(b *testing.B) {
	for _, st := range storetest.Open(b) {
		b.Run(st.Name, func(b *testing.B) {
			benchmarkTraceUsage10k(b, st.DB)
		})
	}
}

func benchmarkTraceUsage10k(b *testing.B, db *store.DB) {
	ctx := context.Background()
	p, err := db.EnsureProject(ctx, "acme", "bench")
	if err != nil {
		b.Fatal(err)
	}
	const n = 10000
	writes := make([]trace.CallWrite, 0, 2*n)
	for i := range n {
		id := "call-" + strconv.Itoa(i)
		s := &trace.CallStart{ProjectID: p.ID, ID: id, OpName: "op", TraceID: "bench-trace", StartedAt: callT0.Add(time.Duration(i) * time.Millisecond)}
		if i > 0 {
			s.ParentID = sp("call-" + strconv.Itoa((i-1)/8))
		}
		writes = append(writes, trace.CallWrite{Start: s}, trace.CallWrite{End: &trace.CallEnd{
			ProjectID: p.ID, ID: id, EndedAt: callT0.Add(time.Duration(i+1) * time.Millisecond),
			Summary: json.RawMessage(fmt.Sprintf(`{"usage":{"model-%d":{"requests":1,"prompt_tokens":%d,"completion_tokens":7}}}`, i%3, i)),
		}})
	}
	if _, err := db.WriteCalls(ctx, writes); err != nil {
		b.Fatal(err)
	}
	body := `{"project_id":"acme/bench","filter":{"trace_ids":["bench-trace"]},"include_costs":true}`
	if got := serveTraceUsage(b, db, nil, body); len(got["call_usage"].(map[string]any)) != n {
		b.Fatal("not every call selected")
	}
	kr, err := auth.NewKeyring(config.Auth{Keys: []config.Key{{Name: "k", Key: "sk-test", Teams: []string{"acme"}}}})
	if err != nil {
		b.Fatal(err)
	}
	serve := serveService(b, admin.New(admin.Options{Keys: kr, Store: db}))
	var req fasthttp.Request
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/trace/usage")
	req.Header.Set("Authorization", "Bearer sk-test")
	req.SetBodyString(body)
	var rctx fasthttp.RequestCtx
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		rctx.Init(&req, nil, nil)
		serve(&rctx)
		if rctx.Response.StatusCode() != fasthttp.StatusOK {
			b.Fatalf("status %d", rctx.Response.StatusCode())
		}
	}
}

// TestAppendTraceTime: the stored form of a time is what AppendFormat
// writes with trace.TimeLayout, in UTC, whatever the time's zone, year or
// fraction (truncated to the microsecond, not rounded).
func TestAppendTraceTime(t *testing.T) {
	east := time.FixedZone("east", 5*3600+30*60)
	times := []time.Time{
		{},
		time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.UTC),
		time.Date(2026, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(2027, 1, 1, 4, 0, 0, 999, east),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 6, 15, 12, 30, 0, 500, time.UTC),
		time.Date(999, 2, 3, 4, 5, 6, 7000, time.UTC),
		time.Unix(0, 0),
		time.Unix(-1, 999999),
	}
	for i := range 1000 {
		times = append(times, time.Unix(0, int64(i)*7919_000_123_457).In(east))
	}
	for _, tm := range times {
		want := tm.UTC().Format(trace.TimeLayout)
		if got := string(store.AppendTraceTime([]byte("x"), tm)); got != "x"+want {
			t.Errorf("%v: %q, want %q", tm, got, "x"+want)
		}
	}
}

// serveService routes svc's rows alone, as the binary's router would.
func serveService(tb testing.TB, svc *admin.Service) fasthttp.RequestHandler {
	tb.Helper()
	router, err := route.New(svc.Routes(), admin.NotFound, admin.MethodNotAllowed)
	if err != nil {
		tb.Fatal(err)
	}
	return router.Serve
}
