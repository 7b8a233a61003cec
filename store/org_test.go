package store_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/tollgate-dev/tollgate/org"
	"github.com/tollgate-dev/tollgate/store"
)

func TestOrgProjectsAndKeys(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		s := org.NewService(d)
		v0, err := d.Version(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, name := range []string{"a", "b", "c"} {
			p, err := s.CreateProject(ctx, "admin", []byte(`{"name":"`+name+`"}`))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, p.ID)
		}
		if v, _ := d.Version(ctx); v != v0+3 {
			t.Fatalf("version %d after 3 writes from %d", v, v0)
		}
		// Pages of 2, after the last id.
		page, more, err := s.ListProjects(ctx, org.Page{Limit: 2}, false)
		if err != nil || len(page) != 2 || !more || page[0].ID != ids[0] || page[1].ID != ids[1] {
			t.Fatalf("page 1 = %+v, %v, %v", page, more, err)
		}
		page, more, err = s.ListProjects(ctx, org.Page{Limit: 2, After: page[1].ID}, false)
		if err != nil || len(page) != 1 || more || page[0].ID != ids[2] || page[0].Name != "c" {
			t.Fatalf("page 2 = %+v, %v, %v", page, more, err)
		}

		ca, err := s.CreateServiceAccount(ctx, "admin", ids[0], []byte(`{"name":"bot"}`))
		if err != nil {
			t.Fatal(err)
		}
		k, err := d.APIKey(ctx, ids[0], ca.Key.ID)
		if err != nil || k.Digest != sha256.Sum256([]byte(ca.Secret)) || k.Redacted != org.Redact(ca.Secret) || k.ServiceAccountID != ca.ID {
			t.Fatalf("stored key = %+v, %v", k, err)
		}
		keys, version, err := d.RuntimeKeys(ctx)
		if err != nil || len(keys) != 1 || keys[0].KeyID != ca.Key.ID || keys[0].ProjectID != ids[0] || keys[0].Digest != k.Digest {
			t.Fatalf("runtime keys = %+v, %v", keys, err)
		}
		if v, _ := d.Version(ctx); v != version {
			t.Fatalf("runtime keys read at %d, version %d", version, v)
		}

		// Archiving the project takes its keys out of the runtime set.
		if _, err := s.ArchiveProject(ctx, "admin", ids[0]); err != nil {
			t.Fatal(err)
		}
		if keys, _, _ := d.RuntimeKeys(ctx); len(keys) != 0 {
			t.Fatalf("keys of an archived project still authenticate: %+v", keys)
		}
		all, _, _ := s.ListProjects(ctx, org.Page{}, true)
		active, _, _ := s.ListProjects(ctx, org.Page{}, false)
		if len(all) != 3 || len(active) != 2 || all[0].Status() != "archived" {
			t.Fatalf("include_archived: %d, active %d, first %+v", len(all), len(active), all[0])
		}

		// Deleting a service account deletes its key.
		ca2, err := s.CreateServiceAccount(ctx, "admin", ids[1], []byte(`{"name":"bot2"}`))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteServiceAccount(ctx, "admin", ids[1], ca2.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := d.APIKey(ctx, ids[1], ca2.Key.ID); !errors.Is(err, org.ErrNotFound) {
			t.Fatalf("key after its account's deletion: %v", err)
		}
		var e *org.Error
		if err := s.DeleteServiceAccount(ctx, "admin", ids[1], ca2.ID); !errors.As(err, &e) || e.Kind != org.Missing {
			t.Fatalf("second delete: %v", err)
		}

		// Every action is in the audit log, newest first, filterable.
		logs, _, err := s.ListAuditLogs(ctx, org.AuditQuery{ProjectIDs: []string{ids[1]}})
		if err != nil || len(logs) != 3 || logs[0].Type != "service_account.deleted" || logs[2].Type != "project.created" {
			t.Fatalf("audit logs = %+v, %v", logs, err)
		}
		logs, more, err = s.ListAuditLogs(ctx, org.AuditQuery{Page: org.Page{Limit: 1, After: logs[0].ID}, ProjectIDs: []string{ids[1]}})
		if err != nil || len(logs) != 1 || !more || logs[0].Type != "service_account.created" {
			t.Fatalf("audit page 2 = %+v, %v, %v", logs, more, err)
		}
	})
}

func TestOrgSettings(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		s := org.NewService(d)
		p, err := s.CreateProject(ctx, "admin", []byte(`{"name":"p"}`))
		if err != nil {
			t.Fatal(err)
		}
		models := []string{"m1", "m2", "m3"}
		if _, err := s.UpdateRateLimit(ctx, "admin", p.ID, "rl-m2", models, []byte(`{"max_requests_per_1_minute":3,"max_tokens_per_1_minute":900}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateRateLimit(ctx, "admin", p.ID, "rl-m2", models, []byte(`{"max_tokens_per_1_minute":1000}`)); err != nil {
			t.Fatal(err)
		}
		rls, more, err := s.ListRateLimits(ctx, p.ID, models, org.Page{Limit: 2, After: "rl-m1"})
		if err != nil || more || len(rls) != 2 || rls[0].Model != "m2" || rls[0].MaxRequestsPer1Minute != 3 || rls[0].MaxTokensPer1Minute != 1000 || rls[1].MaxRequestsPer1Minute != 0 {
			t.Fatalf("rate limits = %+v, %v, %v", rls, more, err)
		}

		mp, err := s.GetModelPermissions(ctx, p.ID)
		if err != nil || mp.Mode != org.DenyList || len(mp.ModelIDs) != 0 {
			t.Fatalf("default permissions = %+v, %v", mp, err)
		}
		if _, err := s.UpdateModelPermissions(ctx, "admin", p.ID, []byte(`{"mode":"allow_list","model_ids":["m1","m1","m3"]}`)); err != nil {
			t.Fatal(err)
		}
		mp, err = s.GetModelPermissions(ctx, p.ID)
		if err != nil || mp.Mode != org.AllowList || len(mp.ModelIDs) != 2 || !mp.Allows("m3") || mp.Allows("m2") {
			t.Fatalf("permissions = %+v, %v", mp, err)
		}
		if err := s.DeleteModelPermissions(ctx, "admin", p.ID); err != nil {
			t.Fatal(err)
		}
		if mp, _ := s.GetModelPermissions(ctx, p.ID); !mp.Allows("m2") {
			t.Fatalf("permissions after delete = %+v", mp)
		}

		var e *org.Error
		if _, err := s.GetSpendLimit(ctx, p.ID); !errors.As(err, &e) || e.Kind != org.Missing {
			t.Fatalf("no spend limit: %v", err)
		}
		if _, err := s.UpdateSpendLimit(ctx, "admin", p.ID, []byte(`{"threshold_amount":2500,"currency":"USD","interval":"month"}`)); err != nil {
			t.Fatal(err)
		}
		if sl, err := s.GetSpendLimit(ctx, p.ID); err != nil || sl.ThresholdCents != 2500 {
			t.Fatalf("spend limit = %+v, %v", sl, err)
		}
		if err := s.DeleteSpendLimit(ctx, "admin", p.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetSpendLimit(ctx, p.ID); !errors.As(err, &e) || e.Kind != org.Missing {
			t.Fatalf("spend limit after delete: %v", err)
		}
	})
}

// TestOrgWriteIsWhole checks that a write whose statement fails leaves
// nothing behind: no row, no audit entry, no version move.
func TestOrgWriteIsWhole(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		p := org.Project{ID: "proj_x", Name: "x", CreatedAt: 1}
		if err := d.CreateProject(ctx, p, org.AuditLog{ID: "audit_log-1", Type: "project.created", Data: "{}"}); err != nil {
			t.Fatal(err)
		}
		v, _ := d.Version(ctx)
		// The same audit id again: the audit insert fails after the project's.
		err := d.CreateProject(ctx, org.Project{ID: "proj_y", Name: "y", CreatedAt: 2}, org.AuditLog{ID: "audit_log-1", Type: "project.created", Data: "{}"})
		if err == nil {
			t.Fatal("a duplicate audit id was written")
		}
		if _, err := d.Project(ctx, "proj_y"); !errors.Is(err, org.ErrNotFound) {
			t.Fatalf("half-written project: %v", err)
		}
		if v2, _ := d.Version(ctx); v2 != v {
			t.Fatalf("version moved from %d to %d on a failed write", v, v2)
		}
	})
}
