package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/weave"
)

// PutFile stores a file under its digest; the same content again is a
// no-op.
func (d *DB) PutFile(ctx context.Context, projectID int64, f weave.File) error {
	if _, err := d.conn().exec(ctx, `INSERT INTO weave_files (project_id, digest, content, size_bytes, created_at)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT (project_id, digest) DO NOTHING`,
		projectID, f.Digest, f.Content, len(f.Content), formatTraceTime(time.Now())); err != nil {
		return fmt.Errorf("put file: %w", err)
	}
	return nil
}

// ReadFile returns a file's content.
func (d *DB) ReadFile(ctx context.Context, projectID int64, digest string) ([]byte, error) {
	var content []byte
	err := d.conn().queryRow(ctx, `SELECT content FROM weave_files WHERE project_id = ? AND digest = ?`,
		projectID, digest).Scan(&content)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("file %s: %w", digest, weave.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read file: %w", err)
	}
	if content == nil {
		content = []byte{}
	}
	return content, nil
}
