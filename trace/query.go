package trace

// CallsFilter selects calls by membership, as Weave's CallsFilter does.
// Every set field narrows the selection (they are ANDed); within a list the
// values are alternatives. An empty list, like an absent one, sets no
// condition, because Weave tests the lists for truthiness.
type CallsFilter struct {
	// OpNames match op_name exactly; an entry ending in ":*" matches every
	// op_name with that prefix (Weave's "any version" op ref).
	OpNames []string
	// InputRefs and OutputRefs match calls whose inputs (output) hold one of
	// the refs as a JSON string value anywhere in the document, at any depth.
	InputRefs  []string
	OutputRefs []string
	ParentIDs  []string
	TraceIDs   []string
	CallIDs    []string
	ThreadIDs  []string
	TurnIDs    []string
	// TraceRootsOnly keeps only calls without a parent.
	TraceRootsOnly bool
	SvcUserIDs     []string
	SvcRunIDs      []string
}

// Query is the "query" field of a calls request: {"$expr": operation}.
type Query struct {
	Expr Operand
}

// Operand is a node of a query expression: an operation (which yields a
// boolean) or a value ($literal, $getField, $convert).
type Operand interface{ operand() }

// AndOp is {"$and": [...]}; an empty list is true.
type AndOp struct{ Operands []Operand }

// OrOp is {"$or": [...]}; an empty list is false.
type OrOp struct{ Operands []Operand }

// NotOp is {"$not": [x]}. A missing field makes the inner comparison
// unknown, and NOT of unknown is taken as true, so that
// {"$not":[{"$eq":[field, "x"]}]} also selects calls without the field.
type NotOp struct{ Operand Operand }

// Comparison names a binary comparison operator.
type Comparison string

// The comparison operators of the query language.
const (
	OpEq  Comparison = "$eq"
	OpGt  Comparison = "$gt"
	OpGte Comparison = "$gte"
	OpLt  Comparison = "$lt"
	OpLte Comparison = "$lte"
)

// CompareOp is {"$eq": [a, b]} and its ordering siblings. $eq with a null
// literal tests for null (a missing field included). The ordering operators
// compare a value with a number or string literal only when the value is of
// the same kind, as Mongo's type bracketing does; $convert compares across
// kinds. A literal compared with started_at or ended_at may be an RFC 3339
// string or Unix seconds.
type CompareOp struct {
	Op          Comparison
	Left, Right Operand
}

// InOp is {"$in": [a, [b, ...]]}.
type InOp struct {
	Left   Operand
	Values []Operand
}

// ContainsOp is {"$contains": {"input": a, "substr": b, "case_insensitive": bool}}:
// substring containment of the operands' text.
type ContainsOp struct {
	Input, Substr   Operand
	CaseInsensitive bool
}

// Literal is {"$literal": value}. Value is nil, bool, string, int64,
// float64, or json.RawMessage for an array or object (compared as its
// compact JSON text).
type Literal struct{ Value any }

// GetField is {"$getField": "dotted.path"} resolved against the call
// columns: Column is a call field (see IsCallField), Path the keys inside
// a JSON column (attributes, inputs, output, summary), empty for the column
// itself.
type GetField struct {
	Column string
	Path   []string
}

// ConvertTo names the target type of a $convert.
type ConvertTo string

// The targets of $convert.
const (
	ToDouble ConvertTo = "double"
	ToString ConvertTo = "string"
	ToInt    ConvertTo = "int"
	ToBool   ConvertTo = "bool"
	ToExists ConvertTo = "exists"
)

// Convert is {"$convert": {"input": a, "to": "double|string|int|bool|exists"}}.
type Convert struct {
	Input Operand
	To    ConvertTo
}

func (AndOp) operand()      {}
func (OrOp) operand()       {}
func (NotOp) operand()      {}
func (CompareOp) operand()  {}
func (InOp) operand()       {}
func (ContainsOp) operand() {}
func (Literal) operand()    {}
func (GetField) operand()   {}
func (Convert) operand()    {}

// SortBy orders a calls query by a field.
type SortBy struct {
	Field GetField
	Desc  bool
}

// CallsQuery is a calls selection with its order and page. Limit < 0 means
// no limit.
type CallsQuery struct {
	Filter *CallsFilter
	Query  *Query
	SortBy []SortBy
	Limit  int
	Offset int
}

// IsCallField reports whether name is a call field a query may read.
func IsCallField(name string) bool {
	switch name {
	case "id", "op_name", "display_name", "trace_id", "parent_id", "thread_id", "turn_id",
		"started_at", "ended_at", "exception", "svc_user_id", "svc_run_id", "wb_user_id", "wb_run_id":
		return true
	}
	return IsJSONField(name)
}

// IsJSONField reports whether name is a call field holding a JSON document.
func IsJSONField(name string) bool {
	switch name {
	case "attributes", "inputs", "output", "summary":
		return true
	}
	return false
}
