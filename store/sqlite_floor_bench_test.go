package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// BenchmarkSQLiteFloor measures what SQLite itself (modernc.org/sqlite,
// with the store's own connection settings) costs per request to store
// rows shaped as the usage writer's, with none of the store's code and no
// argument binding: each batch's rows wait in staging tables filled before
// the CPU clock runs, and the measured transaction copies them with one
// INSERT ... SELECT per table, as the writer's 512-record transactions
// would if binding were free. Each level adds one part of what the writer
// stores:
//
//   - row: the gateway call's columns in a table with no key;
//   - +key: the calls table's primary key (project_id, id);
//   - +indexes: the four indexes the trace queries read by;
//   - +link: the Weave fold's link, a row in a table of its own.
//
// Set beside BenchmarkInsertRecords' cpu-ns/record, the difference is
// what the writer spends outside SQLite's own work: binding the values
// of each row, database/sql, and building the rows (BENCHMARKS.md).
func BenchmarkSQLiteFloor(b *testing.B) {
	const callsCols = `project_id INTEGER NOT NULL, id TEXT NOT NULL, op_name TEXT NOT NULL,
		trace_id TEXT NOT NULL, parent_id TEXT, started_at TEXT NOT NULL, ended_at TEXT,
		attributes TEXT NOT NULL, inputs TEXT NOT NULL, summary TEXT NOT NULL, svc_user_id TEXT`
	const linkCols = `entity TEXT NOT NULL, created INTEGER NOT NULL, completion_id TEXT NOT NULL,
		project_id INTEGER NOT NULL, call_id TEXT NOT NULL, sdk INTEGER NOT NULL`
	withKey := `CREATE TABLE floor_calls (` + callsCols + `, PRIMARY KEY (project_id, id))`
	indexes := []string{
		`CREATE INDEX floor_trace ON floor_calls (project_id, trace_id)`,
		`CREATE INDEX floor_parent ON floor_calls (project_id, parent_id)`,
		`CREATE INDEX floor_op ON floor_calls (project_id, op_name)`,
		`CREATE INDEX floor_started ON floor_calls (project_id, started_at)`,
	}
	links := `CREATE TABLE floor_links (` + linkCols + `, PRIMARY KEY (entity, created, completion_id))`
	levels := []struct {
		name   string
		schema []string
		link   bool
	}{
		{"row", []string{`CREATE TABLE floor_calls (` + callsCols + `)`}, false},
		{"+key", []string{withKey}, false},
		{"+indexes", append([]string{withKey}, indexes...), false},
		{"+link", append(append([]string{withKey}, indexes...), links), true},
	}
	for _, lv := range levels {
		b.Run(lv.name, func(b *testing.B) {
			ctx := context.Background()
			// One connection: the staging tables are TEMP, the
			// connection's own, kept in memory (temp_store).
			c, err := store.SQLDB(storetest.OpenEngine(b, storetest.SQLite)).Conn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			schema := append(lv.schema,
				`CREATE TEMP TABLE staging_calls (`+callsCols+`)`,
				`CREATE TEMP TABLE staging_links (`+linkCols+`)`)
			for _, s := range schema {
				if _, err := c.ExecContext(ctx, s); err != nil {
					b.Fatal(err)
				}
			}
			const batch, perStatement = 512, 64
			stageCalls, err := c.PrepareContext(ctx, valuesInsert(`INSERT INTO staging_calls (project_id, id, op_name, trace_id,
				parent_id, started_at, ended_at, attributes, inputs, summary, svc_user_id) VALUES `, 11, perStatement))
			if err != nil {
				b.Fatal(err)
			}
			stageLinks, err := c.PrepareContext(ctx, valuesInsert(`INSERT INTO staging_links (entity, created, completion_id,
				project_id, call_id, sdk) VALUES `, 6, perStatement))
			if err != nil {
				b.Fatal(err)
			}
			measured := []string{`INSERT INTO floor_calls SELECT * FROM staging_calls`}
			if lv.link {
				measured = append(measured, `INSERT INTO floor_links SELECT * FROM staging_links`)
			}
			n := 0
			var spent time.Duration
			for b.Loop() {
				for range batch / perStatement {
					n = stageRows(b, ctx, stageCalls, stageLinks, n, perStatement)
				}
				cpu0 := processCPU(b)
				tx, err := c.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				for _, s := range measured {
					if _, err := tx.ExecContext(ctx, s); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
				spent += processCPU(b) - cpu0
				for _, s := range []string{`DELETE FROM staging_calls`, `DELETE FROM staging_links`} {
					if _, err := c.ExecContext(ctx, s); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(spent)/float64(b.N*batch), "cpu-ns/row")
		})
	}
}

// stageRows stages rows calls and their links, numbered from n+1 and dated
// 1,000 a second as in BenchmarkInsertRecords, and returns the last number.
func stageRows(b *testing.B, ctx context.Context, calls, links *sql.Stmt, n, rows int) int {
	b.Helper()
	callArgs := make([]any, 0, rows*11)
	linkArgs := make([]any, 0, rows*6)
	for range rows {
		n++
		id := uuid.Must(uuid.NewV7()).String()
		started := usageT0.Add(time.Duration(n) * time.Millisecond)
		completion := fmt.Sprintf("chatcmpl-%016x%016x", rand.Uint64(), rand.Uint64())
		callArgs = append(callArgs, 1, id, "openai.chat.completions.create", id, nil,
			started.Format("2006-01-02T15:04:05.000000Z"), started.Add(40*time.Millisecond).Format("2006-01-02T15:04:05.000000Z"),
			`{"request_id":"`+id+`","key_name":"bench","backend":"mock-fast","status":200,"stream":false,"incomplete":false,"served_model":"bench","completion_id":"`+completion+`"}`,
			"{}", `{"usage":{"bench":{"requests":1,"prompt_tokens":800,"completion_tokens":200,"total_tokens":1000,"cache_read_input_tokens":0}}}`, "bench")
		linkArgs = append(linkArgs, "acme", started.Unix(), completion, 1, id, 0)
	}
	if _, err := calls.ExecContext(ctx, callArgs...); err != nil {
		b.Fatal(err)
	}
	if _, err := links.ExecContext(ctx, linkArgs...); err != nil {
		b.Fatal(err)
	}
	return n
}

// valuesInsert is head followed by rows groups of cols placeholders.
func valuesInsert(head string, cols, rows int) string {
	row := "(" + strings.TrimSuffix(strings.Repeat("?, ", cols), ", ") + ")"
	return head + strings.TrimSuffix(strings.Repeat(row+", ", rows), ", ")
}
