package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/weave"
)

var _ weave.Store = (*DB)(nil)

// putObjectAttempts bounds PutObject's retries on PostgreSQL, as
// putOpVersionAttempts does PutOpVersion's.
const putObjectAttempts = 32

// putObjectSQL stores a new version, or, for a digest the object has
// already, restores a deleted version as the newest one and leaves a live
// one alone. One statement, so that SQLite's writers, which take turns,
// cannot take one version_index twice; on PostgreSQL a lost race violates
// the primary key and is retried.
const putObjectSQL = `
	INSERT INTO weave_objects (project_id, object_id, version_index, digest, kind,
		base_object_class, leaf_object_class, val, size_bytes, created_at, wb_user_id)
	SELECT ?, ?, COALESCE(MAX(version_index) + 1, 0), ?, ?, ?, ?, ?, ?, ?, ?
	FROM weave_objects WHERE project_id = ? AND object_id = ?
	ON CONFLICT (project_id, object_id, digest) DO UPDATE SET
		version_index = excluded.version_index, created_at = excluded.created_at, deleted_at = NULL
	WHERE weave_objects.deleted_at IS NOT NULL`

// objectColumns are what scanObject reads; is_latest is computed, so that
// deleting the newest version makes the one before it latest.
const objectColumns = `o.object_id, o.digest, o.version_index, o.kind, o.base_object_class,
	o.leaf_object_class, o.size_bytes, o.created_at, o.deleted_at, o.wb_user_id,
	CASE WHEN o.deleted_at IS NULL AND o.version_index = (SELECT MAX(l.version_index) FROM weave_objects l
		WHERE l.project_id = o.project_id AND l.object_id = o.object_id AND l.deleted_at IS NULL)
		THEN 1 ELSE 0 END`

// PutObject stores a version of an object. An op's code is copied into the
// op listing (the ops table) under the object's digest, so that ops made
// by the SDKs are listed beside those published through /v2/.../ops.
func (d *DB) PutObject(ctx context.Context, w weave.ObjectWrite) (weave.Object, error) {
	at := formatTraceTime(w.At)
	for attempt := 1; ; attempt++ {
		_, err := d.conn().exec(ctx, putObjectSQL,
			w.ProjectID, w.ObjectID, w.Digest, w.Kind, w.BaseObjectClass, w.LeafObjectClass,
			string(w.Val), len(w.Val), at, w.WBUserID, w.ProjectID, w.ObjectID)
		if err == nil {
			break
		}
		if !isUniqueViolation(err) || attempt == putObjectAttempts {
			return weave.Object{}, fmt.Errorf("put object: %w", err)
		}
	}
	if w.Kind == weave.KindOp {
		if err := d.putOpObject(ctx, w); err != nil {
			return weave.Object{}, err
		}
	}
	o, err := d.ReadObject(ctx, w.ProjectID, w.ObjectID, w.Digest)
	if err != nil {
		return weave.Object{}, fmt.Errorf("put object: %w", err)
	}
	return o, nil
}

// putOpObject lists an op object in the ops table with its code, read from
// the file its value names (empty when the file is not stored).
func (d *DB) putOpObject(ctx context.Context, w weave.ObjectWrite) error {
	var code string
	if w.OpCodeDigest != "" {
		content, err := d.ReadFile(ctx, w.ProjectID, w.OpCodeDigest)
		switch {
		case err == nil:
			code = strings.ToValidUTF8(string(content), "\uFFFD")
		case !errors.Is(err, weave.ErrNotFound):
			return fmt.Errorf("put op: %w", err)
		}
	}
	if err := d.insertOpVersion(ctx, w.ProjectID, w.ObjectID, w.Digest, code, w.At); err != nil {
		return fmt.Errorf("put op: %w", err)
	}
	return nil
}

// versionCond selects one version of an object: a digest, "latest" or
// "v<index>".
func versionCond(version string) (string, any) {
	if version == weave.Latest {
		return `o.deleted_at IS NULL AND o.version_index = (SELECT MAX(l.version_index) FROM weave_objects l
			WHERE l.project_id = o.project_id AND l.object_id = o.object_id AND l.deleted_at IS NULL)`, nil
	}
	if n, ok := weave.VersionIndex(version); ok {
		return `o.version_index = ?`, n
	}
	return `o.digest = ?`, version
}

// ReadObject reads one version of an object.
func (d *DB) ReadObject(ctx context.Context, projectID int64, objectID, version string) (weave.Object, error) {
	cond, arg := versionCond(version)
	args := []any{projectID, objectID}
	if arg != nil {
		args = append(args, arg)
	}
	row := d.conn().queryRow(ctx, `SELECT `+objectColumns+`, o.val FROM weave_objects o
		WHERE o.project_id = ? AND o.object_id = ? AND `+cond, args...)
	o, err := scanObject(row, projectID, true)
	if errors.Is(err, sql.ErrNoRows) {
		return weave.Object{}, fmt.Errorf("object %s:%s: %w", objectID, version, weave.ErrNotFound)
	}
	if err != nil {
		return weave.Object{}, fmt.Errorf("read object: %w", err)
	}
	if o.DeletedAt != nil {
		return o, fmt.Errorf("object %s:v%d: %w", objectID, o.VersionIndex, weave.ErrDeleted)
	}
	return o, nil
}

func scanObject(sc rowScanner, projectID int64, withVal bool) (weave.Object, error) {
	o := weave.Object{ProjectID: projectID}
	var base, leaf, deleted, user sql.NullString
	var created string
	var latest int
	dest := []any{&o.ObjectID, &o.Digest, &o.VersionIndex, &o.Kind, &base, &leaf, &o.SizeBytes,
		&created, &deleted, &user, &latest}
	var val string
	if withVal {
		dest = append(dest, &val)
	}
	if err := sc.Scan(dest...); err != nil {
		return weave.Object{}, err
	}
	o.BaseObjectClass, o.LeafObjectClass, o.WBUserID = nullString(base), nullString(leaf), nullString(user)
	o.IsLatest = latest == 1
	if withVal {
		o.Val = []byte(val)
	}
	var err error
	if o.CreatedAt, err = parseTraceTime(created); err != nil {
		return weave.Object{}, err
	}
	if o.DeletedAt, err = parseNullTraceTime(deleted); err != nil {
		return weave.Object{}, err
	}
	return o, nil
}

// QueryObjects calls fn for each live object version q selects, reading
// them as fn takes them: a version after fn's error is never read.
func (d *DB) QueryObjects(ctx context.Context, projectID int64, q weave.ObjectQuery, fn func(*weave.Object) error) error {
	where := []sqlFrag{{sql: `o.project_id = ? AND o.deleted_at IS NULL`, args: []any{projectID}}}
	if len(q.ObjectIDs) > 0 {
		where = append(where, inStrings("o.object_id", q.ObjectIDs))
	}
	if len(q.BaseObjectClasses) > 0 {
		where = append(where, inStrings("o.base_object_class", q.BaseObjectClasses))
	}
	if len(q.ExcludeBaseObjectClasses) > 0 {
		f := inStrings("o.base_object_class", q.ExcludeBaseObjectClasses)
		where = append(where, wrapSQL("(o.base_object_class IS NULL OR NOT ", f, ")"))
	}
	if len(q.LeafObjectClasses) > 0 {
		where = append(where, inStrings("o.leaf_object_class", q.LeafObjectClasses))
	}
	if q.IsOp != nil {
		kind := weave.KindObject
		if *q.IsOp {
			kind = weave.KindOp
		}
		where = append(where, sqlFrag{sql: `o.kind = ?`, args: []any{kind}})
	}
	if q.LatestOnly {
		where = append(where, rawSQL(`o.version_index = (SELECT MAX(l.version_index) FROM weave_objects l
			WHERE l.project_id = o.project_id AND l.object_id = o.object_id AND l.deleted_at IS NULL)`))
	}
	order := make([]string, 0, len(q.SortBy)+2)
	for _, s := range q.SortBy {
		col := "o.object_id"
		switch s.Field {
		case "created_at":
			col = "o.created_at"
		case "version_index":
			col = "o.version_index"
		}
		if s.Desc {
			col += " DESC"
		}
		order = append(order, col)
	}
	order = append(order, "o.object_id", "o.version_index")
	cols := objectColumns
	if !q.MetadataOnly {
		cols += ", o.val"
	}
	w := joinSQL(" AND ", where...)
	args := append(w.args, d.dialect.limitArg(q.Limit), q.Offset)
	rows, err := d.conn().query(ctx, `SELECT `+cols+` FROM weave_objects o WHERE `+w.sql+
		` ORDER BY `+strings.Join(order, ", ")+` LIMIT ? OFFSET ?`, args...)
	if err != nil {
		return fmt.Errorf("query objects: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		o, err := scanObject(rows, projectID, !q.MetadataOnly)
		if err != nil {
			return fmt.Errorf("query objects: %w", err)
		}
		if err := fn(&o); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("query objects: %w", err)
	}
	return nil
}

// DeleteObjects marks versions deleted, all or none: when one version
// named is not live, nothing is deleted. An op's versions leave the op
// listing too.
func (d *DB) DeleteObjects(ctx context.Context, projectID int64, objectID string, versions []string, at time.Time) (int, error) {
	tx, c, err := d.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("delete objects: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var digests []string
	if len(versions) == 0 {
		digests, err = c.queryStrings(ctx, `SELECT digest FROM weave_objects
			WHERE project_id = ? AND object_id = ? AND deleted_at IS NULL`, projectID, objectID)
		if err != nil {
			return 0, fmt.Errorf("delete objects: %w", err)
		}
	} else {
		seen := make(map[string]bool, len(versions))
		for _, v := range versions {
			cond, arg := versionCond(v)
			args := []any{projectID, objectID}
			if arg != nil {
				args = append(args, arg)
			}
			var dg string
			err := c.queryRow(ctx, `SELECT o.digest FROM weave_objects o
				WHERE o.project_id = ? AND o.object_id = ? AND o.deleted_at IS NULL AND `+cond, args...).Scan(&dg)
			if errors.Is(err, sql.ErrNoRows) {
				return 0, fmt.Errorf("object %s:%s: %w", objectID, v, weave.ErrNotFound)
			}
			if err != nil {
				return 0, fmt.Errorf("delete objects: %w", err)
			}
			if !seen[dg] {
				seen[dg] = true
				digests = append(digests, dg)
			}
		}
	}
	if len(digests) == 0 {
		return 0, fmt.Errorf("object %s: %w", objectID, weave.ErrNotFound)
	}
	ts := formatTraceTime(at)
	for _, table := range []string{"weave_objects", "ops"} {
		f := inStrings("digest", digests)
		args := append([]any{ts, projectID, objectID}, f.args...)
		if _, err := c.exec(ctx, `UPDATE `+table+` SET deleted_at = ?
			WHERE project_id = ? AND object_id = ? AND deleted_at IS NULL AND `+f.sql, args...); err != nil {
			return 0, fmt.Errorf("delete objects: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("delete objects: %w", err)
	}
	return len(digests), nil
}
