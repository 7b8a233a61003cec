package telemetry

import (
	"context"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

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
// protos that is reused from export to export, so that a span costs no
// allocation once the batch has grown to its size. It is owned by the
// ring's consumer goroutine, unlocked.
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
	batch   spanBatch
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
func newSpanBuilder(sampler sdktrace.Sampler, res []*commonpb.KeyValue, resSchemaURL string, servers func() map[string]server) *spanBuilder {
	b := &spanBuilder{
		sampler:  sampler,
		servers:  servers,
		names:    make(map[spanName]string),
		statuses: make(map[int]string),
		reasons:  make([]string, 0, finish.Max),
	}
	b.parentCtx = trace.ContextWithSpan(context.Background(), &b.parent)
	b.batch.ss.Scope = &commonpb.InstrumentationScope{Name: scopeName}
	b.batch.ss.SchemaUrl = semconv.SchemaURL
	b.batch.rs.Resource = &resourcepb.Resource{Attributes: res}
	b.batch.rs.SchemaUrl = resSchemaURL
	b.batch.rs.ScopeSpans = []*tracepb.ScopeSpans{&b.batch.ss}
	b.batch.list[0] = &b.batch.rs
	return b
}

// name is the span's name, "{operation} {model}".
func (b *spanBuilder) name(op, model string) string {
	if n, ok := b.names[spanName{op, model}]; ok {
		return n
	}
	n := op + " " + model
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
		ParentContext: ctx, TraceID: rec.Span.TraceID, Name: name, Kind: trace.SpanKindClient,
	}).Decision == sdktrace.RecordAndSample
	b.parent.sc = trace.SpanContext{}
	if !sampled {
		return false
	}

	bt := &b.batch
	s := bt.spans.next()
	sp := &s.span
	copy(s.ids[:16], rec.Span.TraceID[:])
	copy(s.ids[16:24], rec.Span.SpanID[:])
	sp.TraceId, sp.SpanId = s.ids[:16:16], s.ids[16:24:24]
	sp.Flags = spanFlags
	if hasParent {
		copy(s.ids[24:], rec.Span.ParentSpanID[:])
		sp.ParentSpanId = s.ids[24:32:32]
		sp.Flags |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
	}
	sp.Name = validUTF8(name)
	sp.Kind = tracepb.Span_SPAN_KIND_CLIENT
	sp.StartTimeUnixNano = unixNano(rec.Started.UnixNano())
	sp.EndTimeUnixNano = unixNano(rec.Ended.UnixNano())
	sp.Status = &s.status

	start := len(bt.kvPtrs)
	bt.attr(op)
	bt.attr(semconv.GenAIProviderNameOpenAI)
	bt.attr(semconv.GenAIRequestModel(rec.Model))
	if hasAPIType {
		bt.attr(apiType)
	}
	if srv, ok := b.servers()[rec.Backend]; ok {
		bt.attr(srv.address)
		bt.attr(srv.port)
	}
	if rec.Backend != "" && rec.Status >= 200 && rec.Status < 300 {
		bt.attr(semconv.GenAIResponseModel(rec.ServedModel))
	}
	if rec.CompletionID != "" {
		bt.attr(semconv.GenAIResponseID(rec.CompletionID))
	}
	if rec.FinishReasons.Len() > 0 {
		b.reasons = rec.FinishReasons.AppendStrings(b.reasons[:0])
		bt.stringArray(semconv.GenAIResponseFinishReasonsKey, b.reasons)
	}
	if rec.TotalTokens > 0 || rec.Status >= 200 && rec.Status < 300 {
		bt.attr(semconv.GenAIUsageInputTokens(int(rec.PromptTokens)))
		bt.attr(semconv.GenAIUsageOutputTokens(int(rec.CompletionTokens)))
	}
	bt.attr(attrTeam.String(rec.Team))
	bt.attr(attrProject.String(rec.Project))
	bt.attr(attrKeyName.String(rec.KeyName))
	bt.attr(attrBackend.String(rec.Backend))
	bt.attr(attrCallID.String(rec.CallID))
	bt.attr(attrRequestID.String(rec.RequestID))
	// Each attribute is a part of a span's cost in its encoding and in the
	// collector: the two that would only restate their default (no retry,
	// not streamed) are left out, and an absent one means it.
	if len(rec.Attempts) > 0 {
		bt.attr(attrRetries.Int(len(rec.Attempts)))
	}
	if rec.Stream {
		bt.attr(attrStream.Bool(true))
	}
	if errType := b.errorType(rec); errType != "" {
		bt.attr(semconv.ErrorTypeKey.String(errType))
		s.status.Code = tracepb.Status_STATUS_CODE_ERROR
		s.status.Message = validUTF8(rec.Error)
	}
	sp.Attributes = bt.kvPtrs[start:len(bt.kvPtrs):len(bt.kvPtrs)]

	if len(rec.Attempts) > 0 {
		evStart := len(bt.evPtrs)
		for i := range rec.Attempts {
			a := &rec.Attempts[i]
			ev := bt.events.next()
			ev.Name = attemptEvent
			ev.TimeUnixNano = unixNano(a.Ended.UnixNano())
			kvStart := len(bt.kvPtrs)
			bt.attr(attrBackend.String(a.Backend))
			bt.attr(attrModel.String(a.Model))
			bt.attr(semconv.ErrorTypeKey.String(b.status(a.Status)))
			bt.attr(attrError.String(a.Error))
			bt.attr(attrAttemptDur.Float64(a.Ended.Sub(a.Started).Seconds()))
			ev.Attributes = bt.kvPtrs[kvStart:len(bt.kvPtrs):len(bt.kvPtrs)]
			bt.evPtrs = append(bt.evPtrs, ev)
		}
		sp.Events = bt.evPtrs[evStart:len(bt.evPtrs):len(bt.evPtrs)]
	}
	bt.ss.Spans = append(bt.ss.Spans, sp)
	return true
}

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

// spanBatch is the spans of one export as the OTLP client takes them: one
// ResourceSpans of one ScopeSpans. Every message is taken from an arena
// that reset empties and keeps, so the next batch reuses them.
type spanBatch struct {
	list [1]*tracepb.ResourceSpans
	rs   tracepb.ResourceSpans
	ss   tracepb.ScopeSpans

	spans  arena[spanSlot]
	events arena[tracepb.Span_Event]
	kvs    arena[commonpb.KeyValue]
	vals   arena[commonpb.AnyValue]
	strs   arena[commonpb.AnyValue_StringValue]
	ints   arena[commonpb.AnyValue_IntValue]
	floats arena[commonpb.AnyValue_DoubleValue]
	bools  arena[commonpb.AnyValue_BoolValue]
	arrays arena[arraySlot]
	// kvPtrs, valPtrs and evPtrs hold the slices the messages point to:
	// each span's attributes (then each of its events') are a run of
	// kvPtrs, and so on. When one grows, the spans already built keep
	// the array they were given.
	kvPtrs  []*commonpb.KeyValue
	valPtrs []*commonpb.AnyValue
	evPtrs  []*tracepb.Span_Event
}

// spanSlot is a span with the messages and ids it points to.
type spanSlot struct {
	span   tracepb.Span
	status tracepb.Status
	// ids holds the trace id, span id and parent span id.
	ids [32]byte
}

// arraySlot is an array value with its wrapper.
type arraySlot struct {
	wrap  commonpb.AnyValue_ArrayValue
	array commonpb.ArrayValue
}

// len is the number of spans in the batch.
func (bt *spanBatch) len() int { return len(bt.ss.Spans) }

// resourceSpans is the batch as the OTLP client takes it; valid until
// reset.
func (bt *spanBatch) resourceSpans() []*tracepb.ResourceSpans { return bt.list[:] }

// reset empties the batch, keeping its messages for the next one; none
// keeps a record's strings reachable.
func (bt *spanBatch) reset() {
	clear(bt.ss.Spans)
	bt.ss.Spans = bt.ss.Spans[:0]
	clear(bt.kvPtrs)
	bt.kvPtrs = bt.kvPtrs[:0]
	clear(bt.valPtrs)
	bt.valPtrs = bt.valPtrs[:0]
	clear(bt.evPtrs)
	bt.evPtrs = bt.evPtrs[:0]
	bt.spans.reset()
	bt.events.reset()
	bt.kvs.reset()
	bt.vals.reset()
	bt.strs.reset()
	bt.ints.reset()
	bt.floats.reset()
	bt.bools.reset()
	bt.arrays.reset()
}

// attr appends kv to kvPtrs. Only the scalar types are mapped; the one
// array attribute is added by stringArray.
func (bt *spanBatch) attr(kv attribute.KeyValue) {
	p := bt.kvs.next()
	p.Key = string(kv.Key)
	p.Value = bt.value(kv.Value)
	bt.kvPtrs = append(bt.kvPtrs, p)
}

func (bt *spanBatch) value(v attribute.Value) *commonpb.AnyValue {
	a := bt.vals.next()
	switch v.Type() {
	case attribute.STRING:
		w := bt.strs.next()
		w.StringValue = validUTF8(v.AsString())
		a.Value = w
	case attribute.INT64:
		w := bt.ints.next()
		w.IntValue = v.AsInt64()
		a.Value = w
	case attribute.FLOAT64:
		w := bt.floats.next()
		w.DoubleValue = v.AsFloat64()
		a.Value = w
	case attribute.BOOL:
		w := bt.bools.next()
		w.BoolValue = v.AsBool()
		a.Value = w
	}
	return a
}

// stringArray appends a string array attribute to kvPtrs.
func (bt *spanBatch) stringArray(key attribute.Key, ss []string) {
	start := len(bt.valPtrs)
	for _, s := range ss {
		w := bt.strs.next()
		w.StringValue = validUTF8(s)
		a := bt.vals.next()
		a.Value = w
		bt.valPtrs = append(bt.valPtrs, a)
	}
	arr := bt.arrays.next()
	arr.array.Values = bt.valPtrs[start:len(bt.valPtrs):len(bt.valPtrs)]
	arr.wrap.ArrayValue = &arr.array
	a := bt.vals.next()
	a.Value = &arr.wrap
	p := bt.kvs.next()
	p.Key = string(key)
	p.Value = a
	bt.kvPtrs = append(bt.kvPtrs, p)
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

// arenaChunk is how many values an arena allocates at a time.
const arenaChunk = 256

// arena hands out values from chunks it keeps: reset zeroes the values
// handed out and hands them out again.
type arena[T any] struct {
	chunks [][]T
	// c and i are the chunk and index of the next value.
	c, i int
}

func (a *arena[T]) next() *T {
	if a.c < len(a.chunks) && a.i == len(a.chunks[a.c]) {
		a.c, a.i = a.c+1, 0
	}
	if a.c == len(a.chunks) {
		a.chunks = append(a.chunks, make([]T, arenaChunk))
	}
	p := &a.chunks[a.c][a.i]
	a.i++
	return p
}

func (a *arena[T]) reset() {
	for k := range a.c {
		clear(a.chunks[k])
	}
	if a.c < len(a.chunks) {
		clear(a.chunks[a.c][:a.i])
	}
	a.c, a.i = 0, 0
}

// keyValues is attrs as OTLP has them, the resource's, made once.
func keyValues(attrs []attribute.KeyValue) []*commonpb.KeyValue {
	kvs := make([]*commonpb.KeyValue, 0, len(attrs))
	for _, kv := range attrs {
		kvs = append(kvs, &commonpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return kvs
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.BOOLSLICE:
		return array(v.AsBoolSlice(), func(b bool) attribute.Value { return attribute.BoolValue(b) })
	case attribute.INT64SLICE:
		return array(v.AsInt64Slice(), func(i int64) attribute.Value { return attribute.Int64Value(i) })
	case attribute.FLOAT64SLICE:
		return array(v.AsFloat64Slice(), func(f float64) attribute.Value { return attribute.Float64Value(f) })
	case attribute.STRINGSLICE:
		return array(v.AsStringSlice(), func(s string) attribute.Value { return attribute.StringValue(s) })
	}
	return &commonpb.AnyValue{}
}

func array[T any](vs []T, value func(T) attribute.Value) *commonpb.AnyValue {
	arr := &commonpb.ArrayValue{Values: make([]*commonpb.AnyValue, 0, len(vs))}
	for _, v := range vs {
		arr.Values = append(arr.Values, anyValue(value(v)))
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: arr}}
}
