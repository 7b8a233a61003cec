// Package trace is the domain of the trace service's calls: projects, op
// versions, calls as ingested and as stored, the $expr query AST that
// selects them, what the usage roll-up reads, and the Store contract. It
// knows nothing of HTTP (admin parses and renders) nor of SQL (store
// implements Store); package weave holds the objects, tables, files,
// feedback and prices beside calls.
package trace

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"
)

// TimeLayout is how call timestamps look on the wire and in the store:
// fixed width, so that their text order is their time order.
const TimeLayout = "2006-01-02T15:04:05.000000Z"

// ErrNotFound is returned by a Store when the project, call or run asked for
// does not exist.
var ErrNotFound = errors.New("not found")

// ErrParentNotFound is returned by Store.WriteCalls when a call start names a
// parent but no trace id, and the parent is unknown, so the trace id cannot
// be taken from it.
var ErrParentNotFound = errors.New("parent call not found")

// CallWriteError tells which write of a WriteCalls batch failed, so that the
// error can point at that item of the request.
type CallWriteError struct {
	Index int
	Err   error
}

func (e *CallWriteError) Error() string {
	return "write " + strconv.Itoa(e.Index) + ": " + e.Err.Error()
}

func (e *CallWriteError) Unwrap() error { return e.Err }

// Project is a team's (entity's) project, with the integer behind its
// opaque internal id.
type Project struct {
	ID     int64
	Entity string
	Name   string
}

// OpVersion is one version of an op: its source code, content digest and
// position among the op's versions.
type OpVersion struct {
	ObjectID     string
	Digest       string
	VersionIndex int
	CreatedAt    time.Time
	Code         string
}

// CallStart is the start of a call as ingested. An empty TraceID asks the
// store to take the parent's trace id.
type CallStart struct {
	ProjectID   int64
	ID          string
	OpName      string
	DisplayName *string
	TraceID     string
	ParentID    *string
	ThreadID    *string
	TurnID      *string
	StartedAt   time.Time
	// Attributes and Inputs are JSON objects.
	Attributes json.RawMessage
	Inputs     json.RawMessage
	SvcUserID  *string
	SvcRunID   *string
}

// CallEnd is the end of a call: it sets ended_at, exception, output and
// summary.
type CallEnd struct {
	ProjectID int64
	ID        string
	EndedAt   time.Time
	Exception *string
	// Output is any JSON value; nil stores null.
	Output json.RawMessage
	// Summary is a JSON object; nil stores {}.
	Summary json.RawMessage
	// DisplayName, when not nil, renames the call (the TypeScript SDK
	// sends the name a call ended with).
	DisplayName *string
	// Completion, for a call ingested from an OpenTelemetry span that
	// reports a completion (gen_ai.response.id), names it, so that the
	// gateway's call of that completion folds into this one; nil for
	// other calls, whose completion is read from Output.
	Completion *SpanCompletion
}

// SpanCompletion is the completion an ingested span reports.
type SpanCompletion struct {
	ID string
	// Created is the completion's own date (unix seconds) when the span
	// carries it, 0 otherwise.
	Created int64
	// StartedAt is the span's start; the end is the CallEnd's EndedAt.
	StartedAt time.Time
}

// CallWrite is one item of an ingest batch: exactly one of Start and End.
type CallWrite struct {
	Start *CallStart
	End   *CallEnd
}

// Call is a stored call.
type Call struct {
	ProjectID   int64
	ID          string
	OpName      string
	DisplayName *string
	TraceID     string
	ParentID    *string
	ThreadID    *string
	TurnID      *string
	StartedAt   time.Time
	EndedAt     *time.Time
	Exception   *string
	Attributes  json.RawMessage
	Inputs      json.RawMessage
	Output      json.RawMessage
	Summary     json.RawMessage
	SvcUserID   *string
	SvcRunID    *string
}

// UsageCall is what the trace usage roll-up needs of a selected call.
type UsageCall struct {
	ID       string
	ParentID string
	// Unfinished is true when the call has no ended_at.
	Unfinished bool
	// Usage is the call's summary.usage as JSON text; empty when absent.
	Usage string
	// SDK is true for a call a client's tracer logged (a Weave SDK or an
	// OpenTelemetry exporter, by attributes.weave.source), whose
	// summary.usage already holds children's; ChildUsage is then the
	// summary.usage of each of those children, selected or not.
	SDK        bool
	ChildUsage []string
	// Costs is the call's summary.weave.costs as JSON text, empty when
	// absent: the prices it was costed at, which include_costs honours.
	Costs string
}

// Store persists projects, ops and calls. *store.DB implements it. Methods
// that look one thing up return an error wrapping ErrNotFound when it does
// not exist.
type Store interface {
	// EnsureProject returns the project, creating it on first use.
	EnsureProject(ctx context.Context, entity, name string) (Project, error)
	// FindProject returns an existing project by entity and name.
	FindProject(ctx context.Context, entity, name string) (Project, error)
	// ProjectByID returns an existing project by its internal integer id.
	ProjectByID(ctx context.Context, id int64) (Project, error)

	// PutOpVersion stores code as a version of the op objectID: the same
	// code gives back the existing version, new code the next
	// version_index.
	PutOpVersion(ctx context.Context, projectID int64, objectID, code string, at time.Time) (OpVersion, error)
	// ListOpVersions lists the project's op versions that are not deleted,
	// by object_id ascending then version_index descending. limit < 0 means
	// no limit.
	ListOpVersions(ctx context.Context, projectID int64, limit, offset int) ([]OpVersion, error)
	// DeleteOp marks every version of the op deleted and returns how many
	// were.
	DeleteOp(ctx context.Context, projectID int64, objectID string, at time.Time) (int, error)

	// WriteCalls applies starts and ends in order, in one transaction, and
	// returns the trace id of each start ("" for ends). A start whose call
	// exists already is kept as it was (retries are idempotent). An end
	// whose call has not started yet is kept and applied when the start
	// arrives, as Weave's own server merges them. Failures are a
	// *CallWriteError wrapping ErrParentNotFound.
	WriteCalls(ctx context.Context, writes []CallWrite) ([]string, error)
	// ReadCall returns one call.
	ReadCall(ctx context.Context, projectID int64, id string) (Call, error)
	// QueryCalls calls fn for each call the query selects, in its order.
	QueryCalls(ctx context.Context, projectID int64, q CallsQuery, fn func(*Call) error) error
	// OpenCalls is QueryCalls as a cursor, for a caller that hands calls
	// on as its reader asks for them; it reads until closed, and ctx must
	// live as long.
	OpenCalls(ctx context.Context, projectID int64, q CallsQuery) (CallCursor, error)
	// FinishCall ends a call that has op_name opName: ended_at is set to at
	// unless the call ended already, summary (when not nil) is merged into
	// the call's summary as a JSON merge patch, and exception (when not nil)
	// is set.
	FinishCall(ctx context.Context, projectID int64, id, opName string, at time.Time, summary json.RawMessage, exception *string) error
	// TraceUsageCalls selects at most limit calls with filter and query, by
	// started_at then id, for the trace usage roll-up.
	TraceUsageCalls(ctx context.Context, projectID int64, filter *CallsFilter, query *Query, limit int) ([]UsageCall, error)

	CallStore
}

// CallStore edits, counts and deletes stored calls; it is part of Store.
type CallStore interface {
	// UpdateCall renames a call; an unknown call is an error wrapping
	// ErrNotFound.
	UpdateCall(ctx context.Context, projectID int64, id string, displayName string) error
	// DeleteCalls deletes the calls and all their descendants, and
	// returns how many calls it deleted.
	DeleteCalls(ctx context.Context, projectID int64, ids []string) (int, error)
	// CountCalls counts the calls filter and query select, at most limit
	// of them when limit >= 0.
	CountCalls(ctx context.Context, projectID int64, filter *CallsFilter, query *Query, limit int) (int, error)
	// CallsUsageCalls selects, for the usage roll-up, at most limit calls
	// of the traces the calls ids belong to, by started_at then id.
	CallsUsageCalls(ctx context.Context, projectID int64, ids []string, limit int) ([]UsageCall, error)
	// SetCallOutput replaces a call's output; an unknown call is an error
	// wrapping ErrNotFound.
	SetCallOutput(ctx context.Context, projectID int64, id string, output json.RawMessage) error
}

// CallCursor iterates the calls a query selects, in its order.
type CallCursor interface {
	// Next reads the next call into c; false at the end.
	Next(c *Call) (bool, error)
	// Close releases the cursor; it may be called at any point.
	Close() error
}
