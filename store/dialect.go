package store

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// dialect is the SQL engine a DB talks to. Statements are written once,
// with "?" placeholders and SQL that both engines accept; the dialect
// rewrites the placeholders for PostgreSQL and supplies the few fragments
// that differ (JSON access, LIMIT without a limit); exprCompilerFor gives
// its $expr compiler (expr.go).
type dialect int

const (
	dialectSQLite dialect = iota
	dialectPostgres
)

// String is the engine's name, as config.Store.Driver spells it.
func (d dialect) String() string {
	if d == dialectPostgres {
		return "postgres"
	}
	return "sqlite"
}

// rebind rewrites the ? placeholders of q as $1, $2, ... for PostgreSQL
// and returns q unchanged for SQLite. A question mark inside a quoted
// string or identifier (a jsonpath filter, say) is not a placeholder.
func (d dialect) rebind(q string) string {
	if d != dialectPostgres || strings.IndexByte(q, '?') < 0 {
		return q
	}
	var sb strings.Builder
	sb.Grow(len(q) + 16)
	n := 0
	var quote byte
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case quote != 0:
			// A doubled quote ('it''s') closes and reopens: same result.
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			sb.WriteByte('$')
			sb.WriteString(strconv.Itoa(n))
			continue
		}
		sb.WriteByte(c)
	}
	return sb.String()
}

// limitArg is the argument of "LIMIT ?" for limit, where a negative limit
// means none: SQLite reads -1 as no limit, PostgreSQL reads NULL so and
// rejects negative limits.
func (d dialect) limitArg(limit int) any {
	if limit >= 0 {
		return limit
	}
	if d == dialectPostgres {
		return nil
	}
	return -1
}

// sumTokens is the SQL of the sum over a group of the token count column
// x, safe from overflow on both engines whatever the rows hold: a row
// counts 0 when its count is negative, and the sum saturates at
// math.MaxInt64. Stored counts are what a backend reported (or what
// another writer stored), and one row of 2^63-1 or 1e300 must not make
// every read covering it fail, nor a negative one make a budget look
// unspent.
//
// PostgreSQL sums BIGINT as NUMERIC, exactly, and LEAST saturates before
// the cast (a plain cast fails "bigint out of range"). SQLite's SUM fails
// on integer overflow ("integer overflow"), so it sums with TOTAL, in
// float64: exact while the sum is below 2^53 (9·10^15 tokens), and a CAST
// of a float to INTEGER saturates at the int64 bounds. An INTEGER column
// of SQLite may hold a REAL such as 1e300; the same expression sums it.
func (d dialect) sumTokens(x string) string {
	positive := "CASE WHEN " + x + " > 0 THEN " + x + " ELSE 0 END"
	if d == dialectPostgres {
		return "CAST(LEAST(COALESCE(SUM(" + positive + "), 0), 9223372036854775807) AS BIGINT)"
	}
	return "CAST(TOTAL(" + positive + ") AS INTEGER)"
}

// addTokens is the SQL of a + b for two token sums that are not negative
// (sumTokens values, or the columns usage_rollup keeps them in),
// saturating at math.MaxInt64 as accounting.AddTokens does. Comparing
// before adding keeps it in exact integers on both engines.
func addTokens(a, b string) string {
	return "CASE WHEN " + a + " > 9223372036854775807 - " + b + " THEN 9223372036854775807 ELSE " + a + " + " + b + " END"
}

// querier is what *sql.DB, *sql.Conn and *sql.Tx share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// conn runs statements written with ? placeholders on q, in dialect d. It
// is the one path every statement takes, so that none can reach
// PostgreSQL with SQLite placeholders.
type conn struct {
	q querier
	d dialect
	// tx and stmts, set on a transaction's conn, let it run statements
	// kept prepared for the life of the DB (see cached).
	tx    *sql.Tx
	stmts *stmtCache
}

func (c conn) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return c.q.ExecContext(ctx, c.d.rebind(query), args...)
}

func (c conn) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return c.q.QueryContext(ctx, c.d.rebind(query), args...)
}

// queryStrings runs query, which selects one text column, and returns the
// values of its rows.
func (c conn) queryStrings(ctx context.Context, query string, args ...any) ([]string, error) {
	rows, err := c.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

func (c conn) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	return c.q.QueryRowContext(ctx, c.d.rebind(query), args...)
}

func (c conn) prepare(ctx context.Context, query string) (*sql.Stmt, error) {
	return c.q.PrepareContext(ctx, c.d.rebind(query))
}

// cached returns query prepared once for the life of the DB and bound to
// c's transaction, for the statements every batch runs. The returned
// statement belongs to the transaction, which closes it when it ends. On a
// conn that is not a transaction's it prepares query for this use only;
// the caller closes the statement either way.
func (c conn) cached(ctx context.Context, query string) (*sql.Stmt, error) {
	if c.tx == nil || c.stmts == nil {
		return c.prepare(ctx, query)
	}
	s, err := c.stmts.get(ctx, query)
	if err != nil {
		return nil, err
	}
	return c.tx.StmtContext(ctx, s), nil
}

// isUniqueViolation reports whether err is PostgreSQL's unique_violation.
// SQLite never reports it: its single writer cannot race on a key.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
