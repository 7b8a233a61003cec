package admin

import (
	"context"
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/trace"
)

// maxObjectIDLen bounds an op name, as Weave does.
const maxObjectIDLen = 128

// validObjectID reports whether s can name an op: letters, digits, "_",
// "-" and ".", so that it fits in a ref (weave:///entity/project/op/NAME:digest)
// without escaping.
func validObjectID(s string) bool {
	if s == "" || len(s) > maxObjectIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

type opCreated struct {
	ObjectID     string `json:"object_id"`
	Digest       string `json:"digest"`
	VersionIndex int    `json:"version_index"`
}

type opJSON struct {
	ObjectID     string `json:"object_id"`
	Digest       string `json:"digest"`
	VersionIndex int    `json:"version_index"`
	CreatedAt    string `json:"created_at"`
	Code         string `json:"code"`
}

// createOp serves POST /v2/{entity}/{project}/ops {"name","source_code"}.
func (s *Service) createOp(ctx context.Context, rc *fasthttp.RequestCtx, _ *auth.Key, p pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	name, ok := v.reqString(body, "name", bodyLoc)
	if ok && !validObjectID(name) {
		v.add(at(bodyLoc, "name"), "value_error",
			"Value error, an op name is 1 to 128 letters, digits, '_', '-' or '.'", name)
	}
	code, _ := v.reqString(body, "source_code", bodyLoc)
	if v.failed() {
		return v.err()
	}
	proj, _, e := s.namedProject(ctx, p.entity, p.project, forWrite)
	if e != nil {
		return e
	}
	op, err := s.store.PutOpVersion(ctx, proj.ID, name, code, time.Now())
	if err != nil {
		return internalError(err)
	}
	writeJSON(rc, fasthttp.StatusOK, opCreated{ObjectID: op.ObjectID, Digest: op.Digest, VersionIndex: op.VersionIndex})
	return nil
}

// listOps serves GET /v2/{entity}/{project}/ops?limit=&offset=.
func (s *Service) listOps(ctx context.Context, rc *fasthttp.RequestCtx, _ *auth.Key, p pathParams) *apiError {
	limit, offset, e := pageParams(rc)
	if e != nil {
		return e
	}
	proj, found, e := s.namedProject(ctx, p.entity, p.project, forRead)
	if e != nil {
		return e
	}
	var out []opJSON
	if found {
		ops, err := s.store.ListOpVersions(ctx, proj.ID, limit, offset)
		if err != nil {
			return internalError(err)
		}
		out = make([]opJSON, 0, len(ops))
		for _, op := range ops {
			out = append(out, opJSON{
				ObjectID: op.ObjectID, Digest: op.Digest, VersionIndex: op.VersionIndex,
				CreatedAt: formatTime(op.CreatedAt), Code: op.Code,
			})
		}
	}
	writeList(rc, out)
	return nil
}

// deleteOp serves DELETE /v2/{entity}/{project}/ops/{object_id}: every
// version of the op is marked deleted and leaves the listing.
func (s *Service) deleteOp(ctx context.Context, rc *fasthttp.RequestCtx, _ *auth.Key, p pathParams) *apiError {
	proj, found, e := s.namedProject(ctx, p.entity, p.project, forRead)
	if e != nil {
		return e
	}
	if !found {
		return notFound("Op")
	}
	n, err := s.store.DeleteOp(ctx, proj.ID, p.id, time.Now())
	if err != nil && !errors.Is(err, trace.ErrNotFound) {
		return internalError(err)
	}
	if n == 0 {
		return notFound("Op")
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]int{"num_deleted": n})
	return nil
}

// pageParams reads the limit and offset query parameters; an absent limit
// is -1 (no limit).
func pageParams(ctx *fasthttp.RequestCtx) (limit, offset int, e *apiError) {
	var v validation
	args := ctx.QueryArgs()
	limit, ok := queryNonNegInt(&v, args, "limit")
	if !ok {
		limit = -1
	}
	offset, _ = queryNonNegInt(&v, args, "offset")
	if v.failed() {
		return 0, 0, v.err()
	}
	return limit, offset, nil
}
