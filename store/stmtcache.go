package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
)

// stmtCache keeps the statements the usage writer runs on every batch
// prepared for the life of the DB. Compiling a 64-row INSERT (up to 1,280
// parameters) again for every batch was a sizeable share of the writer's
// CPU; database/sql then prepares each cached statement once per pooled
// connection, and a transaction on that connection reuses it. On SQLite
// the writer runs its INSERTs on statements of its own connection
// (writer_stmts.go), and only the statements it runs through conn.cached
// itself (the markers' purge) are kept here.
type stmtCache struct {
	db *sql.DB
	d  dialect

	mu    sync.Mutex
	stmts map[string]*sql.Stmt // by query as written, with ? placeholders
	// closed is set by close; a statement asked for later is an error
	// rather than a leak.
	closed bool
}

func newStmtCache(db *sql.DB, d dialect) *stmtCache {
	return &stmtCache{db: db, d: d, stmts: make(map[string]*sql.Stmt)}
}

// get returns query prepared on the pool, preparing it on first use.
func (c *stmtCache) get(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("prepare: store closed")
	}
	if s, ok := c.stmts[query]; ok {
		return s, nil
	}
	s, err := c.db.PrepareContext(ctx, c.d.rebind(query))
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	c.stmts[query] = s
	return s, nil
}

// close closes every cached statement; the DB closes its pool after it.
func (c *stmtCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for q, s := range c.stmts {
		errs = append(errs, s.Close())
		delete(c.stmts, q)
	}
	return errors.Join(errs...)
}
