package store

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/tollgate-dev/tollgate/org"
)

// orgMigrations version the Admin API's tables. seq orders each list and
// its pages; org_version holds the change version every write moves, so
// replicas poll one row to learn that keys changed.
var orgMigrations = []migration{
	{
		component: "org",
		version:   1,
		sqlite: []string{
			`CREATE TABLE org_projects (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
				name TEXT NOT NULL, created_at INTEGER NOT NULL, archived_at INTEGER NOT NULL DEFAULT 0)`,
			`CREATE TABLE org_service_accounts (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
				project_id TEXT NOT NULL, name TEXT NOT NULL, role TEXT NOT NULL, created_at INTEGER NOT NULL)`,
			`CREATE TABLE org_api_keys (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
				project_id TEXT NOT NULL, service_account_id TEXT NOT NULL, name TEXT NOT NULL,
				redacted TEXT NOT NULL, digest TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL)`,
			`CREATE TABLE org_rate_limits (project_id TEXT NOT NULL, model TEXT NOT NULL,
				rpm INTEGER NOT NULL, tpm INTEGER NOT NULL, PRIMARY KEY (project_id, model))`,
			`CREATE TABLE org_model_permissions (project_id TEXT NOT NULL PRIMARY KEY, mode TEXT NOT NULL, model_ids TEXT NOT NULL)`,
			`CREATE TABLE org_spend_limits (project_id TEXT NOT NULL PRIMARY KEY, threshold_cents INTEGER NOT NULL)`,
			`CREATE TABLE org_audit_logs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
				type TEXT NOT NULL, effective_at INTEGER NOT NULL, actor TEXT NOT NULL,
				project_id TEXT NOT NULL, resource_id TEXT NOT NULL, data TEXT NOT NULL)`,
			`CREATE TABLE org_version (id INTEGER NOT NULL PRIMARY KEY, version INTEGER NOT NULL)`,
			`INSERT INTO org_version (id, version) VALUES (1, 0)`,
		},
		postgres: []string{
			`CREATE TABLE org_projects (seq BIGSERIAL PRIMARY KEY, id TEXT COLLATE "C" NOT NULL UNIQUE,
				name TEXT NOT NULL, created_at BIGINT NOT NULL, archived_at BIGINT NOT NULL DEFAULT 0)`,
			`CREATE TABLE org_service_accounts (seq BIGSERIAL PRIMARY KEY, id TEXT COLLATE "C" NOT NULL UNIQUE,
				project_id TEXT COLLATE "C" NOT NULL, name TEXT NOT NULL, role TEXT NOT NULL, created_at BIGINT NOT NULL)`,
			`CREATE TABLE org_api_keys (seq BIGSERIAL PRIMARY KEY, id TEXT COLLATE "C" NOT NULL UNIQUE,
				project_id TEXT COLLATE "C" NOT NULL, service_account_id TEXT COLLATE "C" NOT NULL, name TEXT NOT NULL,
				redacted TEXT NOT NULL, digest TEXT COLLATE "C" NOT NULL UNIQUE, created_at BIGINT NOT NULL)`,
			`CREATE TABLE org_rate_limits (project_id TEXT COLLATE "C" NOT NULL, model TEXT COLLATE "C" NOT NULL,
				rpm BIGINT NOT NULL, tpm BIGINT NOT NULL, PRIMARY KEY (project_id, model))`,
			`CREATE TABLE org_model_permissions (project_id TEXT COLLATE "C" NOT NULL PRIMARY KEY, mode TEXT NOT NULL, model_ids TEXT NOT NULL)`,
			`CREATE TABLE org_spend_limits (project_id TEXT COLLATE "C" NOT NULL PRIMARY KEY, threshold_cents BIGINT NOT NULL)`,
			`CREATE TABLE org_audit_logs (seq BIGSERIAL PRIMARY KEY, id TEXT COLLATE "C" NOT NULL UNIQUE,
				type TEXT COLLATE "C" NOT NULL, effective_at BIGINT NOT NULL, actor TEXT NOT NULL,
				project_id TEXT COLLATE "C" NOT NULL, resource_id TEXT NOT NULL, data TEXT NOT NULL)`,
			`CREATE TABLE org_version (id INTEGER NOT NULL PRIMARY KEY, version BIGINT NOT NULL)`,
			`INSERT INTO org_version (id, version) VALUES (1, 0)`,
		},
	},
	{
		// Spend alerts, and the firings that make each fire once per
		// month and threshold across replicas.
		component: "org",
		version:   2,
		sqlite: []string{
			`CREATE TABLE org_spend_alerts (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
				project_id TEXT NOT NULL, threshold_cents INTEGER NOT NULL, recipients TEXT NOT NULL,
				subject_prefix TEXT NOT NULL, webhook_url TEXT NOT NULL, created_at INTEGER NOT NULL)`,
			`CREATE TABLE org_spend_alert_firings (alert_id TEXT NOT NULL, threshold_cents INTEGER NOT NULL,
				period INTEGER NOT NULL, fired_at INTEGER NOT NULL, PRIMARY KEY (alert_id, threshold_cents, period))`,
		},
		postgres: []string{
			`CREATE TABLE org_spend_alerts (seq BIGSERIAL PRIMARY KEY, id TEXT COLLATE "C" NOT NULL UNIQUE,
				project_id TEXT COLLATE "C" NOT NULL, threshold_cents BIGINT NOT NULL, recipients TEXT NOT NULL,
				subject_prefix TEXT NOT NULL, webhook_url TEXT NOT NULL, created_at BIGINT NOT NULL)`,
			`CREATE TABLE org_spend_alert_firings (alert_id TEXT COLLATE "C" NOT NULL, threshold_cents BIGINT NOT NULL,
				period BIGINT NOT NULL, fired_at BIGINT NOT NULL, PRIMARY KEY (alert_id, threshold_cents, period))`,
		},
	},
}

var _ org.Store = (*DB)(nil)

// orgWrite runs write and appends a in one transaction that also moves the
// change version: an admin action is written whole or not at all.
func (d *DB) orgWrite(ctx context.Context, a org.AuditLog, write func(c conn) error) error {
	tx, c, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("org write: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := write(c); err != nil {
		return err
	}
	if _, err := c.exec(ctx, `INSERT INTO org_audit_logs (id, type, effective_at, actor, project_id, resource_id, data)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, a.ID, a.Type, a.EffectiveAt, a.ActorKey, a.ProjectID, a.ResourceID, a.Data); err != nil {
		return fmt.Errorf("org write: audit: %w", err)
	}
	if _, err := c.exec(ctx, `UPDATE org_version SET version = version + 1 WHERE id = 1`); err != nil {
		return fmt.Errorf("org write: version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("org write: commit: %w", err)
	}
	return nil
}

// mustAffect turns a statement that changed no row into org.ErrNotFound.
func mustAffect(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err == nil && n == 0 {
		err = org.ErrNotFound
	}
	return err
}

// Version implements org.Store.
func (d *DB) Version(ctx context.Context) (int64, error) {
	var v int64
	if err := d.conn().queryRow(ctx, `SELECT version FROM org_version WHERE id = 1`).Scan(&v); err != nil {
		return 0, fmt.Errorf("org version: %w", err)
	}
	return v, nil
}

// CreateProject implements org.Store.
func (d *DB) CreateProject(ctx context.Context, p org.Project, a org.AuditLog) error {
	return d.orgWrite(ctx, a, func(c conn) error {
		_, err := c.exec(ctx, `INSERT INTO org_projects (id, name, created_at, archived_at) VALUES (?, ?, ?, ?)`,
			p.ID, p.Name, p.CreatedAt, p.ArchivedAt)
		return err
	})
}

// UpdateProject implements org.Store.
func (d *DB) UpdateProject(ctx context.Context, p org.Project, a org.AuditLog) error {
	return d.orgWrite(ctx, a, func(c conn) error {
		return mustAffect(c.exec(ctx, `UPDATE org_projects SET name = ?, archived_at = ? WHERE id = ?`, p.Name, p.ArchivedAt, p.ID))
	})
}

const projectColumns = `id, name, created_at, archived_at`

func scanProject(r interface{ Scan(...any) error }) (org.Project, error) {
	var p org.Project
	err := r.Scan(&p.ID, &p.Name, &p.CreatedAt, &p.ArchivedAt)
	return p, err
}

// Project implements org.Store.
func (d *DB) Project(ctx context.Context, id string) (org.Project, error) {
	p, err := scanProject(d.conn().queryRow(ctx, `SELECT `+projectColumns+` FROM org_projects WHERE id = ?`, id))
	return p, noRow(err)
}

// noRow maps sql.ErrNoRows to org.ErrNotFound.
func noRow(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return org.ErrNotFound
	}
	return err
}

// orgList reads one page of table's rows matching where (with args), in
// seq order (descending when newestFirst), after the row whose id is
// page.After; hasMore says whether rows follow.
func orgList[T any](ctx context.Context, c conn, columns, table, where string, args []any, page org.Page, newestFirst bool,
	scan func(r interface{ Scan(...any) error }) (T, error)) ([]T, bool, error) {
	// An unknown after id starts from the list's beginning.
	cmp, order, start := ">", "ASC", "-1"
	if newestFirst {
		cmp, order, start = "<", "DESC", "9223372036854775807"
	}
	q := `SELECT ` + columns + ` FROM ` + table + ` WHERE ` + where
	if page.After != "" {
		q += ` AND seq ` + cmp + ` COALESCE((SELECT seq FROM ` + table + ` WHERE id = ?), ` + start + `)`
		args = append(args, page.After)
	}
	q += ` ORDER BY seq ` + order + ` LIMIT ?`
	args = append(args, page.Limit+1)
	rows, err := c.query(ctx, q, args...)
	if err != nil {
		return nil, false, fmt.Errorf("list %s: %w", table, err)
	}
	defer rows.Close()
	out := make([]T, 0, page.Limit)
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, false, fmt.Errorf("list %s: %w", table, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list %s: %w", table, err)
	}
	if len(out) > page.Limit {
		return out[:page.Limit], true, nil
	}
	return out, false, nil
}

// Projects implements org.Store.
func (d *DB) Projects(ctx context.Context, page org.Page, includeArchived bool) ([]org.Project, bool, error) {
	where := `archived_at = 0`
	if includeArchived {
		where = `1 = 1`
	}
	return orgList(ctx, d.conn(), projectColumns, "org_projects", where, nil, page, false, scanProject)
}

// CreateServiceAccount implements org.Store.
func (d *DB) CreateServiceAccount(ctx context.Context, sa org.ServiceAccount, k *org.APIKey, a org.AuditLog) error {
	return d.orgWrite(ctx, a, func(c conn) error {
		if _, err := c.exec(ctx, `INSERT INTO org_service_accounts (id, project_id, name, role, created_at) VALUES (?, ?, ?, ?, ?)`,
			sa.ID, sa.ProjectID, sa.Name, sa.Role, sa.CreatedAt); err != nil {
			return err
		}
		if k == nil {
			return nil
		}
		_, err := c.exec(ctx, `INSERT INTO org_api_keys (id, project_id, service_account_id, name, redacted, digest, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, k.ID, k.ProjectID, k.ServiceAccountID, k.Name, k.Redacted, hex.EncodeToString(k.Digest[:]), k.CreatedAt)
		return err
	})
}

const serviceAccountColumns = `id, project_id, name, role, created_at`

func scanServiceAccount(r interface{ Scan(...any) error }) (org.ServiceAccount, error) {
	var sa org.ServiceAccount
	err := r.Scan(&sa.ID, &sa.ProjectID, &sa.Name, &sa.Role, &sa.CreatedAt)
	return sa, err
}

// ServiceAccount implements org.Store.
func (d *DB) ServiceAccount(ctx context.Context, projectID, id string) (org.ServiceAccount, error) {
	sa, err := scanServiceAccount(d.conn().queryRow(ctx,
		`SELECT `+serviceAccountColumns+` FROM org_service_accounts WHERE project_id = ? AND id = ?`, projectID, id))
	return sa, noRow(err)
}

// ServiceAccounts implements org.Store.
func (d *DB) ServiceAccounts(ctx context.Context, projectID string, page org.Page) ([]org.ServiceAccount, bool, error) {
	return orgList(ctx, d.conn(), serviceAccountColumns, "org_service_accounts", `project_id = ?`, []any{projectID}, page, false, scanServiceAccount)
}

// DeleteServiceAccount implements org.Store.
func (d *DB) DeleteServiceAccount(ctx context.Context, projectID, id string, a org.AuditLog) error {
	return d.orgWrite(ctx, a, func(c conn) error {
		if err := mustAffect(c.exec(ctx, `DELETE FROM org_service_accounts WHERE project_id = ? AND id = ?`, projectID, id)); err != nil {
			return err
		}
		_, err := c.exec(ctx, `DELETE FROM org_api_keys WHERE project_id = ? AND service_account_id = ?`, projectID, id)
		return err
	})
}

const apiKeyColumns = `id, project_id, service_account_id, name, redacted, digest, created_at`

func scanAPIKey(r interface{ Scan(...any) error }) (org.APIKey, error) {
	var k org.APIKey
	var digest string
	if err := r.Scan(&k.ID, &k.ProjectID, &k.ServiceAccountID, &k.Name, &k.Redacted, &digest, &k.CreatedAt); err != nil {
		return k, err
	}
	_, err := hex.Decode(k.Digest[:], []byte(digest))
	return k, err
}

// APIKey implements org.Store.
func (d *DB) APIKey(ctx context.Context, projectID, id string) (org.APIKey, error) {
	k, err := scanAPIKey(d.conn().queryRow(ctx, `SELECT `+apiKeyColumns+` FROM org_api_keys WHERE project_id = ? AND id = ?`, projectID, id))
	return k, noRow(err)
}

// APIKeys implements org.Store.
func (d *DB) APIKeys(ctx context.Context, projectID string, page org.Page) ([]org.APIKey, bool, error) {
	return orgList(ctx, d.conn(), apiKeyColumns, "org_api_keys", `project_id = ?`, []any{projectID}, page, false, scanAPIKey)
}

// DeleteAPIKey implements org.Store.
func (d *DB) DeleteAPIKey(ctx context.Context, projectID, id string, a org.AuditLog) error {
	return d.orgWrite(ctx, a, func(c conn) error {
		return mustAffect(c.exec(ctx, `DELETE FROM org_api_keys WHERE project_id = ? AND id = ?`, projectID, id))
	})
}

// RateLimits implements org.Store.
func (d *DB) RateLimits(ctx context.Context, projectID string) ([]org.RateLimit, error) {
	rows, err := d.conn().query(ctx, `SELECT model, rpm, tpm FROM org_rate_limits WHERE project_id = ? ORDER BY model`, projectID)
	if err != nil {
		return nil, fmt.Errorf("rate limits: %w", err)
	}
	defer rows.Close()
	var out []org.RateLimit
	for rows.Next() {
		rl := org.RateLimit{ProjectID: projectID}
		if err := rows.Scan(&rl.Model, &rl.MaxRequestsPer1Minute, &rl.MaxTokensPer1Minute); err != nil {
			return nil, fmt.Errorf("rate limits: %w", err)
		}
		out = append(out, rl)
	}
	return out, rows.Err()
}

// SetRateLimit implements org.Store.
func (d *DB) SetRateLimit(ctx context.Context, rl org.RateLimit, a org.AuditLog) error {
	return d.orgWrite(ctx, a, func(c conn) error {
		_, err := c.exec(ctx, `INSERT INTO org_rate_limits (project_id, model, rpm, tpm) VALUES (?, ?, ?, ?)
			ON CONFLICT (project_id, model) DO UPDATE SET rpm = excluded.rpm, tpm = excluded.tpm`,
			rl.ProjectID, rl.Model, rl.MaxRequestsPer1Minute, rl.MaxTokensPer1Minute)
		return err
	})
}

// ModelPermissions implements org.Store.
func (d *DB) ModelPermissions(ctx context.Context, projectID string) (org.ModelPermissions, bool, error) {
	var mp org.ModelPermissions
	var ids string
	err := d.conn().queryRow(ctx, `SELECT mode, model_ids FROM org_model_permissions WHERE project_id = ?`, projectID).Scan(&mp.Mode, &ids)
	if errors.Is(err, sql.ErrNoRows) {
		return mp, false, nil
	}
	if err == nil {
		err = json.Unmarshal([]byte(ids), &mp.ModelIDs)
	}
	if err != nil {
		return mp, false, fmt.Errorf("model permissions: %w", err)
	}
	return mp, true, nil
}

// SetModelPermissions implements org.Store.
func (d *DB) SetModelPermissions(ctx context.Context, projectID string, mp *org.ModelPermissions, a org.AuditLog) error {
	return d.orgWrite(ctx, a, func(c conn) error {
		if mp == nil {
			_, err := c.exec(ctx, `DELETE FROM org_model_permissions WHERE project_id = ?`, projectID)
			return err
		}
		ids, err := json.Marshal(mp.ModelIDs)
		if err != nil {
			return err
		}
		_, err = c.exec(ctx, `INSERT INTO org_model_permissions (project_id, mode, model_ids) VALUES (?, ?, ?)
			ON CONFLICT (project_id) DO UPDATE SET mode = excluded.mode, model_ids = excluded.model_ids`, projectID, mp.Mode, string(ids))
		return err
	})
}

// SpendLimit implements org.Store.
func (d *DB) SpendLimit(ctx context.Context, projectID string) (org.SpendLimit, bool, error) {
	var sl org.SpendLimit
	err := d.conn().queryRow(ctx, `SELECT threshold_cents FROM org_spend_limits WHERE project_id = ?`, projectID).Scan(&sl.ThresholdCents)
	if errors.Is(err, sql.ErrNoRows) {
		return sl, false, nil
	}
	if err != nil {
		return sl, false, fmt.Errorf("spend limit: %w", err)
	}
	return sl, true, nil
}

// SetSpendLimit implements org.Store.
func (d *DB) SetSpendLimit(ctx context.Context, projectID string, sl *org.SpendLimit, a org.AuditLog) error {
	return d.orgWrite(ctx, a, func(c conn) error {
		if sl == nil {
			_, err := c.exec(ctx, `DELETE FROM org_spend_limits WHERE project_id = ?`, projectID)
			return err
		}
		_, err := c.exec(ctx, `INSERT INTO org_spend_limits (project_id, threshold_cents) VALUES (?, ?)
			ON CONFLICT (project_id) DO UPDATE SET threshold_cents = excluded.threshold_cents`, projectID, sl.ThresholdCents)
		return err
	})
}

const auditColumns = `id, type, effective_at, actor, project_id, resource_id, data`

func scanAudit(r interface{ Scan(...any) error }) (org.AuditLog, error) {
	var a org.AuditLog
	err := r.Scan(&a.ID, &a.Type, &a.EffectiveAt, &a.ActorKey, &a.ProjectID, &a.ResourceID, &a.Data)
	return a, err
}

// AuditLogs implements org.Store.
func (d *DB) AuditLogs(ctx context.Context, q org.AuditQuery) ([]org.AuditLog, bool, error) {
	where := []string{`1 = 1`}
	var args []any
	for _, f := range []struct {
		column string
		values []string
	}{{"project_id", q.ProjectIDs}, {"type", q.EventTypes}} {
		if len(f.values) == 0 {
			continue
		}
		where = append(where, f.column+` IN (`+strings.TrimSuffix(strings.Repeat("?, ", len(f.values)), ", ")+`)`)
		for _, v := range f.values {
			args = append(args, v)
		}
	}
	return orgList(ctx, d.conn(), auditColumns, "org_audit_logs", strings.Join(where, " AND "), args, q.Page, true, scanAudit)
}

// RuntimeKeys implements org.Store.
func (d *DB) RuntimeKeys(ctx context.Context) ([]org.RuntimeKey, int64, error) {
	e, err := d.Enforced(ctx)
	return e.Keys, e.Version, err
}

// Enforced implements org.Store: the version and the rest are read in one
// transaction, so a caller that polls Version and sees the same value
// holds every change.
func (d *DB) Enforced(ctx context.Context) (org.Enforced, error) {
	e := org.Enforced{Permissions: map[string]org.ModelPermissions{}, SpendLimits: map[string]org.SpendLimit{}}
	tx, c, err := d.begin(ctx)
	if err != nil {
		return e, fmt.Errorf("enforced org: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	if err := c.queryRow(ctx, `SELECT version FROM org_version WHERE id = 1`).Scan(&e.Version); err != nil {
		return e, fmt.Errorf("enforced org: %w", err)
	}
	const active = ` JOIN org_projects p ON p.id = t.project_id WHERE p.archived_at = 0`
	err = eachRow(ctx, c, `SELECT id FROM org_projects WHERE archived_at = 0 ORDER BY seq`, func(r *sql.Rows) error {
		var id string
		err := r.Scan(&id)
		e.Projects = append(e.Projects, id)
		return err
	})
	if err == nil {
		err = eachRow(ctx, c, `SELECT t.id, t.project_id, t.digest FROM org_api_keys t`+active+` ORDER BY t.seq`, func(r *sql.Rows) error {
			var k org.RuntimeKey
			var digest string
			if err := r.Scan(&k.KeyID, &k.ProjectID, &digest); err != nil {
				return err
			}
			if _, err := hex.Decode(k.Digest[:], []byte(digest)); err != nil {
				return fmt.Errorf("key %s: %w", k.KeyID, err)
			}
			e.Keys = append(e.Keys, k)
			return nil
		})
	}
	if err == nil {
		err = eachRow(ctx, c, `SELECT t.project_id, t.model, t.rpm, t.tpm FROM org_rate_limits t`+active+` ORDER BY t.project_id, t.model`, func(r *sql.Rows) error {
			var rl org.RateLimit
			err := r.Scan(&rl.ProjectID, &rl.Model, &rl.MaxRequestsPer1Minute, &rl.MaxTokensPer1Minute)
			e.RateLimits = append(e.RateLimits, rl)
			return err
		})
	}
	if err == nil {
		err = eachRow(ctx, c, `SELECT t.project_id, t.mode, t.model_ids FROM org_model_permissions t`+active, func(r *sql.Rows) error {
			var id, ids string
			var mp org.ModelPermissions
			if err := r.Scan(&id, &mp.Mode, &ids); err != nil {
				return err
			}
			err := json.Unmarshal([]byte(ids), &mp.ModelIDs)
			e.Permissions[id] = mp
			return err
		})
	}
	if err == nil {
		err = eachRow(ctx, c, `SELECT t.project_id, t.threshold_cents FROM org_spend_limits t`+active, func(r *sql.Rows) error {
			var id string
			var sl org.SpendLimit
			err := r.Scan(&id, &sl.ThresholdCents)
			e.SpendLimits[id] = sl
			return err
		})
	}
	if err != nil {
		return e, fmt.Errorf("enforced org: %w", err)
	}
	return e, nil
}

// eachRow runs q and calls fn on each row.
func eachRow(ctx context.Context, c conn, q string, fn func(*sql.Rows) error) error {
	rows, err := c.query(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
