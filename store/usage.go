package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/tollgate-dev/tollgate/accounting"
)

// DB is the persistence of the usage recorder, the limiter and the usage
// API (admin.UsageStore, which cmd/tollgate checks by handing it a DB).
var (
	_ accounting.Store       = (*DB)(nil)
	_ accounting.LimitsStore = (*DB)(nil)
)

// InsertRecords writes recs, their gateway calls and their usage roll-up,
// in one transaction. Several replicas may insert at once on PostgreSQL:
// call ids are distinct between them, insertGatewayCalls creates projects
// in a fixed order, and the roll-up rows, which replicas share, are
// updated last and in key order, so their transactions cannot deadlock
// and hold those rows only until they commit.
//
// The roll-up is idempotent per batch: the batch's marker (see markBatch)
// goes in first, and a batch marked before committed before, so it is not
// rolled up again. The recorder writes a batch again only after a failed
// attempt, whose commit may have succeeded, and then the very same slice
// (accounting.Recorder.write, and serve after a panic in its loop), so the
// marker stops it from counting twice in usage_rollup. Its gateway calls
// are written again all the same, as before markers: each is stored once
// by ON CONFLICT DO NOTHING, and one an SDK call folded since is folded
// again, or stands alone again if that SDK call was deleted (see
// linkGatewayCompletions). A batch marked before is rare, so this costs
// nothing that matters.
//
// After a store panic the recorder writes the batch's records one at a
// time (writeEach), each a batch keyed by its own call id and a count of
// 1. The panic rolled the whole batch back, so none of them was counted
// before, except in two cases too narrow to guard against:
//   - a panic inside the driver's Commit after the database committed:
//     every record then counts twice in usage_rollup (its call is still
//     stored once);
//   - a panic in the recorder's own loop while writeEach is under way:
//     serve writes the whole batch again, whose marker (first id, n) is
//     not a single record's (first id, 1), so the records writeEach had
//     written count twice. Keying the marker by the first id alone would
//     instead lose the records writeEach had not reached.
//
// A batch the engine refuses (a value it cannot hold: see refusal, whose
// error wraps accounting.ErrRecordRefused) is written by the recorder one
// record at a time in the same way, and the record refused alone goes to
// SetAside; the refusal rolled the whole batch back, so none of its
// records was counted before.
func (d *DB) InsertRecords(ctx context.Context, recs []accounting.Record) error {
	if len(recs) == 0 {
		return nil
	}
	if err := d.insertRecords(ctx, recs, time.Now()); err != nil {
		return fmt.Errorf("insert records: %w", refusal(err))
	}
	return nil
}

// insertRecords is InsertRecords at now, the time its marker is dated.
func (d *DB) insertRecords(ctx context.Context, recs []accounting.Record, now time.Time) error {
	if err := fillCallIDs(recs); err != nil {
		return err
	}
	tx, c, done, err := d.beginRecords(ctx)
	if err != nil {
		return err
	}
	defer done()
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	first, err := markBatch(ctx, c, recs, now)
	if err != nil {
		return err
	}
	if err := insertGatewayCalls(ctx, c, recs, c.d == dialectSQLite); err != nil {
		return err
	}
	if first {
		var rollup usageRollup
		for i := range recs {
			rollup.add(&recs[i])
		}
		if err := rollup.write(ctx, c); err != nil {
			return fmt.Errorf("usage roll-up: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// fillCallIDs gives a record without a call id a new UUIDv7. The proxy
// always sets one; a record lacking it must not collide with another, and
// gets its id in recs, before the batch's marker is taken from it, so
// that the recorder writing the same slice again finds the same marker.
func fillCallIDs(recs []accounting.Record) error {
	for i := range recs {
		if recs[i].CallID == "" {
			u, err := uuid.NewV7()
			if err != nil {
				return fmt.Errorf("call id: %w", err)
			}
			recs[i].CallID = u.String()
		}
	}
	return nil
}

// insertUsageBatch marks a batch written: its first record's call id and
// its record count (see InsertRecords for why both), dated written_at.
var insertUsageBatch = multiRowInsert{
	head: `INSERT INTO usage_batches (first_call_id, records, written_at) VALUES `,
	cols: 3,
	tail: ` ON CONFLICT (first_call_id, records) DO NOTHING`,
}

// usageBatchTTL is how long a batch's marker is kept: far longer than the
// recorder retries a batch before any later one of the same gateway (it
// writes batches in order, and each inserts its marker before purging),
// so only another replica could purge a marker still needed, and only
// after this gateway's store was unreachable for a day.
const usageBatchTTL = 24 * time.Hour

// oldUsageBatches are the batch markers, dated by when their batch was written.
var oldUsageBatches = expiringRows{table: "usage_batches", key: "first_call_id, records", at: "written_at"}

// usageBatchPurge bounds the expired markers a batch deletes. Each batch
// adds one marker, so a few deleted per batch keep the table at about a
// day of batches without any statement deleting an unbounded number.
const usageBatchPurge = 8

// markBatch inserts recs' marker, purges up to usageBatchPurge markers
// older than usageBatchTTL, and reports whether recs was not marked
// before, that is whether it is to be rolled up.
func markBatch(ctx context.Context, c conn, recs []accounting.Record, now time.Time) (bool, error) {
	n, err := insertUsageBatch.execRows(ctx, c, 1, []any{recs[0].CallID, len(recs), now.UnixNano()})
	if err != nil {
		return false, fmt.Errorf("usage batch: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	if _, err := oldUsageBatches.purge(ctx, c, now.Add(-usageBatchTTL).UnixNano(), usageBatchPurge); err != nil {
		return false, err
	}
	return true, nil
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
		", " + dl.sumTokens("cached_tokens") + ", " + dl.sumTokens("cache_write_tokens") + `,
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
			&r.InputTokens, &r.OutputTokens, &r.CachedTokens, &r.CacheWriteTokens, &r.Requests, &r.Records); err != nil {
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
