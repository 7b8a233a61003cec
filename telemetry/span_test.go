package telemetry

import (
	"strconv"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/finish"
)

// testRecords are a plain request with a client's parent, a streamed
// root, and a failed request retried twice.
func testRecords() []accounting.Record {
	plain := benchRecord()
	streamed := benchRecord()
	streamed.Stream, streamed.Span.ParentSpanID = true, [8]byte{}
	streamed.FinishReasons = finish.Of(finish.Parse("stop"))
	streamed.FinishReasons.Add(finish.Parse("length"))
	failed := benchRecord()
	failed.Status, failed.Error, failed.CompletionID = 502, "backend answered 503", ""
	now := time.Now()
	failed.Attempts = []accounting.Attempt{
		{Backend: "bad", Model: "flaky", Status: 503, Error: "503", Started: now.Add(-2 * time.Millisecond), Ended: now.Add(-time.Millisecond)},
		{Backend: "worse", Model: "flaky", Status: 429, Error: "429", Started: now.Add(-time.Millisecond), Ended: now},
	}
	return []accounting.Record{plain, streamed, failed}
}

func newTestBuilder(tb testing.TB, sampler sdktrace.Sampler) *spanBuilder {
	e := &Exporter{}
	e.SetBackends([]config.Backend{{Name: "vllm", URL: "http://10.0.0.7:8000/v1"}})
	b := testSpanBuilder(tb, e)
	b.sampler = sampler
	return b
}

// TestBuildSpanAllocatesNothing checks that once a batch has grown to its
// size, building spans into it again after a reset allocates nothing.
func TestBuildSpanAllocatesNothing(t *testing.T) {
	b := newTestBuilder(t, sdktrace.ParentBased(sdktrace.AlwaysSample()))
	recs := testRecords()
	const size = 512
	fill := func() {
		for i := 0; b.batch.len() < size; i++ {
			b.build(&recs[i%len(recs)])
		}
		b.batch.reset()
	}
	fill()
	i := 0
	if n := testing.AllocsPerRun(2*size, func() {
		b.build(&recs[i%len(recs)])
		if i++; b.batch.len() == size {
			b.batch.reset()
		}
	}); n != 0 {
		t.Errorf("building a span into a reused batch allocated %v times", n)
	}
}

// TestBuildSpanSamples checks that the sampler decides which records
// become spans: with the parent's sampled flag under parentbased_*, by
// the trace id under traceidratio.
func TestBuildSpanSamples(t *testing.T) {
	root := benchRecord()
	root.Span.ParentSpanID = [8]byte{}
	sampledParent := benchRecord()
	unsampledParent := benchRecord()
	unsampledParent.Span.NotSampled = true
	for _, tt := range []struct {
		name    string
		sampler sdktrace.Sampler
		rec     accounting.Record
		want    bool
	}{
		{"parentbased_always_on, root", sdktrace.ParentBased(sdktrace.AlwaysSample()), root, true},
		{"parentbased_always_on, sampled parent", sdktrace.ParentBased(sdktrace.AlwaysSample()), sampledParent, true},
		{"parentbased_always_on, parent not sampled", sdktrace.ParentBased(sdktrace.AlwaysSample()), unsampledParent, false},
		{"parentbased_always_off, root", sdktrace.ParentBased(sdktrace.NeverSample()), root, false},
		{"parentbased_always_off, sampled parent", sdktrace.ParentBased(sdktrace.NeverSample()), sampledParent, true},
		{"parentbased_traceidratio 0, root", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0)), root, false},
		{"always_on, parent not sampled", sdktrace.AlwaysSample(), unsampledParent, true},
		{"always_off, sampled parent", sdktrace.NeverSample(), sampledParent, false},
		{"traceidratio 0", sdktrace.TraceIDRatioBased(0), root, false},
		{"traceidratio 1", sdktrace.TraceIDRatioBased(1), root, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestBuilder(t, tt.sampler)
			if got := b.build(&tt.rec); got != tt.want || b.batch.len() != map[bool]int{true: 1}[tt.want] {
				t.Errorf("build = %v with %d spans in the batch, want %v", got, b.batch.len(), tt.want)
			}
		})
	}
}

// TestFieldNumbers checks the field numbers the encoding uses against
// the OTLP protos' descriptors.
func TestFieldNumbers(t *testing.T) {
	fields := func(m proto.Message) protoreflect.FieldDescriptors { return m.ProtoReflect().Descriptor().Fields() }
	scope, span, event := fields(&tracepb.ScopeSpans{}), fields(&tracepb.Span{}), fields(&tracepb.Span_Event{})
	status, kv, any, array := fields(&tracepb.Status{}), fields(&commonpb.KeyValue{}), fields(&commonpb.AnyValue{}), fields(&commonpb.ArrayValue{})
	for _, tt := range []struct {
		fields protoreflect.FieldDescriptors
		name   protoreflect.Name
		got    protowire.Number
	}{
		{scope, "spans", fieldScopeSpansSpans},
		{span, "trace_id", fieldSpanTraceID}, {span, "span_id", fieldSpanSpanID},
		{span, "parent_span_id", fieldSpanParentSpanID}, {span, "name", fieldSpanName},
		{span, "kind", fieldSpanKind}, {span, "start_time_unix_nano", fieldSpanStartTime},
		{span, "end_time_unix_nano", fieldSpanEndTime}, {span, "attributes", fieldSpanAttributes},
		{span, "events", fieldSpanEvents}, {span, "status", fieldSpanStatus}, {span, "flags", fieldSpanFlags},
		{event, "time_unix_nano", fieldEventTime}, {event, "name", fieldEventName}, {event, "attributes", fieldEventAttributes},
		{status, "message", fieldStatusMessage}, {status, "code", fieldStatusCode},
		{kv, "key", fieldKeyValueKey}, {kv, "value", fieldKeyValueValue},
		{any, "string_value", fieldAnyValueString}, {any, "bool_value", fieldAnyValueBool},
		{any, "int_value", fieldAnyValueInt}, {any, "double_value", fieldAnyValueDouble},
		{any, "array_value", fieldAnyValueArray}, {array, "values", fieldArrayValueValues},
	} {
		f := tt.fields.ByName(tt.name)
		if f == nil || f.Number() != tt.got {
			t.Errorf("%s: encoded as field %d, the proto has %v", tt.name, tt.got, f)
		}
	}
}

// TestBuildSpanEncoding checks that the batch, encoded by protobuf as the
// OTLP client encodes it and decoded with the official protos, holds
// exactly the spans of the records: every field and attribute, and
// nothing else.
func TestBuildSpanEncoding(t *testing.T) {
	b := newTestBuilder(t, sdktrace.AlwaysSample())
	recs := testRecords()
	recs[1].Model = "bad\xffmodel"
	recs[2].Error = "backend answered 503 \xff"
	for i := range recs {
		if !b.build(&recs[i]) {
			t.Fatal("the sampler dropped a span")
		}
	}
	raw, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: b.batch.resourceSpans()})
	if err != nil {
		t.Fatal(err)
	}
	var got coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.ResourceSpans) != 1 || len(got.ResourceSpans[0].ScopeSpans) != 1 {
		t.Fatalf("%d resources", len(got.ResourceSpans))
	}
	ss := got.ResourceSpans[0].ScopeSpans[0]
	if ss.Scope.GetName() != scopeName || ss.SchemaUrl != semconv.SchemaURL {
		t.Errorf("scope %q schema %q", ss.Scope.GetName(), ss.SchemaUrl)
	}
	str := func(k, v string) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
	}
	num := func(k string, v int64) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
	}
	strs := func(k string, vs ...string) *commonpb.KeyValue {
		arr := &commonpb.ArrayValue{}
		for _, v := range vs {
			arr.Values = append(arr.Values, &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}})
		}
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: arr}}}
	}
	dur := func(k string, v float64) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v}}}
	}
	yes := &commonpb.KeyValue{Key: "tollgate.stream", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: true}}}
	who := func(rec accounting.Record) []*commonpb.KeyValue {
		return []*commonpb.KeyValue{str("tollgate.team", "acme"), str("tollgate.project", "search"),
			str("tollgate.key_name", "acme-key"), str("tollgate.backend", "vllm"),
			str("tollgate.call_id", rec.CallID), str("tollgate.request_id", "req-1")}
	}
	span := func(rec accounting.Record, name string, attrs ...*commonpb.KeyValue) *tracepb.Span {
		s := &tracepb.Span{TraceId: rec.Span.TraceID[:], SpanId: rec.Span.SpanID[:], Name: name,
			Kind: tracepb.Span_SPAN_KIND_CLIENT, Flags: 0x101, Status: &tracepb.Status{},
			StartTimeUnixNano: uint64(rec.Started.UnixNano()), EndTimeUnixNano: uint64(rec.Ended.UnixNano()), Attributes: attrs}
		if rec.Span.ParentSpanID != ([8]byte{}) {
			s.ParentSpanId, s.Flags = rec.Span.ParentSpanID[:], 0x301
		}
		return s
	}
	head := func(model string) []*commonpb.KeyValue {
		return []*commonpb.KeyValue{str("gen_ai.operation.name", "chat"), str("gen_ai.provider.name", "openai"),
			str("gen_ai.request.model", model), str("openai.api.type", "chat_completions"),
			str("server.address", "10.0.0.7"), num("server.port", 8000)}
	}
	plain, streamed, failed := recs[0], recs[1], recs[2]
	want := []*tracepb.Span{
		span(plain, "chat demo", append(append(head("demo"), str("gen_ai.response.model", "demo"),
			str("gen_ai.response.id", "chatcmpl-123"), num("gen_ai.usage.input_tokens", 57), num("gen_ai.usage.output_tokens", 16)),
			who(plain)...)...),
		span(streamed, "chat bad\uFFFDmodel", append(append(head("bad\uFFFDmodel"), str("gen_ai.response.model", "demo"),
			str("gen_ai.response.id", "chatcmpl-123"), strs("gen_ai.response.finish_reasons", "stop", "length"),
			num("gen_ai.usage.input_tokens", 57), num("gen_ai.usage.output_tokens", 16)), append(who(streamed), yes)...)...),
		span(failed, "chat demo", append(append(head("demo"), num("gen_ai.usage.input_tokens", 57), num("gen_ai.usage.output_tokens", 16)),
			append(who(failed), num("tollgate.retries", 2), str("error.type", "502"))...)...),
	}
	want[2].Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "backend answered 503 \uFFFD"}
	for _, a := range failed.Attempts {
		want[2].Events = append(want[2].Events, &tracepb.Span_Event{Name: "tollgate.attempt_failed", TimeUnixNano: uint64(a.Ended.UnixNano()),
			Attributes: []*commonpb.KeyValue{str("tollgate.backend", a.Backend), str("tollgate.model", "flaky"),
				str("error.type", strconv.Itoa(a.Status)), str("tollgate.error", a.Error), dur("tollgate.attempt.duration_s", a.Ended.Sub(a.Started).Seconds())}})
	}
	if len(ss.Spans) != len(want) {
		t.Fatalf("%d spans decoded, want %d", len(ss.Spans), len(want))
	}
	for i := range want {
		if !proto.Equal(ss.Spans[i], want[i]) {
			t.Errorf("span %d:\n got %v\nwant %v", i, prototext.Format(ss.Spans[i]), prototext.Format(want[i]))
		}
	}

	b.batch.reset()
	raw, _ = proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: b.batch.resourceSpans()})
	got.Reset()
	if err := proto.Unmarshal(raw, &got); err != nil || len(got.ResourceSpans[0].ScopeSpans[0].Spans) != 0 ||
		len(got.ResourceSpans[0].Resource.GetAttributes()) == 0 {
		t.Errorf("a reset batch decodes as %v, %v; want the resource and no span", prototext.Format(&got), err)
	}
}

// TestEnvironmentSamplerAndBatching checks that the sampler and the
// batching are read from the variables the SDK reads, with its defaults,
// and that the file's fields win.
func TestEnvironmentSamplerAndBatching(t *testing.T) {
	const parentOn = "ParentBased{root:AlwaysOnSampler,remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}"
	defaults := batching{queue: 2048, size: 512, delay: 5 * time.Second, timeout: 30 * time.Second}
	for _, tt := range []struct {
		name        string
		env         map[string]string
		cfg         config.Telemetry
		wantSampler string
		wantBatch   batching
		wantErr     bool
	}{
		{name: "defaults", wantSampler: parentOn, wantBatch: defaults},
		{name: "environment", env: map[string]string{"OTEL_TRACES_SAMPLER": "TraceIDRatio", "OTEL_TRACES_SAMPLER_ARG": "0.25",
			"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "50", "OTEL_BSP_SCHEDULE_DELAY": "20", "OTEL_BSP_EXPORT_TIMEOUT": "0"},
			wantSampler: "TraceIDRatioBased{0.25}", wantBatch: batching{queue: 100, size: 50, delay: 20 * time.Millisecond}},
		{name: "file wins", env: map[string]string{"OTEL_TRACES_SAMPLER": "always_off", "OTEL_TRACES_SAMPLER_ARG": "0.5", "OTEL_BSP_MAX_QUEUE_SIZE": "100"},
			cfg:         config.Telemetry{Sampler: "parentbased_traceidratio", MaxQueueSize: 8},
			wantSampler: "ParentBased{root:TraceIDRatioBased{0.5}", wantBatch: batching{queue: 8, size: 8, delay: 5 * time.Second, timeout: 30 * time.Second}},
		{name: "bad ratio", env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, wantErr: true},
		{name: "unknown sampler", env: map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote"}, wantErr: true},
		{name: "bad batch size", env: map[string]string{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "0"}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_BSP_MAX_QUEUE_SIZE",
				"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT"} {
				t.Setenv(k, tt.env[k])
			}
			s, err := newSampler(tt.cfg)
			b, berr := batchingOf(tt.cfg)
			if tt.wantErr {
				if err == nil && berr == nil {
					t.Fatalf("no error, sampler %v, batching %+v", s.Description(), b)
				}
				return
			}
			if err != nil || berr != nil {
				t.Fatal(err, berr)
			}
			if d := s.Description(); len(d) < len(tt.wantSampler) || d[:len(tt.wantSampler)] != tt.wantSampler {
				t.Errorf("sampler %s, want %s", d, tt.wantSampler)
			}
			if b != tt.wantBatch {
				t.Errorf("batching %+v, want %+v", b, tt.wantBatch)
			}
		})
	}
}
