package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// TestNumberedRowsStoreSameRows: the gateway calls and links InsertRecords
// writes on SQLite with literals and shared parameters are the rows, value
// and type, that binding every value of every row stored, for batches
// whose statements take each shape: plain or not, one project and op or
// several, one completion date or several (the records' dates change
// every ten).
func TestNumberedRowsStoreSameRows(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 1, 0, 0, 0, time.UTC)
	plain := func(i int) accounting.Record {
		id := fmt.Sprintf("call-%04d", i)
		r := usageRec(id, "acme", "bot", "m", "k", t0.Add(time.Duration(i)*time.Millisecond), int64(i), 2, 0)
		r.RequestID, r.TraceID = id, id
		r.Endpoint = "chat.completions"
		r.CompletionID = fmt.Sprintf("chatcmpl-%d", i)
		r.CompletionCreated = t0.Unix() + int64(i/10)
		return r
	}
	tests := []struct {
		name string
		n    int
		vary func(r *accounting.Record, i int)
	}{
		{"plain, one project", 101, func(*accounting.Record, int) {}},
		{"plain, teams and ops", 75, func(r *accounting.Record, i int) {
			r.Team = []string{"acme", "zeta", "beta"}[i%3]
			r.Endpoint = []string{"chat.completions", "embeddings"}[i/7%2]
			if i%5 == 0 {
				r.KeyName, r.CompletionID = "", ""
			}
		}},
		{"some not plain", 70, func(r *accounting.Record, i int) {
			switch i % 9 {
			case 1:
				r.Error = "upstream 502"
			case 2:
				r.ParentID = "parent-" + r.CallID
			case 3:
				r.TraceID = "trace-" + r.CallID
			case 4:
				r.Input = []byte(`{"model":"m","messages":[]}`)
			case 5:
				r.Output = []byte("streamed text")
			case 6:
				r.Input, r.Output = []byte(`"not an object"`), []byte(`{"id": "x"}`)
			}
			if i%4 == 0 {
				r.Team = "zeta"
			}
		}},
		{"none plain, one project", 33, func(r *accounting.Record, i int) {
			r.Error = fmt.Sprint("error ", i)
			r.Endpoint = "responses"
		}},
		{"hostile strings", 16, func(r *accounting.Record, i int) {
			s := []string{"", `say "hi"`, "tab\tnew\nline", "<&>", "line\u2028end", `back\\slash`, "☃ 🦫", "'{}'"}[i%8]
			r.KeyName, r.Backend, r.Model, r.ServedModel = s, s, s, s
			r.CompletionID += s
		}},
	}
	forEachStore(t, func(t *testing.T, numbered *store.DB) {
		bound := storetest.OpenEngine(t, numbered.Engine())
		ctx := context.Background()
		for k, tc := range tests {
			recs := make([]accounting.Record, tc.n)
			for i := range recs {
				recs[i] = plain(k*1000 + i)
				tc.vary(&recs[i], i)
			}
			if err := numbered.InsertGatewayCalls(ctx, recs); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if err := bound.InsertGatewayCallsBound(ctx, recs); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		assertSameCalls(t, numbered, bound)
	})
}

// TestNumberedRowsShareKeyNames: a statement binds svc_user_id once when
// all of its rows have the first one's key name, and each row's own
// otherwise; either way the calls and links stored are those binding
// every value stored. The batch of 127 records runs statements of 64,
// 32, 16, 8, 4, 2 and 1 rows, so a change of key at record k falls in a
// statement of one size and leaves the others shared.
func TestNumberedRowsShareKeyNames(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	const n = 127
	tests := []struct {
		name string
		key  func(i int) string
		team func(i int) string
	}{
		{"one key", func(int) string { return "k1" }, nil},
		{"no key", func(int) string { return "" }, nil},
		{"every key its own", func(i int) string { return fmt.Sprint("k", i) }, nil},
		{"key changes at 100", func(i int) string { return []string{"k1", "k2"}[b2i(i >= 100)] }, nil},
		{"no key then a key", func(i int) string { return []string{"", "k1"}[b2i(i%64 == 63)] }, nil},
		{"a key then none", func(i int) string { return []string{"k1", ""}[b2i(i == 96)] }, nil},
		{"one key, teams differ", func(int) string { return "k1" }, func(i int) string { return []string{"acme", "zeta"}[i%2] }},
		{"keys and teams differ", func(i int) string { return fmt.Sprint("k", i%3) }, func(i int) string { return []string{"acme", "zeta"}[i/50%2] }},
	}
	forEachStore(t, func(t *testing.T, numbered *store.DB) {
		bound := storetest.OpenEngine(t, numbered.Engine())
		ctx := context.Background()
		for k, tc := range tests {
			recs := make([]accounting.Record, n)
			for i := range recs {
				id := fmt.Sprintf("call-%02d-%04d", k, i)
				team := "acme"
				if tc.team != nil {
					team = tc.team(i)
				}
				recs[i] = usageRec(id, team, "bot", "m", tc.key(i), t0.Add(time.Duration(i)*time.Millisecond), int64(i), 2, 0)
				recs[i].Endpoint = "chat.completions"
				recs[i].CompletionID = fmt.Sprintf("chatcmpl-%d-%d", k, i)
				recs[i].CompletionCreated = t0.Unix()
			}
			if err := numbered.InsertGatewayCalls(ctx, recs); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if err := bound.InsertGatewayCallsBound(ctx, recs); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		assertSameCalls(t, numbered, bound)
	})
}

// b2i is 1 for true, 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// assertSameCalls compares every column of every call and link in
// numbered with bound's, which must hold at least 200 of each.
func assertSameCalls(t *testing.T, numbered, bound *store.DB) {
	t.Helper()
	for _, q := range []string{
		`SELECT p.entity, p.name, c.* FROM calls c JOIN projects p ON p.id = c.project_id ORDER BY c.id`,
		`SELECT * FROM call_completions ORDER BY entity, created, completion_id`,
	} {
		got, want := dumpRows(t, numbered, q), dumpRows(t, bound, q)
		if len(want) < 200 {
			t.Fatalf("%d rows of %s, want every record's", len(want), q)
		}
		if len(got) != len(want) {
			t.Fatalf("%d rows of %s, want %d", len(got), q, len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("row %d of %s:\n got %s\nwant %s", i, q, got[i], want[i])
			}
		}
	}
}

// dumpRows returns each row of query as its columns' Go types and values.
func dumpRows(t *testing.T, d *store.DB, query string) []string {
	t.Helper()
	rows, err := d.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		for i, v := range vals {
			fmt.Fprintf(&sb, "%s=%T(%q) ", cols[i], v, fmt.Sprint(v))
		}
		out = append(out, sb.String())
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
