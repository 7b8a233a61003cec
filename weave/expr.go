package weave

import (
	"encoding/json"

	"sort"
	"strconv"
	"strings"
)

// Expr is a query expression of the Weave query language ({"$expr": ...})
// evaluated over documents: feedback items and prices, which are few per
// project, are filtered in memory rather than compiled to SQL.
type Expr struct{ root node }

type node interface {
	eval(doc map[string]any) any
}

// ExprError is a malformed expression; Path locates the offending part
// under "$expr".
type ExprError struct {
	Path []any
	Msg  string
}

func (e *ExprError) Error() string { return e.Msg }

// ParseExpr parses the value of a query's "$expr".
func ParseExpr(raw any) (Expr, error) {
	n, err := parseNode(raw, []any{"$expr"})
	if err != nil {
		return Expr{}, err
	}
	return Expr{root: n}, nil
}

// Match reports whether doc satisfies the expression.
func (e Expr) Match(doc map[string]any) bool { return truthy(e.root.eval(doc)) }

func parseNode(raw any, path []any) (node, error) {
	obj, ok := raw.(map[string]any)
	if !ok || len(obj) != 1 {
		return nil, &ExprError{Path: path, Msg: "an operand is an object with exactly one operator key"}
	}
	for k, v := range obj {
		p := append(append([]any{}, path...), k)
		switch k {
		case "$literal":
			return literal{v}, nil
		case "$getField":
			s, ok := v.(string)
			if !ok || s == "" {
				return nil, &ExprError{Path: p, Msg: "$getField takes a dotted field path"}
			}
			return getField(strings.Split(s, ".")), nil
		case "$convert":
			m, ok := v.(map[string]any)
			if !ok {
				return nil, &ExprError{Path: p, Msg: "$convert takes {input, to}"}
			}
			in, err := parseNode(m["input"], append(p, "input"))
			if err != nil {
				return nil, err
			}
			to, _ := m["to"].(string)
			switch to {
			case "double", "string", "int", "bool", "exists":
			default:
				return nil, &ExprError{Path: append(p, "to"), Msg: "$convert to is one of double, string, int, bool, exists"}
			}
			return convert{in, to}, nil
		case "$and", "$or":
			list, ok := v.([]any)
			if !ok {
				return nil, &ExprError{Path: p, Msg: k + " takes a list of operations"}
			}
			ns, err := parseList(list, p)
			if err != nil {
				return nil, err
			}
			return logic{and: k == "$and", ops: ns}, nil
		case "$not":
			list, ok := v.([]any)
			if !ok || len(list) != 1 {
				return nil, &ExprError{Path: p, Msg: "$not takes a list of one operation"}
			}
			n, err := parseNode(list[0], append(p, 0))
			if err != nil {
				return nil, err
			}
			return not{n}, nil
		case "$eq", "$gt", "$gte", "$lt", "$lte":
			list, ok := v.([]any)
			if !ok || len(list) != 2 {
				return nil, &ExprError{Path: p, Msg: k + " takes a list of two operands"}
			}
			ns, err := parseList(list, p)
			if err != nil {
				return nil, err
			}
			return compare{op: k, a: ns[0], b: ns[1]}, nil
		case "$in":
			list, ok := v.([]any)
			if !ok || len(list) != 2 {
				return nil, &ExprError{Path: p, Msg: "$in takes [operand, [operands]]"}
			}
			left, err := parseNode(list[0], append(p, 0))
			if err != nil {
				return nil, err
			}
			vals, ok := list[1].([]any)
			if !ok {
				return nil, &ExprError{Path: append(p, 1), Msg: "$in takes [operand, [operands]]"}
			}
			ns, err := parseList(vals, append(p, 1))
			if err != nil {
				return nil, err
			}
			return in{left, ns}, nil
		case "$contains":
			m, ok := v.(map[string]any)
			if !ok {
				return nil, &ExprError{Path: p, Msg: "$contains takes {input, substr, case_insensitive}"}
			}
			input, err := parseNode(m["input"], append(p, "input"))
			if err != nil {
				return nil, err
			}
			substr, err := parseNode(m["substr"], append(p, "substr"))
			if err != nil {
				return nil, err
			}
			ci, _ := m["case_insensitive"].(bool)
			return contains{input, substr, ci}, nil
		}
		return nil, &ExprError{Path: path, Msg: "unknown operator " + strconv.Quote(k)}
	}
	panic("unreachable")
}

func parseList(list []any, path []any) ([]node, error) {
	out := make([]node, len(list))
	for i, item := range list {
		n, err := parseNode(item, append(append([]any{}, path...), i))
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

type literal struct{ v any }

func (l literal) eval(map[string]any) any { return l.v }

type getField []string

func (g getField) eval(doc map[string]any) any { return Lookup(doc, g) }

// Lookup walks a dotted path into a document; nil when absent.
func Lookup(doc map[string]any, path []string) any {
	var cur any = doc
	for _, k := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		if cur, ok = m[k]; !ok {
			return nil
		}
	}
	return cur
}

type convert struct {
	in node
	to string
}

func (c convert) eval(doc map[string]any) any {
	v := c.in.eval(doc)
	switch c.to {
	case "exists":
		return v != nil
	case "string":
		if v == nil {
			return nil
		}
		return text(v)
	case "bool":
		return truthy(v)
	case "double":
		f, ok := number(v)
		if !ok {
			return nil
		}
		return f
	case "int":
		f, ok := number(v)
		if !ok {
			return nil
		}
		return float64(int64(f))
	}
	return nil
}

type logic struct {
	and bool
	ops []node
}

func (l logic) eval(doc map[string]any) any {
	for _, op := range l.ops {
		if truthy(op.eval(doc)) != l.and {
			return !l.and
		}
	}
	return l.and
}

type not struct{ n node }

func (n not) eval(doc map[string]any) any { return !truthy(n.n.eval(doc)) }

type compare struct {
	op   string
	a, b node
}

func (c compare) eval(doc map[string]any) any {
	a, b := c.a.eval(doc), c.b.eval(doc)
	if c.op == "$eq" {
		return equal(a, b)
	}
	r, ok := order(a, b)
	if !ok {
		return false
	}
	switch c.op {
	case "$gt":
		return r > 0
	case "$gte":
		return r >= 0
	case "$lt":
		return r < 0
	}
	return r <= 0
}

type in struct {
	left node
	vals []node
}

func (x in) eval(doc map[string]any) any {
	v := x.left.eval(doc)
	for _, n := range x.vals {
		if equal(v, n.eval(doc)) {
			return true
		}
	}
	return false
}

type contains struct {
	input, substr node
	ci            bool
}

func (c contains) eval(doc map[string]any) any {
	a, b := c.input.eval(doc), c.substr.eval(doc)
	if a == nil || b == nil {
		return false
	}
	s, sub := text(a), text(b)
	if c.ci {
		s, sub = strings.ToLower(s), strings.ToLower(sub)
	}
	return strings.Contains(s, sub)
}

func truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	}
	if f, ok := number(v); ok {
		return f != 0
	}
	return true
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case int:
		return float64(x), true
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		return f, err == nil
	}
	return 0, false
}

func isNumber(v any) bool {
	switch v.(type) {
	case json.Number, float64, int64, int:
		return true
	}
	return false
}

// text is a value's text: strings as they are, other values as JSON.
func text(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return string(Compact(v))
}

func equal(a, b any) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if isNumber(a) && isNumber(b) {
		x, _ := number(a)
		y, _ := number(b)
		return x == y
	}
	if as, ok := a.(string); ok {
		bs, ok := b.(string)
		return ok && as == bs
	}
	if ab, ok := a.(bool); ok {
		bb, ok := b.(bool)
		return ok && ab == bb
	}
	return string(Compact(a)) == string(Compact(b))
}

// order compares two values of one kind (numbers or strings).
func order(a, b any) (int, bool) {
	if isNumber(a) && isNumber(b) {
		x, _ := number(a)
		y, _ := number(b)
		switch {
		case x < y:
			return -1, true
		case x > y:
			return 1, true
		}
		return 0, true
	}
	as, ok1 := a.(string)
	bs, ok2 := b.(string)
	if ok1 && ok2 {
		return strings.Compare(as, bs), true
	}
	return 0, false
}

// DocSort orders documents by a dotted field.
type DocSort struct {
	Field []string
	Desc  bool
}

// CompareValues orders two values as SortDocs does, for a caller that
// sorts values it holds outside documents.
func CompareValues(a, b any) int { return compareAny(a, b) }

// SortDocs sorts docs stably by keys; absent values sort first ascending.
func SortDocs(docs []map[string]any, keys []DocSort) {
	sort.SliceStable(docs, func(i, j int) bool {
		for _, k := range keys {
			a, b := Lookup(docs[i], k.Field), Lookup(docs[j], k.Field)
			r := compareAny(a, b)
			if r == 0 {
				continue
			}
			if k.Desc {
				return r > 0
			}
			return r < 0
		}
		return false
	})
}

// compareAny orders any two values: null, then numbers, then strings,
// then the rest by their JSON text.
func compareAny(a, b any) int {
	ra, rb := rank(a), rank(b)
	if ra != rb {
		return ra - rb
	}
	if r, ok := order(a, b); ok {
		return r
	}
	if a == nil {
		return 0
	}
	return strings.Compare(text(a), text(b))
}

func rank(v any) int {
	switch {
	case v == nil:
		return 0
	case isNumber(v):
		return 1
	}
	if _, ok := v.(string); ok {
		return 2
	}
	return 3
}

// IDsOf returns the ids an expression names when it only selects by id
// ({"$eq": [{"$getField": "id"}, {"$literal": x}]}, their "$or", or an
// "$in" on id), the only form purges accept, as Weave's do.
func IDsOf(e Expr) ([]string, bool) {
	return idsOf(e.root)
}

func idsOf(n node) ([]string, bool) {
	switch x := n.(type) {
	case compare:
		if x.op != "$eq" {
			return nil, false
		}
		if id, ok := idLiteral(x.a, x.b); ok {
			return []string{id}, true
		}
		if id, ok := idLiteral(x.b, x.a); ok {
			return []string{id}, true
		}
	case in:
		if f, ok := x.left.(getField); !ok || len(f) != 1 || f[0] != "id" {
			return nil, false
		}
		var ids []string
		for _, v := range x.vals {
			l, ok := v.(literal)
			s, sok := l.v.(string)
			if !ok || !sok {
				return nil, false
			}
			ids = append(ids, s)
		}
		return ids, true
	case logic:
		if x.and {
			return nil, false
		}
		var ids []string
		for _, op := range x.ops {
			more, ok := idsOf(op)
			if !ok {
				return nil, false
			}
			ids = append(ids, more...)
		}
		return ids, true
	}
	return nil, false
}

func idLiteral(f, l node) (string, bool) {
	g, ok := f.(getField)
	if !ok || len(g) != 1 || g[0] != "id" {
		return "", false
	}
	lit, ok := l.(literal)
	if !ok {
		return "", false
	}
	s, ok := lit.v.(string)
	return s, ok
}

// Values returns the string values an expression restricts field to, when
// it does: an $eq or $in on the field with string literals, an $and with
// such a part, or an $or all of whose parts are such. Stores use it to
// read only the candidates (by an indexed column) before Match filters
// them; false means every document is a candidate.
func (e Expr) Values(field string) ([]string, bool) {
	return valuesOf(e.root, field)
}

func valuesOf(n node, field string) ([]string, bool) {
	isField := func(x node) bool {
		g, ok := x.(getField)
		return ok && len(g) == 1 && g[0] == field
	}
	str := func(x node) (string, bool) {
		l, ok := x.(literal)
		if !ok {
			return "", false
		}
		s, ok := l.v.(string)
		return s, ok
	}
	switch x := n.(type) {
	case compare:
		if x.op != "$eq" {
			return nil, false
		}
		if s, ok := str(x.b); ok && isField(x.a) {
			return []string{s}, true
		}
		if s, ok := str(x.a); ok && isField(x.b) {
			return []string{s}, true
		}
	case in:
		if !isField(x.left) {
			return nil, false
		}
		out := make([]string, 0, len(x.vals))
		for _, v := range x.vals {
			s, ok := str(v)
			if !ok {
				return nil, false
			}
			out = append(out, s)
		}
		return out, true
	case logic:
		if x.and {
			for _, op := range x.ops {
				if vals, ok := valuesOf(op, field); ok {
					return vals, true
				}
			}
			return nil, false
		}
		var out []string
		for _, op := range x.ops {
			vals, ok := valuesOf(op, field)
			if !ok {
				return nil, false
			}
			out = append(out, vals...)
		}
		return out, len(x.ops) > 0
	}
	return nil, false
}
