package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/tollgate-dev/tollgate/weave"
)

// maxRowsPerStatement bounds the rows one multi-row statement writes or
// reads, well inside both engines' limits on bound parameters.
const maxRowsPerStatement = 500

// A table's row digests are kept as a tree of chunks, so that a new
// version of a large table (an append, a pop, an insert) stores only the
// chunks it changes instead of the whole list again:
//   - the list is cut into chunks after each digest that is a boundary
//     (decided by the digest alone, so an edit moves boundaries only
//     around itself), and after tableChunkMax digests at the latest;
//   - each chunk is stored once per project under the digest of its
//     content, in weave_table_chunks; the chunks' digests form the next
//     level's list, cut the same way, until a level fits in one chunk;
//   - weave_tables keeps that top list in row_digests and the number of
//     levels under it in chunk_height (0: row_digests holds the row
//     digests themselves, as every table did before chunks).
//
// Storing a version writes its top list and, from the top down, only the
// chunks the project does not hold yet.
const (
	// tableChunkBoundary makes one digest in this many a boundary.
	tableChunkBoundary = 64
	// tableChunkMax bounds a chunk's length whatever its digests are.
	tableChunkMax = 256
)

// isChunkBoundary reports whether a chunk ends after digest.
func isChunkBoundary(digest string) bool {
	h := fnv.New32a()
	h.Write([]byte(digest))
	return h.Sum32()%tableChunkBoundary == 0
}

// cutChunks cuts a list of digests into chunks.
func cutChunks(list []string) [][]string {
	var out [][]string
	start := 0
	for i, d := range list {
		if i+1-start == tableChunkMax || isChunkBoundary(d) {
			out = append(out, list[start:i+1])
			start = i + 1
		}
	}
	if start < len(list) {
		out = append(out, list[start:])
	}
	return out
}

// tableTree is a table's row digests as chunks: top is the list kept in
// weave_tables, height the levels of chunks under it, and chunks every
// chunk by its digest.
type tableTree struct {
	top    []string
	height int
	chunks map[string]tableChunk
}

type tableChunk struct {
	items []string
	text  string // items as a JSON array, as stored
}

func buildTableTree(rowDigests []string) (tableTree, error) {
	t := tableTree{top: rowDigests, chunks: map[string]tableChunk{}}
	for {
		cut := cutChunks(t.top)
		if len(cut) <= 1 {
			return t, nil
		}
		next := make([]string, len(cut))
		for i, c := range cut {
			b, err := json.Marshal(c)
			if err != nil {
				return tableTree{}, err
			}
			sum := sha256.Sum256(b)
			next[i] = hex.EncodeToString(sum[:])
			t.chunks[next[i]] = tableChunk{items: c, text: string(b)}
		}
		t.top = next
		t.height++
	}
}

// PutTable stores a table and the rows it may not hold yet, in one
// transaction. Storing a table or a row again changes nothing: both are
// addressed by the digest of their content.
func (d *DB) PutTable(ctx context.Context, projectID int64, digest string, rowDigests []string, rows []weave.TableRow) error {
	tree, err := buildTableTree(rowDigests)
	if err != nil {
		return fmt.Errorf("put table: %w", err)
	}
	top, err := json.Marshal(tree.top)
	if err != nil {
		return fmt.Errorf("put table: %w", err)
	}
	tx, c, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("put table: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := putTableRows(ctx, c, projectID, rows); err != nil {
		return err
	}
	res, err := c.exec(ctx, `INSERT INTO weave_tables (project_id, digest, row_digests, row_count, chunk_height)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT (project_id, digest) DO NOTHING`,
		projectID, digest, string(top), len(rowDigests), tree.height)
	if err != nil {
		return fmt.Errorf("put table: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("put table: %w", err)
	} else if n == 1 {
		// A table already held has all its chunks.
		if err := putTableChunks(ctx, c, projectID, tree); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("put table: %w", err)
	}
	return nil
}

// putTableRows stores the rows the project may not hold yet.
func putTableRows(ctx context.Context, c conn, projectID int64, rows []weave.TableRow) error {
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
	return nil
}

// putTableChunks stores, from the top down, the chunks of tree the project
// does not hold yet: a chunk held is never looked under, since its own
// chunks were stored with it.
func putTableChunks(ctx context.Context, c conn, projectID int64, tree tableTree) error {
	want := tree.top
	for h := tree.height; h > 0 && len(want) > 0; h-- {
		held, err := heldTableChunks(ctx, c, projectID, want)
		if err != nil {
			return err
		}
		var missing []string
		seen := map[string]bool{}
		for _, dg := range want {
			if !held[dg] && !seen[dg] {
				seen[dg] = true
				missing = append(missing, dg)
			}
		}
		var under []string
		for len(missing) > 0 {
			n := min(len(missing), maxRowsPerStatement)
			q := make([]byte, 0, 64+n*12)
			q = append(q, `INSERT INTO weave_table_chunks (project_id, digest, items) VALUES `...)
			args := make([]any, 0, 3*n)
			for i, dg := range missing[:n] {
				if i > 0 {
					q = append(q, ", "...)
				}
				q = append(q, "(?, ?, ?)"...)
				args = append(args, projectID, dg, tree.chunks[dg].text)
				if h > 1 {
					under = append(under, tree.chunks[dg].items...)
				}
			}
			q = append(q, ` ON CONFLICT (project_id, digest) DO NOTHING`...)
			if _, err := c.exec(ctx, string(q), args...); err != nil {
				return fmt.Errorf("put table chunks: %w", err)
			}
			missing = missing[n:]
		}
		want = under
	}
	return nil
}

// heldTableChunks returns which of digests the project holds.
func heldTableChunks(ctx context.Context, c conn, projectID int64, digests []string) (map[string]bool, error) {
	held := map[string]bool{}
	err := tableChunks(ctx, c, projectID, digests, "digest, ''", func(dg, _ string) error {
		held[dg] = true
		return nil
	})
	return held, err
}

// tableChunks calls fn with the digest and the column cols names second
// of each chunk of digests the project holds, a bounded number per
// statement.
func tableChunks(ctx context.Context, c conn, projectID int64, digests []string, cols string, fn func(digest, items string) error) error {
	for len(digests) > 0 {
		n := min(len(digests), maxRowsPerStatement)
		f := inStrings("digest", digests[:n])
		rows, err := c.query(ctx, `SELECT `+cols+` FROM weave_table_chunks WHERE project_id = ? AND `+f.sql,
			append([]any{projectID}, f.args...)...)
		if err != nil {
			return fmt.Errorf("read table chunks: %w", err)
		}
		for rows.Next() {
			var dg, items string
			if err := rows.Scan(&dg, &items); err != nil {
				rows.Close()
				return fmt.Errorf("read table chunks: %w", err)
			}
			if err := fn(dg, items); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read table chunks: %w", err)
		}
		digests = digests[n:]
	}
	return nil
}

// TableRowDigests returns a table's row digests in order.
func (d *DB) TableRowDigests(ctx context.Context, projectID int64, digest string) ([]string, error) {
	var top string
	var height int
	c := d.conn()
	err := c.queryRow(ctx, `SELECT row_digests, chunk_height FROM weave_tables WHERE project_id = ? AND digest = ?`,
		projectID, digest).Scan(&top, &height)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("table %s: %w", digest, weave.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read table: %w", err)
	}
	var list []string
	if err := json.Unmarshal([]byte(top), &list); err != nil {
		return nil, fmt.Errorf("read table %s: %w", digest, err)
	}
	for ; height > 0; height-- {
		items := make(map[string][]string, len(list))
		err := tableChunks(ctx, c, projectID, list, "digest, items", func(dg, raw string) error {
			var l []string
			if err := json.Unmarshal([]byte(raw), &l); err != nil {
				return fmt.Errorf("read table %s: chunk %s: %w", digest, dg, err)
			}
			items[dg] = l
			return nil
		})
		if err != nil {
			return nil, err
		}
		var next []string
		for _, dg := range list {
			l, ok := items[dg]
			if !ok {
				return nil, fmt.Errorf("read table %s: chunk %s missing", digest, dg)
			}
			next = append(next, l...)
		}
		list = next
	}
	if list == nil {
		list = []string{}
	}
	return list, nil
}

// TableRowCount returns how many rows a table has, as stored beside its
// digests, without reading them.
func (d *DB) TableRowCount(ctx context.Context, projectID int64, digest string) (int, error) {
	var n int
	err := d.conn().queryRow(ctx, `SELECT row_count FROM weave_tables WHERE project_id = ? AND digest = ?`,
		projectID, digest).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("table %s: %w", digest, weave.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("read table: %w", err)
	}
	return n, nil
}

// TableRows returns the values of the rows with the given digests; digests
// the project does not hold are absent from the map.
func (d *DB) TableRows(ctx context.Context, projectID int64, rowDigests []string) (map[string]json.RawMessage, error) {
	out := make(map[string]json.RawMessage, len(rowDigests))
	err := d.EachTableRow(ctx, projectID, rowDigests, func(digest string, val json.RawMessage) error {
		out[digest] = val
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// EachTableRow calls fn with each row of rowDigests the project holds, as
// the statement reads it, a bounded number of digests per statement, so
// that a caller that keeps little of each row holds one at a time. Rows
// come in no particular order; a digest named twice in one statement's
// share comes once.
func (d *DB) EachTableRow(ctx context.Context, projectID int64, rowDigests []string, fn func(digest string, val json.RawMessage) error) error {
	for len(rowDigests) > 0 {
		n := min(len(rowDigests), maxRowsPerStatement)
		if err := d.eachTableRow(ctx, projectID, rowDigests[:n], fn); err != nil {
			return err
		}
		rowDigests = rowDigests[n:]
	}
	return nil
}

func (d *DB) eachTableRow(ctx context.Context, projectID int64, rowDigests []string, fn func(digest string, val json.RawMessage) error) error {
	f := inStrings("digest", rowDigests)
	rows, err := d.conn().query(ctx, `SELECT digest, val FROM weave_table_rows WHERE project_id = ? AND `+f.sql,
		append([]any{projectID}, f.args...)...)
	if err != nil {
		return fmt.Errorf("read table rows: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var dg, val string
		if err := rows.Scan(&dg, &val); err != nil {
			return fmt.Errorf("read table rows: %w", err)
		}
		if err := fn(dg, json.RawMessage(val)); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read table rows: %w", err)
	}
	return nil
}
