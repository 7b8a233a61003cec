// Package storetest opens fresh stores for tests, on SQLite always and on
// PostgreSQL when TOLLGATE_TEST_PG_DSN is set, so that one suite runs
// against both engines. It is imported by the tests of store and of the
// packages that test through a real store.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
)

// EnvDSN names the environment variable holding the DSN of the PostgreSQL
// database the suites also run against. Each test gets a schema of its
// own in it, dropped when the test ends.
const EnvDSN = "TOLLGATE_TEST_PG_DSN"

// The engines, as config.Store.Driver names them.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// skipMessage is what a PostgreSQL test says when it is skipped.
const skipMessage = EnvDSN + " not set: PostgreSQL suite skipped"

// schemaTimeout bounds creating and dropping a test schema.
const schemaTimeout = 30 * time.Second

// Named is a store and the engine it runs on.
type Named struct {
	Name string
	DB   *store.DB
}

// Config returns the configuration of a fresh, empty store on engine: a
// SQLite file in t.TempDir(), or a new schema of the TOLLGATE_TEST_PG_DSN
// database, dropped when the test ends. Without the variable, a PostgreSQL
// test is skipped.
func Config(t testing.TB, engine string) config.Store {
	t.Helper()
	switch engine {
	case SQLite:
		return config.Store{Driver: SQLite, Path: filepath.Join(t.TempDir(), "tollgate.db")}
	case Postgres:
		dsn := os.Getenv(EnvDSN)
		if dsn == "" {
			t.Skip(skipMessage)
		}
		return config.Store{Driver: Postgres, DSN: freshSchema(t, dsn)}
	}
	t.Fatalf("storetest: unknown engine %q", engine)
	return config.Store{}
}

// OpenEngine opens a fresh store on engine (see Config), closed when the
// test ends.
func OpenEngine(t testing.TB, engine string) *store.DB {
	t.Helper()
	db, err := store.Open(context.Background(), Config(t, engine))
	if err != nil {
		t.Fatalf("open %s store: %v", engine, err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close %s store: %v", engine, err)
		}
	})
	return db
}

// Open opens a fresh store on every engine available: SQLite, and
// PostgreSQL when TOLLGATE_TEST_PG_DSN is set. It is for benchmarks and
// tests that compare engines; tests that run once per engine use ForEach.
func Open(t testing.TB) []Named {
	t.Helper()
	out := []Named{{Name: SQLite, DB: OpenEngine(t, SQLite)}}
	if os.Getenv(EnvDSN) != "" {
		out = append(out, Named{Name: Postgres, DB: OpenEngine(t, Postgres)})
	}
	return out
}

// ForEach runs fn as a subtest per engine, named after it, each with a
// fresh store. The PostgreSQL subtest is skipped, saying why, when
// TOLLGATE_TEST_PG_DSN is not set.
func ForEach(t *testing.T, fn func(t *testing.T, db *store.DB)) {
	t.Helper()
	for _, engine := range []string{SQLite, Postgres} {
		t.Run(engine, func(t *testing.T) {
			fn(t, OpenEngine(t, engine))
		})
	}
}

// ForEachConfig is ForEach for tests that open the store themselves (to
// reopen it, or open it twice): fn gets a fresh configuration.
func ForEachConfig(t *testing.T, fn func(t *testing.T, cfg config.Store)) {
	t.Helper()
	for _, engine := range []string{SQLite, Postgres} {
		t.Run(engine, func(t *testing.T) {
			fn(t, Config(t, engine))
		})
	}
}

// OpenOne opens one fresh store: on PostgreSQL when TOLLGATE_TEST_PG_DSN is
// set, else on SQLite. It is for suites that test a service through the
// store and so run once; the store's own suite covers both engines.
func OpenOne(t testing.TB) *store.DB {
	t.Helper()
	if os.Getenv(EnvDSN) != "" {
		return OpenEngine(t, Postgres)
	}
	return OpenEngine(t, SQLite)
}

// freshSchema creates a uniquely named schema in the database of dsn,
// drops it (and everything in it) when the test ends, and returns dsn
// with that schema as its search_path.
func freshSchema(t testing.TB, dsn string) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("schema name: %v", err)
	}
	schema := "tg_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), schemaTimeout)
	defer cancel()
	if err := execAdmin(ctx, dsn, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create test schema: %v", err)
	}
	// Registered before the store is opened, so that it runs after the
	// store is closed: dropping waits for no connection of its.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), schemaTimeout)
		defer cancel()
		if err := execAdmin(ctx, dsn, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop test schema: %v", err)
		}
	})
	scoped, err := withSearchPath(dsn, schema)
	if err != nil {
		t.Fatalf("test schema dsn: %v", err)
	}
	return scoped
}

// execAdmin runs one statement on a connection of its own.
func execAdmin(ctx context.Context, dsn, stmt string) error {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("%s: %w", stmt, err)
	}
	return nil
}

// withSearchPath sets search_path in dsn, a URL or a keyword/value
// string: pgx sends it to the server as a run-time parameter.
func withSearchPath(dsn, schema string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return dsn + " search_path=" + schema, nil
}
