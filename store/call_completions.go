package store

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/fold"
	"github.com/tollgate-dev/tollgate/trace"
)

// The links of package fold's rule, one completion, one call: this file
// keeps them in call_completions and executes what fold says each writer
// does. The link's primary key (entity, created, completion_id) serializes
// the two writers: on PostgreSQL the second INSERT waits for the first
// transaction and then sees its row; SQLite has one writer.
//
// created leads the key, after the entity, because completion ids are
// random: keyed by id alone, every link of a batch landed on a different
// B-tree page, all of which the commit wrote (and SQLite's checkpoint
// copied again), more of them the larger the table; keyed by date first,
// a batch's links land on the few pages of the last seconds. Links made
// before the key had a date (traces version 4) have created 0: an SDK end
// whose dated link misses looks for one of those too.

// isDeadlock reports whether err is PostgreSQL's deadlock_detected.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

const (
	linkCompletionSQL = `
		INSERT INTO call_completions (entity, created, completion_id, project_id, call_id, sdk) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (entity, created, completion_id) DO NOTHING`
	readLinkSQL = `SELECT project_id, call_id, sdk FROM call_completions WHERE entity = ? AND created = ? AND completion_id = ?`
)

// linkSDKCompletion links the SDK call projectID/callID, which has just
// ended with a completion (completion, dated created) as its output, to
// that completion, and folds the gateway's call into it if the gateway
// recorded one already.
func linkSDKCompletion(ctx context.Context, c conn, projectID int64, callID string, done fold.Completion) error {
	completion, created := done.ID, done.Created
	var entity string
	var attrs []byte
	err := c.queryRow(ctx, `SELECT p.entity, c.attributes FROM calls c JOIN projects p ON p.id = c.project_id
		WHERE c.project_id = ? AND c.id = ?`, projectID, callID).Scan(&entity, &attrs)
	if err != nil {
		return fmt.Errorf("link completion: %w", err)
	}
	if !fold.IsClientCall(attrs) {
		return nil
	}
	res, err := c.exec(ctx, linkCompletionSQL, entity, created, completion, projectID, callID, true)
	if err != nil {
		return fmt.Errorf("link completion: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("link completion: %w", err)
	}
	if n == 1 {
		if created == 0 {
			return nil
		}
		// The gateway may have linked the completion before links were
		// dated (traces version 4), with created 0. That link is no
		// gateway's to race for any more: only this end reads it.
		created = 0
	}
	var gwProject int64
	var gwCall string
	var sdk bool
	err = c.queryRow(ctx, readLinkSQL, entity, created, completion).Scan(&gwProject, &gwCall, &sdk)
	if n == 1 && errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("link completion: %w", err)
	}
	holder := fold.Gateway
	if sdk {
		holder = fold.SDK
	}
	if fold.OnSDKEnd(holder) != fold.FoldGateway {
		return nil
	}
	var gwAttrs []byte
	err = c.queryRow(ctx, `SELECT attributes FROM calls WHERE project_id = ? AND id = ?`, gwProject, gwCall).Scan(&gwAttrs)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// The gateway's call was deleted; nothing to fold.
	case err != nil:
		return fmt.Errorf("link completion: %w", err)
	default:
		if err := foldGatewayAttributes(ctx, c, projectID, callID, attrs, gwAttrs, gwCall); err != nil {
			return err
		}
		if _, err := c.exec(ctx, `DELETE FROM calls WHERE project_id = ? AND id = ?`, gwProject, gwCall); err != nil {
			return fmt.Errorf("fold gateway call: %w", err)
		}
	}
	// The link is the SDK call's now, which DeleteCalls finds through
	// call_completions_call, not by a key kept in the call (traces
	// version 5): it is no longer keyed.
	if _, err := c.exec(ctx, `UPDATE call_completions SET project_id = ?, call_id = ?, sdk = ?, keyed = ?
		WHERE entity = ? AND created = ? AND completion_id = ?`,
		projectID, callID, true, false, entity, created, completion); err != nil {
		return fmt.Errorf("link completion: %w", err)
	}
	return nil
}

// linkSpanCompletion links the call projectID/callID, ingested from an
// OpenTelemetry span that reports completion span, to that completion as
// linkSDKCompletion does for an SDK call. The span rarely knows the
// completion's date, which the link's key holds: fold.SpanDates says where
// a link the gateway made may be, and which dates the span claims
// otherwise.
func linkSpanCompletion(ctx context.Context, c conn, projectID int64, callID string, span *trace.SpanCompletion, ended time.Time) error {
	first, last, claim := fold.SpanDates(span.Created, span.StartedAt, ended)
	var created int64
	err := c.queryRow(ctx, `SELECT k.created FROM call_completions k JOIN projects p ON p.entity = k.entity
		WHERE p.id = ? AND k.completion_id = ? AND k.created BETWEEN ? AND ? ORDER BY k.created LIMIT 1`,
		projectID, span.ID, first, last).Scan(&created)
	switch {
	case err == nil:
		claim = []int64{created}
	case !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("link span completion: %w", err)
	}
	for _, d := range claim {
		if err := linkSDKCompletion(ctx, c, projectID, callID, fold.Completion{ID: span.ID, Created: d}); err != nil {
			return err
		}
	}
	return nil
}

// foldGatewayAttributes stores the SDK call's attributes with the gateway
// call's folded in (fold.Attributes).
func foldGatewayAttributes(ctx context.Context, c conn, projectID int64, callID string, attrs, gwAttrs []byte, gwCall string) error {
	merged, err := fold.Attributes(attrs, gwAttrs, gwCall)
	if err != nil {
		return err
	}
	if _, err := c.exec(ctx, `UPDATE calls SET attributes = ? WHERE project_id = ? AND id = ?`,
		string(merged), projectID, callID); err != nil {
		return fmt.Errorf("fold gateway call: %w", err)
	}
	return nil
}

// insertCompletionLink inserts the links of a batch's records that carry
// a completion id, keeping the ones that exist. They are keyed: each one's
// gateway call keeps its key (calls.completion_created and
// attributes.completion_id), by which DeleteCalls finds it.
var insertCompletionLink = multiRowInsert{
	head: `INSERT INTO call_completions (entity, created, completion_id, project_id, call_id, sdk, keyed) VALUES `,
	cols: 7,
	tail: ` ON CONFLICT (entity, created, completion_id) DO NOTHING`,
}

// linkKey is the primary key of a link.
type linkKey struct {
	entity     string
	created    int64
	completion string
}

// recordLink is the key of a record's link; row is its gatewayRow.
func recordLink(rec *accounting.Record, row *gatewayRow) linkKey {
	return linkKey{row.project.team, rec.CompletionCreated, rec.CompletionID}
}

// sdkLink is an SDK call a completion is linked to.
type sdkLink struct {
	projectID int64
	callID    string
}

// linkGatewayCompletions links each record's completion to its gateway
// call, just inserted, and folds the calls whose completion an SDK call
// stands for already into those SDK calls (deleting the gateway's row).
// It costs a batch two statements per 64 records when nothing folds.
//
// On PostgreSQL its statements run on the transaction's own connection,
// never prepared on the pool: once a link's row is locked, an SDK ingest of
// the same completion waits for this transaction, and a transaction that
// then needed a second connection of a pool the waiting ingests hold would
// wait for them in turn. On SQLite the INSERT is cached (execLinks), as the
// calls' INSERT before it is: its pool has no bound, and a connection
// waiting for the write lock this transaction holds waits the same.
//
// rows and text are recs' of gatewayCallRows: a link's entity, project and
// call id are the arguments its call was inserted with, not boxed again.
// numbered, on SQLite, has the INSERT bind fewer values (linkShapes).
func linkGatewayCompletions(ctx context.Context, c conn, recs []accounting.Record, rows []gatewayRow, text string, numbered bool) error {
	var linked []int
	keys := make([]linkKey, len(recs))
	for i := range recs {
		if recs[i].CompletionID != "" {
			linked = append(linked, i)
			keys[i] = recordLink(&recs[i], &rows[i])
		}
	}
	// In key order, so that two batches linking the same completions lock
	// them in the same order.
	slices.SortFunc(linked, func(a, b int) int {
		ka, kb := &keys[a], &keys[b]
		if ka.entity == kb.entity && ka.created == kb.created {
			return strings.Compare(ka.completion, kb.completion)
		}
		return cmp.Or(strings.Compare(ka.entity, kb.entity), cmp.Compare(ka.created, kb.created))
	})
	held := make(map[linkKey]sdkLink)
	args := make([]any, 0, insertCompletionLink.cols*min(len(linked), rowsPerInsert))
	for start, size := 0, 0; start < len(linked); start += size {
		size = linkStatementRows(c.d, len(linked)-start)
		part := linked[start : start+size]
		var inserted int64
		var err error
		if numbered {
			inserted, err = execNumberedLinks(ctx, c, recs, rows, part, args)
		} else {
			args = args[:0]
			for _, i := range part {
				row := &rows[i]
				args = append(args, row.project.entity, row.created, recs[i].CompletionID, row.project.idArg, row.callID, false, true)
			}
			inserted, err = execLinks(ctx, c, len(part), args)
		}
		yieldBetweenStatements()
		if err != nil {
			return fmt.Errorf("link completions: %w", err)
		}
		if inserted == int64(len(part)) {
			// Every link is this batch's: no SDK call holds one (on
			// PostgreSQL the INSERT waited for any concurrent writer of
			// the same key), so there is nothing to read back. That is
			// every batch of a gateway no Weave SDK traces through.
			continue
		}
		// Which of them an SDK call holds: links this batch did not insert.
		args = append(args[:0], true)
		for _, i := range part {
			args = append(args, rows[i].project.entity)
		}
		for _, i := range part {
			args = append(args, rows[i].created)
		}
		for _, i := range part {
			args = append(args, recs[i].CompletionID)
		}
		if err := readSDKLinks(ctx, c, len(part), args, held); err != nil {
			return err
		}
	}
	for _, i := range linked {
		row := &rows[i]
		l, ok := held[recordLink(&recs[i], row)]
		if !ok || fold.OnGatewayRecord(fold.SDK) != fold.FoldGateway {
			continue
		}
		if _, err := c.exec(ctx, `DELETE FROM calls WHERE project_id = ? AND id = ?`, row.project.id, recs[i].CallID); err != nil {
			return fmt.Errorf("fold gateway call: %w", err)
		}
		gwAttrs := []byte(text[row.text[2]:row.text[3]])
		var attrs []byte
		err := c.queryRow(ctx, `SELECT attributes FROM calls WHERE project_id = ? AND id = ?`, l.projectID, l.callID).Scan(&attrs)
		if errors.Is(err, sql.ErrNoRows) {
			continue // the SDK call was deleted since
		}
		if err != nil {
			return fmt.Errorf("fold gateway call: %w", err)
		}
		if err := foldGatewayAttributes(ctx, c, l.projectID, l.callID, attrs, gwAttrs, recs[i].CallID); err != nil {
			return err
		}
	}
	return nil
}

// linkStatementRows is how many of n links the next INSERT of
// linkGatewayCompletions carries: rowsPerInsert at most, and on SQLite,
// where the statement is cached (execLinks), a power of two as
// multiRowInsert.exec splits them, so that at most seven shapes are.
func linkStatementRows(d dialect, n int) int {
	if d == dialectSQLite {
		return min(rowsPerInsert, 1<<(bits.Len(uint(n))-1))
	}
	return min(rowsPerInsert, n)
}

// execLinks runs insertCompletionLink for rows links and returns how many
// it inserted. On SQLite it is prepared once for the life of the DB: parsing
// a 64-row INSERT for every statement was a sizeable share of the usage
// writer's work.
func execLinks(ctx context.Context, c conn, rows int, args []any) (int64, error) {
	if c.d == dialectSQLite {
		return insertCompletionLink.execRows(ctx, c, rows, args)
	}
	res, err := c.exec(ctx, insertCompletionLink.sql(rows), args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// linkShapes are the rows of insertCompletionLink's statements on SQLite,
// by [shared][sharedCreated] (see numberedRow): a link's sdk and keyed are
// always false and true, written 0 and 1; in a shared statement every
// link names the first one's entity and project, bound once, and in a
// sharedCreated one its date, which links in key order share in runs
// (the reply's second). Links of one team's batch are all shared, and
// bind 3 values rather than 7, or 2 within a second.
var linkShapes = [2][2]*numberedInsert{
	{
		newNumberedInsert(insertCompletionLink, numberedRow{"?", "?", "?", "?", "?", "0", "1"}),
		newNumberedInsert(insertCompletionLink, numberedRow{"?", "^1", "?", "?", "?", "0", "1"}),
	},
	{
		newNumberedInsert(insertCompletionLink, numberedRow{"^0", "?", "?", "^3", "?", "0", "1"}),
		newNumberedInsert(insertCompletionLink, numberedRow{"^0", "^1", "?", "^3", "?", "0", "1"}),
	},
}

// execNumberedLinks runs insertCompletionLink on SQLite for the links of
// records part in a statement of linkShapes, and returns how many it
// inserted. args is reused for the statement's arguments.
func execNumberedLinks(ctx context.Context, c conn, recs []accounting.Record, rows []gatewayRow, part []int, args []any) (int64, error) {
	shared, sharedCreated := true, true
	first := &rows[part[0]]
	for _, i := range part {
		shared = shared && rows[i].project == first.project
		// Every link has a date: its record has a completion id.
		sharedCreated = sharedCreated && rows[i].created == first.created
	}
	shape := linkShapes[b2i(shared)][b2i(sharedCreated)]
	args = args[:0]
	for j, i := range part {
		row := &rows[i]
		vals := [...]any{row.project.entity, row.created, recs[i].CompletionID, row.project.idArg, row.callID, nil, nil}
		args = shape.row.values(args, vals[:], j == 0)
	}
	return execCached(ctx, c, shape.sql(len(part)), args)
}

// readSDKLinks adds to held the SDK links among n link keys: args are
// true, the n entities, the n dates, then the n completion ids.
func readSDKLinks(ctx context.Context, c conn, n int, args []any, held map[linkKey]sdkLink) error {
	in := tracePlaceholders(n)
	rows, err := c.query(ctx, `SELECT entity, created, completion_id, project_id, call_id FROM call_completions
		WHERE sdk = ? AND entity IN (`+in+`) AND created IN (`+in+`) AND completion_id IN (`+in+`)`, args...)
	if err != nil {
		return fmt.Errorf("link completions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key linkKey
		var l sdkLink
		if err := rows.Scan(&key.entity, &key.created, &key.completion, &l.projectID, &l.callID); err != nil {
			return fmt.Errorf("link completions: %w", err)
		}
		held[key] = l
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("link completions: %w", err)
	}
	return nil
}

// deleteCallLinks deletes the links naming the calls ids of project
// projectID, before DeleteCalls deletes the calls. A link that is not
// keyed is found through call_completions_call (partial on NOT keyed). A
// keyed link, which the usage writer inserted, is found by the key its
// gateway call keeps: the project's entity, completion_created and
// attributes.completion_id (traces version 5); the DELETE names the call
// too, so that a link an SDK call took over since is left alone.
func deleteCallLinks(ctx context.Context, c conn, projectID int64, ids []string) error {
	type key struct {
		created    int64
		completion string
		callID     string
	}
	var keys []key
	for start := 0; start < len(ids); start += deleteBatch {
		part := ids[start:min(start+deleteBatch, len(ids))]
		in := inStrings("call_id", part)
		if _, err := c.exec(ctx, `DELETE FROM call_completions WHERE project_id = ? AND NOT keyed AND `+in.sql,
			append([]any{projectID}, in.args...)...); err != nil {
			return fmt.Errorf("delete links: %w", err)
		}
		in = inStrings("id", part)
		rows, err := c.query(ctx, `SELECT id, completion_created, attributes FROM calls
			WHERE project_id = ? AND completion_created IS NOT NULL AND `+in.sql, append([]any{projectID}, in.args...)...)
		if err != nil {
			return fmt.Errorf("delete links: %w", err)
		}
		for rows.Next() {
			var k key
			var attrs []byte
			if err := rows.Scan(&k.callID, &k.created, &attrs); err != nil {
				rows.Close()
				return fmt.Errorf("delete links: %w", err)
			}
			if k.completion = gjson.GetBytes(attrs, "completion_id").Str; k.completion != "" {
				keys = append(keys, k)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("delete links: %w", err)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	var entity string
	if err := c.queryRow(ctx, `SELECT entity FROM projects WHERE id = ?`, projectID).Scan(&entity); err != nil {
		return fmt.Errorf("delete links: %w", err)
	}
	stmt, err := c.prepare(ctx, `DELETE FROM call_completions
		WHERE entity = ? AND created = ? AND completion_id = ? AND project_id = ? AND call_id = ?`)
	if err != nil {
		return fmt.Errorf("delete links: %w", err)
	}
	defer stmt.Close()
	for _, k := range keys {
		if _, err := stmt.ExecContext(ctx, entity, k.created, k.completion, projectID, k.callID); err != nil {
			return fmt.Errorf("delete links: %w", err)
		}
	}
	return nil
}
