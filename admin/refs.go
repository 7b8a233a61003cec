package admin

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/trace"
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
		v.tooLongList(at(bodyLoc, "refs"), len(list), maxRefsPerBatch)
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
	res := refResolver{s: s, key: key, projects: map[[2]string]*trace.Project{}, objects: map[objectKey]any{}, tables: map[tableKey]*tableCache{},
		budget: readBudget{what: "read fewer refs per batch, or the rows of a large table with /table/query"}}
	vals := make([]json.RawMessage, len(refs))
	done := make(map[string]int, len(refs)) // ref → index of its first value
	for i := range refs {
		if j, ok := done[list[i]]; ok {
			// A ref named again is resolved once, though the answer
			// repeats its value.
			vals[i] = vals[j]
		} else {
			val, err := res.resolve(ctx, refs[i], 0)
			var ae *apiError
			switch {
			case errors.As(err, &ae):
				return ae
			case errors.Is(err, weave.ErrNotFound), errors.Is(err, weave.ErrDeleted), errors.Is(err, trace.ErrNotFound):
				vals[i] = json.RawMessage("null")
			case err != nil:
				return internalError(err)
			default:
				vals[i] = weave.Compact(val)
			}
			done[list[i]] = i
		}
		if e := res.budget.take(len(vals[i]) + 1); e != nil {
			return e
		}
	}
	writeJSON(rc, fasthttp.StatusOK, map[string][]json.RawMessage{"vals": vals})
	return nil
}

// refResolver resolves the refs of one batch. It remembers the projects,
// object versions and tables it read, since a batch usually names many
// rows of one dataset: reading each once keeps a batch of a thousand rows
// to a handful of queries. Values it hands out are shared and never
// modified. Everything it reads from the store counts against budget, as
// the answer does, so that a batch cannot hold more than maxReadBytes.
type refResolver struct {
	s        *Service
	key      *auth.Key
	projects map[[2]string]*trace.Project // nil for a project that does not exist
	objects  map[objectKey]any
	tables   map[tableKey]*tableCache
	budget   readBudget
}

type objectKey struct {
	project           int64
	objectID, version string
}

type tableKey struct {
	project int64
	digest  string
}

type tableCache struct {
	digests []string
	members map[string]bool
	// rows holds the values of the rows read so far, by digest: all of
	// them for a table of at most maxRefsPerBatch rows, read at once.
	rows map[string]json.RawMessage
}

// row returns the value of one of the table's rows.
func (t *tableCache) row(ctx context.Context, r *refResolver, projectID int64, digest string) (json.RawMessage, error) {
	if v, ok := t.rows[digest]; ok {
		return v, nil
	}
	got, err := r.s.weave.TableRows(ctx, projectID, []string{digest})
	if err != nil {
		return nil, err
	}
	v, ok := got[digest]
	if !ok {
		return nil, weave.ErrNotFound
	}
	if e := r.budget.take(len(v)); e != nil {
		return nil, e
	}
	t.rows[digest] = v
	return v, nil
}

func (r *refResolver) project(ctx context.Context, entity, name string) (trace.Project, error) {
	k := [2]string{entity, name}
	if p, ok := r.projects[k]; ok {
		if p == nil {
			return trace.Project{}, weave.ErrNotFound
		}
		return *p, nil
	}
	p, err := r.s.store.FindProject(ctx, entity, name)
	switch {
	case errors.Is(err, trace.ErrNotFound):
		r.projects[k] = nil
		return trace.Project{}, weave.ErrNotFound
	case err != nil:
		return trace.Project{}, err
	}
	r.projects[k] = &p
	return p, nil
}

// resolve reads what ref names and walks its extra path.
func (r *refResolver) resolve(ctx context.Context, ref weave.Ref, hops int) (any, error) {
	if hops > maxRefHops {
		return nil, weave.ErrNotFound
	}
	proj, err := r.project(ctx, ref.Entity, ref.Project)
	if err != nil {
		return nil, err
	}
	var val any
	switch ref.Kind {
	case weave.RefObject, weave.RefOp:
		k := objectKey{proj.ID, ref.Name, ref.Version}
		v, ok := r.objects[k]
		if !ok {
			o, err := r.s.weave.ReadObject(ctx, proj.ID, ref.Name, ref.Version)
			if err != nil {
				return nil, err
			}
			if e := r.budget.take(len(o.Val)); e != nil {
				return nil, e
			}
			v = decodeValue(o.Val)
			r.objects[k] = v
		}
		val = v
	case weave.RefTable:
		return r.walkTable(ctx, proj, ref.Name, ref.Extra, hops)
	case weave.RefCall:
		c, err := r.s.store.ReadCall(ctx, proj.ID, ref.Name)
		if err != nil {
			return nil, err
		}
		raw := mustJSON(renderCall(proj, &c))
		if e := r.budget.take(len(raw)); e != nil {
			return nil, e
		}
		val = decodeValue(raw)
	}
	return r.walk(ctx, val, ref.Extra, hops)
}

// walk follows edges into val. A value that is a ref is resolved first,
// so that a path can run through a dataset into its table's rows.
func (r *refResolver) walk(ctx context.Context, val any, extra []string, hops int) (any, error) {
	for i := 0; i < len(extra); i += 2 {
		edge, arg := extra[i], extra[i+1]
		if str, ok := val.(string); ok && strings.HasPrefix(str, weave.RefScheme) {
			ref, err := weave.ParseRef(str)
			if err != nil {
				return nil, weave.ErrNotFound
			}
			if !r.key.AllowsTeam(ref.Entity) {
				// A stored value naming another team's project reads
				// as nothing rather than leaking it.
				return nil, weave.ErrNotFound
			}
			ref.Extra = append(append([]string(nil), ref.Extra...), extra[i:]...)
			return r.resolve(ctx, ref, hops+1)
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

// table returns a table's row digests and the values of all its rows,
// read once per batch.
func (r *refResolver) table(ctx context.Context, proj trace.Project, digest string) (*tableCache, error) {
	k := tableKey{proj.ID, digest}
	if t, ok := r.tables[k]; ok {
		return t, nil
	}
	digests, err := r.s.weave.TableRowDigests(ctx, proj.ID, digest)
	if err != nil {
		return nil, err
	}
	t := &tableCache{digests: digests, members: make(map[string]bool, len(digests)), rows: map[string]json.RawMessage{}}
	size := 0
	for _, d := range digests {
		t.members[d] = true
		size += len(d)
	}
	if e := r.budget.take(size); e != nil {
		return nil, e
	}
	if len(digests) <= maxRefsPerBatch {
		if t.rows, err = r.s.weave.TableRows(ctx, proj.ID, digests); err != nil {
			return nil, err
		}
		for _, v := range t.rows {
			if e := r.budget.take(len(v)); e != nil {
				return nil, e
			}
		}
	}
	r.tables[k] = t
	return t, nil
}

// walkTable resolves a table ref: the whole table as a list of rows, or,
// with an extra path, the row at an index or with a digest, and on.
func (r *refResolver) walkTable(ctx context.Context, proj trace.Project, digest string, extra []string, hops int) (any, error) {
	t, err := r.table(ctx, proj, digest)
	if err != nil {
		return nil, err
	}
	var row string
	switch {
	case len(extra) == 0:
		if len(t.digests) > maxRefsPerBatch {
			// A whole table that large is read with /table/query.
			return nil, weave.ErrNotFound
		}
		out := make([]any, len(t.digests))
		for i, d := range t.digests {
			out[i] = decodeValue(t.rows[d])
		}
		return out, nil
	case extra[0] == weave.EdgeIndex:
		n, err := strconv.Atoi(extra[1])
		if err != nil || n < 0 || n >= len(t.digests) {
			return nil, weave.ErrNotFound
		}
		row = t.digests[n]
	case extra[0] == weave.EdgeID:
		if !t.members[extra[1]] {
			return nil, weave.ErrNotFound
		}
		row = extra[1]
	default:
		return nil, weave.ErrNotFound
	}
	raw, err := t.row(ctx, r, proj.ID, row)
	if err != nil {
		return nil, err
	}
	return r.walk(ctx, decodeValue(raw), extra[2:], hops)
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
