package store

import (
	"encoding/json"
	"fmt"

	"github.com/tollgate-dev/tollgate/trace"
)

// postgresExpr is the $expr compiler for PostgreSQL. SQLite's
// (expr_sqlite.go) leans on dynamic typing: json_extract gives SQL
// numbers, text or 0/1, and typeof() tells them apart. PostgreSQL is
// typed, so every compiled operand here has a kind (pgKind):
//   - text: a plain column or a string literal. Two text operands compare
//     as text, bytewise (the columns' "C" collation), so that a condition
//     on a column can use its index;
//   - jsonb: a field of a JSON column (a JSON null reads as SQL NULL, as
//     json_extract gives it), any other literal, a $convert to a number;
//   - boolean: an operation used as a value.
//
// Operands of different kinds meet as jsonb, whose comparisons are typed
// as SQLite's are: a number never equals a string. SQLite gives booleans as
// 0 and 1, so there true also equals 1; here it equals only true.
type postgresExpr struct{}

// pgKind is the SQL type of a compiled operand.
type pgKind int

const (
	pgText pgKind = iota
	pgJSON
	pgBool
)

// pgValue is a compiled operand and its SQL type.
type pgValue struct {
	sqlFrag
	kind pgKind
}

// pgNumberPrefix matches the number a text starts with, as SQLite's CAST
// reads it (" 7.5e2abc" is 750, "abc" is 0). It has no question mark, so
// that it cannot be taken for a placeholder.
const pgNumberPrefix = `'^\s*([-+]{0,1}(\d+\.{0,1}\d*|\.\d+)([eE][-+]{0,1}\d+){0,1})'`

// pgTruthy are the texts $convert to bool reads as true, as on SQLite.
const pgTruthy = `('true', '1', 'yes', 'y', 't', 'on')`

// cond compiles an operand where a condition is expected, to a boolean
// that is NULL only where SQLite's would be.
func (p postgresExpr) cond(op trace.Operand) (sqlFrag, error) {
	switch x := op.(type) {
	case trace.AndOp:
		return condList(p, x.Operands, " AND ", "TRUE")
	case trace.OrOp:
		return condList(p, x.Operands, " OR ", "FALSE")
	case trace.NotOp:
		in, err := p.cond(x.Operand)
		if err != nil {
			return sqlFrag{}, err
		}
		return wrapSQL("(NOT COALESCE(", in, ", FALSE))"), nil
	case trace.CompareOp:
		return p.compare(x)
	case trace.InOp:
		return p.in(x)
	case trace.ContainsOp:
		in, err := p.value(x.Input)
		if err != nil {
			return sqlFrag{}, err
		}
		sub, err := p.value(x.Substr)
		if err != nil {
			return sqlFrag{}, err
		}
		if x.CaseInsensitive {
			return joinSQL("", rawSQL("(strpos(lower("), pgAsText(in), rawSQL("), lower("), pgAsText(sub), rawSQL(")) > 0)")), nil
		}
		return joinSQL("", rawSQL("(strpos("), pgAsText(in), rawSQL(", "), pgAsText(sub), rawSQL(") > 0)")), nil
	case trace.Literal, trace.GetField, trace.Convert:
		v, err := p.value(op)
		if err != nil {
			return sqlFrag{}, err
		}
		return pgTruth(v), nil
	}
	return sqlFrag{}, fmt.Errorf("unknown query operand %T", op)
}

// value compiles an operand where a value is expected.
func (p postgresExpr) value(op trace.Operand) (pgValue, error) {
	switch x := op.(type) {
	case trace.Literal:
		return pgLiteral(x.Value)
	case trace.GetField:
		return p.field(x)
	case trace.Convert:
		return p.convert(x)
	}
	f, err := p.cond(op)
	return pgValue{sqlFrag: f, kind: pgBool}, err
}

// field compiles a $getField.
func (p postgresExpr) field(f trace.GetField) (pgValue, error) {
	col, ok := columnSQL(f.Column)
	if !ok {
		return pgValue{}, fmt.Errorf("unknown call field %q", f.Column)
	}
	if !trace.IsJSONField(f.Column) {
		if len(f.Path) > 0 {
			return pgValue{}, fmt.Errorf("call field %q has no keys", f.Column)
		}
		return pgValue{sqlFrag: rawSQL(col), kind: pgText}, nil
	}
	return pgValue{sqlFrag: wrapSQL("NULLIF(", pgJSONAt(col, f.Path), ", CAST('null' AS jsonb))"), kind: pgJSON}, nil
}

func (p postgresExpr) convert(x trace.Convert) (pgValue, error) {
	if x.To == trace.ToExists {
		// A JSON null exists, as json_type() says on SQLite.
		if f, ok := x.Input.(trace.GetField); ok && trace.IsJSONField(f.Column) {
			col, _ := columnSQL(f.Column)
			return pgValue{sqlFrag: wrapSQL("(", pgJSONAt(col, f.Path), " IS NOT NULL)"), kind: pgBool}, nil
		}
	}
	in, err := p.value(x.Input)
	if err != nil {
		return pgValue{}, err
	}
	switch x.To {
	case trace.ToDouble:
		return pgValue{sqlFrag: wrapSQL("to_jsonb(", pgNumber(in), ")"), kind: pgJSON}, nil
	case trace.ToInt:
		return pgValue{sqlFrag: wrapSQL("to_jsonb(trunc(", pgNumber(in), "))"), kind: pgJSON}, nil
	case trace.ToString:
		return pgValue{sqlFrag: pgAsText(in), kind: pgText}, nil
	case trace.ToExists:
		return pgValue{sqlFrag: wrapSQL("(", in.sqlFrag, " IS NOT NULL)"), kind: pgBool}, nil
	case trace.ToBool:
		// Numbers are true when non-zero, text when it reads as true.
		switch in.kind {
		case pgBool:
			return in, nil
		case pgText:
			return pgValue{sqlFrag: wrapSQL("(lower(", in.sqlFrag, ") IN "+pgTruthy+")"), kind: pgBool}, nil
		}
		v := in.sqlFrag
		return pgValue{sqlFrag: joinSQL("",
			rawSQL("(CASE WHEN jsonb_typeof("), v, rawSQL(") = 'number' THEN CAST("), v, rawSQL(" AS numeric) <> 0"),
			rawSQL(" WHEN jsonb_typeof("), v, rawSQL(") = 'boolean' THEN "), v, rawSQL(" = CAST('true' AS jsonb)"),
			rawSQL(" ELSE lower("), v, rawSQL(" #>> '{}') IN "+pgTruthy+" END)")), kind: pgBool}, nil
	}
	return pgValue{}, fmt.Errorf("unknown $convert target %q", x.To)
}

func (p postgresExpr) compare(x trace.CompareOp) (sqlFrag, error) {
	left, right := timeLiteral(x.Left, x.Right), timeLiteral(x.Right, x.Left)
	if other, ok := nullTested(x.Op, left, right); ok {
		v, err := p.value(other)
		if err != nil {
			return sqlFrag{}, err
		}
		return wrapSQL("(", v.sqlFrag, " IS NULL)"), nil
	}
	op, err := comparisonSQL(x.Op)
	if err != nil {
		return sqlFrag{}, err
	}
	l, err := p.value(left)
	if err != nil {
		return sqlFrag{}, err
	}
	r, err := p.value(right)
	if err != nil {
		return sqlFrag{}, err
	}
	if l.kind == pgText && r.kind == pgText {
		return pgTextCompare(l.sqlFrag, op, r.sqlFrag), nil
	}
	if x.Op != trace.OpEq {
		// Ordering compares like types only, as on SQLite (see
		// sqliteExpr.compare): a value with a string literal as text, with
		// a number literal as a number.
		if g, ok := pgGuard(right, left); ok {
			return pgGuarded(g, l, op, r, false), nil
		}
		if g, ok := pgGuard(left, right); ok {
			return pgGuarded(g, r, op, l, true), nil
		}
	}
	return wrapSQL("(", joinSQL(op, pgAsJSON(l), pgAsJSON(r)), ")"), nil
}

func (p postgresExpr) in(x trace.InOp) (sqlFrag, error) {
	if len(x.Values) == 0 {
		return rawSQL("FALSE"), nil
	}
	l, err := p.value(x.Left)
	if err != nil {
		return sqlFrag{}, err
	}
	vals := make([]pgValue, len(x.Values))
	allText := l.kind == pgText
	for i, v := range x.Values {
		if vals[i], err = p.value(timeLiteral(v, x.Left)); err != nil {
			return sqlFrag{}, err
		}
		allText = allText && vals[i].kind == pgText
	}
	fs := make([]sqlFrag, len(vals))
	left := pgAsJSON(l)
	if allText {
		left = l.sqlFrag
	}
	for i, v := range vals {
		if allText {
			fs[i] = v.sqlFrag
		} else {
			fs[i] = pgAsJSON(v)
		}
	}
	return joinSQL("", rawSQL("("), left, rawSQL(" IN ("), joinSQL(", ", fs...), rawSQL("))")), nil
}

// orderKey is the ORDER BY term of one sort_by field on PostgreSQL,
// ordering as SQLite does: NULLs first, then numbers (booleans among them,
// as 0 and 1), then text, bytewise.
func (p postgresExpr) orderKey(field trace.GetField, desc bool) (sqlFrag, error) {
	v, err := p.field(field)
	if err != nil {
		return sqlFrag{}, err
	}
	if v.kind == pgText && pgNotNull(field.Column) {
		// No NULLS clause, which would keep an index from giving the
		// order (the evaluation runs listing reads calls_op backward).
		if desc {
			return wrapSQL("", v.sqlFrag, " DESC"), nil
		}
		return wrapSQL("", v.sqlFrag, " ASC"), nil
	}
	dir := " ASC NULLS FIRST"
	if desc {
		dir = " DESC NULLS LAST"
	}
	if v.kind == pgText {
		return wrapSQL("", v.sqlFrag, dir), nil
	}
	x := v.sqlFrag
	rank := joinSQL("", rawSQL("(CASE WHEN "), x, rawSQL(" IS NULL THEN 0 WHEN jsonb_typeof("), x,
		rawSQL(") IN ('number', 'boolean') THEN 1 ELSE 2 END)"+dir))
	num := joinSQL("", rawSQL("(CASE WHEN jsonb_typeof("), x, rawSQL(") = 'number' THEN CAST("), x,
		rawSQL(" AS numeric) WHEN jsonb_typeof("), x, rawSQL(") = 'boolean' THEN CASE WHEN "), x,
		rawSQL(" = CAST('true' AS jsonb) THEN 1 ELSE 0 END END)"+dir))
	text := joinSQL("", rawSQL("(CASE WHEN jsonb_typeof("), x, rawSQL(") = 'string' THEN "), x,
		rawSQL(` #>> '{}' ELSE CAST(`), x, rawSQL(` AS text) END) COLLATE "C"`+dir))
	return joinSQL(", ", rank, num, text), nil
}

// refsCond matches calls whose JSON document col holds one of refs as a
// string value anywhere in it: the jsonpath walks every value at every
// depth (keys are not values), and == matches any element of $refs. No
// index serves it; it filters the calls the other conditions select.
func (p postgresExpr) refsCond(col string, refs []string) sqlFrag {
	// Marshalling a map of strings cannot fail.
	vars, _ := json.Marshal(map[string][]string{"refs": refs})
	return sqlFrag{
		sql:  "jsonb_path_exists(CAST(" + col + " AS jsonb), '$.** ? (@ == $refs[*])', CAST(? AS jsonb))",
		args: []any{string(vars)},
	}
}

// pgTruth is a value taken as a condition: true unless it is null, 0,
// false or the empty string, as on SQLite.
func pgTruth(v pgValue) sqlFrag {
	switch v.kind {
	case pgText:
		return wrapSQL("(COALESCE(", v.sqlFrag, ", '') <> '')")
	case pgBool:
		return wrapSQL("COALESCE(", v.sqlFrag, ", FALSE)")
	}
	return wrapSQL("COALESCE(", v.sqlFrag,
		" NOT IN (CAST('0' AS jsonb), CAST('false' AS jsonb), CAST('\"\"' AS jsonb)), FALSE)")
}

func pgLiteral(v any) (pgValue, error) {
	switch x := v.(type) {
	case nil:
		return pgValue{sqlFrag: rawSQL("CAST(NULL AS jsonb)"), kind: pgJSON}, nil
	case string:
		return pgValue{sqlFrag: sqlFrag{sql: "CAST(? AS text)", args: []any{x}}, kind: pgText}, nil
	case json.RawMessage:
		return pgValue{sqlFrag: sqlFrag{sql: "CAST(? AS jsonb)", args: []any{string(x)}}, kind: pgJSON}, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return pgValue{}, fmt.Errorf("literal %v: %w", v, err)
	}
	return pgValue{sqlFrag: sqlFrag{sql: "CAST(? AS jsonb)", args: []any{string(b)}}, kind: pgJSON}, nil
}

// pgJSONAt is the jsonb value at path in the JSON text column col, SQL
// NULL when it is missing (a JSON null stays a JSON null).
func pgJSONAt(col string, path []string) sqlFrag {
	doc := "CAST(" + col + " AS jsonb)"
	if len(path) == 0 {
		return rawSQL(doc)
	}
	return sqlFrag{sql: "(" + doc + " #> CAST(? AS text[]))", args: []any{path}}
}

// pgAsJSON is v as jsonb.
func pgAsJSON(v pgValue) sqlFrag {
	if v.kind == pgJSON {
		return v.sqlFrag
	}
	return wrapSQL("to_jsonb(", v.sqlFrag, ")")
}

// pgAsText is v as text: a JSON string unquoted, anything else in its
// JSON form.
func pgAsText(v pgValue) sqlFrag {
	switch v.kind {
	case pgText:
		return v.sqlFrag
	case pgBool:
		return wrapSQL("CAST(", v.sqlFrag, " AS text)")
	}
	return wrapSQL("(", v.sqlFrag, " #>> '{}')")
}

// pgNumber is v as numeric, read as SQLite's CAST reads it: booleans are
// 0 and 1, a text its leading number or 0, an object or array 0.
func pgNumber(v pgValue) sqlFrag {
	switch v.kind {
	case pgBool:
		return wrapSQL("CAST(CAST(", v.sqlFrag, " AS integer) AS numeric)")
	case pgText:
		return joinSQL("", rawSQL("(CASE WHEN "), v.sqlFrag, rawSQL(" IS NULL THEN NULL ELSE COALESCE(CAST(substring("),
			v.sqlFrag, rawSQL(" from "+pgNumberPrefix+") AS numeric), 0) END)"))
	}
	x := v.sqlFrag
	return joinSQL("",
		rawSQL("(CASE WHEN "), x, rawSQL(" IS NULL THEN NULL"),
		rawSQL(" WHEN jsonb_typeof("), x, rawSQL(") = 'number' THEN CAST("), x, rawSQL(" AS numeric)"),
		rawSQL(" WHEN jsonb_typeof("), x, rawSQL(") = 'boolean' THEN CASE WHEN "), x, rawSQL(" = CAST('true' AS jsonb) THEN 1 ELSE 0 END"),
		rawSQL(" WHEN jsonb_typeof("), x, rawSQL(") = 'string' THEN COALESCE(CAST(substring("), x,
		rawSQL(" #>> '{}' from "+pgNumberPrefix+") AS numeric), 0)"),
		rawSQL(" ELSE 0 END)"))
}

// pgTextCompare compares two texts bytewise, as SQLite's BINARY collation
// does; the columns' collation is "C" already, so their indexes serve.
func pgTextCompare(l sqlFrag, op string, r sqlFrag) sqlFrag {
	return joinSQL("", rawSQL("("), l, rawSQL(op), r, rawSQL(` COLLATE "C")`))
}

// pgGuard returns the jsonb type of lit when it is a number or string
// literal compared with a value that is not a literal.
func pgGuard(lit, other trace.Operand) (string, bool) {
	if isLiteral(other) {
		return "", false
	}
	l, ok := lit.(trace.Literal)
	if !ok {
		return "", false
	}
	switch l.Value.(type) {
	case int64, float64:
		return "number", true
	case string:
		return "string", true
	}
	return "", false
}

// pgGuarded compares v with the literal lit (v op lit, or lit op v when
// flipped) where v is of the literal's jsonb type, and is false elsewhere.
func pgGuarded(typ string, v pgValue, op string, lit pgValue, flipped bool) sqlFrag {
	j := pgAsJSON(v)
	var cmp sqlFrag
	switch {
	case typ == "string" && flipped:
		cmp = pgTextCompare(lit.sqlFrag, op, wrapSQL("(", j, " #>> '{}')"))
	case typ == "string":
		cmp = pgTextCompare(wrapSQL("(", j, " #>> '{}')"), op, lit.sqlFrag)
	case flipped:
		cmp = wrapSQL("(", joinSQL(op, pgAsJSON(lit), j), ")")
	default:
		cmp = wrapSQL("(", joinSQL(op, j, pgAsJSON(lit)), ")")
	}
	return joinSQL("", rawSQL("(jsonb_typeof("), j, rawSQL(") = '"+typ+"' AND "), cmp, rawSQL(")"))
}

// pgNotNull reports whether the calls column name is NOT NULL.
func pgNotNull(name string) bool {
	switch name {
	case "id", "op_name", "trace_id", "started_at":
		return true
	}
	return false
}
