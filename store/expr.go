package store

import (
	"fmt"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/trace"
)

// The $expr query language and the filter of a calls request compile to
// SQL through one exprCompiler per engine, chosen once when the store
// opens: sqliteExpr (expr_sqlite.go) and postgresExpr (expr_postgres.go),
// whose methods bear the same names. What does not depend on the engine
// (the filter's membership tests, the call columns, timestamps, the
// structure of $and and $or, the comparison operators, the order's tie
// break) is here, once.
//
// The engines agree on every query but one edge: SQLite reads a JSON
// boolean as 0 or 1, so there true also equals 1 (and false 0);
// PostgreSQL's jsonb keeps them apart.
type exprCompiler interface {
	// cond compiles an operand where a condition is expected.
	cond(op trace.Operand) (sqlFrag, error)
	// orderKey is the ORDER BY term of one sort_by field.
	orderKey(field trace.GetField, desc bool) (sqlFrag, error)
	// refsCond matches calls whose JSON document col holds one of refs as
	// a string value anywhere in it.
	refsCond(col string, refs []string) sqlFrag
}

// exprCompilerFor returns the compiler of engine d.
func exprCompilerFor(d dialect) exprCompiler {
	if d == dialectPostgres {
		return postgresExpr{}
	}
	return sqliteExpr{}
}

// whereCalls compiles the project scope, the filter and the query into one
// WHERE condition over the calls table aliased c.
func whereCalls(x exprCompiler, projectID int64, filter *trace.CallsFilter, query *trace.Query) (sqlFrag, error) {
	conds := []sqlFrag{{sql: "c.project_id = ?", args: []any{projectID}}}
	if filter != nil {
		conds = append(conds, filterConds(x, filter)...)
	}
	if query != nil && query.Expr != nil {
		f, err := x.cond(query.Expr)
		if err != nil {
			return sqlFrag{}, err
		}
		conds = append(conds, f)
	}
	return joinSQL(" AND ", conds...), nil
}

// filterConds compiles a CallsFilter; empty lists set no condition.
func filterConds(x exprCompiler, f *trace.CallsFilter) []sqlFrag {
	var conds []sqlFrag
	if len(f.OpNames) > 0 {
		conds = append(conds, opNamesCond(f.OpNames))
	}
	if len(f.InputRefs) > 0 {
		conds = append(conds, x.refsCond("c.inputs", f.InputRefs))
	}
	if len(f.OutputRefs) > 0 {
		conds = append(conds, x.refsCond("c.output", f.OutputRefs))
	}
	for _, m := range []struct {
		col  string
		vals []string
	}{
		{"c.parent_id", f.ParentIDs},
		{"c.trace_id", f.TraceIDs},
		{"c.id", f.CallIDs},
		{"c.thread_id", f.ThreadIDs},
		{"c.turn_id", f.TurnIDs},
		{"c.svc_user_id", f.SvcUserIDs},
		{"c.svc_run_id", f.SvcRunIDs},
	} {
		if len(m.vals) > 0 {
			conds = append(conds, inStrings(m.col, m.vals))
		}
	}
	if f.TraceRootsOnly {
		conds = append(conds, rawSQL("c.parent_id IS NULL"))
	}
	return conds
}

// opNamesCond matches op names exactly, and "name:*" as name itself or any
// "name:<version>" (Weave's ref to every version of an op). A version is
// selected as the byte range ["name:", "name;"): both engines compare
// op_name bytewise (SQLite's BINARY, PostgreSQL's "C" collation), so the
// range holds exactly the names that start with "name:", whatever their
// characters, no character of the name is a pattern, and the range can use
// the op_name index.
func opNamesCond(names []string) sqlFrag {
	var exact []string
	var alts []sqlFrag
	for _, n := range names {
		if prefix, ok := strings.CutSuffix(n, ":*"); ok {
			exact = append(exact, prefix)
			alts = append(alts, sqlFrag{sql: "(c.op_name >= ? AND c.op_name < ?)", args: []any{prefix + ":", prefix + ";"}})
			continue
		}
		exact = append(exact, n)
	}
	return wrapSQL("(", joinSQL(" OR ", append([]sqlFrag{inStrings("c.op_name", exact)}, alts...)...), ")")
}

// columnSQL maps a call field to its column. The list is closed: only these
// names ever reach the SQL text.
func columnSQL(name string) (string, bool) {
	switch name {
	case "id", "op_name", "display_name", "trace_id", "parent_id", "thread_id", "turn_id",
		"started_at", "ended_at", "exception", "svc_user_id", "svc_run_id",
		"attributes", "inputs", "output", "summary":
		return "c." + name, true
	case "wb_user_id":
		return "c.svc_user_id", true
	case "wb_run_id":
		return "c.svc_run_id", true
	}
	return "", false
}

// nullTested returns, for an $eq with a null literal on one side, the
// operand on the other, which the comparison tests for null (a missing
// field included).
func nullTested(op trace.Comparison, left, right trace.Operand) (trace.Operand, bool) {
	switch {
	case op != trace.OpEq:
		return nil, false
	case isNull(left):
		return right, true
	case isNull(right):
		return left, true
	}
	return nil, false
}

// comparisonSQL is the SQL operator of a comparison, with spaces around.
func comparisonSQL(op trace.Comparison) (string, error) {
	switch op {
	case trace.OpEq:
		return " = ", nil
	case trace.OpGt:
		return " > ", nil
	case trace.OpGte:
		return " >= ", nil
	case trace.OpLt:
		return " < ", nil
	case trace.OpLte:
		return " <= ", nil
	}
	return "", fmt.Errorf("unknown comparison %q", op)
}

func isNull(op trace.Operand) bool {
	l, ok := op.(trace.Literal)
	return ok && l.Value == nil
}

func isLiteral(op trace.Operand) bool {
	_, ok := op.(trace.Literal)
	return ok
}

// timeLiteral rewrites a literal compared with started_at or ended_at into
// the stored timestamp form, so that "2026-11-21T10:00:00Z" and Unix
// seconds compare as times rather than as text. Anything else is returned
// as is.
func timeLiteral(op, other trace.Operand) trace.Operand {
	f, ok := other.(trace.GetField)
	if !ok || (f.Column != "started_at" && f.Column != "ended_at") {
		return op
	}
	l, ok := op.(trace.Literal)
	if !ok {
		return op
	}
	switch v := l.Value.(type) {
	case string:
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02"} {
			if t, err := time.Parse(layout, v); err == nil {
				return trace.Literal{Value: formatTraceTime(t)}
			}
		}
	case int64:
		return trace.Literal{Value: formatTraceTime(time.Unix(v, 0))}
	case float64:
		sec := int64(v)
		return trace.Literal{Value: formatTraceTime(time.Unix(sec, int64((v-float64(sec))*1e9)))}
	}
	return op
}

// orderCalls compiles sort_by; the call id breaks ties so that pages are
// stable.
func orderCalls(x exprCompiler, sortBy []trace.SortBy) (sqlFrag, error) {
	if len(sortBy) == 0 {
		return rawSQL("c.started_at ASC, c.id ASC"), nil
	}
	fs := make([]sqlFrag, 0, len(sortBy)+1)
	byID := false
	for _, s := range sortBy {
		f, err := x.orderKey(s.Field, s.Desc)
		if err != nil {
			return sqlFrag{}, err
		}
		fs = append(fs, f)
		byID = byID || (s.Field.Column == "id")
	}
	if !byID {
		fs = append(fs, rawSQL("c.id ASC"))
	}
	return joinSQL(", ", fs...), nil
}

// condList compiles the operands of $and (sep " AND ") or $or (" OR "),
// each a condition; empty is the engine's truth value of an empty list.
func condList(x exprCompiler, ops []trace.Operand, sep, empty string) (sqlFrag, error) {
	if len(ops) == 0 {
		return rawSQL(empty), nil
	}
	fs := make([]sqlFrag, len(ops))
	for i, op := range ops {
		f, err := x.cond(op)
		if err != nil {
			return sqlFrag{}, err
		}
		fs[i] = f
	}
	return wrapSQL("(", joinSQL(sep, fs...), ")"), nil
}
