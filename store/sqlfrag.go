package store

import "strings"

// Statements built from parts (the calls queries, the objects listing,
// batches of ids) are assembled from sqlFrag values, so that each part's
// placeholders travel with their arguments.

// sqlFrag is a piece of SQL with the arguments of its placeholders, in order.
type sqlFrag struct {
	sql  string
	args []any
}

func rawSQL(s string) sqlFrag { return sqlFrag{sql: s} }

// join concatenates fragments with sep, keeping their arguments in order.
func joinSQL(sep string, fs ...sqlFrag) sqlFrag {
	var sb strings.Builder
	var args []any
	for i, f := range fs {
		if i > 0 {
			sb.WriteString(sep)
		}
		sb.WriteString(f.sql)
		args = append(args, f.args...)
	}
	return sqlFrag{sql: sb.String(), args: args}
}

// wrap surrounds f with prefix and suffix.
func wrapSQL(prefix string, f sqlFrag, suffix string) sqlFrag {
	return sqlFrag{sql: prefix + f.sql + suffix, args: f.args}
}

func tracePlaceholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func inStrings(col string, vals []string) sqlFrag {
	args := make([]any, len(vals))
	for i, v := range vals {
		args[i] = v
	}
	return sqlFrag{sql: col + " IN (" + tracePlaceholders(len(vals)) + ")", args: args}
}
