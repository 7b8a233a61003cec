package store

import (
	"context"
	"fmt"
)

// expiringRows names a table whose rows expire: key is the column list
// that identifies a row, at the integer column compared with the cutoff.
// call_ends, usage_batches and response_owners are purged this way.
type expiringRows struct {
	table, key, at string
	// inclusive deletes rows whose at equals the cutoff too (an expiry
	// time is the first instant a row is gone; a kept-at time is not).
	inclusive bool
}

// purge deletes at most limit rows whose at is before cutoff (or at it,
// when inclusive), the oldest first, and returns how many it deleted. On
// PostgreSQL, writers purging at once skip the rows another holds instead
// of waiting for (or deadlocking with) it.
func (e expiringRows) purge(ctx context.Context, c conn, cutoff int64, limit int) (int64, error) {
	op, lock := "<", ""
	if e.inclusive {
		op = "<="
	}
	if c.d == dialectPostgres {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	stmt, err := c.cached(ctx, `DELETE FROM `+e.table+` WHERE (`+e.key+`) IN (
		SELECT `+e.key+` FROM `+e.table+` WHERE `+e.at+` `+op+` ? ORDER BY `+e.at+` LIMIT ?`+lock+`)`)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", e.table, err)
	}
	defer stmt.Close()
	res, err := stmt.ExecContext(ctx, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", e.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", e.table, err)
	}
	return n, nil
}
