package store

import (
	"context"
	"database/sql"
	"fmt"
	"sort"

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

// ListFeedback returns the project's feedback on weaveRefs (all of it when
// nil), oldest first. A list of refs reads through weave_feedback_ref, a
// bounded number of refs per statement.
func (d *DB) ListFeedback(ctx context.Context, projectID int64, weaveRefs []string) ([]weave.Feedback, error) {
	if weaveRefs == nil {
		return d.listFeedback(ctx, sqlFrag{sql: `project_id = ?`, args: []any{projectID}})
	}
	var out []weave.Feedback
	for len(weaveRefs) > 0 {
		n := min(len(weaveRefs), maxRowsPerStatement)
		part, err := d.listFeedback(ctx, joinSQL(" AND ",
			sqlFrag{sql: `project_id = ?`, args: []any{projectID}}, inStrings("weave_ref", weaveRefs[:n])))
		if err != nil {
			return nil, err
		}
		out = append(out, part...)
		weaveRefs = weaveRefs[n:]
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func (d *DB) listFeedback(ctx context.Context, where sqlFrag) ([]weave.Feedback, error) {
	rows, err := d.conn().query(ctx, `SELECT project_id, id, weave_ref, wb_user_id, creator, created_at, feedback_type,
		payload, annotation_ref, runnable_ref, call_ref, trigger_ref
		FROM weave_feedback WHERE `+where.sql+` ORDER BY created_at, id`, where.args...)
	if err != nil {
		return nil, fmt.Errorf("list feedback: %w", err)
	}
	defer rows.Close()
	var out []weave.Feedback
	for rows.Next() {
		var f weave.Feedback
		var creator, annotation, runnable, call, trigger sql.NullString
		var created, payload string
		if err := rows.Scan(&f.ProjectID, &f.ID, &f.WeaveRef, &f.WBUserID, &creator, &created, &f.FeedbackType,
			&payload, &annotation, &runnable, &call, &trigger); err != nil {
			return nil, fmt.Errorf("list feedback: %w", err)
		}
		if f.CreatedAt, err = parseTraceTime(created); err != nil {
			return nil, err
		}
		f.Payload = []byte(payload)
		f.Creator, f.AnnotationRef, f.RunnableRef = nullString(creator), nullString(annotation), nullString(runnable)
		f.CallRef, f.TriggerRef = nullString(call), nullString(trigger)
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list feedback: %w", err)
	}
	return out, nil
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
