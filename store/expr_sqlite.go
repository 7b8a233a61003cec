package store

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tollgate-dev/tollgate/trace"
)

// sqliteExpr is the $expr compiler for SQLite, which leans on dynamic
// typing: json_extract gives SQL numbers, text or 0/1, and typeof() tells
// them apart.
type sqliteExpr struct{}

// cond compiles an operand where a condition is expected. A value
// there is true unless it is null, 0 or the empty string, so that a
// non-empty {"$literal": "x"} (the spec's example) is true.
func (s sqliteExpr) cond(op trace.Operand) (sqlFrag, error) {
	switch x := op.(type) {
	case trace.AndOp:
		return condList(s, x.Operands, " AND ", "1")
	case trace.OrOp:
		return condList(s, x.Operands, " OR ", "0")
	case trace.NotOp:
		in, err := s.cond(x.Operand)
		if err != nil {
			return sqlFrag{}, err
		}
		return wrapSQL("(NOT COALESCE(", in, ", 0))"), nil
	case trace.CompareOp:
		return s.compare(x)
	case trace.InOp:
		return s.in(x)
	case trace.ContainsOp:
		in, err := s.value(x.Input)
		if err != nil {
			return sqlFrag{}, err
		}
		sub, err := s.value(x.Substr)
		if err != nil {
			return sqlFrag{}, err
		}
		if x.CaseInsensitive {
			return joinSQL("", rawSQL("(instr(lower(CAST("), in, rawSQL(" AS TEXT)), lower(CAST("), sub, rawSQL(" AS TEXT))) > 0)")), nil
		}
		return joinSQL("", rawSQL("(instr(CAST("), in, rawSQL(" AS TEXT), CAST("), sub, rawSQL(" AS TEXT)) > 0)")), nil
	case trace.Literal, trace.GetField, trace.Convert:
		v, err := s.value(op)
		if err != nil {
			return sqlFrag{}, err
		}
		return wrapSQL("(COALESCE(", v, ", 0) NOT IN (0, ''))"), nil
	}
	return sqlFrag{}, fmt.Errorf("unknown query operand %T", op)
}

// value compiles an operand where a value is expected.
func (s sqliteExpr) value(op trace.Operand) (sqlFrag, error) {
	switch x := op.(type) {
	case trace.Literal:
		if x.Value == nil {
			return rawSQL("NULL"), nil
		}
		return sqlFrag{sql: "?", args: []any{sqliteLiteralArg(x.Value)}}, nil
	case trace.GetField:
		return s.field(x)
	case trace.Convert:
		return s.convert(x)
	}
	return s.cond(op)
}

// field compiles a $getField. A JSON column's value is read with
// json_extract, which gives SQL numbers, text and 0/1 for booleans, so
// comparisons with literals work without $convert.
func (s sqliteExpr) field(f trace.GetField) (sqlFrag, error) {
	col, ok := columnSQL(f.Column)
	if !ok {
		return sqlFrag{}, fmt.Errorf("unknown call field %q", f.Column)
	}
	if !trace.IsJSONField(f.Column) {
		if len(f.Path) > 0 {
			return sqlFrag{}, fmt.Errorf("call field %q has no keys", f.Column)
		}
		return rawSQL(col), nil
	}
	return sqlFrag{sql: "json_extract(" + col + ", ?)", args: []any{sqliteJSONPath(f.Path)}}, nil
}

func (s sqliteExpr) convert(x trace.Convert) (sqlFrag, error) {
	if x.To == trace.ToExists {
		if f, ok := x.Input.(trace.GetField); ok && trace.IsJSONField(f.Column) {
			col, _ := columnSQL(f.Column)
			return sqlFrag{sql: "(json_type(" + col + ", ?) IS NOT NULL)", args: []any{sqliteJSONPath(f.Path)}}, nil
		}
	}
	in, err := s.value(x.Input)
	if err != nil {
		return sqlFrag{}, err
	}
	switch x.To {
	case trace.ToDouble:
		return wrapSQL("CAST(", in, " AS REAL)"), nil
	case trace.ToInt:
		return wrapSQL("CAST(", in, " AS INTEGER)"), nil
	case trace.ToString:
		return wrapSQL("CAST(", in, " AS TEXT)"), nil
	case trace.ToExists:
		return wrapSQL("(", in, " IS NOT NULL)"), nil
	case trace.ToBool:
		// Numbers are true when non-zero, text when it reads as true.
		return joinSQL("", rawSQL("(CASE WHEN "), in, rawSQL(" IS NULL THEN NULL WHEN typeof("), in,
			rawSQL(") IN ('integer', 'real') THEN "), in, rawSQL(" != 0 ELSE lower("), in,
			rawSQL(") IN ('true', '1', 'yes', 'y', 't', 'on') END)")), nil
	}
	return sqlFrag{}, fmt.Errorf("unknown $convert target %q", x.To)
}

func (s sqliteExpr) compare(x trace.CompareOp) (sqlFrag, error) {
	left, right := timeLiteral(x.Left, x.Right), timeLiteral(x.Right, x.Left)
	if other, ok := nullTested(x.Op, left, right); ok {
		v, err := s.value(other)
		if err != nil {
			return sqlFrag{}, err
		}
		return wrapSQL("(", v, " IS NULL)"), nil
	}
	op, err := comparisonSQL(x.Op)
	if err != nil {
		return sqlFrag{}, err
	}
	l, err := s.value(left)
	if err != nil {
		return sqlFrag{}, err
	}
	r, err := s.value(right)
	if err != nil {
		return sqlFrag{}, err
	}
	cond := wrapSQL("(", joinSQL(op, l, r), ")")
	if x.Op == trace.OpEq {
		return cond, nil
	}
	// Ordering compares like types only, as Mongo's type bracketing does:
	// SQLite would otherwise rank any text above any number, so that
	// {"$gt": [field, 5]} matched every text value. $convert compares
	// across types.
	if g, ok := sqliteTypeGuard(right); ok && !isLiteral(left) {
		cond = joinSQL("", rawSQL("(typeof("), l, rawSQL(") "+g+" AND "), cond, rawSQL(")"))
	}
	if g, ok := sqliteTypeGuard(left); ok && !isLiteral(right) {
		cond = joinSQL("", rawSQL("(typeof("), r, rawSQL(") "+g+" AND "), cond, rawSQL(")"))
	}
	return cond, nil
}

func (s sqliteExpr) in(x trace.InOp) (sqlFrag, error) {
	if len(x.Values) == 0 {
		return rawSQL("0"), nil
	}
	l, err := s.value(x.Left)
	if err != nil {
		return sqlFrag{}, err
	}
	vals := make([]sqlFrag, len(x.Values))
	for i, v := range x.Values {
		if vals[i], err = s.value(timeLiteral(v, x.Left)); err != nil {
			return sqlFrag{}, err
		}
	}
	return joinSQL("", rawSQL("("), l, rawSQL(" IN ("), joinSQL(", ", vals...), rawSQL("))")), nil
}

// orderKey is the ORDER BY term of one sort_by field on SQLite.
func (s sqliteExpr) orderKey(field trace.GetField, desc bool) (sqlFrag, error) {
	f, err := s.field(field)
	if err != nil {
		return sqlFrag{}, err
	}
	if desc {
		return wrapSQL("", f, " DESC"), nil
	}
	return wrapSQL("", f, " ASC"), nil
}

// refsCond matches calls whose JSON document col holds one of refs as a
// string value anywhere in it. It is SQLite's; pgRefsCond is PostgreSQL's.
func (s sqliteExpr) refsCond(col string, refs []string) sqlFrag {
	in := inStrings("t.atom", refs)
	return sqlFrag{
		sql:  "EXISTS (SELECT 1 FROM json_tree(" + col + ") t WHERE t.type = 'text' AND " + in.sql + ")",
		args: in.args,
	}
}

// sqliteJSONPath renders keys as an SQLite JSON path with every label quoted, so
// that keys holding dots, dashes or slashes (model names) work.
func sqliteJSONPath(keys []string) string {
	var sb strings.Builder
	sb.WriteString("$")
	for _, k := range keys {
		sb.WriteString(`."`)
		sb.WriteString(strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k))
		sb.WriteString(`"`)
	}
	return sb.String()
}

func sqliteLiteralArg(v any) any {
	switch x := v.(type) {
	case bool:
		if x {
			return int64(1)
		}
		return int64(0)
	case json.RawMessage:
		return string(x)
	}
	return v
}

// sqliteTypeGuard returns the typeof() test matching a number or string literal.
func sqliteTypeGuard(op trace.Operand) (string, bool) {
	l, ok := op.(trace.Literal)
	if !ok {
		return "", false
	}
	switch l.Value.(type) {
	case int64, float64:
		return "IN ('integer', 'real')", true
	case string:
		return "= 'text'", true
	}
	return "", false
}
