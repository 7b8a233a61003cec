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
// several.
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
	})
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
