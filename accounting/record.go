// Package accounting records token usage per team and project, enforces
// rate limits and token budgets, and defines the store it needs.
package accounting

import (
	"time"

	"github.com/tollgate-dev/tollgate/internal/finish"
)

// Record is one chat completion as the gateway saw it: who asked, which
// model and backend served it, and exactly how many tokens it used.
//
// The proxy fills a Record once the reply (or stream) is over and hands it
// to a Recorder; the Recorder persists it asynchronously.
type Record struct {
	// RequestID is the X-Request-Id returned to the client.
	RequestID string
	// CallID, TraceID and ParentID place the completion in a trace. CallID
	// and TraceID are always set; ParentID is empty for a root call.
	CallID   string
	TraceID  string
	ParentID string
	// Span is the request's place in W3C trace context: the span the
	// gateway exports for it (when OpenTelemetry export is on) and names
	// to the backend as its parent.
	Span SpanContext
	// Attempts are the upstream attempts that failed and were retried, on
	// another backend or a fallback model, in order; nil when none was.
	// The attempt that ended the request is described by the record
	// itself (Backend, ServedModel, Status, Error).
	Attempts []Attempt

	// KeyName is the name of the API key used, never the secret.
	KeyName string
	Team    string
	Project string
	// Model is the public model id the client asked for.
	Model string
	// ServedModel is the public id of the model that actually served the
	// request; it differs from Model only after a fallback.
	ServedModel string
	// Backend is the name of the backend that served the request; empty
	// when no backend was reached.
	Backend string
	// CompletionID is the id of the completion the client was given (the
	// reply's "id"), by which a Weave SDK's trace of the same completion
	// is joined to the gateway's call; empty when no reply carried one.
	CompletionID string
	// CompletionCreated is the unix second the backend dated that
	// completion with (its "created", "created_at" for a response; of a
	// stream, the last chunk's that is not 0, as the Weave SDK keeps it):
	// the join's key leads with it, so that links of one second are
	// written together. 0 means the completion carried no date.
	CompletionCreated int64
	// Endpoint is the endpoint called: "chat.completions", "completions",
	// "embeddings", "responses", or Anthropic's "messages" and
	// "messages.count_tokens". Empty means
	// "chat.completions" (records made before endpoints were told apart).
	Endpoint string

	// Status is the HTTP status returned to the client. A stream that
	// failed after its first byte keeps status 200 and sets Error.
	Status int
	// Error describes a failure (an upstream error, an in-band stream
	// error, a timeout); empty on success.
	Error string
	// Stream is true for a streamed completion.
	Stream bool
	// Incomplete marks a stream the client abandoned or the backend broke
	// off: its counts are what was seen until then.
	Incomplete bool
	// FinishReasons are why the model stopped generating, as the backend
	// reported it: each choice's finish_reason, a Messages API reply's
	// stop_reason, or a response's status (see finish.ResponseReason);
	// none when no reply or final event gave one.
	FinishReasons finish.Reasons

	PromptTokens     int64
	CompletionTokens int64
	TotalTokens      int64
	// CachedTokens are the prompt tokens read from the backend's prompt
	// cache (OpenAI's cached_tokens, Anthropic's cache_read_input_tokens),
	// and CacheWriteTokens those written to it (Anthropic's
	// cache_creation_input_tokens): both are part of PromptTokens, told
	// apart so that they can be priced apart. Zero means the backend
	// reported none.
	CachedTokens     int64
	CacheWriteTokens int64

	Started time.Time
	Ended   time.Time

	// Input and Output hold the request body and the reply (or the
	// concatenated streamed content) only when traces.store_payloads is on.
	Input  []byte
	Output []byte

	// Hold is what an admission beyond the configured limits (an Admin
	// API project's rate and spend limits) reserved for the request; the
	// Recorder settles it with the record's counts. Nil when nothing was.
	Hold Hold
}

// ClearTokens sets every token count of r to 0: a record charged nothing.
func (r *Record) ClearTokens() {
	r.PromptTokens, r.CompletionTokens, r.TotalTokens, r.CachedTokens, r.CacheWriteTokens = 0, 0, 0, 0, 0
}

// Hold is a reservation an admission made for one request, settled once
// with the request's record.
type Hold interface {
	Settle(rec *Record)
}

// SpanContext is a request's span in W3C trace context (trace ids of 16
// bytes, span ids of 8), as the traceparent header carries it.
type SpanContext struct {
	// TraceID is the trace's id: the client's traceparent's, else
	// Record.TraceID's when that is a UUID (a call id, or a
	// Compat-Trace-Id in that form), else derived from Record.TraceID.
	TraceID [16]byte
	// SpanID is the gateway's span for the request, the parent the
	// backend is given in traceparent: the last 8 bytes of the call id.
	SpanID [8]byte
	// ParentSpanID is the client's span: its traceparent's parent id, or
	// a Compat-Parent-Id of 16 hex digits. Zero means the span has no
	// parent.
	ParentSpanID [8]byte
	// NotSampled says the client's traceparent had its sampled flag off.
	// Zero (false) means it was on, or there was no traceparent.
	NotSampled bool
	// UUIDTraceID says TraceID is a UUID's bytes (a call id, or a
	// Compat-Trace-Id in UUID form), whose bytes 8 to 15 open with the
	// UUID's two variant bits where a W3C trace id's are random. False
	// means a traceparent's id, 32 hex digits, or a hash.
	UUIDTraceID bool
}

// Attempt is one upstream attempt that failed and was retried.
type Attempt struct {
	// Backend is the backend tried, Model the public id of the model it
	// was tried for (a fallback's, after a fallback).
	Backend string
	Model   string
	// Status is the status the attempt would have answered the client
	// with, Error what went wrong.
	Status int
	Error  string
	// Started is when the request was sent, Ended when the attempt failed.
	Started time.Time
	Ended   time.Time
}

// Subject names whose usage a request counts against.
type Subject struct {
	Team    string
	Project string
	Key     string
}
