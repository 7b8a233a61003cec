package admin

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"github.com/tollgate-dev/tollgate/trace"
)

const operatorsList = "$and, $or, $not, $eq, $gt, $gte, $lt, $lte, $in, $contains"

// parseFilter validates a CallsFilter; null gives nil.
func parseFilter(v *validation, raw any, loc []any) *trace.CallsFilter {
	if raw == nil {
		return nil
	}
	obj, ok := v.object(raw, loc, "CallsFilter")
	if !ok {
		return nil
	}
	v.strict(obj, loc, "op_names", "input_refs", "output_refs", "parent_ids", "trace_ids", "call_ids",
		"thread_ids", "turn_ids", "trace_roots_only", "svc_user_ids", "svc_run_ids", "wb_user_ids", "wb_run_ids")
	f := &trace.CallsFilter{
		OpNames:        v.optStringList(obj, "op_names", loc),
		InputRefs:      v.optStringList(obj, "input_refs", loc),
		OutputRefs:     v.optStringList(obj, "output_refs", loc),
		ParentIDs:      v.optStringList(obj, "parent_ids", loc),
		TraceIDs:       v.optStringList(obj, "trace_ids", loc),
		CallIDs:        v.optStringList(obj, "call_ids", loc),
		ThreadIDs:      v.optStringList(obj, "thread_ids", loc),
		TurnIDs:        v.optStringList(obj, "turn_ids", loc),
		TraceRootsOnly: v.optBool(obj, "trace_roots_only", loc, false),
		// Weave's names for the svc_* lists; both sets are alternatives.
		SvcUserIDs: append(v.optStringList(obj, "svc_user_ids", loc), v.optStringList(obj, "wb_user_ids", loc)...),
		SvcRunIDs:  append(v.optStringList(obj, "svc_run_ids", loc), v.optStringList(obj, "wb_run_ids", loc)...),
	}
	// Each value is an SQL parameter: the lists together are bounded too.
	n := 0
	for _, l := range [...][]string{f.OpNames, f.InputRefs, f.OutputRefs, f.ParentIDs, f.TraceIDs, f.CallIDs,
		f.ThreadIDs, f.TurnIDs, f.SvcUserIDs, f.SvcRunIDs} {
		n += len(l)
	}
	if n > maxFilterValues {
		v.addCtx(loc, "value_error", "Value error, the filter's lists hold "+strconv.Itoa(n)+" values together, more than "+
			strconv.Itoa(maxFilterValues), nil, map[string]any{"max_values": maxFilterValues})
		return nil
	}
	return f
}

// parseQuery validates a query object; null gives nil. Its $expr must be
// an operation, not a bare value, as in Weave.
func parseQuery(v *validation, raw any, loc []any) *trace.Query {
	if raw == nil {
		return nil
	}
	obj, ok := v.object(raw, loc, "Query")
	if !ok {
		return nil
	}
	v.strict(obj, loc, "$expr")
	expr, ok := obj["$expr"]
	if !ok {
		v.add(at(loc, "$expr"), "missing", "Field required", obj)
		return nil
	}
	if !boundQuery(v, expr, at(loc, "$expr")) {
		return nil
	}
	op := parseOperand(v, expr, at(loc, "$expr"))
	if op == nil {
		return nil
	}
	switch op.(type) {
	case trace.Literal, trace.GetField, trace.Convert:
		v.add(at(loc, "$expr"), "value_error", "Value error, $expr must be an operation, one of "+operatorsList, expr)
		return nil
	}
	return &trace.Query{Expr: op}
}

// parseOperand validates one operand: an object with exactly one operator
// key. It returns nil after reporting an error.
func parseOperand(v *validation, raw any, loc []any) trace.Operand {
	obj, ok := raw.(map[string]any)
	if !ok {
		v.add(loc, "dict_type", "Input should be a valid dictionary", raw)
		return nil
	}
	var key string
	known := 0
	for k := range obj {
		if isOperandKey(k) {
			key = k
			known++
		}
	}
	if known != 1 {
		v.add(loc, "value_error",
			"Value error, an operand must have exactly one key: $literal, $getField, $convert, "+operatorsList, raw)
		return nil
	}
	n := len(v.errs)
	v.strict(obj, loc, key)
	if len(v.errs) > n {
		return nil
	}
	arg, loc := obj[key], at(loc, key)
	switch key {
	case "$literal":
		return parseLiteral(arg)
	case "$getField":
		s, ok := v.str(arg, loc)
		if !ok {
			return nil
		}
		f, ok := parseFieldPath(v, s, loc)
		if !ok {
			return nil
		}
		return f
	case "$convert":
		return parseConvert(v, arg, loc)
	case "$and", "$or":
		list, ok := arg.([]any)
		if !ok {
			v.add(loc, "list_type", "Input should be a valid list", arg)
			return nil
		}
		ops := make([]trace.Operand, 0, len(list))
		for i, item := range list {
			ops = append(ops, parseOperand(v, item, at(loc, i)))
		}
		if len(v.errs) > n {
			return nil
		}
		if key == "$and" {
			return trace.AndOp{Operands: ops}
		}
		return trace.OrOp{Operands: ops}
	case "$not":
		items, ok := tuple(v, arg, loc, 1)
		if !ok {
			return nil
		}
		x := parseOperand(v, items[0], at(loc, 0))
		if x == nil {
			return nil
		}
		return trace.NotOp{Operand: x}
	case "$eq", "$gt", "$gte", "$lt", "$lte":
		items, ok := tuple(v, arg, loc, 2)
		if !ok {
			return nil
		}
		l, r := parseOperand(v, items[0], at(loc, 0)), parseOperand(v, items[1], at(loc, 1))
		if l == nil || r == nil {
			return nil
		}
		return trace.CompareOp{Op: trace.Comparison(key), Left: l, Right: r}
	case "$in":
		items, ok := tuple(v, arg, loc, 2)
		if !ok {
			return nil
		}
		l := parseOperand(v, items[0], at(loc, 0))
		list, ok := items[1].([]any)
		if !ok {
			v.add(at(loc, 1), "list_type", "Input should be a valid list", items[1])
			return nil
		}
		values := make([]trace.Operand, 0, len(list))
		for i, item := range list {
			values = append(values, parseOperand(v, item, at(loc, 1, i)))
		}
		if l == nil || len(v.errs) > n {
			return nil
		}
		return trace.InOp{Left: l, Values: values}
	case "$contains":
		return parseContains(v, arg, loc)
	}
	return nil
}

func isOperandKey(k string) bool {
	switch k {
	case "$literal", "$getField", "$convert", "$and", "$or", "$not",
		"$eq", "$gt", "$gte", "$lt", "$lte", "$in", "$contains":
		return true
	}
	return false
}

// tuple checks that raw is a list of exactly n items, reporting pydantic's
// tuple errors otherwise.
func tuple(v *validation, raw any, loc []any, n int) ([]any, bool) {
	list, ok := raw.([]any)
	if !ok {
		v.add(loc, "list_type", "Input should be a valid list", raw)
		return nil, false
	}
	if len(list) < n {
		for i := len(list); i < n; i++ {
			v.add(at(loc, i), "missing", "Field required", raw)
		}
		return nil, false
	}
	if len(list) > n {
		v.addCtx(loc, "too_long",
			"Tuple should have at most "+strconv.Itoa(n)+" item"+plural(n)+" after validation, not "+strconv.Itoa(len(list)),
			raw, map[string]any{"field_type": "Tuple", "max_length": n, "actual_length": len(list)})
		return nil, false
	}
	return list, true
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func parseLiteral(raw any) trace.Literal {
	switch x := raw.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return trace.Literal{Value: i}
		}
		f, err := x.Float64()
		if err != nil || math.IsInf(f, 0) {
			// An integer beyond int64: keep its digits, compared as text.
			return trace.Literal{Value: x.String()}
		}
		return trace.Literal{Value: f}
	case map[string]any, []any:
		return trace.Literal{Value: mustJSON(x)}
	}
	// nil, bool, string.
	return trace.Literal{Value: raw}
}

func parseConvert(v *validation, raw any, loc []any) trace.Operand {
	obj, ok := v.object(raw, loc, "ConvertSpec")
	if !ok {
		return nil
	}
	n := len(v.errs)
	v.strict(obj, loc, "input", "to")
	var in trace.Operand
	if x, ok := obj["input"]; ok {
		in = parseOperand(v, x, at(loc, "input"))
	} else {
		v.add(at(loc, "input"), "missing", "Field required", obj)
	}
	to, ok := obj["to"]
	if !ok {
		v.add(at(loc, "to"), "missing", "Field required", obj)
		return nil
	}
	t, _ := to.(string)
	switch trace.ConvertTo(t) {
	case trace.ToDouble, trace.ToString, trace.ToInt, trace.ToBool, trace.ToExists:
	default:
		v.addCtx(at(loc, "to"), "literal_error", "Input should be 'double', 'string', 'int', 'bool' or 'exists'", to,
			map[string]any{"expected": "'double', 'string', 'int', 'bool' or 'exists'"})
		return nil
	}
	if in == nil || len(v.errs) > n {
		return nil
	}
	return trace.Convert{Input: in, To: trace.ConvertTo(t)}
}

func parseContains(v *validation, raw any, loc []any) trace.Operand {
	obj, ok := v.object(raw, loc, "ContainsSpec")
	if !ok {
		return nil
	}
	n := len(v.errs)
	v.strict(obj, loc, "input", "substr", "case_insensitive")
	var in, sub trace.Operand
	if x, ok := obj["input"]; ok {
		in = parseOperand(v, x, at(loc, "input"))
	} else {
		v.add(at(loc, "input"), "missing", "Field required", obj)
	}
	if x, ok := obj["substr"]; ok {
		sub = parseOperand(v, x, at(loc, "substr"))
	} else {
		v.add(at(loc, "substr"), "missing", "Field required", obj)
	}
	ci := v.optBool(obj, "case_insensitive", loc, false)
	if in == nil || sub == nil || len(v.errs) > n {
		return nil
	}
	return trace.ContainsOp{Input: in, Substr: sub, CaseInsensitive: ci}
}

// parseFieldPath resolves a $getField path. Segments are separated by dots;
// "\." is a literal dot and "\\" a backslash. Because model names often
// hold dots ("gpt-4.1"), summary.usage.<model>.<count> without escapes takes
// everything between "usage" and the last segment as the model name.
func parseFieldPath(v *validation, path string, loc []any) (trace.GetField, bool) {
	segs, escaped, ok := splitPath(path)
	if !ok {
		v.add(loc, "value_error", "Value error, malformed field path "+strconv.Quote(path), path)
		return trace.GetField{}, false
	}
	col := segs[0]
	if !trace.IsCallField(col) || (len(segs) > 1 && !trace.IsJSONField(col)) {
		v.add(loc, "value_error", "Value error, unknown call field "+strconv.Quote(path), path)
		return trace.GetField{}, false
	}
	rest := segs[1:]
	if col == "summary" && !escaped && len(rest) >= 4 && rest[0] == "usage" {
		rest = []string{"usage", strings.Join(rest[1:len(rest)-1], "."), rest[len(rest)-1]}
	}
	if len(rest) == 0 {
		rest = nil
	}
	return trace.GetField{Column: col, Path: rest}, true
}

func splitPath(path string) (segs []string, escaped, ok bool) {
	var cur strings.Builder
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '\\' && i+1 < len(path) && (path[i+1] == '.' || path[i+1] == '\\'):
			cur.WriteByte(path[i+1])
			escaped = true
			i++
		case c == '.':
			if cur.Len() == 0 {
				return nil, false, false
			}
			segs = append(segs, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	if cur.Len() == 0 {
		return nil, false, false
	}
	return append(segs, cur.String()), escaped, true
}

// parseSortBy validates a sort_by list of {"field", "direction"}.
func parseSortBy(v *validation, raw any, loc []any) []trace.SortBy {
	var out []trace.SortBy
	sortItems(v, raw, loc, maxSortFields, func(iloc []any, field string, desc, dirOK bool) {
		if !dirOK {
			return
		}
		if f, ok := parseFieldPath(v, field, at(iloc, "field")); ok {
			out = append(out, trace.SortBy{Field: f, Desc: desc})
		}
	})
	return out
}

// sortItems validates a sort_by list of {"field", "direction"} of at most
// limit items (zero: no bound) and calls each with every item whose field
// is a string; dirOK says whether its direction is valid too, "asc" or
// "desc" (desc is then whether it is "desc"). each checks the field as its
// query names fields.
func sortItems(v *validation, raw any, loc []any, limit int, each func(iloc []any, field string, desc, dirOK bool)) {
	if raw == nil {
		return
	}
	list, ok := raw.([]any)
	if !ok {
		v.add(loc, "list_type", "Input should be a valid list", raw)
		return
	}
	if limit > 0 && len(list) > limit {
		v.tooLongList(loc, len(list), limit)
		return
	}
	for i, item := range list {
		iloc := at(loc, i)
		obj, ok := v.object(item, iloc, "SortBy")
		if !ok {
			continue
		}
		field, fok := v.reqString(obj, "field", iloc)
		dir, dok := v.reqString(obj, "direction", iloc)
		if dok && dir != "asc" && dir != "desc" {
			v.addCtx(at(iloc, "direction"), "literal_error", "Input should be 'asc' or 'desc'", dir,
				map[string]any{"expected": "'asc' or 'desc'"})
			dok = false
		}
		if fok {
			each(iloc, field, dir == "desc", dok)
		}
	}
}
