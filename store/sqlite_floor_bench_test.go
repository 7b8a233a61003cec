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
// with the store's own connection settings) costs per request for rows
// shaped as the usage writer's, with none of the store's code around it:
// the arguments are made before the CPU clock runs, and each level adds
// one part of what the writer stores, in 512-row transactions of 64-row
// statements as the writer's. It is the floor under BenchmarkInsertRecords
// (which BENCHMARKS.md compares it with): what a row per request costs on
// this engine whatever code writes it.
//
//   - row: the gateway call's columns in a table with no key;
//   - +key: the calls table's primary key (project_id, id);
//   - +indexes: the four indexes the trace queries read by;
//   - +link: the Weave fold's link, a second row in a table of its own.
func BenchmarkSQLiteFloor(b *testing.B) {
	const callsCols = `project_id INTEGER NOT NULL, id TEXT NOT NULL, op_name TEXT NOT NULL,
		trace_id TEXT NOT NULL, parent_id TEXT, started_at TEXT NOT NULL, ended_at TEXT,
		attributes TEXT NOT NULL, inputs TEXT NOT NULL, summary TEXT NOT NULL, svc_user_id TEXT`
	indexes := []string{
		`CREATE INDEX floor_trace ON floor_calls (project_id, trace_id)`,
		`CREATE INDEX floor_parent ON floor_calls (project_id, parent_id)`,
		`CREATE INDEX floor_op ON floor_calls (project_id, op_name)`,
		`CREATE INDEX floor_started ON floor_calls (project_id, started_at)`,
	}
	link := []string{
		`CREATE TABLE floor_links (entity TEXT NOT NULL, created INTEGER NOT NULL, completion_id TEXT NOT NULL,
			project_id INTEGER NOT NULL, call_id TEXT NOT NULL, sdk INTEGER NOT NULL,
			PRIMARY KEY (entity, created, completion_id))`,
		`CREATE INDEX floor_links_call ON floor_links (project_id, call_id)`,
	}
	withKey := `CREATE TABLE floor_calls (` + callsCols + `, PRIMARY KEY (project_id, id))`
	levels := []struct {
		name   string
		schema []string
		link   bool
	}{
		{"row", []string{`CREATE TABLE floor_calls (` + callsCols + `)`}, false},
		{"+key", []string{withKey}, false},
		{"+indexes", append([]string{withKey}, indexes...), false},
		{"+link", append(append([]string{withKey}, indexes...), link...), true},
	}
	for _, lv := range levels {
		b.Run(lv.name, func(b *testing.B) {
			d := storetest.OpenEngine(b, storetest.SQLite)
			db := store.SQLDB(d)
			ctx := context.Background()
			for _, s := range lv.schema {
				if _, err := db.ExecContext(ctx, s); err != nil {
					b.Fatal(err)
				}
			}
			const batch, perStatement = 512, 64
			insertCalls, err := db.PrepareContext(ctx, valuesInsert(`INSERT INTO floor_calls (project_id, id, op_name, trace_id,
				parent_id, started_at, ended_at, attributes, inputs, summary, svc_user_id) VALUES `, 11, perStatement))
			if err != nil {
				b.Fatal(err)
			}
			var insertLinks *sql.Stmt
			if lv.link {
				insertLinks, err = db.PrepareContext(ctx, valuesInsert(`INSERT INTO floor_links (entity, created, completion_id,
					project_id, call_id, sdk) VALUES `, 6, perStatement))
				if err != nil {
					b.Fatal(err)
				}
			}
			calls := make([][]any, batch/perStatement)
			links := make([][]any, batch/perStatement)
			n := 0
			var spent time.Duration
			for b.Loop() {
				for s := range calls {
					calls[s], links[s] = calls[s][:0], links[s][:0]
					for range perStatement {
						n++
						id := uuid.Must(uuid.NewV7()).String()
						started := usageT0.Add(time.Duration(n) * time.Millisecond)
						completion := fmt.Sprintf("chatcmpl-%016x%016x", rand.Uint64(), rand.Uint64())
						calls[s] = append(calls[s], 1, id, "openai.chat.completions.create", id, nil,
							started.Format("2006-01-02T15:04:05.000000Z"), started.Add(40*time.Millisecond).Format("2006-01-02T15:04:05.000000Z"),
							`{"request_id":"`+id+`","key_name":"bench","backend":"mock-fast","status":200,"stream":false,"incomplete":false,"served_model":"bench","completion_id":"`+completion+`"}`,
							"{}", `{"usage":{"bench":{"requests":1,"prompt_tokens":800,"completion_tokens":200,"total_tokens":1000,"cache_read_input_tokens":0}}}`, "bench")
						links[s] = append(links[s], "acme", started.Unix(), completion, 1, id, false)
					}
				}
				cpu0 := processCPU(b)
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				for s := range calls {
					if _, err := tx.StmtContext(ctx, insertCalls).ExecContext(ctx, calls[s]...); err != nil {
						b.Fatal(err)
					}
					if lv.link {
						if _, err := tx.StmtContext(ctx, insertLinks).ExecContext(ctx, links[s]...); err != nil {
							b.Fatal(err)
						}
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
				spent += processCPU(b) - cpu0
			}
			b.ReportMetric(float64(spent)/float64(b.N*batch), "cpu-ns/row")
		})
	}
}

// valuesInsert is head followed by rows groups of cols placeholders.
func valuesInsert(head string, cols, rows int) string {
	row := "(" + strings.TrimSuffix(strings.Repeat("?, ", cols), ", ") + ")"
	return head + strings.TrimSuffix(strings.Repeat(row+", ", rows), ", ")
}
