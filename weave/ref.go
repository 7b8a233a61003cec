package weave

import (
	"errors"
	"net/url"
	"strings"
	"unicode/utf8"
)

// RefScheme prefixes every Weave ref.
const RefScheme = "weave:///"

// The kinds of ref.
const (
	RefObject = "object"
	RefOp     = "op"
	RefTable  = "table"
	RefCall   = "call"
)

// The edges of a ref's extra path.
const (
	EdgeKey   = "key"
	EdgeAttr  = "attr"
	EdgeIndex = "index"
	EdgeID    = "id"
)

// Ref is a parsed ref:
//
//	weave:///entity/project/object/name:digest[/edge/arg...]
//	weave:///entity/project/op/name:digest[/edge/arg...]
//	weave:///entity/project/table/digest[/edge/arg...]
//	weave:///entity/project/call/id[/edge/arg...]
//
// The extra path walks into the value, edge then argument: key and attr
// name a key of an object, index a position in a list or a table, id a
// row of a table by digest.
type Ref struct {
	Entity, Project string
	Kind            string
	// Name is the object's id, the table's digest or the call's id.
	Name string
	// Version is an object's digest (or "latest", "v<index>"); empty for
	// tables and calls.
	Version string
	// Extra is the edge, argument pairs.
	Extra []string
}

// ErrBadRef is returned by ParseRef for a malformed ref.
var ErrBadRef = errors.New("malformed weave ref")

// ParseRef parses a weave:/// ref. Path parts are URL-unescaped, as Weave
// escapes names and keys that hold "/" or ":".
func ParseRef(s string) (Ref, error) {
	rest, ok := strings.CutPrefix(s, RefScheme)
	if !ok {
		return Ref{}, ErrBadRef
	}
	parts := strings.Split(rest, "/")
	if len(parts) < 4 {
		return Ref{}, ErrBadRef
	}
	for i, p := range parts {
		// An escape may not make a NUL character or bytes that are not
		// UTF-8 ("%00", "%ff"): no name holds them, and PostgreSQL
		// refuses them as parameters.
		u, err := url.PathUnescape(p)
		if err != nil || u == "" || strings.IndexByte(u, 0) >= 0 || !utf8.ValidString(u) {
			return Ref{}, ErrBadRef
		}
		if i != 3 {
			parts[i] = u
		}
	}
	r := Ref{Entity: parts[0], Project: parts[1], Kind: parts[2]}
	switch r.Kind {
	case RefObject, RefOp:
		// The version follows the last ':' of the still-escaped part, so
		// that an escaped ':' stays in the name.
		i := strings.LastIndexByte(parts[3], ':')
		if i <= 0 || i == len(parts[3])-1 {
			return Ref{}, ErrBadRef
		}
		name, err := url.PathUnescape(parts[3][:i])
		if err != nil {
			return Ref{}, ErrBadRef
		}
		r.Name, r.Version = name, parts[3][i+1:]
	case RefTable, RefCall:
		name, err := url.PathUnescape(parts[3])
		if err != nil {
			return Ref{}, ErrBadRef
		}
		r.Name = name
	default:
		return Ref{}, ErrBadRef
	}
	r.Extra = parts[4:]
	if len(r.Extra)%2 != 0 {
		return Ref{}, ErrBadRef
	}
	for i := 0; i < len(r.Extra); i += 2 {
		switch r.Extra[i] {
		case EdgeKey, EdgeAttr, EdgeIndex, EdgeID:
		default:
			return Ref{}, ErrBadRef
		}
	}
	return r, nil
}

// TableRef is the ref of a table.
func TableRef(entity, project, digest string) string {
	return RefScheme + entity + "/" + project + "/" + RefTable + "/" + digest
}
