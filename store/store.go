package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tollgate-dev/tollgate/config"

	// The pure-Go SQLite driver: no cgo, so the binary builds and runs on a
	// fresh machine with nothing but Go.
	_ "modernc.org/sqlite"
)

// PostgreSQL pool bounds. Each replica keeps at most maxPostgresConns
// connections, so that a handful of replicas stay well inside the server's
// default max_connections (100); idle ones are closed after a while so that
// a quiet replica does not pin server processes.
const (
	maxPostgresConns        = 16
	maxPostgresConnIdleTime = 5 * time.Minute
)

// DB is the store, on SQLite or PostgreSQL. It is safe for concurrent use.
type DB struct {
	db      *sql.DB
	dialect dialect
	// expr compiles the $expr queries and filters of calls requests for
	// the engine, chosen once here.
	expr  exprCompiler
	stmts *stmtCache
	// writer is InsertRecords' connection on SQLite (usage_writer.go);
	// nil on PostgreSQL.
	writer *usageWriter
	// throwaway is the directory of a ":memory:" store's file, removed by
	// Close; empty otherwise.
	throwaway string
}

func newDB(db *sql.DB, d dialect) *DB {
	return &DB{db: db, dialect: d, expr: exprCompilerFor(d), stmts: newStmtCache(db, d)}
}

// Open opens (creating it on first start) the store cfg describes and
// applies pending schema migrations.
func Open(ctx context.Context, cfg config.Store) (*DB, error) {
	switch cfg.Driver {
	case "", "sqlite":
		return openSQLite(ctx, cfg.Path)
	case "postgres":
		return openPostgres(ctx, cfg.DSN)
	}
	return nil, fmt.Errorf("open store: driver %q is not supported", cfg.Driver)
}

func openSQLite(ctx context.Context, path string) (*DB, error) {
	// SQLite's own ":memory:" is a database per connection: the pool's
	// second connection (a reader, or the statement cache preparing while
	// the writer's transaction holds the first) would see an empty one, and
	// the first write failed with "no such table". A throwaway file in a
	// directory of its own, removed by Close, gives every connection the
	// same database and the same WAL behaviour as a file store.
	var throwaway string
	if path == config.SQLiteInMemory {
		dir, err := os.MkdirTemp("", "tollgate-store-")
		if err != nil {
			return nil, fmt.Errorf("open store %s: %w", path, err)
		}
		throwaway, path = dir, filepath.Join(dir, "tollgate.db")
	}
	d, err := openSQLiteFile(ctx, path)
	if err != nil {
		if throwaway != "" {
			_ = os.RemoveAll(throwaway)
		}
		return nil, err
	}
	d.throwaway = throwaway
	return d, nil
}

func openSQLiteFile(ctx context.Context, path string) (*DB, error) {
	// WAL lets readers (the usage API, the CLI while the gateway runs)
	// proceed while the writer commits; busy_timeout makes a second process
	// wait for the lock instead of failing at once.
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(1)")
	// A multi-row INSERT that may abort halfway (a NOT NULL or foreign key
	// check) keeps a statement journal of the pages it touches; on a temp
	// file that is a pwrite per page, a sizeable share of the usage
	// writer's CPU. In memory it is a copy.
	q.Add("_pragma", "temp_store(MEMORY)")
	// Every pooled connection keeps its own page cache, 2000 KiB by
	// default, and filled it under load. The usage writer's keys (UUIDv7
	// ids, times) mostly grow, so it works at the right edge of each
	// b-tree, a few pages per tree, and pages it misses come from the OS
	// page cache: a quarter of the default serves the writer as well
	// (BenchmarkInsertRecords), and each connection holds less.
	q.Add("_pragma", "cache_size(-512)")
	// SQLite checkpoints the WAL into the database file at the first
	// commit past wal_autocheckpoint pages, 1000 by default: every 4 MiB
	// the usage writer copied the hot right edge of each index again. At
	// 10000 pages (about 40 MiB of WAL at 4 KiB pages) the same pages are
	// copied a tenth as often, which BenchmarkInsertRecords shows as less
	// system time per record (the copy is the kernel's).
	// journal_size_limit bounds the WAL left on disk: one that grew past
	// 64 MiB (a long reader holding back the checkpoint) is truncated to
	// that when it is next reset.
	q.Add("_pragma", "wal_autocheckpoint(10000)")
	q.Add("_pragma", "journal_size_limit(67108864)")
	dsn := "file:" + path + "?" + q.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	// One idle connection, not database/sql's two: each keeps its own
	// page cache and prepared statements, and the idle ones serve readers
	// and the occasional write (the usage writer takes one connection for
	// good, usage_writer.go, and prepares its INSERTs there).
	// Readers that overlap still get a connection each; the extra one is
	// closed when it comes back.
	db.SetMaxIdleConns(1)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if err := migrateSQLite(ctx, db, allMigrations()); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	d := newDB(db, dialectSQLite)
	d.writer = &usageWriter{db: db}
	return d, nil
}

// openPostgres goes through pgx's database/sql adapter, so that both
// engines share every statement that does not need to differ. The pool is
// database/sql's.
func openPostgres(ctx context.Context, dsn string) (*DB, error) {
	if dsn == "" {
		return nil, fmt.Errorf("open postgres: no dsn")
	}
	pgCfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// The error may quote the DSN, password included; say only where.
		return nil, fmt.Errorf("open postgres: parse dsn: %w", err)
	}
	db := stdlib.OpenDB(*pgCfg)
	db.SetMaxOpenConns(maxPostgresConns)
	db.SetMaxIdleConns(maxPostgresConns)
	db.SetConnMaxIdleTime(maxPostgresConnIdleTime)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open postgres %s: %w", pgCfg.Host, err)
	}
	if err := migratePostgres(ctx, db, allMigrations()); err != nil {
		db.Close()
		return nil, fmt.Errorf("open postgres %s: %w", pgCfg.Host, err)
	}
	return newDB(db, dialectPostgres), nil
}

// Close closes the cached statements, then the database.
func (d *DB) Close() error {
	err := d.stmts.close()
	if d.writer != nil {
		err = errors.Join(err, d.writer.close())
	}
	err = errors.Join(err, d.db.Close())
	if d.throwaway != "" {
		err = errors.Join(err, os.RemoveAll(d.throwaway))
	}
	return err
}

// conn runs statements on the pool.
func (d *DB) conn() conn { return conn{q: d.db, d: d.dialect} }

// begin starts a transaction and returns it with a conn running statements
// in it.
func (d *DB) begin(ctx context.Context) (*sql.Tx, conn, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, conn{}, err
	}
	return tx, conn{q: tx, d: d.dialect, tx: tx, stmts: d.stmts}, nil
}
