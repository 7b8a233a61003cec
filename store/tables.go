package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tollgate-dev/tollgate/weave"
)

// maxRowsPerStatement bounds the rows one multi-row statement writes or
// reads, well inside both engines' limits on bound parameters.
const maxRowsPerStatement = 500

// PutTable stores a table and the rows it may not hold yet, in one
// transaction. Storing a table or a row again changes nothing: both are
// addressed by the digest of their content.
func (d *DB) PutTable(ctx context.Context, projectID int64, digest string, rowDigests []string, rows []weave.TableRow) error {
	list, err := json.Marshal(rowDigests)
	if err != nil {
		return fmt.Errorf("put table: %w", err)
	}
	tx, c, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("put table: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for len(rows) > 0 {
		n := min(len(rows), maxRowsPerStatement)
		q := make([]byte, 0, 64+n*12)
		q = append(q, `INSERT INTO weave_table_rows (project_id, digest, val) VALUES `...)
		args := make([]any, 0, 3*n)
		for i, r := range rows[:n] {
			if i > 0 {
				q = append(q, ", "...)
			}
			q = append(q, "(?, ?, ?)"...)
			args = append(args, projectID, r.Digest, string(r.Val))
		}
		q = append(q, ` ON CONFLICT (project_id, digest) DO NOTHING`...)
		if _, err := c.exec(ctx, string(q), args...); err != nil {
			return fmt.Errorf("put table rows: %w", err)
		}
		rows = rows[n:]
	}
	if _, err := c.exec(ctx, `INSERT INTO weave_tables (project_id, digest, row_digests, row_count)
		VALUES (?, ?, ?, ?) ON CONFLICT (project_id, digest) DO NOTHING`,
		projectID, digest, string(list), len(rowDigests)); err != nil {
		return fmt.Errorf("put table: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("put table: %w", err)
	}
	return nil
}

// TableRowDigests returns a table's row digests in order.
func (d *DB) TableRowDigests(ctx context.Context, projectID int64, digest string) ([]string, error) {
	var list string
	err := d.conn().queryRow(ctx, `SELECT row_digests FROM weave_tables WHERE project_id = ? AND digest = ?`,
		projectID, digest).Scan(&list)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("table %s: %w", digest, weave.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read table: %w", err)
	}
	var out []string
	if err := json.Unmarshal([]byte(list), &out); err != nil {
		return nil, fmt.Errorf("read table %s: %w", digest, err)
	}
	return out, nil
}

// TableRows returns the values of the rows with the given digests; digests
// the project does not hold are absent from the map.
func (d *DB) TableRows(ctx context.Context, projectID int64, rowDigests []string) (map[string]json.RawMessage, error) {
	out := make(map[string]json.RawMessage, len(rowDigests))
	for len(rowDigests) > 0 {
		n := min(len(rowDigests), maxRowsPerStatement)
		f := inStrings("digest", rowDigests[:n])
		rows, err := d.conn().query(ctx, `SELECT digest, val FROM weave_table_rows WHERE project_id = ? AND `+f.sql,
			append([]any{projectID}, f.args...)...)
		if err != nil {
			return nil, fmt.Errorf("read table rows: %w", err)
		}
		for rows.Next() {
			var dg, val string
			if err := rows.Scan(&dg, &val); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read table rows: %w", err)
			}
			out[dg] = json.RawMessage(val)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read table rows: %w", err)
		}
		rowDigests = rowDigests[n:]
	}
	return out, nil
}
