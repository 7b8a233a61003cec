package telemetry

import (
	"context"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

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
// are few, but a record names the model its client asked for; the sets of
// finish reasons are few, but a backend chooses them.
const maxCachedNames = 1024

// spanBuilder makes the spans: one, owned by the ring's consumer
// goroutine, so its buffers are reused from span to span unlocked.
type spanBuilder struct {
	e *Exporter
	// ids is the context every span starts in (see recordIDs): its span
	// is pointed at each record's in turn.
	ids *idContext
	// attrs is the attributes of the span being built; the SDK copies
	// them into the span.
	attrs []attribute.KeyValue
	// names caches "{operation} {model}".
	names map[spanName]string
	// finishes caches the gen_ai.response.finish_reasons attribute of
	// each set of reasons: a string slice attribute is a new array each
	// time it is made, and the sets that occur are few.
	finishes map[finish.Reasons]attribute.KeyValue
	// kind is the start option every span takes, made once.
	kind trace.SpanStartOption
	// start and end hold the options of the span being built.
	start []trace.SpanStartOption
	end   [1]trace.SpanEndOption
}

type spanName struct{ op, model string }

func newSpanBuilder(e *Exporter) *spanBuilder {
	return &spanBuilder{
		e:        e,
		ids:      &idContext{Context: context.Background()},
		attrs:    make([]attribute.KeyValue, 0, 24),
		names:    make(map[spanName]string),
		finishes: make(map[finish.Reasons]attribute.KeyValue),
		kind:     trace.WithSpanKind(trace.SpanKindClient),
		start:    make([]trace.SpanStartOption, 0, 3),
	}
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

// finishReasons is the gen_ai.response.finish_reasons attribute of rs.
func (b *spanBuilder) finishReasons(rs finish.Reasons) attribute.KeyValue {
	if kv, ok := b.finishes[rs]; ok {
		return kv
	}
	kv := semconv.GenAIResponseFinishReasons(rs.AppendStrings(make([]string, 0, finish.Max))...)
	if len(b.finishes) < maxCachedNames {
		b.finishes[rs] = kv
	}
	return kv
}

// build makes rec's span: a CLIENT span named "{operation} {model}", from
// rec.Started to rec.Ended, with rec.Span's ids (see recordIDs), a child of
// the client's span when it named one.
func (b *spanBuilder) build(rec *accounting.Record) {
	b.ids.span = &rec.Span
	var ctx context.Context = b.ids
	if rec.Span.ParentSpanID != ([8]byte{}) {
		flags := trace.FlagsSampled
		if rec.Span.NotSampled {
			flags = 0
		}
		ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: rec.Span.TraceID, SpanID: rec.Span.ParentSpanID, TraceFlags: flags, Remote: true}))
	}
	op, apiType, hasAPIType := operation(rec.Endpoint)
	attrs := append(b.attrs[:0], op, semconv.GenAIProviderNameOpenAI, semconv.GenAIRequestModel(rec.Model))
	if hasAPIType {
		attrs = append(attrs, apiType)
	}
	if s, ok := (*b.e.servers.Load())[rec.Backend]; ok {
		attrs = append(attrs, s.address, s.port)
	}
	if rec.Backend != "" && rec.Status >= 200 && rec.Status < 300 {
		attrs = append(attrs, semconv.GenAIResponseModel(rec.ServedModel))
	}
	if rec.CompletionID != "" {
		attrs = append(attrs, semconv.GenAIResponseID(rec.CompletionID))
	}
	if rec.FinishReasons.Len() > 0 {
		attrs = append(attrs, b.finishReasons(rec.FinishReasons))
	}
	if rec.TotalTokens > 0 || rec.Status >= 200 && rec.Status < 300 {
		attrs = append(attrs, semconv.GenAIUsageInputTokens(int(rec.PromptTokens)),
			semconv.GenAIUsageOutputTokens(int(rec.CompletionTokens)))
	}
	attrs = append(attrs,
		attrTeam.String(rec.Team), attrProject.String(rec.Project), attrKeyName.String(rec.KeyName),
		attrBackend.String(rec.Backend), attrCallID.String(rec.CallID), attrRequestID.String(rec.RequestID))
	// Each attribute is a good part of a span's cost in the SDK and its
	// encoding: the two that would only restate their default (no retry,
	// not streamed) are left out, and an absent one means it.
	if len(rec.Attempts) > 0 {
		attrs = append(attrs, attrRetries.Int(len(rec.Attempts)))
	}
	if rec.Stream {
		attrs = append(attrs, attrStream.Bool(true))
	}
	errType := errorType(rec)
	if errType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(errType))
	}
	// Every attribute is given at the start, where the sampler sees them
	// (the conventions ask it for the operation, provider, model and
	// server), rather than set after: the span copies them once.
	b.start = append(b.start[:0], b.kind, trace.WithTimestamp(rec.Started), trace.WithAttributes(attrs...))
	_, span := b.e.tracer.Start(ctx, b.name(op.Value.AsString(), rec.Model), b.start...)
	b.ids.span = nil
	b.attrs = attrs[:0]
	clear(b.start)
	if !span.IsRecording() {
		return
	}
	if errType != "" {
		span.SetStatus(codes.Error, rec.Error)
	}
	for i := range rec.Attempts {
		a := &rec.Attempts[i]
		span.AddEvent(attemptEvent, trace.WithTimestamp(a.Ended), trace.WithAttributes(
			attrBackend.String(a.Backend), attrModel.String(a.Model),
			semconv.ErrorTypeKey.String(strconv.Itoa(a.Status)), attrError.String(a.Error),
			attrAttemptDur.Float64(a.Ended.Sub(a.Started).Seconds())))
	}
	b.end[0] = trace.WithTimestamp(rec.Ended)
	span.End(b.end[:]...)
	b.end[0] = nil
}

// errorType is the span's error.type: the status answered, for a request
// that failed with one; for a stream that failed after its 200, how it
// ended, as the usage API's group_by=status names it; "" on success.
func errorType(rec *accounting.Record) string {
	switch {
	case rec.Status >= 400 || rec.Status != 0 && rec.Status < 200:
		return strconv.Itoa(rec.Status)
	case rec.Error == "":
		return ""
	case rec.Incomplete && strings.HasPrefix(rec.Error, "client closed"):
		return "client_closed"
	case rec.Incomplete:
		return "stream_broken"
	}
	return "server_error"
}

// spanKey names the record's span in idContext.
type spanKey struct{}

// idContext is the context a span starts in: it carries the record's span
// to recordIDs. spanBuilder keeps one and points it at each record in
// turn, rather than make a context per span.
type idContext struct {
	context.Context
	span *accounting.SpanContext
}

func (c *idContext) Value(key any) any {
	if key == (spanKey{}) {
		return c.span
	}
	return c.Context.Value(key)
}

// recordIDs gives each span the ids its record holds: the trace id and
// span id the gateway sent the backend as its parent. Every span of the
// exporter's tracer is started in an idContext (see spanBuilder.build).
type recordIDs struct{}

func (recordIDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	sp := ctx.Value(spanKey{}).(*accounting.SpanContext)
	return sp.TraceID, sp.SpanID
}

func (recordIDs) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	return ctx.Value(spanKey{}).(*accounting.SpanContext).SpanID
}
