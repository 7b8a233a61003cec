package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
)

// DB is the persistence of the usage recorder, the limiter and the usage
// API (admin.UsageStore, which cmd/tollgate checks by handing it a DB).
var (
	_ accounting.Store       = (*DB)(nil)
	_ accounting.LimitsStore = (*DB)(nil)
)

// insertUsage ignores a call_id already stored: the recorder writes a
// batch again when a commit is reported failed, and a record written twice
// must not fail the batch forever, nor count twice in usage_rollup.
var insertUsage = multiRowInsert{
	head: `INSERT INTO usage_records (
	call_id, request_id, trace_id, parent_id, key_name, team, project,
	model, served_model, backend, endpoint, status, error, stream, incomplete,
	prompt_tokens, completion_tokens, total_tokens, cached_tokens, started, ended
) VALUES `,
	cols: 21,
	tail: ` ON CONFLICT (call_id) DO NOTHING`,
}

// insertUsageReturning is insertUsage returning the call ids it inserted,
// which tell the records new to usage_rollup from those stored before. It
// costs SQLite a copy of every row into a temporary table (and another of
// every id), as much CPU as an index on usage_records, so InsertRecords
// runs it only for a batch it found stored before, in part or in whole.
var insertUsageReturning = multiRowInsert{
	head: insertUsage.head,
	cols: insertUsage.cols,
	tail: insertUsage.tail + ` RETURNING call_id`,
}

// errStoredBefore stops a write that found a record of its batch stored
// already (or twice in the batch).
var errStoredBefore = errors.New("a record is stored already")

// InsertRecords writes recs, their usage rows, their usage roll-up and
// their trace calls, in one transaction. Several replicas may insert at
// once on PostgreSQL: call ids are distinct between them, insertGatewayCalls
// creates projects in a fixed order, and the roll-up rows, which replicas
// share, are updated last and in key order, so their transactions cannot
// deadlock and hold those rows only until they commit.
func (d *DB) InsertRecords(ctx context.Context, recs []accounting.Record) error {
	if len(recs) == 0 {
		return nil
	}
	err := d.insertRecords(ctx, recs, false)
	if errors.Is(err, errStoredBefore) {
		// The recorder writes a batch again after a commit reported failed
		// (that may have succeeded): write it again, asking which records
		// are new.
		err = d.insertRecords(ctx, recs, true)
	}
	if err != nil {
		return fmt.Errorf("insert records: %w", err)
	}
	return nil
}

// insertRecords is InsertRecords. Unless returning, it fails with
// errStoredBefore when a statement inserts fewer records than it carries,
// and adds every record to the roll-up; returning, it adds those its
// statements return.
func (d *DB) insertRecords(ctx context.Context, recs []accounting.Record, returning bool) error {
	tx, c, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var rollup usageRollup
	appendRow := func(args []any, i int) ([]any, error) {
		r := &recs[i]
		return append(args,
			r.CallID, r.RequestID, r.TraceID, r.ParentID, r.KeyName, r.Team, r.Project,
			r.Model, r.ServedModel, r.Backend, recordEndpoint(r), r.Status, r.Error, r.Stream, r.Incomplete,
			r.PromptTokens, r.CompletionTokens, r.TotalTokens, r.CachedTokens,
			unixNano(r.Started), unixNano(r.Ended),
		), nil
	}
	if returning {
		err = insertUsageReturning.execReturning(ctx, c, len(recs), appendRow, func(first, rows int, ids []string) error {
			rollup.addInserted(recs[first:first+rows], ids)
			return nil
		})
	} else {
		err = insertUsage.execCounted(ctx, c, len(recs), appendRow, func(first, rows int, affected int64) error {
			if affected != int64(rows) {
				return errStoredBefore
			}
			for i := first; i < first+rows; i++ {
				rollup.add(&recs[i])
			}
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	if err := insertGatewayCalls(ctx, c, recs); err != nil {
		return err
	}
	if err := rollup.write(ctx, c); err != nil {
		return fmt.Errorf("usage roll-up: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// defaultEndpoint is the endpoint of a record that names none: records
// were all chat completions before endpoints were told apart.
const defaultEndpoint = "chat.completions"

// recordEndpoint is the endpoint column of r, never empty.
func recordEndpoint(r *accounting.Record) string {
	if r.Endpoint == "" {
		return defaultEndpoint
	}
	return r.Endpoint
}

// unixNano is t in unix nanoseconds, 0 for the zero time (whose UnixNano
// is undefined).
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// SpentTokens sums the total tokens of the records started at or after
// since, per team, project and key. A record whose total is 0 (or
// negative) counts its prompt and completion tokens, so that a proxy
// leaving the total unset cannot reset a budget. The sums saturate (see
// dialect.sumTokens): a spend is never negative and never wraps.
//
// It reads usage_rollup, whose resolution is a second: a record counts as
// started at the start of the second it started in, so that since is
// exact when it is a whole second, as budget windows (midnight, the first
// of the month) are.
func (d *DB) SpentTokens(ctx context.Context, since time.Time) ([]accounting.SpentRow, error) {
	c := d.conn()
	rows, err := c.query(ctx, `SELECT team, project, key_name, `+c.d.sumTokens("spent_tokens")+`
		FROM usage_rollup WHERE started_sec >= ?
		GROUP BY team, project, key_name`, ceilSecond(since.UnixNano()))
	if err != nil {
		return nil, fmt.Errorf("spent tokens: %w", err)
	}
	defer rows.Close()
	var out []accounting.SpentRow
	for rows.Next() {
		var r accounting.SpentRow
		if err := rows.Scan(&r.Subject.Team, &r.Subject.Project, &r.Subject.Key, &r.Tokens); err != nil {
			return nil, fmt.Errorf("spent tokens: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("spent tokens: %w", err)
	}
	return out, nil
}

// UsageBuckets sums the usage q selects per bucket and group, in bucket
// order, then by group. Buckets with no usage have no row. Token sums
// saturate (see dialect.sumTokens), so that no stored count can make the
// read fail.
//
// It reads usage_rollup, whose resolution is a second: a record counts as
// started at the start of the second it started in, both to fall in
// [q.Start, q.End) and to fall in a bucket. Bounds and widths that are
// whole seconds (the usage API's) are exact; others (`tollgate usage`
// ends its range now) move each edge up to the next second.
func (d *DB) UsageBuckets(ctx context.Context, q accounting.UsageQuery) ([]accounting.UsageRow, error) {
	if q.BucketWidth <= 0 {
		return nil, fmt.Errorf("usage buckets: bucket width %v is not positive", q.BucketWidth)
	}
	if q.Teams != nil && len(q.Teams) == 0 {
		return nil, nil
	}
	start := q.Start.UnixNano()
	args := []any{start, int64(q.BucketWidth)}
	groupCols := []string{"bucket"}
	var sb strings.Builder
	sb.WriteString("SELECT (started_sec * 1000000000 - ?) / ? AS bucket")
	if q.GroupByProject {
		sb.WriteString(", team, project")
		groupCols = append(groupCols, "team", "project")
	} else {
		sb.WriteString(", '', ''")
	}
	if q.GroupByModel {
		sb.WriteString(", model")
		groupCols = append(groupCols, "model")
	} else {
		sb.WriteString(", ''")
	}
	if q.GroupByKey {
		sb.WriteString(", key_name")
		groupCols = append(groupCols, "key_name")
	} else {
		sb.WriteString(", ''")
	}
	if q.GroupByEndpoint {
		sb.WriteString(", endpoint")
		groupCols = append(groupCols, "endpoint")
	} else {
		sb.WriteString(", ''")
	}
	if q.GroupByStatus {
		sb.WriteString(", status_class")
		groupCols = append(groupCols, "status_class")
	} else {
		sb.WriteString(", ''")
	}
	dl := d.dialect
	sb.WriteString(", " + dl.sumTokens("prompt_tokens") + ", " + dl.sumTokens("completion_tokens") +
		", " + dl.sumTokens("cached_tokens") + `,
		CAST(SUM(requests) AS BIGINT), CAST(SUM(records) AS BIGINT)
		FROM usage_rollup WHERE started_sec >= ? AND started_sec < ?`)
	args = append(args, ceilSecond(start), ceilSecond(q.End.UnixNano()))
	if q.Teams != nil {
		sb.WriteString(" AND team IN (" + placeholders(len(q.Teams)) + ")")
		for _, t := range q.Teams {
			args = append(args, t)
		}
	}
	if len(q.Projects) > 0 {
		sb.WriteString(" AND (")
		for i, p := range q.Projects {
			if i > 0 {
				sb.WriteString(" OR ")
			}
			sb.WriteString("(team = ? AND project = ?)")
			args = append(args, p.Team, p.Project)
		}
		sb.WriteString(")")
	}
	if len(q.Models) > 0 {
		sb.WriteString(" AND model IN (" + placeholders(len(q.Models)) + ")")
		for _, m := range q.Models {
			args = append(args, m)
		}
	}
	if len(q.Endpoints) > 0 {
		sb.WriteString(" AND endpoint IN (" + placeholders(len(q.Endpoints)) + ")")
		for _, e := range q.Endpoints {
			args = append(args, e)
		}
	}
	cols := strings.Join(groupCols, ", ")
	sb.WriteString(" GROUP BY " + cols + " ORDER BY " + cols)

	rows, err := d.conn().query(ctx, sb.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("usage buckets: %w", err)
	}
	defer rows.Close()
	var out []accounting.UsageRow
	for rows.Next() {
		var (
			r      accounting.UsageRow
			bucket int64
		)
		if err := rows.Scan(&bucket, &r.Team, &r.Project, &r.Model, &r.KeyName, &r.Endpoint, &r.Status,
			&r.InputTokens, &r.OutputTokens, &r.CachedTokens, &r.Requests, &r.Records); err != nil {
			return nil, fmt.Errorf("usage buckets: %w", err)
		}
		r.BucketStart = time.Unix(0, start+bucket*int64(q.BucketWidth)).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("usage buckets: %w", err)
	}
	return out, nil
}

// placeholders is n comma-separated "?".
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
