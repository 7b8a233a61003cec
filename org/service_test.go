package org

import (
	"context"
	"errors"
	"testing"
)

// fakeStore holds one active project and counts writes; any other method
// panics (the embedded nil Store), which the validation tests never reach.
type fakeStore struct {
	Store
	writes int
}

func (f *fakeStore) Project(_ context.Context, id string) (Project, error) {
	switch id {
	case "proj_a":
		return Project{ID: id, Name: "a"}, nil
	case "proj_old":
		return Project{ID: id, Name: "old", ArchivedAt: 1}, nil
	}
	return Project{}, ErrNotFound
}

func (f *fakeStore) CreateProject(context.Context, Project, AuditLog) error { f.writes++; return nil }
func (f *fakeStore) UpdateProject(context.Context, Project, AuditLog) error { f.writes++; return nil }
func (f *fakeStore) CreateServiceAccount(context.Context, ServiceAccount, *APIKey, AuditLog) error {
	f.writes++
	return nil
}
func (f *fakeStore) SetModelPermissions(context.Context, string, *ModelPermissions, AuditLog) error {
	f.writes++
	return nil
}
func (f *fakeStore) SetSpendLimit(context.Context, string, *SpendLimit, AuditLog) error {
	f.writes++
	return nil
}
func (f *fakeStore) RateLimits(context.Context, string) ([]RateLimit, error) { return nil, nil }
func (f *fakeStore) SetRateLimit(context.Context, RateLimit, AuditLog) error {
	f.writes++
	return nil
}

func TestValidation(t *testing.T) {
	models := []string{"m1", "m2"}
	tests := []struct {
		name  string
		call  func(s *Service) error
		kind  Kind
		param string
	}{
		{"project no name", func(s *Service) error { _, err := s.CreateProject(context.Background(), "k", []byte(`{}`)); return err }, Invalid, "name"},
		{"project name not string", func(s *Service) error {
			_, err := s.CreateProject(context.Background(), "k", []byte(`{"name":3}`))
			return err
		}, Invalid, "name"},
		{"project empty name", func(s *Service) error {
			_, err := s.CreateProject(context.Background(), "k", []byte(`{"name":""}`))
			return err
		}, Invalid, "name"},
		{"project body not object", func(s *Service) error {
			_, err := s.CreateProject(context.Background(), "k", []byte(`[1]`))
			return err
		}, Invalid, ""},
		{"update archived", func(s *Service) error {
			_, err := s.UpdateProject(context.Background(), "k", "proj_old", []byte(`{"name":"x"}`))
			return err
		}, Invalid, ""},
		{"update unknown", func(s *Service) error {
			_, err := s.UpdateProject(context.Background(), "k", "proj_zz", []byte(`{"name":"x"}`))
			return err
		}, Missing, ""},
		{"service account no name", func(s *Service) error {
			_, err := s.CreateServiceAccount(context.Background(), "k", "proj_a", []byte(`{"create_service_account_only":true}`))
			return err
		}, Invalid, "name"},
		{"service account flag not bool", func(s *Service) error {
			_, err := s.CreateServiceAccount(context.Background(), "k", "proj_a", []byte(`{"name":"x","create_service_account_only":"yes"}`))
			return err
		}, Invalid, "create_service_account_only"},
		{"service account archived project", func(s *Service) error {
			_, err := s.CreateServiceAccount(context.Background(), "k", "proj_old", []byte(`{"name":"x"}`))
			return err
		}, Invalid, ""},
		{"permissions bad mode", func(s *Service) error {
			_, err := s.UpdateModelPermissions(context.Background(), "k", "proj_a", []byte(`{"mode":"maybe","model_ids":[]}`))
			return err
		}, Invalid, "mode"},
		{"permissions no ids", func(s *Service) error {
			_, err := s.UpdateModelPermissions(context.Background(), "k", "proj_a", []byte(`{"mode":"allow_list"}`))
			return err
		}, Invalid, "model_ids"},
		{"permissions empty id", func(s *Service) error {
			_, err := s.UpdateModelPermissions(context.Background(), "k", "proj_a", []byte(`{"mode":"allow_list","model_ids":["m1",""]}`))
			return err
		}, Invalid, "model_ids[1]"},
		{"spend limit negative", func(s *Service) error {
			_, err := s.UpdateSpendLimit(context.Background(), "k", "proj_a", []byte(`{"threshold_amount":-1,"currency":"USD","interval":"month"}`))
			return err
		}, Invalid, "threshold_amount"},
		{"spend limit dollars as float", func(s *Service) error {
			_, err := s.UpdateSpendLimit(context.Background(), "k", "proj_a", []byte(`{"threshold_amount":1.5,"currency":"USD","interval":"month"}`))
			return err
		}, Invalid, "threshold_amount"},
		{"spend limit euro", func(s *Service) error {
			_, err := s.UpdateSpendLimit(context.Background(), "k", "proj_a", []byte(`{"threshold_amount":100,"currency":"EUR","interval":"month"}`))
			return err
		}, Invalid, "currency"},
		{"spend limit weekly", func(s *Service) error {
			_, err := s.UpdateSpendLimit(context.Background(), "k", "proj_a", []byte(`{"threshold_amount":100,"currency":"USD","interval":"week"}`))
			return err
		}, Invalid, "interval"},
		{"rate limit negative", func(s *Service) error {
			_, err := s.UpdateRateLimit(context.Background(), "k", "proj_a", "rl-m1", models, []byte(`{"max_requests_per_1_minute":-3}`))
			return err
		}, Invalid, "max_requests_per_1_minute"},
		{"rate limit unknown model", func(s *Service) error {
			_, err := s.UpdateRateLimit(context.Background(), "k", "proj_a", "rl-m9", models, []byte(`{"max_requests_per_1_minute":3}`))
			return err
		}, Missing, ""},
		{"page limit too large", func(s *Service) error {
			_, _, err := s.ListProjects(context.Background(), Page{Limit: 101}, false)
			return err
		}, Invalid, "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &fakeStore{}
			err := tt.call(NewService(st))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if e.Kind != tt.kind || e.Param != tt.param || e.Message == "" {
				t.Fatalf("err = %+v, want kind %d param %q", e, tt.kind, tt.param)
			}
			if st.writes != 0 {
				t.Fatalf("%d writes after a refused body", st.writes)
			}
		})
	}
}

func TestValidBodiesWrite(t *testing.T) {
	st := &fakeStore{}
	s := NewService(st)
	ctx := context.Background()
	p, err := s.CreateProject(ctx, "k", []byte(`{"name":"Research"}`))
	if err != nil || p.Name != "Research" || len(p.ID) != len("proj_")+24 || p.Status() != "active" {
		t.Fatalf("project = %+v, %v", p, err)
	}
	ca, err := s.CreateServiceAccount(ctx, "k", "proj_a", []byte(`{"name":"bot"}`))
	if err != nil || ca.Key == nil || ca.Key.Redacted != Redact(ca.Secret) || ca.Role != "member" {
		t.Fatalf("account = %+v, %v", ca, err)
	}
	if len(ca.Secret) < 40 || ca.Secret[:11] != "sk-svcacct-" {
		t.Fatalf("secret %q", ca.Secret)
	}
	rl, err := s.UpdateRateLimit(ctx, "k", "proj_a", "rl-m2", []string{"m1", "m2"}, []byte(`{"max_requests_per_1_minute":3}`))
	if err != nil || rl.Model != "m2" || rl.MaxRequestsPer1Minute != 3 {
		t.Fatalf("rate limit = %+v, %v", rl, err)
	}
	if st.writes != 3 {
		t.Fatalf("writes = %d, want 3", st.writes)
	}
}

func TestModelPermissionsAllows(t *testing.T) {
	tests := []struct {
		mp    ModelPermissions
		model string
		want  bool
	}{
		{ModelPermissions{AllowList, []string{"a"}}, "a", true},
		{ModelPermissions{AllowList, []string{"a"}}, "b", false},
		{ModelPermissions{DenyList, []string{"a"}}, "a", false},
		{ModelPermissions{DenyList, []string{"a"}}, "b", true},
		{ModelPermissions{DenyList, nil}, "b", true},
	}
	for _, tt := range tests {
		t.Run(tt.mp.Mode+" "+tt.model, func(t *testing.T) {
			if got := tt.mp.Allows(tt.model); got != tt.want {
				t.Fatalf("Allows = %v", got)
			}
		})
	}
}

func TestSpendAlertBodies(t *testing.T) {
	const ok = `"currency":"USD","interval":"month","notification_channel":{"type":"email","recipients":["a@b.c"]}`
	for _, c := range []struct {
		name, body, param string
	}{
		{"no threshold", `{` + ok + `}`, "threshold_amount"},
		{"zero threshold", `{"threshold_amount":0,` + ok + `}`, "threshold_amount"},
		{"dollars", `{"threshold_amount":1.5,` + ok + `}`, "threshold_amount"},
		{"euro", `{"threshold_amount":5,"currency":"EUR","interval":"month","notification_channel":{"type":"email","recipients":[]}}`, "currency"},
		{"week", `{"threshold_amount":5,"currency":"USD","interval":"week","notification_channel":{"type":"email","recipients":[]}}`, "interval"},
		{"no channel", `{"threshold_amount":5,"currency":"USD","interval":"month"}`, "notification_channel"},
		{"sms", `{"threshold_amount":5,"currency":"USD","interval":"month","notification_channel":{"type":"sms","recipients":[]}}`, "notification_channel.type"},
		{"empty recipient", `{"threshold_amount":5,"currency":"USD","interval":"month","notification_channel":{"type":"email","recipients":[""]}}`, "notification_channel.recipients[0]"},
		{"ftp webhook", `{"threshold_amount":5,` + ok + `,"webhook_url":"ftp://x/y"}`, "webhook_url"},
		{"relative webhook", `{"threshold_amount":5,` + ok + `,"webhook_url":"/hook"}`, "webhook_url"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeStore{}
			_, err := NewService(f).CreateSpendAlert(context.Background(), "admin", "proj_a", []byte(c.body))
			var oe *Error
			if !errors.As(err, &oe) || oe.Kind != Invalid || oe.Param != c.param || f.writes != 0 {
				t.Fatalf("err = %v (%+v), writes %d; want Invalid on %s", err, oe, f.writes, c.param)
			}
		})
	}
}
