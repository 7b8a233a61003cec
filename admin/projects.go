package admin

import (
	"context"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/trace"
)

const internalIDPrefix = "ProjectInternalId:"

// InternalProjectID renders a project's opaque internal id the W&B way:
// base64 of "ProjectInternalId:<integer>".
func InternalProjectID(id int64) string {
	return base64.StdEncoding.EncodeToString([]byte(internalIDPrefix + strconv.FormatInt(id, 10)))
}

// parseInternalProjectID is the inverse of InternalProjectID. Padding is
// optional, as some clients strip it.
func parseInternalProjectID(s string) (int64, bool) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		if b, err = base64.RawStdEncoding.DecodeString(s); err != nil {
			return 0, false
		}
	}
	digits, ok := strings.CutPrefix(string(b), internalIDPrefix)
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || id <= 0 {
		return 0, false
	}
	return id, true
}

// splitProjectID splits an external project id "entity/project".
func splitProjectID(s string) (entity, name string, ok bool) {
	entity, name, ok = strings.Cut(s, "/")
	if !ok || entity == "" || name == "" || strings.Contains(name, "/") {
		return "", "", false
	}
	return entity, name, true
}

// projectAccess says what a request does with its project: reading an
// unknown project finds nothing, writing creates it.
type projectAccess int

const (
	forRead projectAccess = iota
	forWrite
)

// resolveProject turns a body's project_id, "entity/project" or an internal
// id, into a project the key may use. For reads of a project that does not
// exist it returns found=false and no error; for writes it creates a
// project named entity/project, and refuses an unknown internal id with 404.
func (s *Service) resolveProject(ctx context.Context, key *auth.Key, raw string, loc []any, access projectAccess) (p trace.Project, found bool, e *apiError) {
	if e := boundProjectID(raw, loc); e != nil {
		return trace.Project{}, false, e
	}
	if entity, name, ok := splitProjectID(raw); ok {
		if !key.AllowsTeam(entity) {
			return trace.Project{}, false, forbidden(entity)
		}
		return s.namedProject(ctx, entity, name, access)
	}
	id, ok := parseInternalProjectID(raw)
	if !ok {
		return trace.Project{}, false, invalid([]fieldError{{
			Loc: loc, Type: "value_error", Input: raw,
			Msg: "Value error, project_id must be entity/project or an internal project id",
		}})
	}
	p, err := s.store.ProjectByID(ctx, id)
	switch {
	case errors.Is(err, trace.ErrNotFound):
		if access == forWrite {
			return trace.Project{}, false, notFound("Project")
		}
		return trace.Project{}, false, nil
	case err != nil:
		return trace.Project{}, false, internalError(err)
	case !key.AllowsTeam(p.Entity):
		return trace.Project{}, false, forbidden(p.Entity)
	}
	return p, true, nil
}

// namedProject finds (reads) or ensures (writes) the project entity/name,
// whose entity is already authorized.
func (s *Service) namedProject(ctx context.Context, entity, name string, access projectAccess) (trace.Project, bool, *apiError) {
	if access == forWrite {
		p, err := s.store.EnsureProject(ctx, entity, name)
		if err != nil {
			return trace.Project{}, false, internalError(err)
		}
		return p, true, nil
	}
	p, err := s.store.FindProject(ctx, entity, name)
	switch {
	case errors.Is(err, trace.ErrNotFound):
		return trace.Project{}, false, nil
	case err != nil:
		return trace.Project{}, false, internalError(err)
	}
	return p, true, nil
}

type projectInfo struct {
	ExternalProjectID string `json:"external_project_id"`
	InternalProjectID string `json:"internal_project_id"`
}

// projectsInfo serves POST /service/projects_info. Every id must be
// well-formed (422) and of a team the key may use (403, rather than
// silently leaving it out, so that a caller can tell "no such project" from
// "not yours"); unknown projects are left out of the answer.
func (s *Service) projectsInfo(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	v.strict(body, bodyLoc, "project_ids")
	ids := v.reqStringList(body, "project_ids", bodyLoc, maxListItems)
	type ref struct{ entity, name, raw string }
	refs := make([]ref, 0, len(ids))
	for i, id := range ids {
		entity, name, ok := splitProjectID(id)
		if !ok {
			v.add(at(bodyLoc, "project_ids", i), "value_error", "Value error, project id must be entity/project", id)
			continue
		}
		refs = append(refs, ref{entity, name, id})
	}
	if v.failed() {
		return v.err()
	}
	for _, r := range refs {
		if !key.AllowsTeam(r.entity) {
			return forbidden(r.entity)
		}
	}
	out := make([]projectInfo, 0, len(refs))
	seen := make(map[string]bool, len(refs))
	for _, r := range refs {
		if seen[r.raw] {
			continue
		}
		seen[r.raw] = true
		p, err := s.store.FindProject(ctx, r.entity, r.name)
		if errors.Is(err, trace.ErrNotFound) {
			continue
		}
		if err != nil {
			return internalError(err)
		}
		out = append(out, projectInfo{ExternalProjectID: r.raw, InternalProjectID: InternalProjectID(p.ID)})
	}
	writeJSON(rc, fasthttp.StatusOK, out)
	return nil
}
