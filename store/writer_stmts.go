package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"
)

// writerStmts are the statements the usage writer runs on every batch
// (execCached), prepared once on its SQLite connection's driver connection
// and run there with driver arguments directly.
//
// Through database/sql each statement took the transaction's copy of the
// pool's statement (Tx.StmtContext) and converted and checked every
// argument (driverArgsConnLocked: a Valuer probe, the driver's checker,
// driver.DefaultParameterConverter) into a new []driver.NamedValue. The
// writer's values are the driver's types already but for an int now and
// then, converted here as database/sql converts it, so running the
// statements directly spares every argument that work and its copy.
//
// The statements belong to one driver connection: usageWriter drops them
// when it opens another and closes them before it discards the one they
// were prepared on, as database/sql closes its own before closing a
// connection.
type writerStmts struct {
	stmts map[string]writerStmt // by query as written
	args  []driver.NamedValue   // see namedValues
}

// writerStmt is a statement prepared on the writer's driver connection.
type writerStmt struct {
	driver.Stmt
	exec driver.StmtExecContext // Stmt's
}

// exec runs query, prepared on dc on first use, with args and returns how
// many rows it changed. dc is the writer's driver connection, held (see
// usageWriter.exec).
func (w *writerStmts) exec(ctx context.Context, dc any, query string, args []any) (int64, error) {
	s, ok := w.stmts[query]
	if !ok {
		var err error
		if s, err = w.prepare(ctx, dc, query); err != nil {
			return 0, err
		}
	}
	if want := s.NumInput(); want >= 0 && want != len(args) {
		return 0, fmt.Errorf("sql: expected %d arguments, got %d", want, len(args))
	}
	nv := w.namedValues(len(args))
	for i, a := range args {
		switch a.(type) {
		case string, int64, nil, bool, []byte, float64, time.Time:
			// The driver's own types, as most of the writer's are.
		default:
			v, err := driverValue(a)
			if err != nil {
				return 0, fmt.Errorf("sql: converting argument $%d type: %w", i+1, err)
			}
			a = v
		}
		nv[i].Value = a
	}
	res, err := s.exec.ExecContext(ctx, nv)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// namedValues returns n arguments numbered 1 to n, to set the values of.
// They are kept from one statement to the next rather than allocated for
// each, as database/sql did; a statement's values are its batch's, which
// the batch's end forgets (forgetValues).
func (w *writerStmts) namedValues(n int) []driver.NamedValue {
	for i := len(w.args); i < n; i++ {
		w.args = append(w.args, driver.NamedValue{Ordinal: i + 1})
	}
	return w.args[:n]
}

// forgetValues drops the arguments' values, keeping their slots.
func (w *writerStmts) forgetValues() {
	for i := range w.args {
		w.args[i].Value = nil
	}
}

// prepare prepares query on dc and keeps it.
func (w *writerStmts) prepare(ctx context.Context, dc any, query string) (writerStmt, error) {
	pc, ok := dc.(driver.ConnPrepareContext)
	if !ok {
		return writerStmt{}, fmt.Errorf("prepare: driver connection %T cannot prepare with a context", dc)
	}
	st, err := pc.PrepareContext(ctx, query)
	if err != nil {
		return writerStmt{}, fmt.Errorf("prepare: %w", err)
	}
	exec, ok := st.(driver.StmtExecContext)
	if !ok {
		return writerStmt{}, errors.Join(fmt.Errorf("prepare: driver statement %T cannot execute with a context", st), st.Close())
	}
	if w.stmts == nil {
		w.stmts = make(map[string]writerStmt)
	}
	s := writerStmt{Stmt: st, exec: exec}
	w.stmts[query] = s
	return s, nil
}

// close closes every statement, on the driver connection they were
// prepared on, held by the caller, and forgets them.
func (w *writerStmts) close() error {
	var errs []error
	for _, s := range w.stmts {
		errs = append(errs, s.Close())
	}
	*w = writerStmts{}
	return errors.Join(errs...)
}

// driverValue is a, not one of the driver's value types, as database/sql
// passes it to the driver: an int as int64, the rest through
// driver.DefaultParameterConverter (a driver.Valuer's value, other
// integers and floats, pointers), which the SQLite driver leaves to
// database/sql, having no converter or checker of its own.
func driverValue(a any) (driver.Value, error) {
	if v, ok := a.(int); ok {
		return int64(v), nil
	}
	return driver.DefaultParameterConverter.ConvertValue(a)
}

// writerTx is a transaction of the usage writer as a conn's querier: the
// conn's other statements run in the transaction through database/sql,
// and execCached runs the cached ones on the writer's statements.
type writerTx struct {
	*sql.Tx
	w *usageWriter
}
