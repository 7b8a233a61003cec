package store

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
)

// rowsPerInsert is how many rows one INSERT statement of a batch carries.
// One statement per row spends much of its time outside the B-tree work
// that is the point of it: database/sql's locking and argument checks, and
// SQLite's per-statement start and halt; on PostgreSQL, a round trip per
// row. Carrying many rows a statement spreads those costs over them, on
// both engines (BenchmarkInsertRecords shows it).
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
// before the usage writer's next statement. A full batch is many
// statements of up to rowsPerInsert rows; without a yield the writer keeps
// one of the scheduler's processors (of two on a 2-core machine) for all
// of them, and requests arriving meanwhile queue for the other. In
// alternated tollbench runs the yield shortened the gateway's added p99
// and left its CPU per request as it was.
func yieldBetweenStatements() { runtime.Gosched() }

// each splits n rows into statements as exec says and calls run with the
// first row, the row count and the arguments of each.
func (m multiRowInsert) each(n int, appendRow func(args []any, i int) ([]any, error), run func(first, rows int, args []any) error) error {
	args := make([]any, 0, min(n, rowsPerInsert)*m.cols)
	for start := 0; start < n; {
		rows := statementRows(n - start)
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

// statementRows is how many of n rows left the next statement carries, as
// exec splits them.
func statementRows(n int) int {
	return min(rowsPerInsert, 1<<(bits.Len(uint(n))-1))
}

// execRows runs the statement for rows rows with args and returns how
// many rows it inserted (ON CONFLICT DO NOTHING skips the others).
func (m multiRowInsert) execRows(ctx context.Context, c conn, rows int, args []any) (int64, error) {
	return execCached(ctx, c, m.sql(rows), args)
}

// execCached runs query, cached (conn.cached), with args and returns how
// many rows it changed. In the SQLite usage writer's transaction it runs
// on the writer's own statements (writer_stmts.go).
func execCached(ctx context.Context, c conn, query string, args []any) (int64, error) {
	if wt, ok := c.q.(*writerTx); ok {
		return wt.w.exec(ctx, query, args)
	}
	stmt, err := c.cached(ctx, query)
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

// numberedRow is a VALUES row of a SQLite statement, one entry a column:
//   - "?", a value of the row's own, bound;
//   - "^k", the value of column k of the statement's first row, bound
//     there once for all of its rows;
//   - anything else, SQL written as is (a literal: NULL, '{}', 0).
//
// Every bound value costs modernc.org/sqlite a call into SQLite under the
// connection's mutex, and a text one a C copy, freed and unbound again
// after the statement; even a NULL pays the call. A value every row of
// the statement shares is written ?NNN after the first row, which SQLite
// reads as that parameter again; one the row always has is a literal. The
// values stored are the same as when each is bound.
//
// SQLite gives a plain ? the number after the largest so far, so a ?NNN
// may only name a parameter before it, as "^k" does. The driver binds the
// numbered ones by their number, the others in order: args are the row's
// "?" values, and the first row's "^k" ones, in column order (see values).
//
// No row refers to another value of its own (trace_id = id): the driver
// asks SQLite the name of every parameter it binds, which SQLite looks up
// in a list of the statement's numbered ones, so a name per row made each
// statement's binding quadratic in its rows (sqlite3VListNumToName), which
// cost more than it saved.
type numberedRow []string

// numberedInsert is a multiRowInsert on SQLite whose rows are row, with
// the statement of each count of rows multiRowInsert.exec runs (1, 2, 4,
// ..., rowsPerInsert) written once, rather than written out again, ?NNN
// and all, for every statement a batch runs. Each is written on first use
// rather than when the package is initialised: of the 20 row shapes and 7
// counts a gateway whose requests look alike runs a handful, and the rest
// would stay in the heap for the life of the process.
type numberedInsert struct {
	m    multiRowInsert
	row  numberedRow
	sqls [numberedCounts]atomic.Pointer[string] // by bits.Len(rows) - 1
}

// numberedCounts is how many counts of rows a numberedInsert has a
// statement for: 1, 2, 4, ..., rowsPerInsert.
const numberedCounts = 7

func newNumberedInsert(m multiRowInsert, row numberedRow) *numberedInsert {
	if len(row) != m.cols {
		panic(fmt.Sprintf("numberedInsert: %d columns, want %d", len(row), m.cols))
	}
	return &numberedInsert{m: m, row: row}
}

// sql returns the statement for rows rows, a power of two up to
// rowsPerInsert. Two callers writing the same statement at once store
// equal text, so either may win.
func (n *numberedInsert) sql(rows int) string {
	p := &n.sqls[bits.Len(uint(rows))-1]
	if s := p.Load(); s != nil {
		return *s
	}
	s := n.row.sql(n.m.head, rows, n.m.tail)
	p.Store(&s)
	return s
}

// sql returns head + rows rows + tail.
func (r numberedRow) sql(head string, rows int, tail string) string {
	var sb strings.Builder
	sb.WriteString(head)
	first := make([]int, len(r)) // the parameter of each of the first row's columns
	own := make([]int, len(r))
	n := 0
	for i := range rows {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteByte('(')
		for k, col := range r {
			if k > 0 {
				sb.WriteString(", ")
			}
			switch {
			case col == "?" || col[0] == '^' && i == 0:
				n++
				own[k] = n
				sb.WriteByte('?')
			case col[0] == '^':
				sb.WriteString("?" + strconv.Itoa(first[r.column(col)]))
			default:
				sb.WriteString(col)
			}
		}
		if i == 0 {
			copy(first, own)
		}
		sb.WriteByte(')')
	}
	sb.WriteString(tail)
	return sb.String()
}

// column is the column k of a "^k" entry.
func (numberedRow) column(col string) int {
	k, err := strconv.Atoi(col[1:])
	if err != nil {
		panic(fmt.Sprintf("numberedRow: bad column %q", col))
	}
	return k
}

// values appends to args the values of vals, a row's values by column,
// that r binds: its "?" columns, and its "^k" ones if first.
func (r numberedRow) values(args []any, vals []any, first bool) []any {
	for k, col := range r {
		if col == "?" || first && col[0] == '^' {
			args = append(args, vals[k])
		}
	}
	return args
}
