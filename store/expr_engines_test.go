package store_test

import (
	"reflect"
	"testing"

	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/trace"
)

// TestQueryJSONBooleansByEngine pins the one $expr edge on which the
// engines' compilers differ (see store/expr.go): both select a JSON
// boolean by a boolean literal, and SQLite, which reads JSON booleans as 0
// and 1, also selects true by 1 and false by 0, where PostgreSQL's jsonb
// does not. A change to either compiler that moves this edge shows here.
func TestQueryJSONBooleansByEngine(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		p := fixture(t, db)
		onSQLiteOnly := func(ids ...string) []string {
			if db.Engine() == "sqlite" {
				return ids
			}
			return []string{}
		}
		tests := []struct {
			name string
			q    trace.CallsQuery
			want []string
		}{
			{"true by true", where(cmp(trace.OpEq, field("attributes", "flag"), lit(true))), []string{"c1"}},
			{"false by false", where(cmp(trace.OpEq, field("attributes", "flag"), lit(false))), []string{"c2"}},
			{"true by 1", where(cmp(trace.OpEq, field("attributes", "flag"), lit(int64(1)))), onSQLiteOnly("c1")},
			{"false by 0", where(cmp(trace.OpEq, field("attributes", "flag"), lit(int64(0)))), onSQLiteOnly("c2")},
			{"$convert to bool agrees", where(cmp(trace.OpEq, trace.Convert{Input: field("attributes", "flag"), To: trace.ToBool}, lit(true))), []string{"c1"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if got := selectIDs(t, db, p, tt.q); !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("%s: got %v, want %v", db.Engine(), got, tt.want)
				}
			})
		}
	})
}
