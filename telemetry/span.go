package telemetry

import (
	"context"
	"math"
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

// spanBuilder encodes the OTLP spans of records straight into a batch
// (see spanBatch), with no message per span or attribute, so that a span
// costs no allocation once the batch has grown to its size. It is owned
// by the ring's consumer goroutine, unlocked.
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
	// span and event hold the encoding of the span, and of the event,
	// being built.
	span, event []byte
	batch       spanBatch
}

type spanName struct{ op, model string }

// parentSpan is the client's span as the sampler sees it.
type parentSpan struct {
	noop.Span
	sc trace.SpanContext
}

func (p *parentSpan) SpanContext() trace.SpanContext { return p.sc }

// newSpanBuilder makes spans into batches whose ResourceSpans describe
// res, with resSchemaURL the resource's schema; sampler decides which
// records get one.
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
		ParentContext: ctx, TraceID: rec.Span.TraceID, Name: name, Kind: trace.SpanKindClient,
	}).Decision == sdktrace.RecordAndSample
	b.parent.sc = trace.SpanContext{}
	if !sampled {
		return false
	}

	sp := b.span[:0]
	sp = appendBytes(sp, fieldSpanTraceID, rec.Span.TraceID[:])
	sp = appendBytes(sp, fieldSpanSpanID, rec.Span.SpanID[:])
	flags := spanFlags
	if hasParent {
		sp = appendBytes(sp, fieldSpanParentSpanID, rec.Span.ParentSpanID[:])
		flags |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
	}
	sp = appendString(sp, fieldSpanName, name)
	sp = protowire.AppendTag(sp, fieldSpanKind, protowire.VarintType)
	sp = protowire.AppendVarint(sp, uint64(tracepb.Span_SPAN_KIND_CLIENT))
	sp = appendTime(sp, fieldSpanStartTime, rec.Started.UnixNano())
	sp = appendTime(sp, fieldSpanEndTime, rec.Ended.UnixNano())
	sp = protowire.AppendTag(sp, fieldSpanFlags, protowire.Fixed32Type)
	sp = protowire.AppendFixed32(sp, flags)

	const attrs = fieldSpanAttributes
	sp = appendAttr(sp, attrs, op)
	sp = appendAttr(sp, attrs, semconv.GenAIProviderNameOpenAI)
	sp = appendAttr(sp, attrs, semconv.GenAIRequestModel(rec.Model))
	if hasAPIType {
		sp = appendAttr(sp, attrs, apiType)
	}
	if srv, ok := b.servers()[rec.Backend]; ok {
		sp = appendAttr(sp, attrs, srv.address)
		sp = appendAttr(sp, attrs, srv.port)
	}
	if rec.Backend != "" && rec.Status >= 200 && rec.Status < 300 {
		sp = appendAttr(sp, attrs, semconv.GenAIResponseModel(rec.ServedModel))
	}
	if rec.CompletionID != "" {
		sp = appendAttr(sp, attrs, semconv.GenAIResponseID(rec.CompletionID))
	}
	if rec.FinishReasons.Len() > 0 {
		b.reasons = rec.FinishReasons.AppendStrings(b.reasons[:0])
		sp = appendStringsAttr(sp, attrs, semconv.GenAIResponseFinishReasonsKey, b.reasons)
	}
	if rec.TotalTokens > 0 || rec.Status >= 200 && rec.Status < 300 {
		sp = appendAttr(sp, attrs, semconv.GenAIUsageInputTokens(int(rec.PromptTokens)))
		sp = appendAttr(sp, attrs, semconv.GenAIUsageOutputTokens(int(rec.CompletionTokens)))
	}
	sp = appendAttr(sp, attrs, attrTeam.String(rec.Team))
	sp = appendAttr(sp, attrs, attrProject.String(rec.Project))
	sp = appendAttr(sp, attrs, attrKeyName.String(rec.KeyName))
	sp = appendAttr(sp, attrs, attrBackend.String(rec.Backend))
	sp = appendAttr(sp, attrs, attrCallID.String(rec.CallID))
	sp = appendAttr(sp, attrs, attrRequestID.String(rec.RequestID))
	// Each attribute is a part of a span's cost in its encoding and in the
	// collector: the two that would only restate their default (no retry,
	// not streamed) are left out, and an absent one means it.
	if len(rec.Attempts) > 0 {
		sp = appendAttr(sp, attrs, attrRetries.Int(len(rec.Attempts)))
	}
	if rec.Stream {
		sp = appendAttr(sp, attrs, attrStream.Bool(true))
	}
	// The status is always there, as the SDK gives it: UNSET, or ERROR
	// with the record's error.
	var code tracepb.Status_StatusCode
	var message string
	if errType := b.errorType(rec); errType != "" {
		sp = appendAttr(sp, attrs, semconv.ErrorTypeKey.String(errType))
		code, message = tracepb.Status_STATUS_CODE_ERROR, validUTF8(rec.Error)
	}
	size := 0
	if message != "" {
		size += protowire.SizeTag(fieldStatusMessage) + protowire.SizeBytes(len(message))
	}
	if code != 0 {
		size += protowire.SizeTag(fieldStatusCode) + protowire.SizeVarint(uint64(code))
	}
	sp = protowire.AppendTag(sp, fieldSpanStatus, protowire.BytesType)
	sp = protowire.AppendVarint(sp, uint64(size))
	if message != "" {
		sp = appendString(sp, fieldStatusMessage, message)
	}
	if code != 0 {
		sp = protowire.AppendTag(sp, fieldStatusCode, protowire.VarintType)
		sp = protowire.AppendVarint(sp, uint64(code))
	}

	for i := range rec.Attempts {
		a := &rec.Attempts[i]
		const attrs = fieldEventAttributes
		ev := appendTime(b.event[:0], fieldEventTime, a.Ended.UnixNano())
		ev = appendString(ev, fieldEventName, attemptEvent)
		ev = appendAttr(ev, attrs, attrBackend.String(a.Backend))
		ev = appendAttr(ev, attrs, attrModel.String(a.Model))
		ev = appendAttr(ev, attrs, semconv.ErrorTypeKey.String(b.status(a.Status)))
		ev = appendAttr(ev, attrs, attrError.String(a.Error))
		ev = appendAttr(ev, attrs, attrAttemptDur.Float64(a.Ended.Sub(a.Started).Seconds()))
		sp = appendMessage(sp, fieldSpanEvents, ev)
		b.event = ev
	}
	b.span = sp
	b.batch.add(sp)
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

// spanBatch is the spans of one export as the OTLP client takes them: one
// ResourceSpans of one ScopeSpans, whose spans are already encoded. They
// are the ScopeSpans' unknown fields, which protobuf's encoding writes as
// they are: a span field of the ScopeSpans each, as its Spans would have
// been written. A reset keeps the buffer, for the next batch.
type spanBatch struct {
	list [1]*tracepb.ResourceSpans
	rs   tracepb.ResourceSpans
	ss   tracepb.ScopeSpans
	// spans holds the encoded spans, n of them.
	spans []byte
	n     int
}

// add appends a span, encoded.
func (bt *spanBatch) add(span []byte) {
	bt.spans = appendMessage(bt.spans, fieldScopeSpansSpans, span)
	bt.n++
}

// len is the number of spans in the batch.
func (bt *spanBatch) len() int { return bt.n }

// resourceSpans is the batch as the OTLP client takes it; valid until
// the next add or reset.
func (bt *spanBatch) resourceSpans() []*tracepb.ResourceSpans {
	bt.ss.ProtoReflect().SetUnknown(bt.spans)
	return bt.list[:]
}

// reset empties the batch.
func (bt *spanBatch) reset() {
	bt.ss.ProtoReflect().SetUnknown(nil)
	bt.spans, bt.n = bt.spans[:0], 0
}

// The OTLP protos' field numbers the encoding uses (TestFieldNumbers
// checks them against the protos' descriptors).
const (
	fieldScopeSpansSpans  protowire.Number = 2
	fieldSpanTraceID      protowire.Number = 1
	fieldSpanSpanID       protowire.Number = 2
	fieldSpanParentSpanID protowire.Number = 4
	fieldSpanName         protowire.Number = 5
	fieldSpanKind         protowire.Number = 6
	fieldSpanStartTime    protowire.Number = 7
	fieldSpanEndTime      protowire.Number = 8
	fieldSpanAttributes   protowire.Number = 9
	fieldSpanEvents       protowire.Number = 11
	fieldSpanStatus       protowire.Number = 15
	fieldSpanFlags        protowire.Number = 16
	fieldEventTime        protowire.Number = 1
	fieldEventName        protowire.Number = 2
	fieldEventAttributes  protowire.Number = 3
	fieldStatusMessage    protowire.Number = 2
	fieldStatusCode       protowire.Number = 3
	fieldKeyValueKey      protowire.Number = 1
	fieldKeyValueValue    protowire.Number = 2
	fieldAnyValueString   protowire.Number = 1
	fieldAnyValueBool     protowire.Number = 2
	fieldAnyValueInt      protowire.Number = 3
	fieldAnyValueDouble   protowire.Number = 4
	fieldAnyValueArray    protowire.Number = 5
	fieldArrayValueValues protowire.Number = 1
)

func appendBytes(b []byte, f protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, f, protowire.BytesType), v)
}

// appendString appends a string field; s must be valid UTF-8, as
// protobuf's strings are.
func appendString(b []byte, f protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, f, protowire.BytesType), s)
}

func appendMessage(b []byte, f protowire.Number, m []byte) []byte {
	return appendBytes(b, f, m)
}

// appendTime appends a timestamp as OTLP has it, a time before 1970 as 0.
func appendTime(b []byte, f protowire.Number, ns int64) []byte {
	return protowire.AppendFixed64(protowire.AppendTag(b, f, protowire.Fixed64Type), uint64(max(0, ns))) //nolint:gosec // not negative
}

// appendAttr appends kv as the KeyValue field f. Only the scalar types are
// encoded (another is an empty value); the one array attribute is
// appendStringsAttr's. A string that is not valid UTF-8 has its invalid
// bytes replaced, as a collector would refuse the whole export.
func appendAttr(b []byte, f protowire.Number, kv attribute.KeyValue) []byte {
	var s string
	var valueSize int
	switch kv.Value.Type() {
	case attribute.STRING:
		s = validUTF8(kv.Value.AsString())
		valueSize = protowire.SizeTag(fieldAnyValueString) + protowire.SizeBytes(len(s))
	case attribute.INT64:
		valueSize = protowire.SizeTag(fieldAnyValueInt) + protowire.SizeVarint(uint64(kv.Value.AsInt64())) //nolint:gosec // two's complement, as protobuf has it
	case attribute.FLOAT64:
		valueSize = protowire.SizeTag(fieldAnyValueDouble) + protowire.SizeFixed64()
	case attribute.BOOL:
		valueSize = protowire.SizeTag(fieldAnyValueBool) + 1
	}
	b = appendKeyValueHead(b, f, kv.Key, valueSize)
	switch kv.Value.Type() {
	case attribute.STRING:
		b = appendString(b, fieldAnyValueString, s)
	case attribute.INT64:
		b = protowire.AppendTag(b, fieldAnyValueInt, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(kv.Value.AsInt64())) //nolint:gosec // two's complement, as protobuf has it
	case attribute.FLOAT64:
		b = protowire.AppendTag(b, fieldAnyValueDouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(kv.Value.AsFloat64()))
	case attribute.BOOL:
		b = protowire.AppendTag(b, fieldAnyValueBool, protowire.VarintType)
		b = protowire.AppendVarint(b, protowire.EncodeBool(kv.Value.AsBool()))
	}
	return b
}

// appendStringsAttr appends a string array attribute as the KeyValue
// field f; ss must be valid UTF-8.
func appendStringsAttr(b []byte, f protowire.Number, key attribute.Key, ss []string) []byte {
	arraySize := 0
	for _, s := range ss {
		elem := protowire.SizeTag(fieldAnyValueString) + protowire.SizeBytes(len(s))
		arraySize += protowire.SizeTag(fieldArrayValueValues) + protowire.SizeBytes(elem)
	}
	b = appendKeyValueHead(b, f, key, protowire.SizeTag(fieldAnyValueArray)+protowire.SizeBytes(arraySize))
	b = protowire.AppendTag(b, fieldAnyValueArray, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(arraySize))
	for _, s := range ss {
		b = protowire.AppendTag(b, fieldArrayValueValues, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(protowire.SizeTag(fieldAnyValueString)+protowire.SizeBytes(len(s))))
		b = appendString(b, fieldAnyValueString, s)
	}
	return b
}

// appendKeyValueHead appends a KeyValue up to its AnyValue's contents,
// which are valueSize bytes.
func appendKeyValueHead(b []byte, f protowire.Number, key attribute.Key, valueSize int) []byte {
	size := protowire.SizeTag(fieldKeyValueKey) + protowire.SizeBytes(len(key)) +
		protowire.SizeTag(fieldKeyValueValue) + protowire.SizeBytes(valueSize)
	b = protowire.AppendTag(b, f, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = appendString(b, fieldKeyValueKey, string(key))
	b = protowire.AppendTag(b, fieldKeyValueValue, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(valueSize))
}

// validUTF8 is s with its invalid bytes replaced by U+FFFD.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
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
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: validUTF8(v.AsString())}}
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
