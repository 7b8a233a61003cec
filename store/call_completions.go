package store

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tollgate-dev/tollgate/accounting"
)

// One completion, one call. When a Weave SDK traces a completion that went
// through the gateway, two writers describe it: the gateway records its
// call (asynchronously, in the usage writer's batches), and the SDK logs
// its own, whose output carries the completion id the gateway returned.
// They are folded into the SDK's call, in the SDK's trace, which takes the
// gateway's attributes under attributes.gateway; the gateway's call is not
// kept. Without an SDK call the gateway's call stands alone.
//
// The fold happens at ingest rather than at query time: then every reader
// (calls queries, /trace/usage, /calls/usage, query stats, exports) sees
// one row and needs no join against another project's calls, and a
// project's roll-up cannot count the completion twice whatever it selects.
// Either writer may come first, so each one does the fold when it finds
// the other's link in call_completions: the gateway's batch deletes the
// row it has just inserted and patches the SDK call's attributes; the
// SDK's end deletes the gateway's row and patches its own. Both orders leave the same SDK call
// (the merged attributes are the same JSON merge patch) and no gateway
// row. The link's primary key (entity, completion_id) serializes the two:
// on PostgreSQL the second INSERT waits for the first transaction and then
// sees its row; SQLite has one writer.
//
// A link never crosses entities: the SDK call's team must be the gateway
// call's team, so that nobody can pull another team's call into a trace by
// naming its completion id.

// isDeadlock reports whether err is PostgreSQL's deadlock_detected.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// isSDKSource reports whether an attributes.weave.source value names a
// Weave SDK.
func isSDKSource(s string) bool { return s == "js-sdk" || s == "python-sdk" }

// completionID returns the completion id a traced OpenAI call's output
// carries (a chat completion, streamed or not, a text completion or a
// response), or "".
func completionID(output []byte) string {
	if len(output) == 0 || output[0] != '{' {
		return ""
	}
	r := gjson.GetManyBytes(output, "id", "object")
	if r[0].Type != gjson.String || r[0].Str == "" {
		return ""
	}
	switch r[1].Str {
	case "chat.completion", "chat.completion.chunk", "text_completion", "response":
		return r[0].Str
	}
	return ""
}

const (
	linkCompletionSQL = `
		INSERT INTO call_completions (entity, completion_id, project_id, call_id, sdk) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (entity, completion_id) DO NOTHING`
	readLinkSQL = `SELECT project_id, call_id, sdk FROM call_completions WHERE entity = ? AND completion_id = ?`
)

// linkSDKCompletion links the SDK call projectID/callID, which has just
// ended with a completion as its output, to that completion, and folds the
// gateway's call into it if the gateway recorded one already.
func linkSDKCompletion(ctx context.Context, c conn, projectID int64, callID, completion string) error {
	var entity string
	var attrs []byte
	err := c.queryRow(ctx, `SELECT p.entity, c.attributes FROM calls c JOIN projects p ON p.id = c.project_id
		WHERE c.project_id = ? AND c.id = ?`, projectID, callID).Scan(&entity, &attrs)
	if err != nil {
		return fmt.Errorf("link completion: %w", err)
	}
	if !isSDKSource(gjson.GetBytes(attrs, "weave.source").Str) {
		return nil
	}
	res, err := c.exec(ctx, linkCompletionSQL, entity, completion, projectID, callID, true)
	if err != nil {
		return fmt.Errorf("link completion: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	var gwProject int64
	var gwCall string
	var sdk bool
	if err := c.queryRow(ctx, readLinkSQL, entity, completion).Scan(&gwProject, &gwCall, &sdk); err != nil {
		return fmt.Errorf("link completion: %w", err)
	}
	if sdk {
		// Another SDK call (or this one, ending again) holds it already.
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
	if _, err := c.exec(ctx, `UPDATE call_completions SET project_id = ?, call_id = ?, sdk = ? WHERE entity = ? AND completion_id = ?`,
		projectID, callID, true, entity, completion); err != nil {
		return fmt.Errorf("link completion: %w", err)
	}
	return nil
}

// foldGatewayAttributes merges the gateway call's attributes, with its
// call id, into the SDK call's as attributes.gateway.
func foldGatewayAttributes(ctx context.Context, c conn, projectID int64, callID string, attrs, gwAttrs []byte, gwCall string) error {
	gw, err := sjson.SetBytes(gwAttrs, "call_id", gwCall)
	if err != nil {
		return fmt.Errorf("fold gateway call: %w", err)
	}
	patch := make([]byte, 0, len(gw)+16)
	patch = append(append(append(patch, `{"gateway":`...), gw...), '}')
	merged, err := mergePatch(attrs, patch)
	if err != nil {
		return fmt.Errorf("fold gateway call: %w", err)
	}
	if _, err := c.exec(ctx, `UPDATE calls SET attributes = ? WHERE project_id = ? AND id = ?`,
		string(merged), projectID, callID); err != nil {
		return fmt.Errorf("fold gateway call: %w", err)
	}
	return nil
}

// insertCompletionLink inserts the links of a batch's records that carry
// a completion id, keeping the ones that exist.
var insertCompletionLink = multiRowInsert{
	head: `INSERT INTO call_completions (entity, completion_id, project_id, call_id, sdk) VALUES `,
	cols: 5,
	tail: ` ON CONFLICT (entity, completion_id) DO NOTHING`,
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
// Its statements run on the transaction's own connection, never prepared
// on the pool: once a link's row is locked, an SDK ingest of the same
// completion waits for this transaction, and on PostgreSQL a transaction
// that then needed a second connection of a pool the waiting ingests hold
// would wait for them in turn.
func linkGatewayCompletions(ctx context.Context, c conn, recs []accounting.Record, projects map[[2]string]int64) error {
	var linked []int
	for i := range recs {
		if recs[i].CompletionID != "" {
			linked = append(linked, i)
		}
	}
	// In key order, so that two batches linking the same completions lock
	// them in the same order.
	slices.SortFunc(linked, func(a, b int) int {
		return cmp.Or(strings.Compare(recordProject(&recs[a])[0], recordProject(&recs[b])[0]),
			strings.Compare(recs[a].CompletionID, recs[b].CompletionID))
	})
	held := make(map[[2]string]sdkLink)
	for start := 0; start < len(linked); start += rowsPerInsert {
		part := linked[start:min(start+rowsPerInsert, len(linked))]
		args := make([]any, 0, insertCompletionLink.cols*len(part))
		for _, i := range part {
			tp := recordProject(&recs[i])
			args = append(args, tp[0], recs[i].CompletionID, projects[tp], recs[i].CallID, false)
		}
		if _, err := c.exec(ctx, insertCompletionLink.sql(len(part)), args...); err != nil {
			return fmt.Errorf("link completions: %w", err)
		}
		// Which of them an SDK call holds: links this batch did not insert.
		args = append(args[:0], true)
		for _, i := range part {
			args = append(args, recordProject(&recs[i])[0])
		}
		for _, i := range part {
			args = append(args, recs[i].CompletionID)
		}
		if err := readSDKLinks(ctx, c, len(part), args, held); err != nil {
			return err
		}
	}
	for _, i := range linked {
		tp := recordProject(&recs[i])
		l, ok := held[[2]string{tp[0], recs[i].CompletionID}]
		if !ok {
			continue
		}
		if _, err := c.exec(ctx, `DELETE FROM calls WHERE project_id = ? AND id = ?`, projects[tp], recs[i].CallID); err != nil {
			return fmt.Errorf("fold gateway call: %w", err)
		}
		gwAttrs, err := gatewayAttributesJSON(&recs[i])
		if err != nil {
			return fmt.Errorf("fold gateway call: %w", err)
		}
		var attrs []byte
		err = c.queryRow(ctx, `SELECT attributes FROM calls WHERE project_id = ? AND id = ?`, l.projectID, l.callID).Scan(&attrs)
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

// readSDKLinks adds to held the SDK links among n (entity, completion)
// pairs: args are true, the n entities, then the n completion ids.
func readSDKLinks(ctx context.Context, c conn, n int, args []any, held map[[2]string]sdkLink) error {
	rows, err := c.query(ctx, `SELECT entity, completion_id, project_id, call_id FROM call_completions
		WHERE sdk = ? AND entity IN (`+tracePlaceholders(n)+`) AND completion_id IN (`+tracePlaceholders(n)+`)`, args...)
	if err != nil {
		return fmt.Errorf("link completions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key [2]string
		var l sdkLink
		if err := rows.Scan(&key[0], &key[1], &l.projectID, &l.callID); err != nil {
			return fmt.Errorf("link completions: %w", err)
		}
		held[key] = l
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("link completions: %w", err)
	}
	return nil
}
