// Package store persists usage records and traces, in SQLite (the embedded
// default) or PostgreSQL. It implements the contracts of the domain
// packages accounting, trace and weave, and the usage API's store that admin
// defines where it consumes it; it imports no HTTP package.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// migration is one versioned schema step of one component. Versions of a
// component start at 1 and never change once released: a schema change is
// a new migration, never an edit of an old one. Each engine has its own
// statements for the same step, so that both schemas stay at the same
// version.
type migration struct {
	component string
	version   int
	sqlite    []string
	postgres  []string
}

func (m migration) stmts(d dialect) []string {
	if d == dialectPostgres {
		return m.postgres
	}
	return m.sqlite
}

// allMigrations are the migrations of every component, in the order they
// apply.
func allMigrations() []migration {
	return append(append(append(append(append(append([]migration{}, usageMigrations...), traceMigrations...), weaveMigrations...), responseOwnerMigrations...), orgMigrations...), priceMigrations...)
}

const createSchemaMigrations = `CREATE TABLE IF NOT EXISTS schema_migrations (
	component TEXT NOT NULL,
	version   INTEGER NOT NULL,
	PRIMARY KEY (component, version))`

// beginner is what *sql.DB and *sql.Conn share: a migration runs on the
// pool for SQLite and on the connection holding the lock for PostgreSQL.
type beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// migrateSQLite applies, in one transaction per migration, every migration
// not yet recorded in schema_migrations. Components (usage, traces) are
// versioned independently so that each can evolve on its own.
func migrateSQLite(ctx context.Context, db *sql.DB, migrations []migration) error {
	return migrate(ctx, db, dialectSQLite, migrations)
}

// migrateLockKey names, with the schema, the advisory lock migrations hold:
// stores in different schemas of one database migrate independently.
const migrateLockKey = `hashtextextended('tollgate.migrate:' || current_schema(), 0)`

// migratePostgres migrates as migrateSQLite does, holding a session
// advisory lock, so that replicas starting together migrate one at a time:
// the first applies the migrations, the others find them recorded. The
// lock is held on one connection, on which the migrations also run.
func migratePostgres(ctx context.Context, db *sql.DB, migrations []migration) (err error) {
	c, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, `SELECT pg_advisory_lock(`+migrateLockKey+`)`); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	defer func() {
		// Unlock even when ctx is done; if that fails too, the caller
		// closes the pool, and the session's end releases the lock.
		var ok bool
		uerr := c.QueryRowContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+migrateLockKey+`)`).Scan(&ok)
		if uerr == nil && !ok {
			uerr = errors.New("lock not held")
		}
		if uerr != nil && err == nil {
			err = fmt.Errorf("migrate: unlock: %w", uerr)
		}
	}()
	return migrate(ctx, c, dialectPostgres, migrations)
}

func migrate(ctx context.Context, db beginner, d dialect, migrations []migration) error {
	if _, err := db.ExecContext(ctx, createSchemaMigrations); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	for _, m := range migrations {
		if err := applyMigration(ctx, db, d, m); err != nil {
			return fmt.Errorf("migrate %s v%d: %w", m.component, m.version, err)
		}
	}
	return nil
}

func applyMigration(ctx context.Context, db beginner, d dialect, m migration) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	c := conn{q: tx, d: d}
	var n int
	if err := c.queryRow(ctx,
		`SELECT COUNT(*) FROM schema_migrations WHERE component = ? AND version = ?`,
		m.component, m.version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	for _, stmt := range m.stmts(d) {
		if _, err := c.exec(ctx, stmt); err != nil {
			return err
		}
	}
	if _, err := c.exec(ctx,
		`INSERT INTO schema_migrations (component, version) VALUES (?, ?)`,
		m.component, m.version); err != nil {
		return err
	}
	return tx.Commit()
}
