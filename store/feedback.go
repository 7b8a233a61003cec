package store

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/tollgate-dev/tollgate/weave"
)

const insertFeedbackSQL = `INSERT INTO weave_feedback (project_id, id, weave_ref, wb_user_id, creator, created_at,
	feedback_type, payload, annotation_ref, runnable_ref, call_ref, trigger_ref)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

func feedbackArgs(f *weave.Feedback) []any {
	return []any{f.ProjectID, f.ID, f.WeaveRef, f.WBUserID, f.Creator, formatTraceTime(f.CreatedAt),
		f.FeedbackType, string(f.Payload), f.AnnotationRef, f.RunnableRef, f.CallRef, f.TriggerRef}
}

// PutFeedback stores a new feedback item.
func (d *DB) PutFeedback(ctx context.Context, f weave.Feedback) error {
	if _, err := d.conn().exec(ctx, insertFeedbackSQL, feedbackArgs(&f)...); err != nil {
		return fmt.Errorf("put feedback: %w", err)
	}
	return nil
}

// QueryFeedback calls fn for each feedback item q selects, oldest first
// (then by id), reading them as fn takes them: the page of q.Limit and
// q.Offset is cut by the statement, and an item fn is not called for is
// never read. Refs read through weave_feedback_ref.
func (d *DB) QueryFeedback(ctx context.Context, projectID int64, q weave.FeedbackQuery, fn func(*weave.Feedback) error) error {
	where := sqlFrag{sql: `project_id = ?`, args: []any{projectID}}
	if q.Refs != nil {
		if len(q.Refs) == 0 {
			return nil
		}
		where = joinSQL(" AND ", where, inStrings("weave_ref", q.Refs))
	}
	rows, err := d.conn().query(ctx, `SELECT project_id, id, weave_ref, wb_user_id, creator, created_at, feedback_type,
		payload, annotation_ref, runnable_ref, call_ref, trigger_ref
		FROM weave_feedback WHERE `+where.sql+` ORDER BY created_at, id LIMIT ? OFFSET ?`,
		append(where.args, d.dialect.limitArg(q.Limit), q.Offset)...)
	if err != nil {
		return fmt.Errorf("query feedback: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var f weave.Feedback
		var creator, annotation, runnable, call, trigger sql.NullString
		var created, payload string
		if err := rows.Scan(&f.ProjectID, &f.ID, &f.WeaveRef, &f.WBUserID, &creator, &created, &f.FeedbackType,
			&payload, &annotation, &runnable, &call, &trigger); err != nil {
			return fmt.Errorf("query feedback: %w", err)
		}
		if f.CreatedAt, err = parseTraceTime(created); err != nil {
			return err
		}
		f.Payload = []byte(payload)
		f.Creator, f.AnnotationRef, f.RunnableRef = nullString(creator), nullString(annotation), nullString(runnable)
		f.CallRef, f.TriggerRef = nullString(call), nullString(trigger)
		if err := fn(&f); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("query feedback: %w", err)
	}
	return nil
}

// DeleteFeedback deletes feedback by id.
func (d *DB) DeleteFeedback(ctx context.Context, projectID int64, ids []string) (int, error) {
	return deleteByIDs(ctx, d.conn(), "weave_feedback", projectID, ids)
}

// ReplaceFeedback deletes oldID and stores f in one transaction.
func (d *DB) ReplaceFeedback(ctx context.Context, oldID string, f weave.Feedback) error {
	tx, c, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("replace feedback: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	n, err := deleteByIDs(ctx, c, "weave_feedback", f.ProjectID, []string{oldID})
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("feedback %s: %w", oldID, weave.ErrNotFound)
	}
	if _, err := c.exec(ctx, insertFeedbackSQL, feedbackArgs(&f)...); err != nil {
		return fmt.Errorf("replace feedback: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("replace feedback: %w", err)
	}
	return nil
}

// deleteByIDs deletes a project's rows of table by id.
func deleteByIDs(ctx context.Context, c conn, table string, projectID int64, ids []string) (int, error) {
	total := 0
	for len(ids) > 0 {
		n := min(len(ids), maxRowsPerStatement)
		f := inStrings("id", ids[:n])
		res, err := c.exec(ctx, `DELETE FROM `+table+` WHERE project_id = ? AND `+f.sql,
			append([]any{projectID}, f.args...)...)
		if err != nil {
			return 0, fmt.Errorf("delete from %s: %w", table, err)
		}
		k, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("delete from %s: %w", table, err)
		}
		total += int(k)
		ids = ids[n:]
	}
	return total, nil
}
