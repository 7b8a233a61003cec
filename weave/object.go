package weave

import (
	"fmt"
	"strconv"
	"strings"
)

// KindOf is the kind of a value as Weave tells it: an op is a
// CustomWeaveType (or a plain typed value) whose type is "Op".
func KindOf(val any) string {
	m, ok := val.(map[string]any)
	if !ok {
		return KindObject
	}
	t, _ := m["_type"].(string)
	if wt, ok := m["weave_type"].(map[string]any); ok {
		t, _ = wt["type"].(string)
	}
	if t == "Op" {
		return KindOp
	}
	return KindObject
}

// isBaseObjectClass reports whether class, directly under pydantic's
// BaseModel, makes a value a Weave object with classes.
func isBaseObjectClass(class string) bool { return class == "BaseObject" || class == "Object" }

// ObjectClasses returns the leaf and base classes of a value saved from a
// weave.Object subclass: its _class_name, and the first class under
// Object (or BaseObject) in its _bases. Both are nil for other values.
func ObjectClasses(val any) (leaf, base *string) {
	m, ok := val.(map[string]any)
	if !ok {
		return nil, nil
	}
	raw, ok := m["_bases"].([]any)
	if !ok || len(raw) < 2 {
		return nil, nil
	}
	last, _ := raw[len(raw)-1].(string)
	second, _ := raw[len(raw)-2].(string)
	if last != "BaseModel" || !isBaseObjectClass(second) {
		return nil, nil
	}
	name, ok := m["_class_name"].(string)
	if !ok {
		return nil, nil
	}
	b := name
	if len(raw) > 2 {
		if s, ok := raw[len(raw)-3].(string); ok {
			b = s
		}
	}
	return &name, &b
}

// OpCodeFile is the name, in an op's files, of the file holding its code.
const OpCodeFile = "obj.py"

// OpCodeDigest returns the digest of an op value's code file, or "".
func OpCodeDigest(val any) string {
	m, ok := val.(map[string]any)
	if !ok {
		return ""
	}
	files, ok := m["files"].(map[string]any)
	if !ok {
		return ""
	}
	d, _ := files[OpCodeFile].(string)
	return d
}

// VersionIndex parses a "v<index>" version selector.
func VersionIndex(version string) (int, bool) {
	digits, ok := strings.CutPrefix(version, "v")
	if !ok || digits == "" {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 || strconv.Itoa(n) != digits {
		return 0, false
	}
	return n, true
}

// TableUpdate is one edit of a table: exactly one of Append, Pop and
// Insert.
type TableUpdate struct {
	// Append adds Row at the end.
	Append bool
	// Pop removes the row at Index.
	Pop bool
	// Insert puts Row at Index, shifting the rows from there.
	Insert bool
	Index  int
	// Row is the row's value (a JSON object, decoded with UseNumber).
	Row map[string]any
}

// TableUpdateResult is a table after updates: its digest, its row
// digests, the rows the store may not hold yet, and the digest each
// update added or removed, in update order.
type TableUpdateResult struct {
	Digest     string
	RowDigests []string
	NewRows    []TableRow
	Updated    []string
}

// ApplyTableUpdates applies updates to a table whose row digests are base,
// as Weave's table_update does. An index out of range fails the whole
// update, naming the update.
func ApplyTableUpdates(base []string, updates []TableUpdate) (TableUpdateResult, error) {
	rows := append([]string(nil), base...)
	known := make(map[string]bool, len(rows))
	for _, d := range rows {
		known[d] = true
	}
	var res TableUpdateResult
	add := func(row map[string]any) (string, error) {
		d, err := ValueDigest(row)
		if err != nil {
			return "", err
		}
		if !known[d] {
			known[d] = true
			res.NewRows = append(res.NewRows, TableRow{Digest: d, Val: Compact(row)})
		}
		return d, nil
	}
	for i, u := range updates {
		switch {
		case u.Append:
			d, err := add(u.Row)
			if err != nil {
				return TableUpdateResult{}, err
			}
			rows = append(rows, d)
			res.Updated = append(res.Updated, d)
		case u.Pop:
			if u.Index < 0 || u.Index >= len(rows) {
				return TableUpdateResult{}, &IndexError{Update: i, Index: u.Index, Len: len(rows)}
			}
			res.Updated = append(res.Updated, rows[u.Index])
			rows = append(rows[:u.Index], rows[u.Index+1:]...)
		case u.Insert:
			if u.Index < 0 || u.Index > len(rows) {
				return TableUpdateResult{}, &IndexError{Update: i, Index: u.Index, Len: len(rows)}
			}
			d, err := add(u.Row)
			if err != nil {
				return TableUpdateResult{}, err
			}
			rows = append(rows[:u.Index], append([]string{d}, rows[u.Index:]...)...)
			res.Updated = append(res.Updated, d)
		}
	}
	res.RowDigests = rows
	res.Digest = TableDigest(rows)
	return res, nil
}

// IndexError is an update whose index is outside the table.
type IndexError struct {
	Update, Index, Len int
}

func (e *IndexError) Error() string {
	return fmt.Sprintf("update %d: index %d out of range for a table of %d rows", e.Update, e.Index, e.Len)
}

// NewTable computes the row digests and table digest of rows.
func NewTable(rows []map[string]any) (digest string, rowDigests []string, stored []TableRow, err error) {
	rowDigests = make([]string, len(rows))
	seen := make(map[string]bool, len(rows))
	for i, r := range rows {
		d, err := ValueDigest(r)
		if err != nil {
			return "", nil, nil, err
		}
		rowDigests[i] = d
		if !seen[d] {
			seen[d] = true
			stored = append(stored, TableRow{Digest: d, Val: Compact(r)})
		}
	}
	return TableDigest(rowDigests), rowDigests, stored, nil
}
