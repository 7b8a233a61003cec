package store

import (
	"context"
	"database/sql"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
)

// Hooks for the store_test package, which runs the suites on both engines
// through storetest (which imports store, so the suites cannot live in
// package store).

// Engine is the DB's engine, "sqlite" or "postgres".
func (d *DB) Engine() string { return d.dialect.String() }

// QueryRow runs a query written with ? placeholders on either engine.
func (d *DB) QueryRow(ctx context.Context, query string, args ...any) *sql.Row {
	return d.conn().queryRow(ctx, query, args...)
}

// Query runs a query written with ? placeholders on either engine.
func (d *DB) Query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return d.conn().query(ctx, query, args...)
}

// Begin starts a transaction.
func (d *DB) Begin(ctx context.Context) (*sql.Tx, error) { return d.db.BeginTx(ctx, nil) }

// TxExec runs a statement written with ? placeholders in tx.
func (d *DB) TxExec(ctx context.Context, tx *sql.Tx, query string, args ...any) error {
	_, err := conn{q: tx, d: d.dialect}.exec(ctx, query, args...)
	return err
}

// InsertGatewayCalls records recs as trace calls only, in one transaction,
// as InsertRecords does.
func (d *DB) InsertGatewayCalls(ctx context.Context, recs []accounting.Record) error {
	return d.insertGatewayCalls(ctx, recs, d.dialect == dialectSQLite)
}

// InsertGatewayCallsBound is InsertGatewayCalls binding every value of
// every row, as before SQLite's statements numbered their parameters.
func (d *DB) InsertGatewayCallsBound(ctx context.Context, recs []accounting.Record) error {
	return d.insertGatewayCalls(ctx, recs, false)
}

func (d *DB) insertGatewayCalls(ctx context.Context, recs []accounting.Record, numbered bool) error {
	if err := fillCallIDs(recs); err != nil {
		return err
	}
	tx, c, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := insertGatewayCalls(ctx, c, recs, numbered); err != nil {
		return err
	}
	return tx.Commit()
}

// AppendTraceTime is appendTraceTime.
func AppendTraceTime(b []byte, t time.Time) []byte { return appendTraceTime(b, t) }

// Migrations counts the migrations of each component.
func Migrations() map[string]int {
	n := make(map[string]int)
	for _, m := range allMigrations() {
		n[m.component]++
	}
	return n
}

// Rebind is the placeholder rewriting of the engine named.
func Rebind(engine, query string) string {
	if engine == "postgres" {
		return dialectPostgres.rebind(query)
	}
	return dialectSQLite.rebind(query)
}
