package store

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"
	"strings"
)

// rowsPerInsert is how many rows one INSERT statement of a batch carries.
// One statement per row spends much of its time outside the B-tree work
// that is the point of it: database/sql's locking and argument checks, and
// SQLite's per-statement start and halt; on PostgreSQL, a round trip per
// row. In BenchmarkInsertRecords, 64 rows per statement cut the writer's
// CPU per record by about 30 % on SQLite and by about 70 % on PostgreSQL.
// 64 rows of the widest table (usage_rollup, 14 columns) are 896
// parameters, far below the limits of SQLite (32,766) and PostgreSQL
// (65,535).
const rowsPerInsert = 64

// multiRowInsert is an INSERT of several rows in one statement:
// head + "(?, ..., ?), (?, ..., ?)" + tail, with cols placeholders a row.
type multiRowInsert struct {
	head string // "INSERT INTO t (a, b) VALUES "
	cols int
	tail string // " ON CONFLICT ... DO NOTHING", or ""
}

// sql returns the statement for rows rows.
func (m multiRowInsert) sql(rows int) string {
	row := "(" + strings.TrimSuffix(strings.Repeat("?, ", m.cols), ", ") + ")"
	var sb strings.Builder
	sb.Grow(len(m.head) + rows*(len(row)+2) + len(m.tail))
	sb.WriteString(m.head)
	for i := range rows {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(row)
	}
	sb.WriteString(m.tail)
	return sb.String()
}

// exec inserts n rows: rowsPerInsert at a time, then the rest in
// statements of 32, 16, ..., 1 rows as its binary digits say (37 rows are
// 32 + 4 + 1). So a batch runs at most seven statement shapes per table,
// each prepared once for the life of the DB (conn.cached) instead of
// compiled again for every batch. appendRow appends the cols arguments of
// row i to args and returns the result.
func (m multiRowInsert) exec(ctx context.Context, c conn, n int, appendRow func(args []any, i int) ([]any, error)) error {
	return m.each(n, appendRow, func(_, rows int, args []any) error {
		_, err := m.execRows(ctx, c, rows, args)
		yieldBetweenStatements()
		return err
	})
}

// yieldBetweenStatements lets the goroutines waiting for a processor run
// before the usage writer's next statement. A 512-record batch is several
// milliseconds of CPU in statements of up to 64 rows; without a yield it
// keeps one of the scheduler's processors (two on a 2-core machine) for all
// of them, and requests arriving meanwhile queue for the other: in three
// alternated tollbench runs at 2,000 requests/s the gateway's added p99
// was 1.22-1.53 ms without it and 0.37-0.72 ms with it, CPU per request
// unchanged within noise.
func yieldBetweenStatements() { runtime.Gosched() }

// each splits n rows into statements as exec says and calls run with the
// first row, the row count and the arguments of each.
func (m multiRowInsert) each(n int, appendRow func(args []any, i int) ([]any, error), run func(first, rows int, args []any) error) error {
	args := make([]any, 0, min(n, rowsPerInsert)*m.cols)
	for start := 0; start < n; {
		rows := min(rowsPerInsert, 1<<(bits.Len(uint(n-start))-1))
		args = args[:0]
		for i := start; i < start+rows; i++ {
			var err error
			if args, err = appendRow(args, i); err != nil {
				return err
			}
		}
		if len(args) != rows*m.cols {
			return fmt.Errorf("rows %d to %d: %d arguments, want %d", start, start+rows-1, len(args), rows*m.cols)
		}
		if err := run(start, rows, args); err != nil {
			return fmt.Errorf("rows %d to %d: %w", start, start+rows-1, err)
		}
		start += rows
	}
	return nil
}

// execRows runs the statement for rows rows with args and returns how
// many rows it inserted (ON CONFLICT DO NOTHING skips the others).
func (m multiRowInsert) execRows(ctx context.Context, c conn, rows int, args []any) (int64, error) {
	stmt, err := c.cached(ctx, m.sql(rows))
	if err != nil {
		return 0, err
	}
	defer stmt.Close()
	res, err := stmt.ExecContext(ctx, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
