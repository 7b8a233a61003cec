package admin

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/org"
)

// OrgAPI serves OpenAI's Admin API for projects (/v1/organization/projects
// and everything under it) and the audit log (/v1/organization/audit_logs),
// to admin keys only, in OpenAI's wire: objects, lists
// {object,data,first_id,last_id,has_more} paged with ?after=<last_id>,
// Unix-second times, cents for spend limits, and OpenAI's error shape.
type OrgAPI struct {
	svc  *org.Service
	keys *auth.Keyring
	// models lists the gateway's model ids, those a rate limit exists for.
	models func() []string
}

// NewOrgAPI returns the Admin API over svc, authenticating with keys.
func NewOrgAPI(svc *org.Service, keys *auth.Keyring, models func() []string) *OrgAPI {
	return &OrgAPI{svc: svc, keys: keys, models: models}
}

// The paths OrgAPI serves, for the route tables.
const (
	OrgProjectsPath  = "/v1/organization/projects"
	OrgAuditLogsPath = "/v1/organization/audit_logs"
)

// Serve answers one Admin API request.
func (a *OrgAPI) Serve(ctx *fasthttp.RequestCtx) {
	key := a.keys.Lookup(auth.Secret(nil, ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)))
	switch {
	case key == nil:
		usageWriteError(ctx, &usageError{status: fasthttp.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
			message: "Missing or invalid API key: send Authorization: Bearer KEY."})
		return
	case !key.Admin:
		usageWriteError(ctx, &usageError{status: fasthttp.StatusForbidden, typ: "invalid_request_error", code: "insufficient_permissions",
			message: "The Admin API needs an admin key (auth.keys[].admin: true)."})
		return
	}
	// The store gets a context of its own rather than the RequestCtx, as in
	// Service.Handle: database/sql watches a context from goroutines that
	// may outlive the handler, and fasthttp reuses a RequestCtx at once.
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := orgCall{ctx: ctx, store: sctx, api: a, actor: key.Name}
	path := string(ctx.Path())
	var v any
	var err error
	if path == OrgAuditLogsPath {
		v, err = c.only(fasthttp.MethodGet, c.auditLogs)
	} else {
		rest := strings.TrimPrefix(strings.TrimPrefix(path, OrgProjectsPath), "/")
		var segs []string
		if rest != "" {
			segs = strings.Split(rest, "/")
		}
		v, err = c.route(segs)
	}
	if err != nil {
		orgWriteError(ctx, err)
		return
	}
	usageWriteJSON(ctx, fasthttp.StatusOK, v)
}

// orgCall is one request to the Admin API.
type orgCall struct {
	ctx *fasthttp.RequestCtx
	// store is the context of the call's store reads and writes.
	store context.Context
	api   *OrgAPI
	actor string
}

// orgRouteError is a path or method the Admin API does not serve.
type orgRouteError struct {
	status int
	allow  string
}

func (e *orgRouteError) Error() string { return "route" }

// orgHandlers maps methods to what answers them on one path.
type orgHandlers map[string]func() (any, error)

func (c *orgCall) serve(h orgHandlers) (any, error) {
	if f, ok := h[string(c.ctx.Method())]; ok {
		return f()
	}
	allow := make([]string, 0, len(h))
	for _, m := range []string{fasthttp.MethodGet, fasthttp.MethodPost, fasthttp.MethodDelete} {
		if _, ok := h[m]; ok {
			allow = append(allow, m)
		}
	}
	return nil, &orgRouteError{status: fasthttp.StatusMethodNotAllowed, allow: strings.Join(allow, ", ")}
}

func (c *orgCall) only(method string, f func() (any, error)) (any, error) {
	return c.serve(orgHandlers{method: f})
}

func (c *orgCall) route(segs []string) (any, error) {
	rc := c.store
	body := c.ctx.PostBody()
	switch {
	case len(segs) == 0:
		return c.serve(orgHandlers{fasthttp.MethodGet: c.listProjects, fasthttp.MethodPost: func() (any, error) {
			return projectJSON(c.svc().CreateProject(rc, c.actor, body))
		}})
	case segs[0] == "" || slicesHasEmpty(segs):
		return nil, &orgRouteError{status: fasthttp.StatusNotFound}
	}
	pid := segs[0]
	switch {
	case len(segs) == 1:
		return c.serve(orgHandlers{
			fasthttp.MethodGet:  func() (any, error) { return projectJSON(c.svc().GetProject(rc, pid)) },
			fasthttp.MethodPost: func() (any, error) { return projectJSON(c.svc().UpdateProject(rc, c.actor, pid, body)) },
		})
	case len(segs) == 2 && segs[1] == "archive":
		return c.only(fasthttp.MethodPost, func() (any, error) { return projectJSON(c.svc().ArchiveProject(rc, c.actor, pid)) })
	case len(segs) == 2 && segs[1] == "service_accounts":
		return c.serve(orgHandlers{
			fasthttp.MethodGet: func() (any, error) {
				page, err := c.page()
				if err != nil {
					return nil, err
				}
				sas, more, err := c.svc().ListServiceAccounts(rc, pid, page)
				return listJSON(sas, more, err, func(sa org.ServiceAccount) (string, any) { return sa.ID, serviceAccountJSON(sa) })
			},
			fasthttp.MethodPost: func() (any, error) {
				ca, err := c.svc().CreateServiceAccount(rc, c.actor, pid, body)
				if err != nil {
					return nil, err
				}
				out := struct {
					serviceAccountOut
					APIKey *createdKeyOut `json:"api_key"`
				}{serviceAccountOut: serviceAccountJSON(ca.ServiceAccount)}
				if ca.Key != nil {
					out.APIKey = &createdKeyOut{Object: org.ObjectServiceAccountKey, ID: ca.Key.ID, Name: ca.Key.Name,
						CreatedAt: ca.Key.CreatedAt, Value: ca.Secret}
				}
				return out, nil
			},
		})
	case len(segs) == 3 && segs[1] == "service_accounts":
		sid := segs[2]
		return c.serve(orgHandlers{
			fasthttp.MethodGet: func() (any, error) {
				sa, err := c.svc().GetServiceAccount(rc, pid, sid)
				if err != nil {
					return nil, err
				}
				return serviceAccountJSON(sa), nil
			},
			fasthttp.MethodDelete: func() (any, error) {
				return deletedJSON(org.ObjectServiceAccountGone, sid, c.svc().DeleteServiceAccount(rc, c.actor, pid, sid))
			},
		})
	case len(segs) == 2 && segs[1] == "api_keys":
		return c.only(fasthttp.MethodGet, func() (any, error) {
			page, err := c.page()
			if err != nil {
				return nil, err
			}
			keys, more, err := c.svc().ListAPIKeys(rc, pid, page)
			if err != nil {
				return nil, err
			}
			return c.apiKeysJSON(pid, keys, more)
		})
	case len(segs) == 3 && segs[1] == "api_keys":
		kid := segs[2]
		return c.serve(orgHandlers{
			fasthttp.MethodGet: func() (any, error) {
				k, err := c.svc().GetAPIKey(rc, pid, kid)
				if err != nil {
					return nil, err
				}
				out, err := c.apiKeysJSON(pid, []org.APIKey{k}, false)
				if err != nil {
					return nil, err
				}
				return out.Data[0], nil
			},
			fasthttp.MethodDelete: func() (any, error) {
				return deletedJSON(org.ObjectAPIKeyGone, kid, c.svc().DeleteAPIKey(rc, c.actor, pid, kid))
			},
		})
	case len(segs) == 2 && segs[1] == "rate_limits":
		return c.only(fasthttp.MethodGet, func() (any, error) {
			page, err := c.page()
			if err != nil {
				return nil, err
			}
			rls, more, err := c.svc().ListRateLimits(rc, pid, c.api.models(), page)
			return listJSON(rls, more, err, func(rl org.RateLimit) (string, any) { return org.RateLimitID(rl.Model), rateLimitJSON(rl) })
		})
	case len(segs) == 3 && segs[1] == "rate_limits":
		return c.only(fasthttp.MethodPost, func() (any, error) {
			rl, err := c.svc().UpdateRateLimit(rc, c.actor, pid, segs[2], c.api.models(), body)
			if err != nil {
				return nil, err
			}
			return rateLimitJSON(rl), nil
		})
	case len(segs) == 2 && segs[1] == "model_permissions":
		return c.serve(orgHandlers{
			fasthttp.MethodGet: func() (any, error) { return modelPermissionsJSON(c.svc().GetModelPermissions(rc, pid)) },
			fasthttp.MethodPost: func() (any, error) {
				return modelPermissionsJSON(c.svc().UpdateModelPermissions(rc, c.actor, pid, body))
			},
			fasthttp.MethodDelete: func() (any, error) {
				return deletedJSON(org.ObjectModelPermissionsGone, "", c.svc().DeleteModelPermissions(rc, c.actor, pid))
			},
		})
	case len(segs) == 2 && segs[1] == "spend_limit":
		return c.serve(orgHandlers{
			fasthttp.MethodGet:  func() (any, error) { return spendLimitJSON(c.svc().GetSpendLimit(rc, pid)) },
			fasthttp.MethodPost: func() (any, error) { return spendLimitJSON(c.svc().UpdateSpendLimit(rc, c.actor, pid, body)) },
			fasthttp.MethodDelete: func() (any, error) {
				return deletedJSON(org.ObjectSpendLimitGone, "", c.svc().DeleteSpendLimit(rc, c.actor, pid))
			},
		})
	case len(segs) == 2 && segs[1] == "spend_alerts":
		return c.serve(orgHandlers{
			fasthttp.MethodGet: func() (any, error) {
				page, err := c.page()
				if err != nil {
					return nil, err
				}
				alerts, more, err := c.svc().ListSpendAlerts(rc, pid, page)
				return listJSON(alerts, more, err, func(sa org.SpendAlert) (string, any) { return sa.ID, spendAlertOut(sa) })
			},
			fasthttp.MethodPost: func() (any, error) { return spendAlertJSON(c.svc().CreateSpendAlert(rc, c.actor, pid, body)) },
		})
	case len(segs) == 3 && segs[1] == "spend_alerts":
		aid := segs[2]
		return c.serve(orgHandlers{
			fasthttp.MethodGet:  func() (any, error) { return spendAlertJSON(c.svc().GetSpendAlert(rc, pid, aid)) },
			fasthttp.MethodPost: func() (any, error) { return spendAlertJSON(c.svc().UpdateSpendAlert(rc, c.actor, pid, aid, body)) },
			fasthttp.MethodDelete: func() (any, error) {
				return deletedJSON(org.ObjectSpendAlertGone, aid, c.svc().DeleteSpendAlert(rc, c.actor, pid, aid))
			},
		})
	}
	return nil, &orgRouteError{status: fasthttp.StatusNotFound}
}

func slicesHasEmpty(segs []string) bool {
	for _, s := range segs {
		if s == "" {
			return true
		}
	}
	return false
}

func (c *orgCall) svc() *org.Service { return c.api.svc }

// page reads limit and after.
func (c *orgCall) page() (org.Page, error) {
	args := c.ctx.QueryArgs()
	p := org.Page{After: string(args.Peek("after"))}
	if raw := args.Peek("limit"); len(raw) > 0 {
		n, err := strconv.Atoi(string(raw))
		if err != nil {
			return p, &org.Error{Kind: org.Invalid, Param: "limit", Message: "Invalid 'limit': expected an integer."}
		}
		p.Limit = n
	}
	return p, nil
}

func (c *orgCall) listProjects() (any, error) {
	page, err := c.page()
	if err != nil {
		return nil, err
	}
	include := false
	if raw := c.ctx.QueryArgs().Peek("include_archived"); len(raw) > 0 {
		include, err = strconv.ParseBool(string(raw))
		if err != nil {
			return nil, &org.Error{Kind: org.Invalid, Param: "include_archived", Message: "Invalid 'include_archived': expected true or false."}
		}
	}
	ps, more, err := c.svc().ListProjects(c.store, page, include)
	return listJSON(ps, more, err, func(p org.Project) (string, any) { return p.ID, projectOut(p) })
}

// multi reads an array query, sent by the SDKs as name[]=a&name[]=b.
func (c *orgCall) multi(name string) []string {
	var out []string
	for _, n := range []string{name + "[]", name} {
		for _, v := range c.ctx.QueryArgs().PeekMulti(n) {
			out = append(out, string(v))
		}
	}
	return out
}

func (c *orgCall) auditLogs() (any, error) {
	page, err := c.page()
	if err != nil {
		return nil, err
	}
	logs, more, err := c.svc().ListAuditLogs(c.store, org.AuditQuery{Page: page, ProjectIDs: c.multi("project_ids"), EventTypes: c.multi("event_types")})
	return listJSON(logs, more, err, func(l org.AuditLog) (string, any) {
		out := map[string]any{
			"id": l.ID, "type": l.Type, "effective_at": l.EffectiveAt,
			"actor": map[string]any{"type": "api_key", "api_key": map[string]any{"id": l.ActorKey, "type": "admin_key"}},
		}
		if l.ProjectID != "" {
			out["project"] = map[string]any{"id": l.ProjectID}
		}
		details := map[string]any{"id": l.ResourceID}
		var data map[string]any
		if json.Unmarshal([]byte(l.Data), &data) == nil {
			for k, v := range data {
				details[k] = v
			}
		}
		out[l.Type] = details
		return l.ID, out
	})
}

// orgList is OpenAI's list object.
type orgList struct {
	Object  string  `json:"object"`
	Data    []any   `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

func listJSON[T any](items []T, more bool, err error, render func(T) (string, any)) (orgList, error) {
	if err != nil {
		return orgList{}, err
	}
	out := orgList{Object: "list", Data: make([]any, 0, len(items)), HasMore: more}
	for i, it := range items {
		id, v := render(it)
		if i == 0 {
			out.FirstID = &id
		}
		if i == len(items)-1 {
			out.LastID = &id
		}
		out.Data = append(out.Data, v)
	}
	return out, nil
}

type projectJSONOut struct {
	Object     string `json:"object"`
	ID         string `json:"id"`
	Name       string `json:"name"`
	CreatedAt  int64  `json:"created_at"`
	ArchivedAt *int64 `json:"archived_at"`
	Status     string `json:"status"`
}

func projectOut(p org.Project) projectJSONOut {
	out := projectJSONOut{Object: org.ObjectProject, ID: p.ID, Name: p.Name, CreatedAt: p.CreatedAt, Status: p.Status()}
	if p.ArchivedAt != 0 {
		out.ArchivedAt = &p.ArchivedAt
	}
	return out
}

func projectJSON(p org.Project, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	return projectOut(p), nil
}

type serviceAccountOut struct {
	Object    string `json:"object"`
	ID        string `json:"id"`
	Name      string `json:"name"`
	Role      string `json:"role"`
	CreatedAt int64  `json:"created_at"`
}

func serviceAccountJSON(sa org.ServiceAccount) serviceAccountOut {
	return serviceAccountOut{Object: org.ObjectServiceAccount, ID: sa.ID, Name: sa.Name, Role: sa.Role, CreatedAt: sa.CreatedAt}
}

type createdKeyOut struct {
	Object    string `json:"object"`
	ID        string `json:"id"`
	Name      string `json:"name"`
	CreatedAt int64  `json:"created_at"`
	Value     string `json:"value"`
}

type apiKeyOut struct {
	Object             string `json:"object"`
	ID                 string `json:"id"`
	Name               string `json:"name"`
	RedactedValue      string `json:"redacted_value"`
	CreatedAt          int64  `json:"created_at"`
	LastUsedAt         *int64 `json:"last_used_at"`
	OwnerProjectAccess string `json:"owner_project_access"`
	Owner              struct {
		Type           string            `json:"type"`
		ServiceAccount serviceAccountOut `json:"service_account"`
	} `json:"owner"`
}

// apiKeysJSON renders keys with their owners, read from the store.
func (c *orgCall) apiKeysJSON(pid string, keys []org.APIKey, more bool) (orgList, error) {
	owners := make(map[string]org.ServiceAccount, len(keys))
	for _, k := range keys {
		if _, ok := owners[k.ServiceAccountID]; ok {
			continue
		}
		sa, err := c.svc().GetServiceAccount(c.store, pid, k.ServiceAccountID)
		if err != nil {
			return orgList{}, err
		}
		owners[k.ServiceAccountID] = sa
	}
	return listJSON(keys, more, nil, func(k org.APIKey) (string, any) {
		out := apiKeyOut{Object: org.ObjectAPIKey, ID: k.ID, Name: k.Name, RedactedValue: k.Redacted, CreatedAt: k.CreatedAt,
			OwnerProjectAccess: "active"}
		out.Owner.Type = "service_account"
		out.Owner.ServiceAccount = serviceAccountJSON(owners[k.ServiceAccountID])
		return k.ID, out
	})
}

func rateLimitJSON(rl org.RateLimit) any {
	return struct {
		Object string `json:"object"`
		ID     string `json:"id"`
		Model  string `json:"model"`
		RPM    int64  `json:"max_requests_per_1_minute"`
		TPM    int64  `json:"max_tokens_per_1_minute"`
	}{org.ObjectRateLimit, org.RateLimitID(rl.Model), rl.Model, rl.MaxRequestsPer1Minute, rl.MaxTokensPer1Minute}
}

func modelPermissionsJSON(mp org.ModelPermissions, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	return struct {
		Object   string   `json:"object"`
		Mode     string   `json:"mode"`
		ModelIDs []string `json:"model_ids"`
	}{org.ObjectModelPermissions, mp.Mode, mp.ModelIDs}, nil
}

func spendLimitJSON(sl org.SpendLimit, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	return struct {
		Object          string `json:"object"`
		ThresholdAmount int64  `json:"threshold_amount"`
		Currency        string `json:"currency"`
		Interval        string `json:"interval"`
		Enforcement     struct {
			Status string `json:"status"`
		} `json:"enforcement"`
	}{Object: org.ObjectSpendLimit, ThresholdAmount: sl.ThresholdCents, Currency: "USD", Interval: "month",
		Enforcement: struct {
			Status string `json:"status"`
		}{"active"}}, nil
}

// spendAlertJSONOut is OpenAI's project.spend_alert, with tollgate's
// webhook_url (null when none).
type spendAlertJSONOut struct {
	Object              string  `json:"object"`
	ID                  string  `json:"id"`
	ThresholdAmount     int64   `json:"threshold_amount"`
	Currency            string  `json:"currency"`
	Interval            string  `json:"interval"`
	NotificationChannel any     `json:"notification_channel"`
	WebhookURL          *string `json:"webhook_url"`
}

func spendAlertOut(sa org.SpendAlert) spendAlertJSONOut {
	channel := map[string]any{"type": "email", "recipients": sa.Recipients, "subject_prefix": nil}
	if sa.SubjectPrefix != "" {
		channel["subject_prefix"] = sa.SubjectPrefix
	}
	out := spendAlertJSONOut{Object: org.ObjectSpendAlert, ID: sa.ID, ThresholdAmount: sa.ThresholdCents, Currency: "USD",
		Interval: "month", NotificationChannel: channel}
	if sa.WebhookURL != "" {
		out.WebhookURL = &sa.WebhookURL
	}
	return out
}

func spendAlertJSON(sa org.SpendAlert, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	return spendAlertOut(sa), nil
}

func deletedJSON(object, id string, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	if id == "" {
		return struct {
			Object  string `json:"object"`
			Deleted bool   `json:"deleted"`
		}{object, true}, nil
	}
	return struct {
		Object  string `json:"object"`
		ID      string `json:"id"`
		Deleted bool   `json:"deleted"`
	}{object, id, true}, nil
}

// orgWriteError maps an error to OpenAI's error shape, once: the domain's
// kinds, the routing errors, and anything else as a 500 that names nothing
// internal.
func orgWriteError(ctx *fasthttp.RequestCtx, err error) {
	var oe *org.Error
	var re *orgRouteError
	switch {
	case errors.As(err, &oe) && oe.Kind == org.Missing:
		usageWriteError(ctx, &usageError{status: fasthttp.StatusNotFound, typ: "invalid_request_error", code: "not_found", message: oe.Message})
	case errors.As(err, &oe):
		usageWriteError(ctx, &usageError{status: fasthttp.StatusBadRequest, typ: "invalid_request_error", param: oe.Param, message: oe.Message})
	case errors.As(err, &re) && re.status == fasthttp.StatusMethodNotAllowed:
		ctx.Response.Header.Set("Allow", re.allow)
		usageWriteError(ctx, &usageError{status: re.status, typ: "invalid_request_error",
			message: "Method " + string(ctx.Method()) + " is not allowed here; use " + re.allow + "."})
	case errors.As(err, &re):
		usageWriteError(ctx, &usageError{status: fasthttp.StatusNotFound, typ: "invalid_request_error", code: "unknown_url",
			message: "Unknown request URL: " + string(ctx.Method()) + " " + string(ctx.Path()) + "."})
	default:
		ctx.Logger().Printf("admin api: %v", err)
		ctx.Response.Header.Set("x-should-retry", "true")
		usageWriteError(ctx, &usageError{status: fasthttp.StatusInternalServerError, typ: "api_error",
			message: "The server had an error while processing your request."})
	}
}
