package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/tollgate-dev/tollgate/accounting"
)

// refusal wraps err in accounting.ErrRecordRefused when it is the engine
// refusing a value (writing the same records again fails the same way),
// and returns it as it is otherwise (a lost connection, a full disk, a
// deadlock: the recorder retries those).
//
// PostgreSQL: SQLSTATE classes 22 (data exception: a NUL or bytes not
// UTF-8, a number out of range), 23 (integrity constraint violation) and
// 54 (program limit exceeded: an index row over 2,704 bytes). SQLite
// holds any text and takes no NUL for an end; it refuses a value too big
// (SQLITE_TOOBIG), a constraint (SQLITE_CONSTRAINT) or a type
// (SQLITE_MISMATCH).
func refusal(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:min(2, len(pgErr.Code))] {
		case "22", "23", "54":
			return fmt.Errorf("%w: %w", accounting.ErrRecordRefused, err)
		}
		return err
	}
	var liteErr *sqlite.Error
	if errors.As(err, &liteErr) {
		switch liteErr.Code() & 0xff {
		case sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH:
			return fmt.Errorf("%w: %w", accounting.ErrRecordRefused, err)
		}
	}
	return err
}

// refusedRecord is a record as usage_refused keeps it: every field, under
// the names of the gateway's other tables, times in RFC 3339. As JSON it
// is text any engine holds: encoding/json escapes a NUL and replaces bytes
// that are not UTF-8 with U+FFFD, the one change it makes to a record.
type refusedRecord struct {
	RequestID         string    `json:"request_id"`
	CallID            string    `json:"call_id"`
	TraceID           string    `json:"trace_id"`
	ParentID          string    `json:"parent_id,omitempty"`
	KeyName           string    `json:"key_name"`
	Team              string    `json:"team"`
	Project           string    `json:"project"`
	Model             string    `json:"model"`
	ServedModel       string    `json:"served_model,omitempty"`
	Backend           string    `json:"backend,omitempty"`
	CompletionID      string    `json:"completion_id,omitempty"`
	CompletionCreated int64     `json:"completion_created,omitempty"`
	Endpoint          string    `json:"endpoint"`
	Status            int       `json:"status"`
	Error             string    `json:"error,omitempty"`
	Stream            bool      `json:"stream"`
	Incomplete        bool      `json:"incomplete"`
	PromptTokens      int64     `json:"prompt_tokens"`
	CompletionTokens  int64     `json:"completion_tokens"`
	TotalTokens       int64     `json:"total_tokens"`
	CachedTokens      int64     `json:"cached_tokens"`
	CacheWriteTokens  int64     `json:"cache_write_tokens,omitempty"`
	Started           time.Time `json:"started"`
	Ended             time.Time `json:"ended"`
	Input             string    `json:"input,omitempty"`
	Output            string    `json:"output,omitempty"`
}

// insertRefused keeps a refused record once.
const insertRefused = `INSERT INTO usage_refused (record_sha256, refused_at, reason, record) VALUES (?, ?, ?, ?)
	ON CONFLICT (record_sha256) DO NOTHING`

// SetAside keeps rec, which InsertRecords refused, in usage_refused with
// reason (see usageMigrations, version 5). Setting the same record aside
// again keeps the first row.
func (d *DB) SetAside(ctx context.Context, rec accounting.Record, reason string) error {
	r := &rec
	doc, err := json.Marshal(refusedRecord{
		RequestID: r.RequestID, CallID: r.CallID, TraceID: r.TraceID, ParentID: r.ParentID,
		KeyName: r.KeyName, Team: r.Team, Project: r.Project, Model: r.Model, ServedModel: r.ServedModel,
		Backend: r.Backend, CompletionID: r.CompletionID, CompletionCreated: r.CompletionCreated,
		Endpoint: recordEndpoint(r), Status: r.Status, Error: r.Error, Stream: r.Stream, Incomplete: r.Incomplete,
		PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens, TotalTokens: r.TotalTokens,
		CachedTokens: r.CachedTokens, CacheWriteTokens: r.CacheWriteTokens, Started: r.Started.UTC(), Ended: r.Ended.UTC(),
		Input: string(r.Input), Output: string(r.Output),
	})
	if err != nil {
		return fmt.Errorf("set aside usage record: %w", err)
	}
	sum := sha256.Sum256(doc)
	// The reason is the engine's message, which may quote the value it
	// refused: made text the engine holds, as the record is.
	reason = strings.ToValidUTF8(strings.ReplaceAll(reason, "\x00", `\u0000`), "\uFFFD")
	if _, err := d.conn().exec(ctx, insertRefused, hex.EncodeToString(sum[:]), time.Now().UnixNano(), reason, string(doc)); err != nil {
		return fmt.Errorf("set aside usage record: %w", err)
	}
	return nil
}
