package admin_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/tollgate-dev/tollgate/admin"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/org"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// orgClients serves the Admin API over st on an in-memory listener and
// returns openai-go clients with the admin key and with a plain key.
func orgClients(t *testing.T, st org.Store) (adminClient, plainClient openai.Client, db org.Store) {
	t.Helper()
	keys, err := auth.NewKeyring(config.Auth{Keys: []config.Key{
		{Name: "ops", Key: "sk-admin", Admin: true},
		{Name: "dev", Key: "sk-plain", Teams: []string{"*"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	api := admin.NewOrgAPI(org.NewService(st), keys, func() []string { return []string{"m1", "m2", "m3"} })
	ln := fasthttputil.NewInmemoryListener()
	// A short MaxIdleWorkerDuration lets the worker pool's cleaner see
	// Shutdown before goleak looks.
	srv := &fasthttp.Server{Handler: api.Serve, NoDefaultDate: true, MaxIdleWorkerDuration: 10 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		if err := srv.Shutdown(); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return ln.Dial() }}}
	t.Cleanup(hc.CloseIdleConnections)
	client := func(key string) openai.Client {
		return openai.NewClient(option.WithBaseURL("http://tollgate/v1/"), option.WithAdminAPIKey(key), option.WithAPIKey(key),
			option.WithHTTPClient(hc), option.WithMaxRetries(0))
	}
	return client("sk-admin"), client("sk-plain"), st
}

func apiError(t *testing.T, err error, status int, param string) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v, want *openai.Error", err)
	}
	if e.StatusCode != status || e.Param != param || e.Message == "" {
		t.Fatalf("error %d param %q message %q; want %d param %q", e.StatusCode, e.Param, e.Message, status, param)
	}
	return e
}

func TestOrgAPIWithSDK(t *testing.T) {
	storetest.ForEach(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		cl, plain, _ := orgClients(t, db)
		orgs := cl.Admin.Organization

		p, err := orgs.Projects.New(ctx, openai.AdminOrganizationProjectNewParams{Name: "research"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(p.ID, "proj_") || p.Name != "research" || p.Status != "active" || p.CreatedAt == 0 || p.ArchivedAt != 0 {
			t.Fatalf("project = %+v", p)
		}

		sa, err := orgs.Projects.ServiceAccounts.New(ctx, p.ID, openai.AdminOrganizationProjectServiceAccountNewParams{Name: "bot"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(sa.ID, "svc_acct_") || !strings.HasPrefix(sa.APIKey.Value, "sk-svcacct-") || sa.Role != "member" {
			t.Fatalf("service account = %+v", sa)
		}
		got, err := orgs.Projects.ServiceAccounts.Get(ctx, p.ID, sa.ID)
		if err != nil || got.Name != "bot" {
			t.Fatalf("retrieve service account = %+v, %v", got, err)
		}

		keys, err := orgs.Projects.APIKeys.List(ctx, p.ID, openai.AdminOrganizationProjectAPIKeyListParams{})
		if err != nil || len(keys.Data) != 1 {
			t.Fatalf("keys = %+v, %v", keys, err)
		}
		k := keys.Data[0]
		wantRedacted := "sk-…" + sa.APIKey.Value[len(sa.APIKey.Value)-4:]
		if k.ID != sa.APIKey.ID || k.RedactedValue != wantRedacted || strings.Contains(keys.RawJSON(), sa.APIKey.Value) ||
			k.Owner.Type != "service_account" || k.Owner.ServiceAccount.ID != sa.ID {
			t.Fatalf("key = %+v (raw %s)", k, keys.RawJSON())
		}
		one, err := orgs.Projects.APIKeys.Get(ctx, p.ID, k.ID)
		if err != nil || one.RedactedValue != wantRedacted {
			t.Fatalf("retrieve key = %+v, %v", one, err)
		}

		del, err := orgs.Projects.ServiceAccounts.Delete(ctx, p.ID, sa.ID)
		if err != nil || !del.Deleted || del.ID != sa.ID || del.Object != "organization.project.service_account.deleted" {
			t.Fatalf("delete = %+v, %v", del, err)
		}
		if _, err := orgs.Projects.APIKeys.Get(ctx, p.ID, k.ID); err == nil {
			t.Fatal("the deleted account's key is still listed")
		} else {
			apiError(t, err, 404, "")
		}

		rl, err := orgs.Projects.RateLimits.UpdateRateLimit(ctx, p.ID, "rl-m2", openai.AdminOrganizationProjectRateLimitUpdateRateLimitParams{
			MaxRequestsPer1Minute: openai.Int(3)})
		if err != nil || rl.Model != "m2" || rl.MaxRequestsPer1Minute != 3 || rl.ID != "rl-m2" {
			t.Fatalf("rate limit = %+v, %v", rl, err)
		}
		mp, err := orgs.Projects.ModelPermissions.Update(ctx, p.ID, openai.AdminOrganizationProjectModelPermissionUpdateParams{
			Mode: "allow_list", ModelIDs: []string{"m1"}})
		if err != nil || mp.Mode != "allow_list" || len(mp.ModelIDs) != 1 {
			t.Fatalf("model permissions = %+v, %v", mp, err)
		}
		sl, err := orgs.Projects.SpendLimit.Update(ctx, p.ID, openai.AdminOrganizationProjectSpendLimitUpdateParams{
			Currency: "USD", Interval: "month", ThresholdAmount: 2500})
		if err != nil || sl.ThresholdAmount != 2500 || sl.Currency != "USD" {
			t.Fatalf("spend limit = %+v, %v", sl, err)
		}

		arch, err := orgs.Projects.Archive(ctx, p.ID)
		if err != nil || arch.Status != "archived" || arch.ArchivedAt == 0 {
			t.Fatalf("archive = %+v, %v", arch, err)
		}
		_, err = orgs.Projects.ServiceAccounts.New(ctx, p.ID, openai.AdminOrganizationProjectServiceAccountNewParams{Name: "late"})
		apiError(t, err, 400, "")

		logs, err := orgs.AuditLogs.List(ctx, openai.AdminOrganizationAuditLogListParams{ProjectIDs: []string{p.ID}})
		if err != nil || len(logs.Data) != 7 || logs.Data[0].Type != "project.archived" || logs.Data[6].Type != "project.created" ||
			logs.Data[0].Project.ID != p.ID {
			t.Fatalf("audit logs = %s, %v", logs.RawJSON(), err)
		}

		// A plain key is refused, and so is no key.
		_, err = plain.Admin.Organization.Projects.Get(ctx, p.ID)
		apiError(t, err, 403, "")
	})
}

func TestOrgAPIPaging(t *testing.T) {
	storetest.ForEach(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		cl, _, _ := orgClients(t, db)
		projects := cl.Admin.Organization.Projects
		var want []string
		for _, name := range []string{"a", "b", "c", "d", "e"} {
			p, err := projects.New(ctx, openai.AdminOrganizationProjectNewParams{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, p.ID)
		}
		if _, err := projects.Archive(ctx, want[4]); err != nil {
			t.Fatal(err)
		}
		page, err := projects.List(ctx, openai.AdminOrganizationProjectListParams{Limit: openai.Int(2)})
		if err != nil || len(page.Data) != 2 || !page.HasMore || page.LastID != want[1] {
			t.Fatalf("page 1 = %s, %v", page.RawJSON(), err)
		}
		var got []string
		iter := projects.ListAutoPaging(ctx, openai.AdminOrganizationProjectListParams{Limit: openai.Int(2)})
		for iter.Next() {
			got = append(got, iter.Current().ID)
		}
		if err := iter.Err(); err != nil || strings.Join(got, ",") != strings.Join(want[:4], ",") {
			t.Fatalf("paged ids = %v (%v), want %v", got, err, want[:4])
		}
		all, err := projects.List(ctx, openai.AdminOrganizationProjectListParams{IncludeArchived: openai.Bool(true), Limit: openai.Int(100)})
		if err != nil || len(all.Data) != 5 || all.Data[4].Status != "archived" {
			t.Fatalf("include_archived = %s, %v", all.RawJSON(), err)
		}
	})
}

func TestOrgAPIBadBodies(t *testing.T) {
	storetest.ForEach(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		cl, _, st := orgClients(t, db)
		orgs := cl.Admin.Organization
		p, err := orgs.Projects.New(ctx, openai.AdminOrganizationProjectNewParams{Name: "p"})
		if err != nil {
			t.Fatal(err)
		}
		before, _ := st.Version(ctx)
		tests := []struct {
			name, path, body, param string
		}{
			{"project without name", "organization/projects", `{}`, "name"},
			{"project name not a string", "organization/projects", `{"name":["x"]}`, "name"},
			{"service account without name", "organization/projects/" + p.ID + "/service_accounts", `{"name":""}`, "name"},
			{"spend limit in dollars", "organization/projects/" + p.ID + "/spend_limit", `{"threshold_amount":25.5,"currency":"USD","interval":"month"}`, "threshold_amount"},
			{"spend limit in euros", "organization/projects/" + p.ID + "/spend_limit", `{"threshold_amount":25,"currency":"EUR","interval":"month"}`, "currency"},
			{"model permissions mode", "organization/projects/" + p.ID + "/model_permissions", `{"mode":"all","model_ids":[]}`, "mode"},
			{"rate limit negative", "organization/projects/" + p.ID + "/rate_limits/rl-m1", `{"max_tokens_per_1_minute":-1}`, "max_tokens_per_1_minute"},
			{"not json", "organization/projects", `{"name":`, ""},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var out map[string]any
				err := cl.Post(ctx, tt.path, []byte(tt.body), &out, option.WithHeader("Content-Type", "application/json"))
				e := apiError(t, err, 400, tt.param)
				if e.Type != "invalid_request_error" {
					t.Fatalf("type %q", e.Type)
				}
			})
		}
		if after, _ := st.Version(ctx); after != before {
			t.Fatalf("bad bodies wrote: version %d -> %d", before, after)
		}
		list, err := orgs.Projects.List(ctx, openai.AdminOrganizationProjectListParams{})
		if err != nil || len(list.Data) != 1 {
			t.Fatalf("projects after bad bodies = %s, %v", list.RawJSON(), err)
		}
	})
}
