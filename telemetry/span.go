package telemetry

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/internal/finish"
)

// The gateway's own attributes, beside the GenAI conventions'.
const (
	attrTeam       = attribute.Key("tollgate.team")
	attrProject    = attribute.Key("tollgate.project")
	attrKeyName    = attribute.Key("tollgate.key_name")
	attrBackend    = attribute.Key("tollgate.backend")
	attrRetries    = attribute.Key("tollgate.retries")
	attrCallID     = attribute.Key("tollgate.call_id")
	attrRequestID  = attribute.Key("tollgate.request_id")
	attrStream     = attribute.Key("tollgate.stream")
	attrModel      = attribute.Key("tollgate.model")
	attrError      = attribute.Key("tollgate.error")
	attrAttemptDur = attribute.Key("tollgate.attempt.duration_s")
)

// attemptEvent names the span event of a retried attempt.
const attemptEvent = "tollgate.attempt_failed"

// scopeName is the instrumentation scope of every span.
const scopeName = "github.com/tollgate-dev/tollgate"

// spanFlags are the OTLP flags of a sampled span: the W3C sampled flag,
// and that whether its parent is remote is known.
const spanFlags = uint32(trace.FlagsSampled) | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)

// operation is the GenAI operation of an endpoint, as Record.Endpoint
// names it, and the openai.api.type the OpenAI conventions give it (none
// for the endpoints they do not name). The Responses API is a chat
// operation of API type "responses".
func operation(endpoint string) (op attribute.KeyValue, apiType attribute.KeyValue, hasAPIType bool) {
	switch endpoint {
	case "completions":
		return semconv.GenAIOperationNameTextCompletion, attribute.KeyValue{}, false
	case "embeddings":
		return semconv.GenAIOperationNameEmbeddings, attribute.KeyValue{}, false
	case "responses":
		return semconv.GenAIOperationNameChat, semconv.OpenAIAPITypeResponses, true
	}
	return semconv.GenAIOperationNameChat, semconv.OpenAIAPITypeChatCompletions, true
}

// maxCachedNames bounds spanBuilder's caches: the models a gateway serves
// are few, but a record names the model its client asked for.
const maxCachedNames = 1024

// spanBuilder makes the OTLP spans of records straight into a batch of
// pdata spans that is reused from export to export, so that a span costs
// no allocation once the batch has grown to its size and its spans to the
// records' shapes. It is owned by the ring's consumer goroutine, unlocked.
type spanBuilder struct {
	sampler sdktrace.Sampler
	// servers gives a backend's server.address and server.port.
	servers func() map[string]server
	// parent is the client's span a record continues, as the sampler
	// reads it from parentCtx, which holds it once for all records.
	parent    parentSpan
	parentCtx context.Context
	// names caches "{operation} {model}".
	names map[spanName]string
	// statuses caches the text of HTTP statuses, error.type's values.
	statuses map[int]string
	// reasons holds the finish reasons of the span being built.
	reasons []string
	batch   *spanBatch
}

type spanName struct{ op, model string }

// parentSpan is the client's span as the sampler sees it.
type parentSpan struct {
	noop.Span
	sc trace.SpanContext
}

func (p *parentSpan) SpanContext() trace.SpanContext { return p.sc }

// newSpanBuilder makes spans into batches whose ResourceSpans describe
// res, in semconv's schema, with schemaURL the resource's; sampler decides
// which records get one.
func newSpanBuilder(sampler sdktrace.Sampler, res []attribute.KeyValue, resSchemaURL string, servers func() map[string]server) *spanBuilder {
	b := &spanBuilder{
		sampler:  sampler,
		servers:  servers,
		names:    make(map[spanName]string),
		statuses: make(map[int]string),
		reasons:  make([]string, 0, finish.Max),
	}
	b.parentCtx = trace.ContextWithSpan(context.Background(), &b.parent)
	b.batch = newSpanBatch(res, resSchemaURL)
	return b
}

// name is the span's name, "{operation} {model}", in valid UTF-8.
func (b *spanBuilder) name(op, model string) string {
	if n, ok := b.names[spanName{op, model}]; ok {
		return n
	}
	n := validUTF8(op + " " + model)
	if len(b.names) < maxCachedNames {
		b.names[spanName{op, model}] = n
	}
	return n
}

// status is code's text.
func (b *spanBuilder) status(code int) string {
	if s, ok := b.statuses[code]; ok {
		return s
	}
	s := strconv.Itoa(code)
	if len(b.statuses) < maxCachedNames {
		b.statuses[code] = s
	}
	return s
}

// build adds rec's span to the batch, if the sampler keeps it: a CLIENT
// span named "{operation} {model}", from rec.Started to rec.Ended, with
// rec.Span's ids (the trace id and span id the gateway sent the backend
// as its parent), a child of the client's span when it named one. It
// reports whether a span was added.
func (b *spanBuilder) build(rec *accounting.Record) bool {
	op, apiType, hasAPIType := operation(rec.Endpoint)
	name := b.name(op.Value.AsString(), rec.Model)
	ctx := context.Background()
	hasParent := rec.Span.ParentSpanID != ([8]byte{})
	if hasParent {
		flags := trace.FlagsSampled
		if rec.Span.NotSampled {
			flags = 0
		}
		b.parent.sc = trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: rec.Span.TraceID, SpanID: rec.Span.ParentSpanID, TraceFlags: flags, Remote: true})
		ctx = b.parentCtx
	}
	// The samplers tollgate offers decide by the parent and the trace id
	// only, so they are given no attributes.
	sampled := b.sampler.ShouldSample(sdktrace.SamplingParameters{
		ParentContext: ctx, TraceID: samplingTraceID(&rec.Span), Name: name, Kind: trace.SpanKindClient,
	}).Decision == sdktrace.RecordAndSample
	b.parent.sc = trace.SpanContext{}
	if !sampled {
		return false
	}

	bt := b.batch
	sp := bt.next()
	sp.SetTraceID(rec.Span.TraceID)
	sp.SetSpanID(rec.Span.SpanID)
	flags := spanFlags
	if hasParent {
		sp.SetParentSpanID(rec.Span.ParentSpanID)
		flags |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
	} else {
		sp.SetParentSpanID(pcommon.SpanID{})
	}
	sp.SetFlags(flags)
	sp.SetName(name)
	sp.SetKind(ptrace.SpanKindClient)
	sp.SetStartTimestamp(pcommon.Timestamp(unixNano(rec.Started.UnixNano())))
	sp.SetEndTimestamp(pcommon.Timestamp(unixNano(rec.Ended.UnixNano())))

	// The attributes every span has come first and the others after, in
	// a fixed order, so that spans of one shape in a row set each
	// attribute over the one at its place (see attrList.setOver).
	var attrs attrList
	attrs.constant(op)
	attrs.constant(semconv.GenAIProviderNameOpenAI)
	attrs.str(string(semconv.GenAIRequestModelKey), rec.Model)
	attrs.str(string(attrTeam), rec.Team)
	attrs.str(string(attrProject), rec.Project)
	attrs.str(string(attrKeyName), rec.KeyName)
	attrs.str(string(attrBackend), rec.Backend)
	attrs.str(string(attrCallID), rec.CallID)
	attrs.str(string(attrRequestID), rec.RequestID)
	if hasAPIType {
		attrs.constant(apiType)
	}
	if srv, ok := b.servers()[rec.Backend]; ok {
		attrs.trusted(string(semconv.ServerAddressKey), srv.address)
		attrs.int(string(semconv.ServerPortKey), srv.port)
	}
	if rec.TotalTokens > 0 || rec.Status >= 200 && rec.Status < 300 {
		attrs.int(string(semconv.GenAIUsageInputTokensKey), rec.PromptTokens)
		attrs.int(string(semconv.GenAIUsageOutputTokensKey), rec.CompletionTokens)
	}
	if rec.Backend != "" && rec.Status >= 200 && rec.Status < 300 {
		attrs.str(string(semconv.GenAIResponseModelKey), rec.ServedModel)
	}
	if rec.CompletionID != "" {
		attrs.str(string(semconv.GenAIResponseIDKey), rec.CompletionID)
	}
	if rec.FinishReasons.Len() > 0 {
		b.reasons = rec.FinishReasons.AppendStrings(b.reasons[:0])
		attrs.strings(string(semconv.GenAIResponseFinishReasonsKey), b.reasons)
	}
	// Each attribute is a part of a span's cost in its encoding and in the
	// collector: the two that would only restate their default (no retry,
	// not streamed) are left out, and an absent one means it.
	if rec.Stream {
		attrs.boolean(string(attrStream), true)
	}
	if len(rec.Attempts) > 0 {
		attrs.int(string(attrRetries), int64(len(rec.Attempts)))
	}
	st := sp.Status()
	if errType := b.errorType(rec); errType != "" {
		attrs.trusted(string(semconv.ErrorTypeKey), errType)
		st.SetCode(ptrace.StatusCodeError)
		st.SetMessage(validUTF8(rec.Error))
	} else {
		st.SetCode(ptrace.StatusCodeUnset)
		st.SetMessage("")
	}
	attrs.setOver(sp.Attributes())

	evs := sp.Events()
	for i := range rec.Attempts {
		a := &rec.Attempts[i]
		var ev ptrace.SpanEvent
		if i < evs.Len() {
			ev = evs.At(i)
		} else {
			ev = evs.AppendEmpty()
		}
		ev.SetName(attemptEvent)
		ev.SetTimestamp(pcommon.Timestamp(unixNano(a.Ended.UnixNano())))
		attrs.n = 0
		attrs.str(string(attrBackend), a.Backend)
		attrs.str(string(attrModel), a.Model)
		attrs.trusted(string(semconv.ErrorTypeKey), b.status(a.Status))
		attrs.str(string(attrError), a.Error)
		attrs.double(string(attrAttemptDur), a.Ended.Sub(a.Started).Seconds())
		attrs.setOver(ev.Attributes())
	}
	if evs.Len() > len(rec.Attempts) {
		i := 0
		evs.RemoveIf(func(ptrace.SpanEvent) bool { i++; return i > len(rec.Attempts) })
	}
	return true
}

// samplingTraceID is the trace id the sampler decides on. The ratio
// samplers read bytes 8 to 15 of a trace id as a random number, as a W3C
// trace id's are; a UUID's open with its variant bits, 10, which would keep
// every trace out below a ratio of one half and let every one in above
// three quarters. So for a UUID, the 62 bits after them, random in a call
// id as in UUIDs of versions 4 and 7, are read in their place.
func samplingTraceID(sp *accounting.SpanContext) trace.TraceID {
	id := trace.TraceID(sp.TraceID)
	if sp.UUIDTraceID {
		binary.BigEndian.PutUint64(id[8:], binary.BigEndian.Uint64(id[8:])<<2)
	}
	return id
}

// maxSpanAttrs is the most attributes a span has.
const maxSpanAttrs = 20

// errorType is the span's error.type: the status answered, for a request
// that failed with one; for a stream that failed after its 200, how it
// ended, as the usage API's group_by=status names it; "" on success.
func (b *spanBuilder) errorType(rec *accounting.Record) string {
	switch {
	case rec.Status >= 400 || rec.Status != 0 && rec.Status < 200:
		return b.status(rec.Status)
	case rec.Error == "":
		return ""
	case rec.Incomplete && strings.HasPrefix(rec.Error, "client closed"):
		return "client_closed"
	case rec.Incomplete:
		return "stream_broken"
	}
	return "server_error"
}

// unixNano is a timestamp as OTLP has it, a time before 1970 as 0.
func unixNano(ns int64) uint64 { return uint64(max(0, ns)) } //nolint:gosec // not negative

// spanBatch is the spans of one export: one ResourceSpans of one
// ScopeSpans, as pdata's Traces, which encodes them with generated code,
// no reflection. The Traces is kept from batch to batch, and so are its
// spans: the next batch's spans are set over them, attribute by
// attribute, which reuses each value's message, so that a span costs no
// allocation once the batch has grown to its size and its spans to their
// shape.
type spanBatch struct {
	traces ptrace.Traces
	spans  ptrace.SpanSlice
	// n is the number of spans of the batch: the first n of spans.
	n int
	// rs carries the encoded ResourceSpans to the OTLP client, as its
	// unknown fields; list holds it.
	rs   tracepb.ResourceSpans
	list [1]*tracepb.ResourceSpans
}

// newSpanBatch makes a batch of spans whose resource has the attributes
// res, in the schema resSchemaURL.
func newSpanBatch(res []attribute.KeyValue, resSchemaURL string) *spanBatch {
	bt := &spanBatch{traces: ptrace.NewTraces()}
	rs := bt.traces.ResourceSpans().AppendEmpty()
	rs.SetSchemaUrl(resSchemaURL)
	attrs := rs.Resource().Attributes()
	attrs.EnsureCapacity(len(res))
	for _, kv := range res {
		putValue(attrs.PutEmpty(string(kv.Key)), kv.Value)
	}
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName(scopeName)
	ss.SetSchemaUrl(semconv.SchemaURL)
	bt.spans = ss.Spans()
	return bt
}

// len is the number of spans in the batch.
func (bt *spanBatch) len() int { return bt.n }

// next is the batch's next span: an earlier batch's, to be set over, or
// a new one.
func (bt *spanBatch) next() ptrace.Span {
	bt.n++
	if bt.n <= bt.spans.Len() {
		return bt.spans.At(bt.n - 1)
	}
	return bt.spans.AppendEmpty()
}

// resourceSpans is the batch as the OTLP client takes it: a ResourceSpans
// whose unknown fields are pdata's encoding of the batch's ResourceSpans,
// which protobuf's encoding writes as they are. It is valid until the
// next call.
func (bt *spanBatch) resourceSpans() ([]*tracepb.ResourceSpans, error) {
	if bt.spans.Len() > bt.n {
		i := 0
		bt.spans.RemoveIf(func(ptrace.Span) bool { i++; return i > bt.n })
	}
	data, err := (&ptrace.ProtoMarshaler{}).MarshalTraces(bt.traces)
	if err != nil {
		return nil, fmt.Errorf("encoding spans: %w", err)
	}
	// data is a TracesData: its one field, resource_spans, once.
	num, typ, n := protowire.ConsumeTag(data)
	if n < 0 || num != 1 || typ != protowire.BytesType {
		return nil, errors.New("encoding spans: no resource_spans")
	}
	fields, m := protowire.ConsumeBytes(data[n:])
	if m < 0 || n+m != len(data) {
		return nil, errors.New("encoding spans: not one resource_spans")
	}
	bt.rs.ProtoReflect().SetUnknown(fields)
	bt.list[0] = &bt.rs
	return bt.list[:], nil
}

// reset empties the batch; it keeps the resource, the scope and the
// spans, to be set over, but clears their strings, so that no record's
// stays reachable.
func (bt *spanBatch) reset() {
	for i := range min(bt.n, bt.spans.Len()) {
		sp := bt.spans.At(i)
		sp.SetName("")
		sp.Status().SetMessage("")
		clearStrings(sp.Attributes())
		for _, ev := range sp.Events().All() {
			clearStrings(ev.Attributes())
		}
	}
	bt.n = 0
	bt.rs.ProtoReflect().SetUnknown(nil)
}

// clearStrings empties m's string values, and those of its arrays.
func clearStrings(m pcommon.Map) {
	for _, v := range m.All() {
		switch v.Type() {
		case pcommon.ValueTypeStr:
			v.SetStr("")
		case pcommon.ValueTypeSlice:
			for _, e := range v.Slice().All() {
				e.SetStr("")
			}
		}
	}
}

// putValue sets dst to v, of any type, as the resource's values are.
func putValue(dst pcommon.Value, v attribute.Value) {
	switch v.Type() {
	case attribute.BOOL:
		dst.SetBool(v.AsBool())
	case attribute.INT64:
		dst.SetInt(v.AsInt64())
	case attribute.FLOAT64:
		dst.SetDouble(v.AsFloat64())
	case attribute.STRING:
		dst.SetStr(validUTF8(v.AsString()))
	case attribute.BOOLSLICE:
		s := dst.SetEmptySlice()
		for _, b := range v.AsBoolSlice() {
			s.AppendEmpty().SetBool(b)
		}
	case attribute.INT64SLICE:
		s := dst.SetEmptySlice()
		for _, i := range v.AsInt64Slice() {
			s.AppendEmpty().SetInt(i)
		}
	case attribute.FLOAT64SLICE:
		s := dst.SetEmptySlice()
		for _, f := range v.AsFloat64Slice() {
			s.AppendEmpty().SetDouble(f)
		}
	case attribute.STRINGSLICE:
		s := dst.SetEmptySlice()
		for _, str := range v.AsStringSlice() {
			s.AppendEmpty().SetStr(validUTF8(str))
		}
	}
}

// validUTF8 is s with each invalid byte sequence replaced by U+FFFD.
// Protobuf strings must be UTF-8: the client refuses to encode a batch
// holding one that is not (a model name a client sent, say), which would
// lose every span of the batch.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
