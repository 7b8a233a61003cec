package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/fold"
	"github.com/tollgate-dev/tollgate/internal/jsonmerge"
	"github.com/tollgate-dev/tollgate/trace"
)

var _ trace.Store = (*DB)(nil)

func formatTraceTime(t time.Time) string { return string(appendTraceTime(nil, t)) }

// appendTraceTime appends t in the stored form of trace times: UTC, to the
// microseconds, fixed width (trace.TimeLayout), so text order is time order.
// It writes the digits itself, as AppendFormat would (the fraction
// truncated, not rounded), because AppendFormat reads its layout again for
// every time, and the usage writer formats two per request. A year
// AppendFormat would not write as four digits goes to AppendFormat.
func appendTraceTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, trace.TimeLayout)
	}
	hour, minute, sec := t.Clock()
	b = appendPadded(b, year, 4)
	b = append(b, '-')
	b = appendPadded(b, int(month), 2)
	b = append(b, '-')
	b = appendPadded(b, day, 2)
	b = append(b, 'T')
	b = appendPadded(b, hour, 2)
	b = append(b, ':')
	b = appendPadded(b, minute, 2)
	b = append(b, ':')
	b = appendPadded(b, sec, 2)
	b = append(b, '.')
	b = appendPadded(b, t.Nanosecond()/1000, 6)
	return append(b, 'Z')
}

// appendPadded appends n, which is not negative and has at most width
// digits, as width decimal digits.
func appendPadded(b []byte, n, width int) []byte {
	b = append(b, "000000"[:width]...)
	for i := len(b) - 1; n > 0; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return b
}

func parseTraceTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse stored time %q: %w", s, err)
	}
	return t, nil
}

// parseNullTraceTime is parseTraceTime for a column that may be NULL, which
// is nil.
func parseNullTraceTime(s sql.NullString) (*time.Time, error) {
	if !s.Valid {
		return nil, nil
	}
	t, err := parseTraceTime(s.String)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// ensureProject returns the id of the project entity/name, creating it on
// first use. The common case, an existing project, costs one read. It
// works on its own and inside the usage writer's transaction.
func ensureProject(ctx context.Context, c conn, entity, name string) (int64, error) {
	const find = `SELECT id FROM projects WHERE entity = ? AND name = ?`
	var id int64
	err := c.queryRow(ctx, find, entity, name).Scan(&id)
	if err == nil {
		return id, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("find project: %w", err)
	}
	if _, err := c.exec(ctx,
		`INSERT INTO projects (entity, name, created_at) VALUES (?, ?, ?) ON CONFLICT (entity, name) DO NOTHING`,
		entity, name, formatTraceTime(time.Now())); err != nil {
		return 0, fmt.Errorf("create project: %w", err)
	}
	if err := c.queryRow(ctx, find, entity, name).Scan(&id); err != nil {
		return 0, fmt.Errorf("find project: %w", err)
	}
	return id, nil
}

// EnsureProject returns the project, creating it on first use.
func (d *DB) EnsureProject(ctx context.Context, entity, name string) (trace.Project, error) {
	id, err := ensureProject(ctx, d.conn(), entity, name)
	if err != nil {
		return trace.Project{}, err
	}
	return trace.Project{ID: id, Entity: entity, Name: name}, nil
}

// FindProject returns an existing project by entity and name.
func (d *DB) FindProject(ctx context.Context, entity, name string) (trace.Project, error) {
	p := trace.Project{Entity: entity, Name: name}
	err := d.conn().queryRow(ctx, `SELECT id FROM projects WHERE entity = ? AND name = ?`, entity, name).Scan(&p.ID)
	if errors.Is(err, sql.ErrNoRows) {
		return trace.Project{}, fmt.Errorf("project %s/%s: %w", entity, name, trace.ErrNotFound)
	}
	if err != nil {
		return trace.Project{}, fmt.Errorf("find project: %w", err)
	}
	return p, nil
}

// ProjectByID returns an existing project by its internal integer id.
func (d *DB) ProjectByID(ctx context.Context, id int64) (trace.Project, error) {
	p := trace.Project{ID: id}
	err := d.conn().queryRow(ctx, `SELECT entity, name FROM projects WHERE id = ?`, id).Scan(&p.Entity, &p.Name)
	if errors.Is(err, sql.ErrNoRows) {
		return trace.Project{}, fmt.Errorf("project %d: %w", id, trace.ErrNotFound)
	}
	if err != nil {
		return trace.Project{}, fmt.Errorf("find project: %w", err)
	}
	return p, nil
}

// opDigest is the content digest of an op's code: the unpadded base64url
// SHA-256, the form of Weave's digests.
func opDigest(code string) string {
	sum := sha256.Sum256([]byte(code))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// putOpVersionAttempts bounds PutOpVersion's retries on PostgreSQL. Each
// lost race means that another publisher's version committed, so up to
// this many publishers of new code for one op, racing, all get through.
const putOpVersionAttempts = 32

// PutOpVersion stores code as a version of the op. It is one statement, so
// that on SQLite, whose writers take turns, concurrent publishers of one op
// cannot both take the same version_index. On PostgreSQL two publishers of
// new code can both read the same MAX(version_index); the loser's insert
// then violates the primary key and is retried, now seeing the winner's
// version. Publishing the code of a deleted version restores it.
func (d *DB) PutOpVersion(ctx context.Context, projectID int64, objectID, code string, at time.Time) (trace.OpVersion, error) {
	digest := opDigest(code)
	if err := d.insertOpVersion(ctx, projectID, objectID, digest, code, at); err != nil {
		return trace.OpVersion{}, fmt.Errorf("put op version: %w", err)
	}
	op := trace.OpVersion{ObjectID: objectID, Digest: digest}
	var created string
	if err := d.conn().queryRow(ctx,
		`SELECT version_index, created_at, code FROM ops WHERE project_id = ? AND object_id = ? AND digest = ?`,
		projectID, objectID, digest).Scan(&op.VersionIndex, &created, &op.Code); err != nil {
		return trace.OpVersion{}, fmt.Errorf("read op version: %w", err)
	}
	var err error
	if op.CreatedAt, err = parseTraceTime(created); err != nil {
		return trace.OpVersion{}, err
	}
	return op, nil
}

// insertOpVersion stores code as the version digest of the op, as
// PutOpVersion and an op object put do: one statement, retried when
// PostgreSQL refuses a version_index another publisher took meanwhile.
func (d *DB) insertOpVersion(ctx context.Context, projectID int64, objectID, digest, code string, at time.Time) error {
	for attempt := 1; ; attempt++ {
		_, err := d.conn().exec(ctx, `
			INSERT INTO ops (project_id, object_id, version_index, digest, code, created_at)
			SELECT ?, ?, COALESCE(MAX(version_index) + 1, 0), ?, ?, ?
			FROM ops WHERE project_id = ? AND object_id = ?
			ON CONFLICT (project_id, object_id, digest) DO UPDATE SET deleted_at = NULL`,
			projectID, objectID, digest, code, formatTraceTime(at), projectID, objectID)
		if err == nil || !isUniqueViolation(err) || attempt == putOpVersionAttempts {
			return err
		}
	}
}

// ListOpVersions lists the project's live op versions by object_id, newest
// version first.
func (d *DB) ListOpVersions(ctx context.Context, projectID int64, limit, offset int) ([]trace.OpVersion, error) {
	rows, err := d.conn().query(ctx, `
		SELECT object_id, digest, version_index, created_at, code FROM ops
		WHERE project_id = ? AND deleted_at IS NULL
		ORDER BY object_id ASC, version_index DESC
		LIMIT ? OFFSET ?`, projectID, d.dialect.limitArg(limit), offset)
	if err != nil {
		return nil, fmt.Errorf("list ops: %w", err)
	}
	defer rows.Close()
	var out []trace.OpVersion
	for rows.Next() {
		var op trace.OpVersion
		var created string
		if err := rows.Scan(&op.ObjectID, &op.Digest, &op.VersionIndex, &created, &op.Code); err != nil {
			return nil, fmt.Errorf("list ops: %w", err)
		}
		if op.CreatedAt, err = parseTraceTime(created); err != nil {
			return nil, err
		}
		out = append(out, op)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list ops: %w", err)
	}
	return out, nil
}

// DeleteOp marks the op's live versions deleted.
func (d *DB) DeleteOp(ctx context.Context, projectID int64, objectID string, at time.Time) (int, error) {
	res, err := d.conn().exec(ctx,
		`UPDATE ops SET deleted_at = ? WHERE project_id = ? AND object_id = ? AND deleted_at IS NULL`,
		formatTraceTime(at), projectID, objectID)
	if err != nil {
		return 0, fmt.Errorf("delete op: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("delete op: %w", err)
	}
	return int(n), nil
}

// The statements of WriteCalls. A start takes its trace id from the
// request or, when that is empty, from the parent inside the same
// statement: every statement of the transaction writes, so SQLite never
// has to upgrade a read transaction to a write one (which fails at once
// under WAL when another writer committed in between).
const (
	startCallSQL = `
		INSERT INTO calls (project_id, id, op_name, display_name, trace_id, parent_id, thread_id, turn_id,
			started_at, attributes, inputs, svc_user_id, svc_run_id)
		SELECT ?, ?, ?, ?, t.trace_id, ?, ?, ?, ?, ?, ?, ?, ?
		FROM (SELECT COALESCE(NULLIF(?, ''),
			(SELECT p.trace_id FROM calls p WHERE p.project_id = ? AND p.id = ?)) AS trace_id) t
		WHERE t.trace_id IS NOT NULL
		ON CONFLICT (project_id, id) DO NOTHING`
	endCallSQL = `
		UPDATE calls SET ended_at = ?, exception = ?, output = ?, summary = ?, display_name = COALESCE(?, display_name)
		WHERE project_id = ? AND id = ?`
	// pendingEndSQL keeps the end of a call not started yet; a repeated
	// end replaces it, as it would replace a started call's, and is kept
	// from its own arrival.
	pendingEndSQL = `
		INSERT INTO call_ends (project_id, id, ended_at, exception, output, summary, display_name, kept_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (project_id, id) DO UPDATE SET ended_at = excluded.ended_at, exception = excluded.exception,
			output = excluded.output, summary = excluded.summary, display_name = excluded.display_name,
			kept_at = excluded.kept_at`
	takePendingEndSQL = `
		DELETE FROM call_ends WHERE project_id = ? AND id = ?
		RETURNING ended_at, exception, output, summary, display_name`
)

// callEndTTL is how long an end whose call has not started is kept: an SDK
// sends a call's start and end within seconds of each other, so an end
// still waiting a day later belongs to a start that was lost or refused.
const callEndTTL = 24 * time.Hour

// keptCallEnds are the ends kept in call_ends, dated by when they were kept.
var keptCallEnds = expiringRows{table: "call_ends", key: "project_id, id", at: "kept_at"}

// callEndPurgeBatch bounds the expired ends one WriteCalls deletes. Every
// batch that keeps ends takes up to this many expired ones away, so the
// table stays near its waiting ends without any statement ever deleting
// an unbounded number.
const callEndPurgeBatch = 100

// WriteCalls applies starts and ends in order, in one transaction. An end
// whose call has not started is kept in call_ends, and the start applies
// it, so that the order in which an SDK's batches (or the items of one
// batch) arrive changes nothing. An end kept longer than callEndTTL is
// purged: a batch that keeps ends also deletes up to callEndPurgeBatch
// expired ones.
//
// On PostgreSQL a batch that links completions may deadlock with the
// gateway's usage writer linking the same ones in another order; the
// database then aborts one of the two, and this side tries again (every
// write of a batch is idempotent).
func (d *DB) WriteCalls(ctx context.Context, writes []trace.CallWrite) ([]string, error) {
	for attempt := 1; ; attempt++ {
		traces, err := d.writeCallsOnce(ctx, writes)
		if err == nil || !isDeadlock(err) || attempt == writeCallsAttempts {
			return traces, err
		}
	}
}

// writeCallsAttempts bounds WriteCalls' tries after deadlocks.
const writeCallsAttempts = 3

func (d *DB) writeCallsOnce(ctx context.Context, writes []trace.CallWrite) ([]string, error) {
	tx, c, err := d.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("write calls: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var start, end *sql.Stmt
	if end, err = c.prepare(ctx, endCallSQL); err != nil {
		return nil, fmt.Errorf("write calls: %w", err)
	}
	defer end.Close()
	traces := make([]string, len(writes))
	now := time.Now()
	kept := false
	for i, w := range writes {
		switch {
		case w.Start != nil:
			if start == nil {
				if start, err = c.prepare(ctx, startCallSQL); err != nil {
					return nil, fmt.Errorf("write calls: %w", err)
				}
				defer start.Close()
			}
			if traces[i], err = writeStart(ctx, c, start, end, w.Start); err != nil {
				return nil, &trace.CallWriteError{Index: i, Err: err}
			}
		case w.End != nil:
			pending, err := writeEnd(ctx, c, end, w.End, now)
			if err != nil {
				return nil, &trace.CallWriteError{Index: i, Err: err}
			}
			kept = kept || pending
		}
	}
	if kept {
		if _, err := keptCallEnds.purge(ctx, c, now.Add(-callEndTTL).UnixNano(), callEndPurgeBatch); err != nil {
			return nil, fmt.Errorf("write calls: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("write calls: %w", err)
	}
	return traces, nil
}

func writeStart(ctx context.Context, c conn, stmt, end *sql.Stmt, s *trace.CallStart) (string, error) {
	res, err := stmt.ExecContext(ctx,
		s.ProjectID, s.ID, s.OpName, s.DisplayName, s.ParentID, s.ThreadID, s.TurnID,
		formatTraceTime(s.StartedAt), jsonOrDefault(s.Attributes, "{}"), jsonOrDefault(s.Inputs, "{}"), s.SvcUserID, s.SvcRunID,
		s.TraceID, s.ProjectID, s.ParentID)
	if err != nil {
		return "", fmt.Errorf("start call: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return "", fmt.Errorf("start call: %w", err)
	} else if n == 1 {
		if err := applyPendingEnd(ctx, c, end, s.ProjectID, s.ID); err != nil {
			return "", err
		}
		if s.TraceID != "" {
			return s.TraceID, nil
		}
		return traceOf(ctx, c, s.ProjectID, s.ID)
	}
	// Nothing inserted: the call exists (a retried start keeps the stored
	// call and answers its trace id), or its parent is unknown.
	traceID, err := traceOf(ctx, c, s.ProjectID, s.ID)
	if errors.Is(err, trace.ErrNotFound) {
		return "", trace.ErrParentNotFound
	}
	return traceID, err
}

// applyPendingEnd applies the end that arrived before the call's start, if
// one did.
func applyPendingEnd(ctx context.Context, c conn, end *sql.Stmt, projectID int64, id string) error {
	var e trace.CallEnd
	var ended string
	var exception, output, display sql.NullString
	var summary []byte
	err := c.queryRow(ctx, takePendingEndSQL, projectID, id).Scan(&ended, &exception, &output, &summary, &display)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("take pending end: %w", err)
	}
	e.ProjectID, e.ID = projectID, id
	if e.EndedAt, err = parseTraceTime(ended); err != nil {
		return err
	}
	e.Exception, e.DisplayName = nullString(exception), nullString(display)
	if output.Valid {
		e.Output = json.RawMessage(output.String)
	}
	e.Summary = summary
	// The call was just inserted, so the end applies and is not kept again.
	_, err = writeEnd(ctx, c, end, &e, time.Time{})
	return err
}

// writeEnd ends the call, or keeps the end in call_ends, dated now, when
// the call has not started; pending reports the latter.
func writeEnd(ctx context.Context, c conn, stmt *sql.Stmt, e *trace.CallEnd, now time.Time) (pending bool, err error) {
	var output any
	if len(e.Output) > 0 && string(e.Output) != "null" {
		output = string(e.Output)
	}
	summary := jsonOrDefault(e.Summary, "{}")
	res, err := stmt.ExecContext(ctx, formatTraceTime(e.EndedAt), e.Exception, output, summary, e.DisplayName, e.ProjectID, e.ID)
	if err != nil {
		return false, fmt.Errorf("end call: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("end call: %w", err)
	}
	if n == 0 {
		if _, err := c.exec(ctx, pendingEndSQL, e.ProjectID, e.ID, formatTraceTime(e.EndedAt), e.Exception,
			output, summary, e.DisplayName, now.UnixNano()); err != nil {
			return false, fmt.Errorf("keep early end of call %s: %w", e.ID, err)
		}
		return true, nil
	}
	if e.Completion != nil {
		return false, linkSpanCompletion(ctx, c, e.ProjectID, e.ID, e.Completion, e.EndedAt)
	}
	if done, ok := fold.CompletionOf(e.Output); ok {
		return false, linkSDKCompletion(ctx, c, e.ProjectID, e.ID, done)
	}
	return false, nil
}

func traceOf(ctx context.Context, c conn, projectID int64, id string) (string, error) {
	var traceID string
	err := c.queryRow(ctx, `SELECT trace_id FROM calls WHERE project_id = ? AND id = ?`, projectID, id).Scan(&traceID)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("call %s: %w", id, trace.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("read trace id: %w", err)
	}
	return traceID, nil
}

func jsonOrDefault(m json.RawMessage, def string) string {
	if len(m) == 0 {
		return def
	}
	return string(m)
}

// callColumns are the columns scanCall reads, in its order.
const callColumns = `c.id, c.op_name, c.display_name, c.trace_id, c.parent_id, c.thread_id, c.turn_id,
	c.started_at, c.ended_at, c.exception, c.attributes, c.inputs, c.output, c.summary, c.svc_user_id, c.svc_run_id`

type rowScanner interface{ Scan(dest ...any) error }

func scanCall(sc rowScanner, projectID int64) (trace.Call, error) {
	c := trace.Call{ProjectID: projectID}
	var display, parent, thread, turn, ended, exception, output, user, run sql.NullString
	var started string
	var attrs, inputs, summary []byte
	if err := sc.Scan(&c.ID, &c.OpName, &display, &c.TraceID, &parent, &thread, &turn,
		&started, &ended, &exception, &attrs, &inputs, &output, &summary, &user, &run); err != nil {
		return trace.Call{}, err
	}
	var err error
	if c.StartedAt, err = parseTraceTime(started); err != nil {
		return trace.Call{}, err
	}
	if c.EndedAt, err = parseNullTraceTime(ended); err != nil {
		return trace.Call{}, err
	}
	c.DisplayName, c.ParentID, c.ThreadID, c.TurnID = nullString(display), nullString(parent), nullString(thread), nullString(turn)
	c.Exception, c.SvcUserID, c.SvcRunID = nullString(exception), nullString(user), nullString(run)
	c.Attributes, c.Inputs, c.Summary = attrs, inputs, summary
	if output.Valid {
		c.Output = json.RawMessage(output.String)
	}
	return c, nil
}

func nullString(s sql.NullString) *string {
	if !s.Valid {
		return nil
	}
	return &s.String
}

// ReadCall returns one call.
func (d *DB) ReadCall(ctx context.Context, projectID int64, id string) (trace.Call, error) {
	row := d.conn().queryRow(ctx, `SELECT `+callColumns+` FROM calls c WHERE c.project_id = ? AND c.id = ?`, projectID, id)
	c, err := scanCall(row, projectID)
	if errors.Is(err, sql.ErrNoRows) {
		return trace.Call{}, fmt.Errorf("call %s: %w", id, trace.ErrNotFound)
	}
	if err != nil {
		return trace.Call{}, fmt.Errorf("read call: %w", err)
	}
	return c, nil
}

// QueryCalls calls fn for each call the query selects, in its order
// (started_at then id unless sort_by says otherwise).
func (d *DB) QueryCalls(ctx context.Context, projectID int64, q trace.CallsQuery, fn func(*trace.Call) error) error {
	cur, err := d.OpenCalls(ctx, projectID, q)
	if err != nil {
		return err
	}
	defer cur.Close()
	var c trace.Call
	for {
		ok, err := cur.Next(&c)
		if err != nil || !ok {
			return err
		}
		if err := fn(&c); err != nil {
			return err
		}
	}
}

// OpenCalls returns a cursor over the calls the query selects, in
// QueryCalls' order. It holds a connection until closed.
func (d *DB) OpenCalls(ctx context.Context, projectID int64, q trace.CallsQuery) (trace.CallCursor, error) {
	where, err := whereCalls(d.expr, projectID, q.Filter, q.Query)
	if err != nil {
		return nil, fmt.Errorf("query calls: %w", err)
	}
	order, err := orderCalls(d.expr, q.SortBy)
	if err != nil {
		return nil, fmt.Errorf("query calls: %w", err)
	}
	args := append(append(where.args, order.args...), d.dialect.limitArg(q.Limit), q.Offset)
	rows, err := d.conn().query(ctx,
		`SELECT `+callColumns+` FROM calls c WHERE `+where.sql+` ORDER BY `+order.sql+` LIMIT ? OFFSET ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("query calls: %w", err)
	}
	return &callCursor{rows: rows, projectID: projectID}, nil
}

// callCursor reads calls from rows as they are asked for.
type callCursor struct {
	rows      *sql.Rows
	projectID int64
}

func (c *callCursor) Next(out *trace.Call) (bool, error) {
	if !c.rows.Next() {
		if err := c.rows.Err(); err != nil {
			return false, fmt.Errorf("query calls: %w", err)
		}
		return false, nil
	}
	call, err := scanCall(c.rows, c.projectID)
	if err != nil {
		return false, fmt.Errorf("query calls: %w", err)
	}
	*out = call
	return true, nil
}

func (c *callCursor) Close() error { return c.rows.Close() }

// FinishCall ends a call of op opName, keeping an earlier end time.
func (d *DB) FinishCall(ctx context.Context, projectID int64, id, opName string, at time.Time, summary json.RawMessage, exception *string) error {
	if d.dialect == dialectPostgres {
		return d.finishCallPostgres(ctx, projectID, id, opName, at, summary, exception)
	}
	var patch any
	if len(summary) > 0 {
		patch = string(summary)
	}
	res, err := d.conn().exec(ctx, `
		UPDATE calls SET
			ended_at = COALESCE(ended_at, ?),
			summary = CASE WHEN ? IS NULL THEN summary ELSE json_patch(summary, ?) END,
			exception = COALESCE(?, exception)
		WHERE project_id = ? AND id = ? AND op_name = ?`,
		formatTraceTime(at), patch, patch, exception, projectID, id, opName)
	if err != nil {
		return fmt.Errorf("finish call: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("finish call: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("call %s: %w", id, trace.ErrNotFound)
	}
	return nil
}

// finishCallPostgres is FinishCall on PostgreSQL, which has no json_patch:
// the call is locked, its summary merged in Go (as SQLite's json_patch
// merges, to the same text) and written back.
func (d *DB) finishCallPostgres(ctx context.Context, projectID int64, id, opName string, at time.Time, summary json.RawMessage, exception *string) error {
	tx, c, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("finish call: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var stored string
	err = c.queryRow(ctx, `SELECT summary FROM calls WHERE project_id = ? AND id = ? AND op_name = ? FOR UPDATE`,
		projectID, id, opName).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("call %s: %w", id, trace.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("finish call: %w", err)
	}
	if len(summary) > 0 {
		merged, err := jsonmerge.Patch([]byte(stored), summary)
		if err != nil {
			return fmt.Errorf("finish call: merge summary: %w", err)
		}
		stored = string(merged)
	}
	if _, err := c.exec(ctx, `
		UPDATE calls SET ended_at = COALESCE(ended_at, ?), summary = ?, exception = COALESCE(?, exception)
		WHERE project_id = ? AND id = ?`,
		formatTraceTime(at), stored, exception, projectID, id); err != nil {
		return fmt.Errorf("finish call: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("finish call: %w", err)
	}
	return nil
}

// TraceUsageCalls selects at most limit calls for the usage roll-up, in
// started_at order, reading only what the roll-up needs: ids, the
// unfinished flag, summary.usage as JSON text and, for calls an SDK
// logged, their SDK children's summary.usage.
func (d *DB) TraceUsageCalls(ctx context.Context, projectID int64, filter *trace.CallsFilter, query *trace.Query, limit int) ([]trace.UsageCall, error) {
	where, err := whereCalls(d.expr, projectID, filter, query)
	if err != nil {
		return nil, fmt.Errorf("select usage calls: %w", err)
	}
	return d.usageCalls(ctx, projectID, where, limit)
}

// CallsUsageCalls selects at most limit calls of the traces the calls ids
// belong to, for /calls/usage.
func (d *DB) CallsUsageCalls(ctx context.Context, projectID int64, ids []string, limit int) ([]trace.UsageCall, error) {
	in := inStrings("a.id", ids)
	where := sqlFrag{
		sql:  "c.project_id = ? AND c.trace_id IN (SELECT a.trace_id FROM calls a WHERE a.project_id = ? AND " + in.sql + ")",
		args: append([]any{projectID, projectID}, in.args...),
	}
	return d.usageCalls(ctx, projectID, where, limit)
}

// usageSQL is summary.usage as JSON text, and sourceSQL
// attributes.weave.source as text, of the calls table aliased alias.
// PostgreSQL's json (not jsonb) gives the stored text of the member back
// as it is, as SQLite's -> does.
func usageSQL(d dialect, alias string) string {
	if d == dialectPostgres {
		return `CAST(CAST(` + alias + `.summary AS json) -> 'usage' AS text)`
	}
	return alias + `.summary -> '$.usage'`
}

// costsSQL is summary.weave.costs as JSON text.
func costsSQL(d dialect, alias string) string {
	if d == dialectPostgres {
		return `CAST(CAST(` + alias + `.summary AS json) #> '{weave,costs}' AS text)`
	}
	return alias + `.summary -> '$.weave.costs'`
}

func sourceSQL(d dialect, alias string) string {
	if d == dialectPostgres {
		return `(CAST(` + alias + `.attributes AS json) #>> '{weave,source}')`
	}
	return `json_extract(` + alias + `.attributes, '$.weave.source')`
}

func (d *DB) usageCalls(ctx context.Context, projectID int64, where sqlFrag, limit int) ([]trace.UsageCall, error) {
	rows, err := d.conn().query(ctx, `
		SELECT c.id, c.parent_id, c.ended_at IS NULL, `+usageSQL(d.dialect, "c")+`, `+sourceSQL(d.dialect, "c")+`,
			`+costsSQL(d.dialect, "c")+`
		FROM calls c WHERE `+where.sql+`
		ORDER BY c.started_at, c.id LIMIT ?`, append(where.args, d.dialect.limitArg(limit))...)
	if err != nil {
		return nil, fmt.Errorf("select usage calls: %w", err)
	}
	defer rows.Close()
	out := make([]trace.UsageCall, 0, min(max(limit, 0), 1024))
	sdk := make(map[string]cumulativeCall)
	for rows.Next() {
		var c trace.UsageCall
		var parent, usage, source, costs sql.NullString
		if err := rows.Scan(&c.ID, &parent, &c.Unfinished, &usage, &source, &costs); err != nil {
			return nil, fmt.Errorf("select usage calls: %w", err)
		}
		c.ParentID, c.Usage, c.Costs = parent.String, usage.String, costs.String
		if c.SDK = fold.IsClientSource(source.String); c.SDK {
			sdk[c.ID] = cumulativeCall{index: len(out), source: source.String}
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("select usage calls: %w", err)
	}
	rows.Close()
	if err := d.sdkChildUsage(ctx, projectID, out, sdk); err != nil {
		return nil, err
	}
	return out, nil
}

// childUsageBatch is how many parent ids one query of sdkChildUsage names.
const childUsageBatch = 500

// cumulativeCall is a call whose summary holds children's usage
// (fold.IsClientSource): its index in the roll-up's calls and its source.
type cumulativeCall struct {
	index  int
	source string
}

// sdkChildUsage fills ChildUsage of the calls whose summaries are
// cumulative (out[sdk[id].index]) with the summary.usage of each of their
// children, selected or not, that fold.SummaryHoldsChild says the parent's
// summary holds.
func (d *DB) sdkChildUsage(ctx context.Context, projectID int64, out []trace.UsageCall, sdk map[string]cumulativeCall) error {
	if len(sdk) == 0 {
		return nil
	}
	parents := make([]string, 0, len(sdk))
	for id := range sdk {
		parents = append(parents, id)
	}
	for start := 0; start < len(parents); start += childUsageBatch {
		in := inStrings("k.parent_id", parents[start:min(start+childUsageBatch, len(parents))])
		rows, err := d.conn().query(ctx, `
			SELECT k.parent_id, `+usageSQL(d.dialect, "k")+`, `+sourceSQL(d.dialect, "k")+`
			FROM calls k WHERE k.project_id = ? AND `+in.sql, append([]any{projectID}, in.args...)...)
		if err != nil {
			return fmt.Errorf("select child usage: %w", err)
		}
		for rows.Next() {
			var parent string
			var usage, source sql.NullString
			if err := rows.Scan(&parent, &usage, &source); err != nil {
				rows.Close()
				return fmt.Errorf("select child usage: %w", err)
			}
			if p, ok := sdk[parent]; ok && usage.Valid && fold.SummaryHoldsChild(p.source, source.String) {
				out[p.index].ChildUsage = append(out[p.index].ChildUsage, usage.String)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("select child usage: %w", err)
		}
	}
	return nil
}

// UpdateCall renames a call.
func (d *DB) UpdateCall(ctx context.Context, projectID int64, id string, displayName string) error {
	res, err := d.conn().exec(ctx, `UPDATE calls SET display_name = ? WHERE project_id = ? AND id = ?`, displayName, projectID, id)
	if err != nil {
		return fmt.Errorf("update call: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("update call: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("call %s: %w", id, trace.ErrNotFound)
	}
	return nil
}

// SetCallOutput replaces a call's output.
func (d *DB) SetCallOutput(ctx context.Context, projectID int64, id string, output json.RawMessage) error {
	var out any
	if len(output) > 0 && string(output) != "null" {
		out = string(output)
	}
	res, err := d.conn().exec(ctx, `UPDATE calls SET output = ? WHERE project_id = ? AND id = ?`, out, projectID, id)
	if err != nil {
		return fmt.Errorf("set call output: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("set call output: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("call %s: %w", id, trace.ErrNotFound)
	}
	return nil
}

// deleteBatch is how many ids one DELETE of DeleteCalls names.
const deleteBatch = 500

// DeleteCalls deletes the calls, all their descendants, their pending ends
// and their completion links, in one transaction.
func (d *DB) DeleteCalls(ctx context.Context, projectID int64, ids []string) (int, error) {
	tx, c, err := d.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("delete calls: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	in := inStrings("r.id", ids)
	doomed, err := c.queryStrings(ctx, `
		WITH RECURSIVE doomed (id) AS (
			SELECT r.id FROM calls r WHERE r.project_id = ? AND `+in.sql+`
			UNION
			SELECT k.id FROM calls k JOIN doomed ON k.parent_id = doomed.id WHERE k.project_id = ?)
		SELECT id FROM doomed`, append(append([]any{projectID}, in.args...), projectID)...)
	if err != nil {
		return 0, fmt.Errorf("delete calls: %w", err)
	}
	// An asked id may also name an end whose start never came.
	pending := append(append([]string{}, doomed...), ids...)
	// The links first: the keyed ones are found by what their calls keep.
	if err := deleteCallLinks(ctx, c, projectID, doomed); err != nil {
		return 0, fmt.Errorf("delete calls: %w", err)
	}
	for _, del := range []struct {
		table, col string
		ids        []string
	}{
		{"calls", "id", doomed},
		{"call_ends", "id", pending},
	} {
		for start := 0; start < len(del.ids); start += deleteBatch {
			part := inStrings(del.col, del.ids[start:min(start+deleteBatch, len(del.ids))])
			if _, err := c.exec(ctx, `DELETE FROM `+del.table+` WHERE project_id = ? AND `+part.sql,
				append([]any{projectID}, part.args...)...); err != nil {
				return 0, fmt.Errorf("delete calls: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("delete calls: %w", err)
	}
	return len(doomed), nil
}

// CountCalls counts the selected calls, at most limit when limit >= 0.
func (d *DB) CountCalls(ctx context.Context, projectID int64, filter *trace.CallsFilter, query *trace.Query, limit int) (int, error) {
	where, err := whereCalls(d.expr, projectID, filter, query)
	if err != nil {
		return 0, fmt.Errorf("count calls: %w", err)
	}
	var n int
	if err := d.conn().queryRow(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM calls c WHERE `+where.sql+` LIMIT ?) s`,
		append(where.args, d.dialect.limitArg(limit))...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count calls: %w", err)
	}
	return n, nil
}
