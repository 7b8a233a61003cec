// Package org is the domain of OpenAI's Admin API as tollgate serves it:
// projects, their service accounts and API keys, per-model rate limits,
// model permissions, spend limits and the audit log of every change. It
// holds the rules (what a valid body is, what archiving does) and declares
// the Store it needs; it knows nothing of HTTP or SQL.
//
// Tenancy: an OpenAI project is a tollgate team whose name is the
// project's id, and a service account's key is a tollgate key of that team
// charging the project "default" unless Compat-Project names another, so
// Compat-Project, the usage API and the trace service keep their meaning.
package org

import (
	"context"
	"errors"
)

// Object strings, as OpenAI names them.
const (
	ObjectProject              = "organization.project"
	ObjectServiceAccount       = "organization.project.service_account"
	ObjectServiceAccountKey    = "organization.project.service_account.api_key"
	ObjectServiceAccountGone   = "organization.project.service_account.deleted"
	ObjectAPIKey               = "organization.project.api_key"
	ObjectAPIKeyGone           = "organization.project.api_key.deleted"
	ObjectRateLimit            = "project.rate_limit"
	ObjectModelPermissions     = "project.model_permissions"
	ObjectModelPermissionsGone = "project.model_permissions.deleted"
	ObjectSpendLimit           = "project.spend_limit"
	ObjectSpendLimitGone       = "project.spend_limit.deleted"
	ObjectSpendAlert           = "project.spend_alert"
	ObjectSpendAlertGone       = "project.spend_alert.deleted"
)

// Project is an OpenAI project: a tollgate team (see the package comment).
type Project struct {
	ID   string
	Name string
	// CreatedAt and ArchivedAt are Unix seconds; ArchivedAt 0 is active.
	CreatedAt  int64
	ArchivedAt int64
}

// Status is "active" or "archived", as OpenAI reports it.
func (p Project) Status() string {
	if p.ArchivedAt != 0 {
		return "archived"
	}
	return "active"
}

// ServiceAccount is a project's non-human member, owner of API keys.
type ServiceAccount struct {
	ID        string
	ProjectID string
	Name      string
	// Role is "member" (the role OpenAI gives a created service account).
	Role      string
	CreatedAt int64
}

// APIKey is a project API key, without its secret: the store keeps only
// its SHA-256.
type APIKey struct {
	ID               string
	ProjectID        string
	ServiceAccountID string
	Name             string
	// Redacted is the secret as OpenAI shows it afterwards: "sk-…" and its
	// last characters.
	Redacted  string
	Digest    [32]byte
	CreatedAt int64
}

// RateLimit is one model's limits in a project; 0 means no limit.
type RateLimit struct {
	ProjectID             string
	Model                 string
	MaxRequestsPer1Minute int64
	MaxTokensPer1Minute   int64
}

// RateLimitID is the id OpenAI gives a project's limit of model.
func RateLimitID(model string) string { return "rl-" + model }

// Model permission modes.
const (
	AllowList = "allow_list"
	DenyList  = "deny_list"
)

// ModelPermissions restrict the models a project's keys may call.
type ModelPermissions struct {
	Mode     string
	ModelIDs []string
}

// Allows reports whether a project with these permissions may call model.
func (m ModelPermissions) Allows(model string) bool {
	for _, id := range m.ModelIDs {
		if id == model {
			return m.Mode == AllowList
		}
	}
	return m.Mode != AllowList
}

// SpendLimit is a hard monthly limit of a project's spend, in US cents.
type SpendLimit struct {
	ThresholdCents int64
}

// SpendAlert is a threshold of a project's monthly spend, in US cents,
// that fires once per month when the spend reaches it: a log line, the
// metric tollgate_spend_alerts_fired_total, and a POST to WebhookURL when
// set. The notification channel is kept as OpenAI's API takes it (email
// recipients), though tollgate sends no email: the recipients go in the
// webhook's payload.
type SpendAlert struct {
	ID             string
	ProjectID      string
	ThresholdCents int64
	Recipients     []string
	SubjectPrefix  string
	// WebhookURL, when not empty, is POSTed the alert when it fires
	// (tollgate's addition to OpenAI's body).
	WebhookURL string
	CreatedAt  int64
}

// AuditLog is one admin action, as OpenAI's audit log lists it.
type AuditLog struct {
	ID          string
	Type        string
	EffectiveAt int64
	// ActorKey names the admin key that acted (its configured name or
	// runtime id).
	ActorKey  string
	ProjectID string
	// ResourceID is the id of what the action changed.
	ResourceID string
	// Data is the JSON object of the action's details ("{}" when none).
	Data string
}

// RuntimeKey is an API key created through the Admin API, as the hot path
// needs it: the digest of its secret and the team and key name it acts as.
type RuntimeKey struct {
	Digest    [32]byte
	KeyID     string
	ProjectID string
}

// Page selects one page of a list: items after the item with id After
// ("" from the start), at most Limit of them.
type Page struct {
	After string
	Limit int
}

// AuditQuery selects audit log entries, newest first.
type AuditQuery struct {
	Page
	ProjectIDs []string
	EventTypes []string
}

// ErrNotFound is what a Store answers for an id it does not hold.
var ErrNotFound = errors.New("not found")

// Store persists the organization. Every write is one transaction that
// also appends its audit entry and moves the change version, so nothing is
// half-written and replicas notice the change by polling Version.
type Store interface {
	// Version is the change version: it grows with every write.
	Version(ctx context.Context) (int64, error)

	CreateProject(ctx context.Context, p Project, a AuditLog) error
	// UpdateProject writes p's name and archived_at.
	UpdateProject(ctx context.Context, p Project, a AuditLog) error
	Project(ctx context.Context, id string) (Project, error)
	// Projects lists projects in creation order; archived ones only when
	// includeArchived. hasMore says whether items follow the page.
	Projects(ctx context.Context, page Page, includeArchived bool) (ps []Project, hasMore bool, err error)

	// CreateServiceAccount writes the account and, when k is not nil, its key.
	CreateServiceAccount(ctx context.Context, sa ServiceAccount, k *APIKey, a AuditLog) error
	ServiceAccount(ctx context.Context, projectID, id string) (ServiceAccount, error)
	ServiceAccounts(ctx context.Context, projectID string, page Page) ([]ServiceAccount, bool, error)
	// DeleteServiceAccount deletes the account and its keys.
	DeleteServiceAccount(ctx context.Context, projectID, id string, a AuditLog) error

	APIKey(ctx context.Context, projectID, id string) (APIKey, error)
	APIKeys(ctx context.Context, projectID string, page Page) ([]APIKey, bool, error)
	DeleteAPIKey(ctx context.Context, projectID, id string, a AuditLog) error

	// RateLimits lists the project's limits set so far, by model.
	RateLimits(ctx context.Context, projectID string) ([]RateLimit, error)
	SetRateLimit(ctx context.Context, rl RateLimit, a AuditLog) error

	// ModelPermissions answers ok false when the project has none.
	ModelPermissions(ctx context.Context, projectID string) (mp ModelPermissions, ok bool, err error)
	// SetModelPermissions writes mp, or deletes them when mp is nil.
	SetModelPermissions(ctx context.Context, projectID string, mp *ModelPermissions, a AuditLog) error

	SpendLimit(ctx context.Context, projectID string) (sl SpendLimit, ok bool, err error)
	// SetSpendLimit writes sl, or deletes it when sl is nil.
	SetSpendLimit(ctx context.Context, projectID string, sl *SpendLimit, a AuditLog) error

	AuditLogs(ctx context.Context, q AuditQuery) ([]AuditLog, bool, error)

	// PutSpendAlert creates the alert or replaces the one of its id.
	PutSpendAlert(ctx context.Context, sa SpendAlert, a AuditLog) error
	SpendAlert(ctx context.Context, projectID, id string) (SpendAlert, error)
	SpendAlerts(ctx context.Context, projectID string, page Page) ([]SpendAlert, bool, error)
	DeleteSpendAlert(ctx context.Context, projectID, id string, a AuditLog) error
	// ActiveSpendAlerts lists the alerts of active projects.
	ActiveSpendAlerts(ctx context.Context) ([]SpendAlert, error)
	// ClaimSpendAlert records that alert id fired at threshold cents in
	// the interval starting at period (Unix seconds), and reports whether
	// this call was the first to: an alert fires once per interval and
	// threshold, whichever replica sees it first.
	ClaimSpendAlert(ctx context.Context, id string, thresholdCents, period, firedAt int64) (bool, error)

	// RuntimeKeys lists the keys that authenticate now (those of active
	// projects), with the version they were read at.
	RuntimeKeys(ctx context.Context) ([]RuntimeKey, int64, error)
	// Enforced reads, at one version, everything the hot path enforces:
	// the runtime keys and the active projects' limits and permissions.
	Enforced(ctx context.Context) (Enforced, error)
}

// Enforced is what the hot path holds in memory of the organization, read
// at Version.
type Enforced struct {
	Version int64
	Keys    []RuntimeKey
	// Projects are the active projects' ids.
	Projects    []string
	RateLimits  []RateLimit
	Permissions map[string]ModelPermissions
	SpendLimits map[string]SpendLimit
}
