package admin

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/weave"
)

// Bounds of /refs/read_batch: refs per request, as Weave's, and refs
// followed while resolving one (a value that is itself a ref, a table's
// row), against cycles.
const (
	maxRefsPerBatch = 1000
	maxRefHops      = 16
)

// refsReadBatch serves POST /refs/read_batch {"refs": [...]} → {"vals":
// [...]}, one value per ref, null for a ref to something that does not
// exist or was deleted. A ref into a project of a team the key may not use
// refuses the whole batch.
func (s *Service) refsReadBatch(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	raw, ok := body["refs"]
	if !ok {
		v.add(at(bodyLoc, "refs"), "missing", "Field required", body)
		return v.err()
	}
	list := v.stringList(raw, at(bodyLoc, "refs"))
	if len(list) > maxRefsPerBatch {
		v.addCtx(at(bodyLoc, "refs"), "too_long", "List should have at most 1000 items after validation", len(list),
			map[string]any{"max_length": maxRefsPerBatch})
	}
	refs := make([]weave.Ref, len(list))
	for i, s := range list {
		r, err := weave.ParseRef(s)
		if err != nil {
			v.add(at(bodyLoc, "refs", i), "value_error", "Value error, invalid ref "+strconv.Quote(s), s)
			continue
		}
		refs[i] = r
	}
	if v.failed() {
		return v.err()
	}
	for _, r := range refs {
		if !key.AllowsTeam(r.Entity) {
			return forbidden(r.Entity)
		}
	}
	vals := make([]json.RawMessage, len(refs))
	for i := range refs {
		val, err := s.resolveRef(ctx, key, refs[i], 0)
		switch {
		case errors.Is(err, weave.ErrNotFound), errors.Is(err, weave.ErrDeleted), errors.Is(err, ErrNotFound):
			vals[i] = json.RawMessage("null")
		case err != nil:
			return internalError(err)
		default:
			vals[i] = weave.Compact(val)
		}
	}
	writeJSON(rc, fasthttp.StatusOK, map[string][]json.RawMessage{"vals": vals})
	return nil
}

// resolveRef reads what r names and walks its extra path.
func (s *Service) resolveRef(ctx context.Context, key *auth.Key, r weave.Ref, hops int) (any, error) {
	if hops > maxRefHops {
		return nil, weave.ErrNotFound
	}
	proj, err := s.store.FindProject(ctx, r.Entity, r.Project)
	if err != nil {
		return nil, err
	}
	var val any
	switch r.Kind {
	case weave.RefObject, weave.RefOp:
		o, err := s.weave.ReadObject(ctx, proj.ID, r.Name, r.Version)
		if err != nil {
			return nil, err
		}
		val = decodeValue(o.Val)
	case weave.RefTable:
		return s.walkTable(ctx, key, proj, r.Name, r.Extra, hops)
	case weave.RefCall:
		c, err := s.store.ReadCall(ctx, proj.ID, r.Name)
		if err != nil {
			return nil, err
		}
		val = decodeValue(mustJSON(renderCall(proj, &c)))
	}
	return s.walk(ctx, key, val, r.Extra, hops)
}

// walk follows edges into val. A value that is a ref is resolved first,
// so that a path can run through a dataset into its table's rows.
func (s *Service) walk(ctx context.Context, key *auth.Key, val any, extra []string, hops int) (any, error) {
	for i := 0; i < len(extra); i += 2 {
		edge, arg := extra[i], extra[i+1]
		if str, ok := val.(string); ok && strings.HasPrefix(str, weave.RefScheme) {
			r, err := weave.ParseRef(str)
			if err != nil {
				return nil, weave.ErrNotFound
			}
			if !key.AllowsTeam(r.Entity) {
				// A stored value naming another team's project reads
				// as nothing rather than leaking it.
				return nil, weave.ErrNotFound
			}
			r.Extra = append(append([]string(nil), r.Extra...), extra[i:]...)
			return s.resolveRef(ctx, key, r, hops+1)
		}
		switch edge {
		case weave.EdgeKey, weave.EdgeAttr:
			m, ok := val.(map[string]any)
			if !ok {
				return nil, weave.ErrNotFound
			}
			if val, ok = m[arg]; !ok {
				return nil, weave.ErrNotFound
			}
		case weave.EdgeIndex:
			l, ok := val.([]any)
			n, err := strconv.Atoi(arg)
			if !ok || err != nil || n < 0 || n >= len(l) {
				return nil, weave.ErrNotFound
			}
			val = l[n]
		default:
			return nil, weave.ErrNotFound
		}
	}
	return val, nil
}

// walkTable resolves a table ref: the whole table as a list of rows, or,
// with an extra path, the row at an index or with a digest, and on.
func (s *Service) walkTable(ctx context.Context, key *auth.Key, proj Project, digest string, extra []string, hops int) (any, error) {
	digests, err := s.weave.TableRowDigests(ctx, proj.ID, digest)
	if err != nil {
		return nil, err
	}
	var want []string
	switch {
	case len(extra) == 0:
		want = digests
	case extra[0] == weave.EdgeIndex:
		n, err := strconv.Atoi(extra[1])
		if err != nil || n < 0 || n >= len(digests) {
			return nil, weave.ErrNotFound
		}
		want = digests[n : n+1]
	case extra[0] == weave.EdgeID:
		if !contains(digests, extra[1]) {
			return nil, weave.ErrNotFound
		}
		want = []string{extra[1]}
	default:
		return nil, weave.ErrNotFound
	}
	rows, err := s.weave.TableRows(ctx, proj.ID, want)
	if err != nil {
		return nil, err
	}
	if len(extra) == 0 {
		out := make([]any, len(want))
		for i, d := range want {
			out[i] = decodeValue(rows[d])
		}
		return out, nil
	}
	row, ok := rows[want[0]]
	if !ok {
		return nil, weave.ErrNotFound
	}
	return s.walk(ctx, key, decodeValue(row), extra[2:], hops)
}

func decodeValue(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytesReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil
	}
	return v
}
