package store_test

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
	"github.com/tollgate-dev/tollgate/trace"
)

// The store's suites run once per engine: on a fresh SQLite file always,
// and on a fresh PostgreSQL schema when TOLLGATE_TEST_PG_DSN is set (the
// postgres subtests say so when they skip). Both engines must pass the
// same assertions; that is what keeps them interchangeable.

// forEachStore runs fn as a subtest per engine with a fresh store.
func forEachStore(t *testing.T, fn func(t *testing.T, db *store.DB)) {
	t.Helper()
	storetest.ForEach(t, fn)
}

// forEachStoreConfig runs fn as a subtest per engine with the
// configuration of a fresh store, for tests that open it themselves.
func forEachStoreConfig(t *testing.T, fn func(t *testing.T, cfg config.Store)) {
	t.Helper()
	storetest.ForEachConfig(t, fn)
}

func TestEngines(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		if want := t.Name()[strings.LastIndexByte(t.Name(), '/')+1:]; db.Engine() != want {
			t.Fatalf("store on %s, want %s", db.Engine(), want)
		}
	})
}

func TestOpenRejectsUnknownDriver(t *testing.T) {
	tests := []struct {
		name string
		cfg  config.Store
	}{
		{"unknown driver", config.Store{Driver: "mysql"}},
		{"postgres without a dsn", config.Store{Driver: "postgres"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if db, err := store.Open(context.Background(), tt.cfg); err == nil {
				db.Close()
				t.Fatal("Open = nil error, want one")
			}
		})
	}
}

// TestConcurrentOpenMigratesOnce starts five replicas at once on one
// fresh PostgreSQL schema: the advisory lock makes one migrate while the
// others wait, then find every migration recorded.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	cfg := storetest.Config(t, storetest.Postgres)
	ctx := context.Background()
	const replicas = 5
	dbs := make([]*store.DB, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { dbs[i], errs[i] = store.Open(ctx, cfg) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: Open: %v", i, err)
			continue
		}
		t.Cleanup(func() { dbs[i].Close() })
	}
	if t.Failed() {
		t.FailNow()
	}
	rows := map[string]int{}
	for component := range store.Migrations() {
		var n, dup int
		if err := dbs[0].QueryRow(ctx, `SELECT COUNT(*), COUNT(*) - COUNT(DISTINCT version)
			FROM schema_migrations WHERE component = ?`, component).Scan(&n, &dup); err != nil {
			t.Fatal(err)
		}
		if dup != 0 {
			t.Errorf("%s: %d duplicate versions", component, dup)
		}
		rows[component] = n
	}
	if want := store.Migrations(); !reflect.DeepEqual(rows, want) {
		t.Errorf("schema_migrations rows per component = %v, want %v", rows, want)
	}
}

// TestPutOpVersionConcurrent publishes one op from several goroutines at
// once: new code takes distinct, consecutive version indexes, and the same
// code the same version. On PostgreSQL this is the unique-violation retry
// at work.
func TestPutOpVersionConcurrent(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p, err := db.EnsureProject(ctx, "acme", "ops")
		if err != nil {
			t.Fatal(err)
		}
		const publishers = 8
		var wg sync.WaitGroup
		versions := make([]int, publishers)
		same := make([]int, publishers)
		errs := make([]error, 2*publishers)
		for i := range publishers {
			wg.Go(func() {
				op, err := db.PutOpVersion(ctx, p.ID, "op", fmt.Sprintf("def f(): return %d", i), callT0)
				versions[i], errs[i] = op.VersionIndex, err
			})
			wg.Go(func() {
				op, err := db.PutOpVersion(ctx, p.ID, "shared", "def g(): pass", callT0)
				same[i], errs[publishers+i] = op.VersionIndex, err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("publisher %d: %v", i, err)
			}
		}
		sort.Ints(versions)
		for i, v := range versions {
			if v != i {
				t.Fatalf("version indexes = %v, want 0..%d each once", versions, publishers-1)
			}
		}
		for _, v := range same {
			if v != 0 {
				t.Fatalf("same code got versions %v, want all 0", same)
			}
		}
	})
}

// TestInsertRecordsConcurrentNewProjects runs writers that create the same
// new projects at once, in opposite record orders, as replicas of one
// gateway do: none may fail (on PostgreSQL, none may deadlock). Each round
// has projects of its own, so that every round creates them.
func TestInsertRecordsConcurrentNewProjects(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		const rounds, writers, projects = 10, 6, 6
		for round := range rounds {
			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make([]error, writers)
			for w := range writers {
				wg.Go(func() {
					var recs []accounting.Record
					for i := range projects {
						if w%2 == 1 {
							i = projects - 1 - i
						}
						name := fmt.Sprintf("r%d-p%d", round, i)
						recs = append(recs, usageRec(fmt.Sprintf("w%d-%s", w, name), "acme", name, "m", "k", usageT0, 1, 1, 0))
					}
					<-start
					errs[w] = db.InsertRecords(ctx, recs)
				})
			}
			close(start)
			wg.Wait()
			for w, err := range errs {
				if err != nil {
					t.Fatalf("round %d, writer %d: %v", round, w, err)
				}
			}
		}
		for round := range rounds {
			for i := range projects {
				name := fmt.Sprintf("r%d-p%d", round, i)
				p, err := db.FindProject(ctx, "acme", name)
				if err != nil {
					t.Fatalf("project %s: %v", name, err)
				}
				var n int
				if err := db.QueryRow(ctx, `SELECT COUNT(*) FROM calls WHERE project_id = ?`, p.ID).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != writers {
					t.Errorf("project %s has %d calls, want %d", name, n, writers)
				}
			}
		}
	})
}

func TestRebind(t *testing.T) {
	tests := []struct {
		name, engine, in, want string
	}{
		{"sqlite keeps ?", storetest.SQLite, `a = ? AND b = ?`, `a = ? AND b = ?`},
		{"postgres numbers", storetest.Postgres, `a = ? AND b IN (?, ?)`, `a = $1 AND b IN ($2, $3)`},
		{"quoted ? is not a placeholder", storetest.Postgres, `f(x, '$.** ? (@ == $r)', ?) AND "q?" = ?`, `f(x, '$.** ? (@ == $r)', $1) AND "q?" = $2`},
		{"doubled quotes", storetest.Postgres, `'it''s ?' = ?`, `'it''s ?' = $1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := store.Rebind(tt.engine, tt.in); got != tt.want {
				t.Fatalf("rebind(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestFinishCallConcurrent finishes one run from several goroutines, each
// merging its own summary key: none may be lost.
func TestFinishCallConcurrent(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		p := fixture(t, db)
		const finishers = 6
		var wg sync.WaitGroup
		errs := make([]error, finishers)
		for i := range finishers {
			wg.Go(func() {
				errs[i] = db.FinishCall(ctx, p.ID, "c2", "Evaluation.evaluate", callT0.Add(time.Duration(i+1)*time.Second),
					[]byte(fmt.Sprintf(`{"k%d":%d}`, i, i)), nil)
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("finisher %d: %v", i, err)
			}
		}
		c, err := db.ReadCall(ctx, p.ID, "c2")
		if err != nil {
			t.Fatal(err)
		}
		for i := range finishers {
			if !strings.Contains(string(c.Summary), fmt.Sprintf(`"k%d":%d`, i, i)) {
				t.Errorf("summary %s lost k%d", c.Summary, i)
			}
		}
	})
}

// TestQueryEdgeCases holds the corners where SQLite's dynamic typing and
// PostgreSQL's typed compiler could part: both engines must agree.
func TestQueryEdgeCases(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		p := fixture(t, db)
		tests := []struct {
			name string
			q    trace.CallsQuery
			want []string
		}{
			{"$gt on a JSON string", where(cmp(trace.OpGt, field("inputs", "msg"), lit("A"))), []string{"c1"}},
			{"$lt on a JSON string, numbers excluded", where(cmp(trace.OpLt, field("attributes", "name"), lit("B"))), []string{"c1"}},
			{"$lt with the literal first", where(cmp(trace.OpLt, lit("B"), field("attributes", "name"))), []string{}},
			{"$convert double of text without a number", where(cmp(trace.OpEq, trace.Convert{Input: field("attributes", "name"), To: trace.ToDouble}, lit(int64(0)))), []string{"c1"}},
			{"$convert int across kinds", where(cmp(trace.OpLt, trace.Convert{Input: field("attributes", "n"), To: trace.ToInt}, lit(int64(8)))), []string{"c1", "c3"}},
			{"$in across kinds", where(trace.InOp{Left: field("attributes", "n"), Values: []trace.Operand{lit(int64(3)), lit("7")}}), []string{"c1", "c3"}},
			{"$in on a column", where(trace.InOp{Left: field("op_name"), Values: []trace.Operand{lit("Evaluation.evaluate"), lit(int64(1))}}), []string{"c2"}},
			{"$eq on a nested number", where(cmp(trace.OpEq, field("summary", "usage", "m", "total_tokens"), lit(int64(5)))), []string{"c3"}},
			{"$contains on a number's text", where(trace.ContainsOp{Input: field("attributes", "n"), Substr: lit("1")}), []string{"c2"}},
			{"$not of a missing document", where(trace.NotOp{Operand: field("output")}), []string{"c2"}},
			{"$gt on a column with a number is false", where(cmp(trace.OpGt, field("id"), lit(int64(0)))), []string{}},
			{"sort nulls first ascending", trace.CallsQuery{Limit: -1, SortBy: []trace.SortBy{{Field: field("ended_at")}}}, []string{"c2", "c1", "c3"}},
			{"sort nulls last descending", trace.CallsQuery{Limit: -1, SortBy: []trace.SortBy{{Field: field("display_name"), Desc: true}}}, []string{"c3", "c1", "c2"}},
			{"sort a JSON field ascending", trace.CallsQuery{Limit: -1, SortBy: []trace.SortBy{{Field: field("attributes", "flag")}}}, []string{"c3", "c2", "c1"}},
			{"newest first, as the evaluation runs listing", trace.CallsQuery{Limit: 2, SortBy: []trace.SortBy{
				{Field: field("started_at"), Desc: true}, {Field: field("id"), Desc: true},
			}}, []string{"c3", "c2"}},
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

func where(expr trace.Operand) trace.CallsQuery {
	return trace.CallsQuery{Query: &trace.Query{Expr: expr}, Limit: -1}
}
