// Package weave is the W&B Weave trace-server domain beside calls (which
// are package trace's): object
// versions (ops among them), tables of rows, files, feedback and a
// project's own prices, with Weave's digests and refs. It holds the types
// and the Store contract; it knows nothing of HTTP (admin parses and
// renders) nor of SQL (store implements Store).
package weave

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// ErrNotFound is returned by a Store when the object version, table, row,
// file or feedback asked for does not exist.
var ErrNotFound = errors.New("not found")

// ErrDeleted is returned by Store.ReadObject when the version asked for
// exists but was deleted.
var ErrDeleted = errors.New("deleted")

// The kinds of object.
const (
	KindOp     = "op"
	KindObject = "object"
)

// Object is one stored version of an object.
type Object struct {
	ProjectID    int64
	ObjectID     string
	Digest       string
	VersionIndex int
	// IsLatest is true for the live version with the highest index.
	IsLatest bool
	// Kind is KindOp or KindObject.
	Kind string
	// BaseObjectClass and LeafObjectClass are nil for values that are not
	// weave.Object (or BaseObject) subclasses.
	BaseObjectClass *string
	LeafObjectClass *string
	// Val is the value as compact JSON; nil when only metadata was read.
	Val       json.RawMessage
	SizeBytes int64
	CreatedAt time.Time
	DeletedAt *time.Time
	WBUserID  *string
}

// ObjectWrite is a value to store as a version of an object.
type ObjectWrite struct {
	ProjectID       int64
	ObjectID        string
	Digest          string
	Kind            string
	BaseObjectClass *string
	LeafObjectClass *string
	Val             json.RawMessage
	// OpCodeDigest, for an op, is the digest of the file holding its
	// source code: the store copies that code into the op listing.
	OpCodeDigest string
	WBUserID     *string
	At           time.Time
}

// Version selectors of ReadObject and DeleteObjects besides a digest.
const (
	// Latest selects the live version with the highest index.
	Latest = "latest"
)

// FeedbackQuery selects a page of a project's feedback.
type FeedbackQuery struct {
	// Refs keeps the feedback on these weave refs; nil keeps all, empty
	// none.
	Refs []string
	// Limit < 0 means no limit.
	Limit  int
	Offset int
}

// ObjectQuery selects object versions of a project.
type ObjectQuery struct {
	ObjectIDs                []string
	BaseObjectClasses        []string
	ExcludeBaseObjectClasses []string
	LeafObjectClasses        []string
	// IsOp, when set, keeps only ops (true) or only other objects (false).
	IsOp *bool
	// LatestOnly keeps each object's latest version only.
	LatestOnly bool
	// SortBy is a list of ObjectSort; empty means object_id then
	// version_index ascending.
	SortBy []ObjectSort
	// Limit < 0 means no limit.
	Limit, Offset int
	// MetadataOnly leaves Val nil.
	MetadataOnly bool
}

// ObjectSort orders an object listing by Field, one of the fields
// IsObjectSortField accepts.
type ObjectSort struct {
	Field string
	Desc  bool
}

// ObjectSortFieldNames names the fields object listings sort by, for
// error messages.
const ObjectSortFieldNames = "object_id, created_at, version_index"

// IsObjectSortField reports whether object listings sort by field.
func IsObjectSortField(field string) bool {
	switch field {
	case "object_id", "created_at", "version_index":
		return true
	}
	return false
}

// TableRow is one row of a table: its digest and value.
type TableRow struct {
	Digest string
	Val    json.RawMessage
}

// File is a stored file.
type File struct {
	Digest  string
	Content []byte
}

// Feedback is one feedback item on a ref (a call, an object version).
type Feedback struct {
	ProjectID    int64
	ID           string
	WeaveRef     string
	WBUserID     string
	Creator      *string
	CreatedAt    time.Time
	FeedbackType string
	// Payload is a JSON object.
	Payload       json.RawMessage
	AnnotationRef *string
	RunnableRef   *string
	CallRef       *string
	TriggerRef    *string
}

// Cost is a project's price for one model (llm_id), per token, from its
// effective date on.
type Cost struct {
	ProjectID               int64
	ID                      string
	LLMID                   string
	PromptTokenCost         float64
	CompletionTokenCost     float64
	PromptTokenCostUnit     string
	CompletionTokenCostUnit string
	EffectiveDate           time.Time
	ProviderID              string
	CreatedAt               time.Time
	CreatedBy               string
}

// Price is what one token of a model costs a project, in the unit of its
// Cost (USD unless set otherwise).
type Price struct {
	PromptTokenCost     float64
	CompletionTokenCost float64
}

// Store persists objects, tables, files, feedback and costs. *store.DB
// implements it. Every method is scoped to one project; lookups of what
// does not exist return an error wrapping ErrNotFound.
type Store interface {
	// PutObject stores a version of an object. The same digest again
	// returns the existing version (restored, as the newest version, if it
	// was deleted); a new digest takes the next version_index.
	PutObject(ctx context.Context, w ObjectWrite) (Object, error)
	// ReadObject reads one version: version is a digest, Latest, or
	// "v<index>". A deleted version is ErrDeleted.
	ReadObject(ctx context.Context, projectID int64, objectID, version string) (Object, error)
	// QueryObjects calls fn for each live object version q selects, in
	// its order, reading them as fn takes them; fn's error ends the query
	// and is returned.
	QueryObjects(ctx context.Context, projectID int64, q ObjectQuery, fn func(*Object) error) error
	// DeleteObjects marks versions deleted (every live one when versions
	// is empty; each element as in ReadObject) and returns how many.
	// ErrNotFound when a version named is not a live one.
	DeleteObjects(ctx context.Context, projectID int64, objectID string, versions []string, at time.Time) (int, error)

	// PutTable stores a table: its digest, its rows' digests in order,
	// and the values of rows the store may not hold yet (rows already held
	// are kept as they are).
	PutTable(ctx context.Context, projectID int64, digest string, rowDigests []string, rows []TableRow) error
	// TableRowDigests returns a table's row digests in order.
	TableRowDigests(ctx context.Context, projectID int64, digest string) ([]string, error)
	// TableRowCount returns how many rows a table has, without reading
	// its row digests.
	TableRowCount(ctx context.Context, projectID int64, digest string) (int, error)
	// TableRows returns the values of the rows with the given digests.
	TableRows(ctx context.Context, projectID int64, rowDigests []string) (map[string]json.RawMessage, error)
	// EachTableRow calls fn with the digest and value of each row of
	// rowDigests the store holds, in no particular order, one row at a
	// time; fn's error ends the read and is returned.
	EachTableRow(ctx context.Context, projectID int64, rowDigests []string, fn func(digest string, val json.RawMessage) error) error

	// PutFile stores a file under its digest; storing it again is a no-op.
	PutFile(ctx context.Context, projectID int64, f File) error
	// ReadFile returns a file's content.
	ReadFile(ctx context.Context, projectID int64, digest string) ([]byte, error)

	// PutFeedback stores a new feedback item.
	PutFeedback(ctx context.Context, f Feedback) error
	// QueryFeedback calls fn for each feedback item q selects, oldest
	// first, reading no more than the page asks for; fn's error ends the
	// query and is returned.
	QueryFeedback(ctx context.Context, projectID int64, q FeedbackQuery, fn func(*Feedback) error) error
	// DeleteFeedback deletes feedback by id and returns how many were.
	DeleteFeedback(ctx context.Context, projectID int64, ids []string) (int, error)
	// ReplaceFeedback deletes the feedback oldID and stores f, atomically;
	// ErrNotFound when oldID does not exist.
	ReplaceFeedback(ctx context.Context, oldID string, f Feedback) error

	// PutCosts stores a project's prices.
	PutCosts(ctx context.Context, costs []Cost) error
	// ListCosts returns the project's prices, oldest first.
	ListCosts(ctx context.Context, projectID int64) ([]Cost, error)
	// DeleteCosts deletes prices by id and returns how many were.
	DeleteCosts(ctx context.Context, projectID int64, ids []string) (int, error)
	// ProjectPrices returns, by llm_id, the project's price in effect at
	// at: the one with the latest effective date not after at (the latest
	// created among equals). Models without a price of the project are
	// absent, so that the gateway's configured pricing applies to them.
	ProjectPrices(ctx context.Context, projectID int64, at time.Time) (map[string]Price, error)
}
