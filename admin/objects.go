package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/trace"
	"github.com/tollgate-dev/tollgate/weave"
)

// maxDeleteDigests bounds the versions one /obj/delete names, as Weave's.
const maxDeleteDigests = 100

// objJSON is Weave's ObjSchema.
type objJSON struct {
	ProjectID       string          `json:"project_id"`
	ObjectID        string          `json:"object_id"`
	CreatedAt       string          `json:"created_at"`
	DeletedAt       *string         `json:"deleted_at"`
	Digest          string          `json:"digest"`
	VersionIndex    int             `json:"version_index"`
	IsLatest        int             `json:"is_latest"`
	Kind            string          `json:"kind"`
	BaseObjectClass *string         `json:"base_object_class"`
	LeafObjectClass *string         `json:"leaf_object_class"`
	Val             json.RawMessage `json:"val"`
	WBUserID        *string         `json:"wb_user_id"`
	SizeBytes       int64           `json:"size_bytes"`
}

func renderObject(projectID string, o *weave.Object) objJSON {
	out := objJSON{
		ProjectID: projectID, ObjectID: o.ObjectID, CreatedAt: formatTime(o.CreatedAt), Digest: o.Digest,
		VersionIndex: o.VersionIndex, Kind: o.Kind, BaseObjectClass: o.BaseObjectClass,
		LeafObjectClass: o.LeafObjectClass, Val: o.Val, WBUserID: o.WBUserID, SizeBytes: o.SizeBytes,
	}
	if o.IsLatest {
		out.IsLatest = 1
	}
	if o.DeletedAt != nil {
		d := formatTime(*o.DeletedAt)
		out.DeletedAt = &d
	}
	if out.Val == nil {
		out.Val = json.RawMessage("null")
	}
	return out
}

// projectOf reads a body's required project_id and resolves it for the
// key. found is false, with no error, for a read of a project that does
// not exist yet.
func (s *Service) projectOf(ctx context.Context, v *validation, key *auth.Key, obj map[string]any, loc []any, access projectAccess) (raw string, p trace.Project, found bool, e *apiError) {
	raw, ok := v.reqString(obj, "project_id", loc)
	if !ok || v.failed() {
		return "", trace.Project{}, false, v.err()
	}
	p, found, e = s.resolveProject(ctx, key, raw, at(loc, "project_id"), access)
	return raw, p, found, e
}

// objCreate serves POST /obj/create {"obj": ObjSchemaForInsert}.
func (s *Service) objCreate(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	raw, ok := body["obj"]
	if !ok {
		v.add(at(bodyLoc, "obj"), "missing", "Field required", body)
		return v.err()
	}
	loc := at(bodyLoc, "obj")
	obj, ok := v.object(raw, loc, "ObjSchemaForInsert")
	if !ok {
		return v.err()
	}
	objectID, ok := v.reqString(obj, "object_id", loc)
	if ok && !validObjectID(objectID) {
		v.add(at(loc, "object_id"), "value_error",
			"Value error, an object id is 1 to 128 letters, digits, '_', '-' or '.'", objectID)
	}
	val, hasVal := obj["val"]
	if !hasVal {
		v.add(at(loc, "val"), "missing", "Field required", obj)
	}
	builtin := v.optString(obj, "builtin_object_class", loc)
	if builtin == nil {
		builtin = v.optString(obj, "set_base_object_class", loc)
	}
	if v.failed() {
		return v.err()
	}
	leaf, base := weave.ObjectClasses(val)
	if builtin != nil {
		switch m, isDict := val.(map[string]any); {
		case leaf != nil && *leaf != *builtin:
			v.add(at(loc, "builtin_object_class"), "value_error", "Value error, object_class must match val's defined object class: "+*leaf+" != "+*builtin, *builtin)
		case !isDict:
			v.add(at(loc, "builtin_object_class"), "value_error", "Value error, object_class cannot be provided for non-dict objects", *builtin)
		case leaf == nil:
			// A builtin class marks the value as that class, as Weave's
			// dump of the validated model does.
			val = withClass(m, *builtin)
			leaf, base = weave.ObjectClasses(val)
		}
		if v.failed() {
			return v.err()
		}
	}
	_, proj, _, e := s.projectOf(ctx, &v, key, obj, loc, forWrite)
	if e != nil {
		return e
	}
	digest, err := weave.ValueDigest(val)
	if err != nil {
		return internalError(err)
	}
	w := weave.ObjectWrite{
		ProjectID: proj.ID, ObjectID: objectID, Digest: digest, Kind: weave.KindOf(val),
		BaseObjectClass: base, LeafObjectClass: leaf, Val: weave.Compact(val), WBUserID: &key.Name, At: time.Now(),
	}
	if w.Kind == weave.KindOp {
		w.OpCodeDigest = weave.OpCodeDigest(val)
	}
	o, err := s.weave.PutObject(ctx, w)
	if err != nil {
		return internalError(err)
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]string{"digest": o.Digest, "object_id": o.ObjectID})
	return nil
}

func withClass(m map[string]any, class string) map[string]any {
	out := make(map[string]any, len(m)+2)
	for k, x := range m {
		out[k] = x
	}
	out["_class_name"] = class
	out["_bases"] = []any{"BaseObject", "BaseModel"}
	return out
}

// objRead serves POST /obj/read {project_id, object_id, digest, metadata_only}.
// digest may be "latest" or "v<index>".
func (s *Service) objRead(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	objectID, _ := v.reqString(body, "object_id", bodyLoc)
	version, _ := v.reqString(body, "digest", bodyLoc)
	metadataOnly := v.optBool(body, "metadata_only", bodyLoc, false)
	raw, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forRead)
	if e != nil {
		return e
	}
	notFoundErr := notFound("Obj " + objectID + ":" + version)
	if !found {
		return notFoundErr
	}
	o, err := s.weave.ReadObject(ctx, proj.ID, objectID, version)
	switch {
	case errors.Is(err, weave.ErrNotFound):
		return notFoundErr
	case errors.Is(err, weave.ErrDeleted):
		return notFound(objectID + ":v" + strconv.Itoa(o.VersionIndex) + " was deleted, object")
	case err != nil:
		return internalError(err)
	}
	if metadataOnly {
		o.Val = json.RawMessage("{}")
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]objJSON{"obj": renderObject(raw, &o)})
	return nil
}

// objectOverhead is what an object's answer takes besides its value, for
// the read budget.
const objectOverhead = 256

// objsQuery serves POST /objs/query {project_id, filter, limit, offset,
// sort_by, metadata_only}: at most maxQueryPage objects (a larger limit is
// a 422) within maxReadBytes (a 413 past it), read one at a time.
func (s *Service) objsQuery(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	q := weave.ObjectQuery{Limit: -1}
	if raw, ok := body["filter"]; ok && raw != nil {
		floc := at(bodyLoc, "filter")
		if f, ok := v.object(raw, floc, "ObjectVersionFilter"); ok {
			v.strict(f, floc, "base_object_classes", "exclude_base_object_classes", "leaf_object_classes",
				"object_ids", "is_op", "latest_only")
			q.BaseObjectClasses = v.optStringList(f, "base_object_classes", floc)
			q.ExcludeBaseObjectClasses = v.optStringList(f, "exclude_base_object_classes", floc)
			q.LeafObjectClasses = v.optStringList(f, "leaf_object_classes", floc)
			q.ObjectIDs = v.optStringList(f, "object_ids", floc)
			for _, l := range []struct {
				name string
				n    int
			}{
				{"base_object_classes", len(q.BaseObjectClasses)}, {"exclude_base_object_classes", len(q.ExcludeBaseObjectClasses)},
				{"leaf_object_classes", len(q.LeafObjectClasses)}, {"object_ids", len(q.ObjectIDs)},
			} {
				if l.n > maxListItems {
					v.tooLongList(at(floc, l.name), l.n, maxListItems)
				}
			}
			if x, ok := f["is_op"]; ok && x != nil {
				b := v.boolean(x, at(floc, "is_op"))
				q.IsOp = &b
			}
			q.LatestOnly = v.optBool(f, "latest_only", floc, false)
		}
	}
	q.Limit = v.pageLimit(body, v.optNonNegInt(body, "limit", bodyLoc, -1))
	q.Offset = v.optNonNegInt(body, "offset", bodyLoc, 0)
	q.MetadataOnly = v.optBool(body, "metadata_only", bodyLoc, false)
	for _, srt := range parseDocSort(&v, body["sort_by"], at(bodyLoc, "sort_by")) {
		f := strings.Join(srt.Field, ".")
		if !weave.IsObjectSortField(f) {
			v.add(at(bodyLoc, "sort_by"), "value_error", "Value error, objects sort by "+weave.ObjectSortFieldNames, f)
			continue
		}
		q.SortBy = append(q.SortBy, weave.ObjectSort{Field: f, Desc: srt.Desc})
	}
	raw, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forRead)
	if e != nil {
		return e
	}
	out := []objJSON{}
	if found {
		budget := readBudget{what: "lower the limit, or list with metadata_only and read each object with /obj/read"}
		err := s.weave.QueryObjects(ctx, proj.ID, q, func(o *weave.Object) error {
			if q.MetadataOnly {
				o.Val = json.RawMessage("{}")
			}
			if e := budget.take(len(o.Val) + objectOverhead); e != nil {
				return e
			}
			out = append(out, renderObject(raw, o))
			return nil
		})
		var ae *apiError
		switch {
		case errors.As(err, &ae):
			return ae
		case err != nil:
			return internalError(err)
		}
	}
	writeJSON(rc, fasthttp.StatusOK, map[string][]objJSON{"objs": out})
	return nil
}

// objDelete serves POST /obj/delete {project_id, object_id, digests}.
func (s *Service) objDelete(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	objectID, _ := v.reqString(body, "object_id", bodyLoc)
	digests := v.optStringList(body, "digests", bodyLoc)
	if len(digests) > maxDeleteDigests {
		v.tooLongList(at(bodyLoc, "digests"), len(digests), maxDeleteDigests)
	}
	_, proj, found, e := s.projectOf(ctx, &v, key, body, bodyLoc, forRead)
	if e != nil {
		return e
	}
	if !found {
		return notFound("Object " + objectID)
	}
	n, err := s.weave.DeleteObjects(ctx, proj.ID, objectID, digests, time.Now())
	if e := lookupError(err, "Object "+objectID); e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]int{"num_deleted": n})
	return nil
}

// parseDocSort validates a sort_by list of {"field", "direction"} whose
// fields are dotted paths into a document.
func parseDocSort(v *validation, raw any, loc []any) []weave.DocSort {
	var out []weave.DocSort
	sortItems(v, raw, loc, 0, func(iloc []any, field string, desc, dirOK bool) {
		path := strings.Split(field, ".")
		if contains(path, "") {
			v.add(at(iloc, "field"), "value_error", "Value error, malformed field path "+strconv.Quote(field), field)
			return
		}
		if dirOK {
			out = append(out, weave.DocSort{Field: path, Desc: desc})
		}
	})
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

func itoa(i int) string { return strconv.Itoa(i) }
