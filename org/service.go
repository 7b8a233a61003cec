package org

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Kind classifies an Error; the HTTP layer maps each to a status once.
type Kind int

const (
	// Invalid is a bad request: a body, a parameter, a state (400).
	Invalid Kind = iota
	// Missing is an unknown id (404).
	Missing
)

// Error is a refused admin action, naming the parameter at fault when
// there is one, as OpenAI's error shape does.
type Error struct {
	Kind    Kind
	Param   string
	Message string
}

func (e *Error) Error() string { return e.Message }

func invalid(param, format string, args ...any) *Error {
	return &Error{Kind: Invalid, Param: param, Message: fmt.Sprintf(format, args...)}
}

// Bounds of what a body may hold.
const (
	maxNameLen      = 256
	maxModelIDs     = 1000
	maxModelIDLen   = 256
	DefaultPageSize = 20
	MaxPageSize     = 100
	// maxSpendCents caps a spend limit (a billion dollars): far beyond
	// any real limit, and far from the int64 overflow of cost sums.
	maxSpendCents = 100_000_000_000
	// maxPerMinute caps a rate limit's value.
	maxPerMinute = 1 << 40
)

// Service applies the Admin API's rules over a Store.
type Service struct {
	store Store
	now   func() time.Time
}

// NewService returns the service writing to st.
func NewService(st Store) *Service { return &Service{store: st, now: time.Now} }

// Store is the service's store, for the reads that need no rule.
func (s *Service) Store() Store { return s.store }

// newID returns prefix followed by 24 random lower-case alphanumerics.
func newID(prefix string) string { return prefix + randomString(24) }

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func randomString(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return string(b)
}

// NewSecret returns a new service-account key secret and its stored form:
// the secret is shown once and never kept.
func NewSecret() (secret string, digest [32]byte, redacted string) {
	buf := make([]byte, 36)
	if _, err := rand.Read(buf); err != nil {
		panic(err)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	for i := range buf {
		buf[i] = alphabet[int(buf[i])%len(alphabet)]
	}
	secret = "sk-svcacct-" + string(buf)
	return secret, sha256.Sum256([]byte(secret)), Redact(secret)
}

// Redact is a secret as OpenAI shows it after creation: "sk-…" and its
// last four characters.
func Redact(secret string) string {
	if len(secret) < 8 {
		return "sk-…"
	}
	return "sk-…" + secret[len(secret)-4:]
}

func (s *Service) audit(actor, typ, projectID, resourceID string, data any) AuditLog {
	b, err := json.Marshal(data)
	if err != nil || data == nil {
		b = []byte("{}")
	}
	return AuditLog{ID: newID("audit_log-"), Type: typ, EffectiveAt: s.now().Unix(), ActorKey: actor,
		ProjectID: projectID, ResourceID: resourceID, Data: string(b)}
}

// notFound maps a store's ErrNotFound to a 404 naming what is missing.
func notFound(err error, what, id string) error {
	if errors.Is(err, ErrNotFound) {
		return &Error{Kind: Missing, Message: fmt.Sprintf("No %s found with id '%s'.", what, id)}
	}
	return err
}

// CheckPage validates a list's limit (0 is the default).
func CheckPage(p Page) (Page, error) {
	switch {
	case p.Limit == 0:
		p.Limit = DefaultPageSize
	case p.Limit < 1 || p.Limit > MaxPageSize:
		return p, invalid("limit", "Invalid 'limit': expected an integer between 1 and %d, got %d.", MaxPageSize, p.Limit)
	}
	return p, nil
}

// GetProject returns the project id.
func (s *Service) GetProject(ctx context.Context, id string) (Project, error) {
	p, err := s.store.Project(ctx, id)
	return p, notFound(err, "project", id)
}

// activeProject returns the project id, refusing an archived one: an
// archived project takes no change.
func (s *Service) activeProject(ctx context.Context, id string) (Project, error) {
	p, err := s.GetProject(ctx, id)
	if err == nil && p.ArchivedAt != 0 {
		err = invalid("", "Project '%s' is archived and cannot be changed.", id)
	}
	return p, err
}

// CreateProject validates body ({"name"}) and creates the project.
func (s *Service) CreateProject(ctx context.Context, actor string, body []byte) (Project, error) {
	var in struct {
		Name *string `json:"name"`
	}
	if err := decode(body, &in); err != nil {
		return Project{}, err
	}
	name, err := checkName(in.Name, true)
	if err != nil {
		return Project{}, err
	}
	p := Project{ID: newID("proj_"), Name: name, CreatedAt: s.now().Unix()}
	a := s.audit(actor, "project.created", p.ID, p.ID, map[string]any{"data": map[string]string{"name": name, "title": name}})
	return p, s.store.CreateProject(ctx, p, a)
}

// UpdateProject validates body ({"name"}) and renames the project.
func (s *Service) UpdateProject(ctx context.Context, actor, id string, body []byte) (Project, error) {
	var in struct {
		Name *string `json:"name"`
	}
	if err := decode(body, &in); err != nil {
		return Project{}, err
	}
	name, err := checkName(in.Name, false)
	if err != nil {
		return Project{}, err
	}
	p, err := s.activeProject(ctx, id)
	if err != nil {
		return Project{}, err
	}
	if in.Name == nil {
		return p, nil
	}
	p.Name = name
	a := s.audit(actor, "project.updated", p.ID, p.ID, map[string]any{"changes_requested": map[string]string{"title": name}})
	return p, s.store.UpdateProject(ctx, p, a)
}

// ArchiveProject archives the project: its keys stop authenticating, and
// it takes no further change. Archiving an archived project changes nothing.
func (s *Service) ArchiveProject(ctx context.Context, actor, id string) (Project, error) {
	p, err := s.GetProject(ctx, id)
	if err != nil || p.ArchivedAt != 0 {
		return p, err
	}
	p.ArchivedAt = s.now().Unix()
	a := s.audit(actor, "project.archived", p.ID, p.ID, nil)
	return p, s.store.UpdateProject(ctx, p, a)
}

// ListProjects lists projects (active ones unless includeArchived).
func (s *Service) ListProjects(ctx context.Context, page Page, includeArchived bool) ([]Project, bool, error) {
	page, err := CheckPage(page)
	if err != nil {
		return nil, false, err
	}
	return s.store.Projects(ctx, page, includeArchived)
}

// CreatedAccount is a new service account with its key, whose secret is
// shown this once.
type CreatedAccount struct {
	ServiceAccount
	Key    *APIKey
	Secret string
}

// CreateServiceAccount validates body ({"name", "create_service_account_only"})
// and creates the account with a key unless told not to.
func (s *Service) CreateServiceAccount(ctx context.Context, actor, projectID string, body []byte) (CreatedAccount, error) {
	var in struct {
		Name        *string `json:"name"`
		AccountOnly *bool   `json:"create_service_account_only"`
	}
	if err := decode(body, &in); err != nil {
		return CreatedAccount{}, err
	}
	name, err := checkName(in.Name, true)
	if err != nil {
		return CreatedAccount{}, err
	}
	if _, err := s.activeProject(ctx, projectID); err != nil {
		return CreatedAccount{}, err
	}
	now := s.now().Unix()
	out := CreatedAccount{ServiceAccount: ServiceAccount{ID: newID("svc_acct_"), ProjectID: projectID, Name: name, Role: "member", CreatedAt: now}}
	if in.AccountOnly == nil || !*in.AccountOnly {
		secret, digest, redacted := NewSecret()
		out.Secret = secret
		out.Key = &APIKey{ID: newID("key_"), ProjectID: projectID, ServiceAccountID: out.ID, Name: "Secret Key",
			Redacted: redacted, Digest: digest, CreatedAt: now}
	}
	a := s.audit(actor, "service_account.created", projectID, out.ID, map[string]any{"data": map[string]string{"role": "member"}})
	return out, s.store.CreateServiceAccount(ctx, out.ServiceAccount, out.Key, a)
}

// GetServiceAccount returns a project's service account.
func (s *Service) GetServiceAccount(ctx context.Context, projectID, id string) (ServiceAccount, error) {
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return ServiceAccount{}, err
	}
	sa, err := s.store.ServiceAccount(ctx, projectID, id)
	return sa, notFound(err, "service account", id)
}

// ListServiceAccounts lists a project's service accounts.
func (s *Service) ListServiceAccounts(ctx context.Context, projectID string, page Page) ([]ServiceAccount, bool, error) {
	page, err := CheckPage(page)
	if err != nil {
		return nil, false, err
	}
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return nil, false, err
	}
	return s.store.ServiceAccounts(ctx, projectID, page)
}

// DeleteServiceAccount deletes the account and its keys, which stop
// authenticating.
func (s *Service) DeleteServiceAccount(ctx context.Context, actor, projectID, id string) error {
	if _, err := s.GetServiceAccount(ctx, projectID, id); err != nil {
		return err
	}
	a := s.audit(actor, "service_account.deleted", projectID, id, nil)
	return notFound(s.store.DeleteServiceAccount(ctx, projectID, id, a), "service account", id)
}

// GetAPIKey returns a project's API key.
func (s *Service) GetAPIKey(ctx context.Context, projectID, id string) (APIKey, error) {
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return APIKey{}, err
	}
	k, err := s.store.APIKey(ctx, projectID, id)
	return k, notFound(err, "API key", id)
}

// ListAPIKeys lists a project's API keys.
func (s *Service) ListAPIKeys(ctx context.Context, projectID string, page Page) ([]APIKey, bool, error) {
	page, err := CheckPage(page)
	if err != nil {
		return nil, false, err
	}
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return nil, false, err
	}
	return s.store.APIKeys(ctx, projectID, page)
}

// DeleteAPIKey deletes a project's API key; it stops authenticating.
func (s *Service) DeleteAPIKey(ctx context.Context, actor, projectID, id string) error {
	if _, err := s.GetAPIKey(ctx, projectID, id); err != nil {
		return err
	}
	a := s.audit(actor, "api_key.deleted", projectID, id, nil)
	return notFound(s.store.DeleteAPIKey(ctx, projectID, id, a), "API key", id)
}

// ListRateLimits lists the project's limit of every model in models (the
// gateway's), 0 where none is set, a page of them in models' order.
func (s *Service) ListRateLimits(ctx context.Context, projectID string, models []string, page Page) ([]RateLimit, bool, error) {
	page, err := CheckPage(page)
	if err != nil {
		return nil, false, err
	}
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return nil, false, err
	}
	set, err := s.store.RateLimits(ctx, projectID)
	if err != nil {
		return nil, false, err
	}
	byModel := make(map[string]RateLimit, len(set))
	for _, rl := range set {
		byModel[rl.Model] = rl
	}
	all := make([]RateLimit, 0, len(models))
	started := page.After == ""
	for _, m := range models {
		if !started {
			started = RateLimitID(m) == page.After
			continue
		}
		rl, ok := byModel[m]
		if !ok {
			rl = RateLimit{ProjectID: projectID, Model: m}
		}
		all = append(all, rl)
	}
	if len(all) > page.Limit {
		return all[:page.Limit], true, nil
	}
	return all, false, nil
}

// UpdateRateLimit validates body ({"max_requests_per_1_minute",
// "max_tokens_per_1_minute"}) and sets the limit rateLimitID names, of a
// model among models.
func (s *Service) UpdateRateLimit(ctx context.Context, actor, projectID, rateLimitID string, models []string, body []byte) (RateLimit, error) {
	var in struct {
		RPM *int64 `json:"max_requests_per_1_minute"`
		TPM *int64 `json:"max_tokens_per_1_minute"`
	}
	if err := decode(body, &in); err != nil {
		return RateLimit{}, err
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"max_requests_per_1_minute", in.RPM}, {"max_tokens_per_1_minute", in.TPM}} {
		if f.v != nil && (*f.v < 0 || *f.v > maxPerMinute) {
			return RateLimit{}, invalid(f.name, "Invalid '%s': expected an integer between 0 and %d, got %d.", f.name, int64(maxPerMinute), *f.v)
		}
	}
	if _, err := s.activeProject(ctx, projectID); err != nil {
		return RateLimit{}, err
	}
	model := ""
	for _, m := range models {
		if RateLimitID(m) == rateLimitID {
			model = m
		}
	}
	if model == "" {
		return RateLimit{}, &Error{Kind: Missing, Message: fmt.Sprintf("No rate limit found with id '%s'.", rateLimitID)}
	}
	set, err := s.store.RateLimits(ctx, projectID)
	if err != nil {
		return RateLimit{}, err
	}
	rl := RateLimit{ProjectID: projectID, Model: model}
	for _, r := range set {
		if r.Model == model {
			rl = r
		}
	}
	if in.RPM != nil {
		rl.MaxRequestsPer1Minute = *in.RPM
	}
	if in.TPM != nil {
		rl.MaxTokensPer1Minute = *in.TPM
	}
	a := s.audit(actor, "rate_limit.updated", projectID, rateLimitID, map[string]any{"changes_requested": map[string]int64{
		"max_requests_per_1_minute": rl.MaxRequestsPer1Minute, "max_tokens_per_1_minute": rl.MaxTokensPer1Minute}})
	return rl, s.store.SetRateLimit(ctx, rl, a)
}

// GetModelPermissions returns the project's model permissions: a deny
// list of nothing when none are set.
func (s *Service) GetModelPermissions(ctx context.Context, projectID string) (ModelPermissions, error) {
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return ModelPermissions{}, err
	}
	mp, ok, err := s.store.ModelPermissions(ctx, projectID)
	if !ok && err == nil {
		mp = ModelPermissions{Mode: DenyList, ModelIDs: []string{}}
	}
	return mp, err
}

// UpdateModelPermissions validates body ({"mode", "model_ids"}) and sets them.
func (s *Service) UpdateModelPermissions(ctx context.Context, actor, projectID string, body []byte) (ModelPermissions, error) {
	var in struct {
		Mode     *string   `json:"mode"`
		ModelIDs *[]string `json:"model_ids"`
	}
	if err := decode(body, &in); err != nil {
		return ModelPermissions{}, err
	}
	switch {
	case in.Mode == nil:
		return ModelPermissions{}, invalid("mode", "Missing required parameter: 'mode'.")
	case *in.Mode != AllowList && *in.Mode != DenyList:
		return ModelPermissions{}, invalid("mode", "Invalid 'mode': expected one of 'allow_list', 'deny_list', got '%s'.", clip(*in.Mode))
	case in.ModelIDs == nil:
		return ModelPermissions{}, invalid("model_ids", "Missing required parameter: 'model_ids'.")
	case len(*in.ModelIDs) > maxModelIDs:
		return ModelPermissions{}, invalid("model_ids", "Invalid 'model_ids': expected at most %d ids, got %d.", maxModelIDs, len(*in.ModelIDs))
	}
	ids := make([]string, 0, len(*in.ModelIDs))
	seen := make(map[string]bool, len(ids))
	for i, id := range *in.ModelIDs {
		if id == "" || len(id) > maxModelIDLen {
			return ModelPermissions{}, invalid(fmt.Sprintf("model_ids[%d]", i), "Invalid 'model_ids[%d]': expected a model id of 1 to %d characters.", i, maxModelIDLen)
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if _, err := s.activeProject(ctx, projectID); err != nil {
		return ModelPermissions{}, err
	}
	mp := ModelPermissions{Mode: *in.Mode, ModelIDs: ids}
	a := s.audit(actor, "model_permissions.updated", projectID, projectID, map[string]any{"mode": mp.Mode, "model_ids": ids})
	return mp, s.store.SetModelPermissions(ctx, projectID, &mp, a)
}

// DeleteModelPermissions removes the project's model permissions: every
// model is allowed again.
func (s *Service) DeleteModelPermissions(ctx context.Context, actor, projectID string) error {
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return err
	}
	return s.store.SetModelPermissions(ctx, projectID, nil, s.audit(actor, "model_permissions.deleted", projectID, projectID, nil))
}

// GetSpendLimit returns the project's spend limit, a 404 when none is set.
func (s *Service) GetSpendLimit(ctx context.Context, projectID string) (SpendLimit, error) {
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return SpendLimit{}, err
	}
	sl, ok, err := s.store.SpendLimit(ctx, projectID)
	if err == nil && !ok {
		err = &Error{Kind: Missing, Message: fmt.Sprintf("Project '%s' has no spend limit.", projectID)}
	}
	return sl, err
}

// UpdateSpendLimit validates body ({"threshold_amount" in cents,
// "currency": "USD", "interval": "month"}) and sets the limit.
func (s *Service) UpdateSpendLimit(ctx context.Context, actor, projectID string, body []byte) (SpendLimit, error) {
	var in struct {
		Threshold *int64  `json:"threshold_amount"`
		Currency  *string `json:"currency"`
		Interval  *string `json:"interval"`
	}
	if err := decode(body, &in); err != nil {
		return SpendLimit{}, err
	}
	switch {
	case in.Threshold == nil:
		return SpendLimit{}, invalid("threshold_amount", "Missing required parameter: 'threshold_amount'.")
	case *in.Threshold < 0 || *in.Threshold > maxSpendCents:
		return SpendLimit{}, invalid("threshold_amount", "Invalid 'threshold_amount': expected cents between 0 and %d, got %d.", int64(maxSpendCents), *in.Threshold)
	case in.Currency == nil:
		return SpendLimit{}, invalid("currency", "Missing required parameter: 'currency'.")
	case *in.Currency != "USD":
		return SpendLimit{}, invalid("currency", "Invalid 'currency': expected 'USD', got '%s'.", clip(*in.Currency))
	case in.Interval == nil:
		return SpendLimit{}, invalid("interval", "Missing required parameter: 'interval'.")
	case *in.Interval != "month":
		return SpendLimit{}, invalid("interval", "Invalid 'interval': expected 'month', got '%s'.", clip(*in.Interval))
	}
	if _, err := s.activeProject(ctx, projectID); err != nil {
		return SpendLimit{}, err
	}
	sl := SpendLimit{ThresholdCents: *in.Threshold}
	a := s.audit(actor, "spend_limit.updated", projectID, projectID, map[string]any{"threshold_amount": sl.ThresholdCents, "currency": "USD", "interval": "month"})
	return sl, s.store.SetSpendLimit(ctx, projectID, &sl, a)
}

// DeleteSpendLimit removes the project's spend limit.
func (s *Service) DeleteSpendLimit(ctx context.Context, actor, projectID string) error {
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return err
	}
	return s.store.SetSpendLimit(ctx, projectID, nil, s.audit(actor, "spend_limit.deleted", projectID, projectID, nil))
}

// ListAuditLogs lists audit log entries, newest first.
func (s *Service) ListAuditLogs(ctx context.Context, q AuditQuery) ([]AuditLog, bool, error) {
	page, err := CheckPage(q.Page)
	if err != nil {
		return nil, false, err
	}
	q.Page = page
	return s.store.AuditLogs(ctx, q)
}

func checkName(name *string, required bool) (string, error) {
	switch {
	case name == nil && required:
		return "", invalid("name", "Missing required parameter: 'name'.")
	case name == nil:
		return "", nil
	case *name == "" || len(*name) > maxNameLen:
		return "", invalid("name", "Invalid 'name': expected a string of 1 to %d characters.", maxNameLen)
	}
	return *name, nil
}

// clip shortens a client's value quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
