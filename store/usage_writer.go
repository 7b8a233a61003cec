package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
)

// usageWriter is the SQLite connection InsertRecords writes on, kept out
// of the pool with foreign-key checks off.
//
// Every calls row and link a batch inserts names a project that
// ensureRecordProjects looked up or created in the same transaction, so
// their foreign-key probes into projects could never fail, and this
// connection spares every row its probe. PRAGMA foreign_keys
// is a connection's, cannot change inside a transaction, and expires the
// connection's prepared statements when it changes, so the writer keeps a
// connection of its own with checks off rather than turning them off
// around each batch. Every other statement, on the pool, keeps them on:
// the connection never goes back to the pool (close discards it).
//
// PostgreSQL checks each foreign key in the server, by an index probe
// that a session cannot skip without superuser rights; its writer uses
// the pool.
type usageWriter struct {
	db *sql.DB
	// mu is held from begin until the transaction has ended, so that one
	// batch at a time uses conn and stmts.
	mu   sync.Mutex
	conn *sql.Conn // nil until the first batch, and after it failed
	// stmts are the statements every batch runs, prepared on conn's
	// driver connection (writer_stmts.go); empty while conn is nil.
	stmts writerStmts
}

// begin starts a transaction on the writer's connection, opening it
// first if need be. The caller ends the transaction, then calls done.
func (w *usageWriter) begin(ctx context.Context) (*sql.Tx, func(), error) {
	w.mu.Lock()
	if w.conn == nil {
		c, err := w.db.Conn(ctx)
		if err != nil {
			w.mu.Unlock()
			return nil, nil, fmt.Errorf("usage writer: %w", err)
		}
		w.conn = c
		if _, err := c.ExecContext(ctx, `PRAGMA foreign_keys = OFF`); err != nil {
			err = errors.Join(fmt.Errorf("usage writer: %w", err), w.discard())
			w.mu.Unlock()
			return nil, nil, err
		}
	}
	tx, err := w.conn.BeginTx(ctx, nil)
	if err != nil {
		// The connection may be broken: the next batch opens another.
		err = errors.Join(err, w.discard())
		w.mu.Unlock()
		return nil, nil, err
	}
	return tx, w.done, nil
}

// done ends begin's hold on the writer. The statements' arguments let go
// of the batch's values, which would otherwise stay reachable until the
// next batch: its rows' text, a whole batch's worth of heap.
func (w *usageWriter) done() {
	w.stmts.forgetValues()
	w.mu.Unlock()
}

// exec runs query, one of the statements every batch runs, with args in
// the transaction begin started, on the writer's statements, and returns
// how many rows it changed.
func (w *usageWriter) exec(ctx context.Context, query string, args []any) (int64, error) {
	var n int64
	err := w.conn.Raw(func(dc any) error {
		// database/sql rolls back a transaction whose context has ended,
		// on a goroutine of its own, and the statement would then run on
		// its own, outside of any transaction. The rollback waits for dc,
		// which Raw holds: if the context is live now, the transaction
		// outlasts the statement.
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		n, err = w.stmts.exec(ctx, dc, query, args)
		if errors.Is(err, driver.ErrBadConn) {
			// Raw closes dc: its statements go first.
			err = errors.Join(err, w.stmts.close())
		}
		return err
	})
	return n, err
}

// close discards the writer's connection; the DB closes its pool after.
func (w *usageWriter) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		return nil
	}
	return w.discard()
}

// discard closes the writer's statements and then its driver connection,
// rather than returning the connection to the pool, where a connection
// with foreign-key checks off must never serve another statement.
func (w *usageWriter) discard() error {
	c := w.conn
	w.conn = nil
	var stmtsErr error
	// Raw closes the connection when its function reports it bad; Close
	// then has nothing left to do.
	err := c.Raw(func(any) error {
		stmtsErr = w.stmts.close()
		return driver.ErrBadConn
	})
	// On a connection database/sql closed already (after a
	// driver.ErrBadConn from a transaction's own statement, which the
	// SQLite driver does not return) the statements can no longer be
	// closed; they are dropped.
	w.stmts = writerStmts{}
	if !errors.Is(err, driver.ErrBadConn) {
		return errors.Join(stmtsErr, err, c.Close())
	}
	return stmtsErr
}

// beginRecords starts InsertRecords' transaction: on SQLite on the usage
// writer's connection, on PostgreSQL on the pool. The caller ends the
// transaction, then calls done. On SQLite the conn runs cached statements
// on the writer's own (writerTx).
func (d *DB) beginRecords(ctx context.Context) (*sql.Tx, conn, func(), error) {
	if d.writer == nil {
		tx, c, err := d.begin(ctx)
		return tx, c, func() {}, err
	}
	tx, done, err := d.writer.begin(ctx)
	if err != nil {
		return nil, conn{}, nil, err
	}
	return tx, conn{q: &writerTx{Tx: tx, w: d.writer}, d: d.dialect, tx: tx, stmts: d.stmts}, done, nil
}
