package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/tollgate-dev/tollgate/org"
)

const spendAlertColumns = `id, project_id, threshold_cents, recipients, subject_prefix, webhook_url, created_at`

func scanSpendAlert(r interface{ Scan(...any) error }) (org.SpendAlert, error) {
	var sa org.SpendAlert
	var recipients string
	if err := r.Scan(&sa.ID, &sa.ProjectID, &sa.ThresholdCents, &recipients, &sa.SubjectPrefix, &sa.WebhookURL, &sa.CreatedAt); err != nil {
		return sa, err
	}
	return sa, json.Unmarshal([]byte(recipients), &sa.Recipients)
}

// PutSpendAlert implements org.Store.
func (d *DB) PutSpendAlert(ctx context.Context, sa org.SpendAlert, a org.AuditLog) error {
	recipients, err := json.Marshal(sa.Recipients)
	if err != nil {
		return fmt.Errorf("put spend alert: %w", err)
	}
	return d.orgWrite(ctx, a, func(c conn) error {
		_, err := c.exec(ctx, `INSERT INTO org_spend_alerts (`+spendAlertColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET threshold_cents = excluded.threshold_cents, recipients = excluded.recipients,
			subject_prefix = excluded.subject_prefix, webhook_url = excluded.webhook_url`,
			sa.ID, sa.ProjectID, sa.ThresholdCents, string(recipients), sa.SubjectPrefix, sa.WebhookURL, sa.CreatedAt)
		return err
	})
}

// SpendAlert implements org.Store.
func (d *DB) SpendAlert(ctx context.Context, projectID, id string) (org.SpendAlert, error) {
	sa, err := scanSpendAlert(d.conn().queryRow(ctx,
		`SELECT `+spendAlertColumns+` FROM org_spend_alerts WHERE project_id = ? AND id = ?`, projectID, id))
	return sa, noRow(err)
}

// SpendAlerts implements org.Store.
func (d *DB) SpendAlerts(ctx context.Context, projectID string, page org.Page) ([]org.SpendAlert, bool, error) {
	return orgList(ctx, d.conn(), spendAlertColumns, "org_spend_alerts", `project_id = ?`, []any{projectID}, page, false, scanSpendAlert)
}

// DeleteSpendAlert implements org.Store.
func (d *DB) DeleteSpendAlert(ctx context.Context, projectID, id string, a org.AuditLog) error {
	return d.orgWrite(ctx, a, func(c conn) error {
		return mustAffect(c.exec(ctx, `DELETE FROM org_spend_alerts WHERE project_id = ? AND id = ?`, projectID, id))
	})
}

// ActiveSpendAlerts implements org.Store.
func (d *DB) ActiveSpendAlerts(ctx context.Context) ([]org.SpendAlert, error) {
	var out []org.SpendAlert
	err := eachRow(ctx, d.conn(), `SELECT t.id, t.project_id, t.threshold_cents, t.recipients, t.subject_prefix, t.webhook_url, t.created_at
		FROM org_spend_alerts t JOIN org_projects p ON p.id = t.project_id WHERE p.archived_at = 0 ORDER BY t.seq`,
		func(r *sql.Rows) error {
			sa, err := scanSpendAlert(r)
			out = append(out, sa)
			return err
		})
	if err != nil {
		return nil, fmt.Errorf("active spend alerts: %w", err)
	}
	return out, nil
}

// ClaimSpendAlert implements org.Store: the firing's primary key lets
// exactly one caller insert it.
func (d *DB) ClaimSpendAlert(ctx context.Context, id string, thresholdCents, period, firedAt int64) (bool, error) {
	res, err := d.conn().exec(ctx, `INSERT INTO org_spend_alert_firings (alert_id, threshold_cents, period, fired_at)
		VALUES (?, ?, ?, ?) ON CONFLICT (alert_id, threshold_cents, period) DO NOTHING`, id, thresholdCents, period, firedAt)
	if err != nil {
		return false, fmt.Errorf("claim spend alert: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("claim spend alert: %w", err)
	}
	return n == 1, nil
}
