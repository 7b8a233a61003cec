package telemetry

import (
	"crypto/rand"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/collector/pdata/pcommon"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

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
// size, building spans into it again after a reset allocates nothing when
// each span is set over one of the same shape (the same attributes and
// events): the batch holds a multiple of the records' kinds.
func TestBuildSpanAllocatesNothing(t *testing.T) {
	b := newTestBuilder(t, sdktrace.ParentBased(sdktrace.AlwaysSample()))
	recs := testRecords()
	const size = 171 * 3
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

// TestRatioSamplesItsShare checks that a ratio sampler keeps its share of
// the traces whatever names them: traces named after a call, or a
// Compat-Trace-Id, are UUIDs whose variant bits lead the bytes the samplers
// read as random (read as they are, a ratio under one half kept none), and
// a traceparent's are random.
func TestRatioSamplesItsShare(t *testing.T) {
	const traces = 20000
	ids := map[string]func() accounting.SpanContext{
		"UUIDv7": func() accounting.SpanContext {
			return accounting.SpanContext{TraceID: uuid.Must(uuid.NewV7()), UUIDTraceID: true}
		},
		"UUIDv4": func() accounting.SpanContext {
			return accounting.SpanContext{TraceID: uuid.New(), UUIDTraceID: true}
		},
		"W3C": func() accounting.SpanContext {
			var sp accounting.SpanContext
			_, _ = rand.Read(sp.TraceID[:])
			return sp
		},
	}
	for name, id := range ids {
		for _, ratio := range []float64{0.1, 0.5, 0.9} {
			t.Run(fmt.Sprint(name, " ", ratio), func(t *testing.T) {
				b := newTestBuilder(t, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)))
				rec := benchRecord()
				rec.Span.ParentSpanID = [8]byte{}
				kept := 0
				for range traces {
					sp := id()
					rec.Span.TraceID, rec.Span.UUIDTraceID = sp.TraceID, sp.UUIDTraceID
					if b.build(&rec) {
						kept++
					}
					b.batch.reset()
				}
				// Four standard deviations of a binomial count.
				if got, sd := float64(kept)/traces, math.Sqrt(ratio*(1-ratio)/traces); math.Abs(got-ratio) > 4*sd {
					t.Errorf("kept %.4f of the traces, want %.2f", got, ratio)
				}
			})
		}
	}
}

// TestBatchResetKeepsNoRecord checks that a reset batch holds none of the
// records' strings and no span, but keeps the resource and the scope.
func TestBatchResetKeepsNoRecord(t *testing.T) {
	b := newTestBuilder(t, sdktrace.AlwaysSample())
	for _, rec := range testRecords() {
		b.build(&rec)
	}
	b.batch.reset()
	if n := b.batch.len(); n != 0 {
		t.Fatalf("reset left %d spans", n)
	}
	// The spans kept to be set over hold no string of a record.
	for _, sp := range b.batch.spans.All() {
		var strs []string
		maps := []pcommon.Map{sp.Attributes()}
		for _, ev := range sp.Events().All() {
			maps = append(maps, ev.Attributes())
		}
		for _, m := range maps {
			for k, v := range m.All() {
				switch v.Type() {
				case pcommon.ValueTypeStr:
					strs = append(strs, k+"="+v.Str())
				case pcommon.ValueTypeSlice:
					for _, e := range v.Slice().All() {
						strs = append(strs, k+"="+e.Str())
					}
				}
			}
		}
		for _, s := range append(strs, sp.Name(), sp.Status().Message()) {
			if s != "" && !strings.HasSuffix(s, "=") {
				t.Errorf("a reset span still holds %q", s)
			}
		}
	}
	got := sentRequest(t, b)
	rs := got.GetResourceSpans()
	if len(rs) != 1 || len(rs[0].GetResource().GetAttributes()) == 0 || len(rs[0].GetScopeSpans()) != 1 ||
		rs[0].GetScopeSpans()[0].GetScope().GetName() != scopeName || len(rs[0].GetScopeSpans()[0].GetSpans()) != 0 {
		t.Errorf("after a reset the batch is %v", got)
	}
}

// sentRequest is the request the OTLP client would send for b's batch:
// encoded by protobuf as the client encodes it, and decoded with the
// official protos.
func sentRequest(t *testing.T, b *spanBuilder) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	rs, err := b.batch.resourceSpans()
	if err != nil {
		t.Fatal(err)
	}
	out, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: rs})
	if err != nil {
		t.Fatalf("the batch does not encode: %v", err)
	}
	var got coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	return &got
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

// A record whose strings are not valid UTF-8 still becomes a span the
// client can encode, with U+FFFD for each invalid sequence: protobuf
// refuses to encode the batch otherwise.
func TestBuildSpanReplacesInvalidUTF8(t *testing.T) {
	b := newTestBuilder(t, sdktrace.AlwaysSample())
	rec := testRecords()[0]
	rec.Model, rec.Team = "demo\xff", "ac\xc3me"
	if !b.build(&rec) {
		t.Fatal("record not sampled")
	}
	sp := sentRequest(t, b).GetResourceSpans()[0].GetScopeSpans()[0].GetSpans()[0]
	if sp.GetName() != "chat demo\uFFFD" {
		t.Errorf("name = %q", sp.GetName())
	}
	attrs := map[string]string{}
	for _, kv := range sp.GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	if attrs["gen_ai.request.model"] != "demo\uFFFD" || attrs["tollgate.team"] != "ac\uFFFDme" {
		t.Errorf("attributes = %v", attrs)
	}
}

// TestBuildSpanEncoding checks the request the OTLP client would send,
// decoded with the official protos, against the spans of testRecords
// written out field by field, and the resource and the scope: in a new
// batch, then set over the spans of an earlier batch, each over one of
// another shape, and in a batch shorter than the earlier one. Attribute
// order is not compared: a span set over another keeps the attributes
// they share where they were.
func TestBuildSpanEncoding(t *testing.T) {
	b := newTestBuilder(t, sdktrace.AlwaysSample())
	recs := testRecords()
	want := wantSpans(recs)
	for _, order := range [][]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {2}, {1, 0}} {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			b.batch.reset()
			var wantOrder []*tracepb.Span
			for _, i := range order {
				if !b.build(&recs[i]) {
					t.Fatal("record not sampled")
				}
				wantOrder = append(wantOrder, want[i])
			}
			checkRequest(t, sentRequest(t, b), wantOrder)
		})
	}
}

// wantSpans is the spans of testRecords, written out field by field.
func wantSpans(recs []accounting.Record) []*tracepb.Span {
	str := func(k, v string) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
	}
	num := func(k string, v int64) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
	}
	ids := func(rec *accounting.Record) (traceID, spanID []byte) {
		return rec.Span.TraceID[:], rec.Span.SpanID[:]
	}
	ns := func(tm time.Time) uint64 { return uint64(tm.UnixNano()) } //nolint:gosec // after 1970
	who := func(rec *accounting.Record) []*commonpb.KeyValue {
		return []*commonpb.KeyValue{str("tollgate.team", "acme"), str("tollgate.project", "search"),
			str("tollgate.key_name", "acme-key"), str("tollgate.backend", "vllm"),
			str("tollgate.call_id", rec.CallID), str("tollgate.request_id", "req-1")}
	}
	head := []*commonpb.KeyValue{str("gen_ai.operation.name", "chat"), str("gen_ai.provider.name", "openai"),
		str("gen_ai.request.model", "demo"), str("openai.api.type", "chat_completions"),
		str("server.address", "10.0.0.7"), num("server.port", 8000)}
	tokens := []*commonpb.KeyValue{num("gen_ai.usage.input_tokens", 57), num("gen_ai.usage.output_tokens", 16)}
	cat := func(parts ...[]*commonpb.KeyValue) []*commonpb.KeyValue {
		var out []*commonpb.KeyValue
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	plain, streamed, failed := &recs[0], &recs[1], &recs[2]
	var want []*tracepb.Span
	tid, sid := ids(plain)
	want = append(want, &tracepb.Span{TraceId: tid, SpanId: sid, ParentSpanId: plain.Span.ParentSpanID[:],
		Flags: 0x301, Name: "chat demo", Kind: tracepb.Span_SPAN_KIND_CLIENT,
		StartTimeUnixNano: ns(plain.Started), EndTimeUnixNano: ns(plain.Ended),
		Attributes: cat(head, []*commonpb.KeyValue{str("gen_ai.response.model", "demo"), str("gen_ai.response.id", "chatcmpl-123")},
			tokens, who(plain)),
		Status: &tracepb.Status{}})
	tid, sid = ids(streamed)
	reasons := &commonpb.KeyValue{Key: "gen_ai.response.finish_reasons", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{
		ArrayValue: &commonpb.ArrayValue{Values: []*commonpb.AnyValue{
			{Value: &commonpb.AnyValue_StringValue{StringValue: "stop"}},
			{Value: &commonpb.AnyValue_StringValue{StringValue: "length"}}}}}}}
	want = append(want, &tracepb.Span{TraceId: tid, SpanId: sid, Flags: 0x101, Name: "chat demo", Kind: tracepb.Span_SPAN_KIND_CLIENT,
		StartTimeUnixNano: ns(streamed.Started), EndTimeUnixNano: ns(streamed.Ended),
		Attributes: cat(head, []*commonpb.KeyValue{str("gen_ai.response.model", "demo"), str("gen_ai.response.id", "chatcmpl-123"), reasons},
			tokens, who(streamed), []*commonpb.KeyValue{{Key: "tollgate.stream", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: true}}}}),
		Status: &tracepb.Status{}})
	tid, sid = ids(failed)
	var events []*tracepb.Span_Event
	for _, a := range failed.Attempts {
		events = append(events, &tracepb.Span_Event{Name: "tollgate.attempt_failed", TimeUnixNano: ns(a.Ended),
			Attributes: []*commonpb.KeyValue{str("tollgate.backend", a.Backend), str("tollgate.model", a.Model),
				str("error.type", fmt.Sprint(a.Status)), str("tollgate.error", a.Error),
				{Key: "tollgate.attempt.duration_s", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: a.Ended.Sub(a.Started).Seconds()}}}}})
	}
	want = append(want, &tracepb.Span{TraceId: tid, SpanId: sid, ParentSpanId: failed.Span.ParentSpanID[:],
		Flags: 0x301, Name: "chat demo", Kind: tracepb.Span_SPAN_KIND_CLIENT,
		StartTimeUnixNano: ns(failed.Started), EndTimeUnixNano: ns(failed.Ended),
		Attributes: cat(head, tokens, who(failed), []*commonpb.KeyValue{num("tollgate.retries", 2), str("error.type", "502")}),
		Events:     events,
		Status:     &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "backend answered 503"}})
	return want
}

// checkRequest checks got's resource, scope and spans, the attributes of
// each span sorted by key.
func checkRequest(t *testing.T, got *coltracepb.ExportTraceServiceRequest, want []*tracepb.Span) {
	t.Helper()
	if len(got.GetResourceSpans()) != 1 || len(got.GetResourceSpans()[0].GetScopeSpans()) != 1 {
		t.Fatalf("request = %v, want one ResourceSpans of one ScopeSpans", got)
	}
	rs := got.GetResourceSpans()[0]
	res, err := newResource(config.Telemetry{})
	if err != nil {
		t.Fatal(err)
	}
	if rs.GetSchemaUrl() != res.SchemaURL() {
		t.Errorf("resource schema = %q, want %q", rs.GetSchemaUrl(), res.SchemaURL())
	}
	wantRes := map[string]string{}
	for _, kv := range res.Attributes() {
		wantRes[string(kv.Key)] = kv.Value.Emit()
	}
	gotRes := map[string]string{}
	for _, kv := range rs.GetResource().GetAttributes() {
		gotRes[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	if !reflect.DeepEqual(gotRes, wantRes) || wantRes["service.name"] != "tollgate" {
		t.Errorf("resource = %v, want %v", gotRes, wantRes)
	}
	ss := rs.GetScopeSpans()[0]
	if !proto.Equal(ss.GetScope(), &commonpb.InstrumentationScope{Name: scopeName}) || ss.GetSchemaUrl() != semconv.SchemaURL {
		t.Errorf("scope = %v, schema %q", ss.GetScope(), ss.GetSchemaUrl())
	}
	if len(ss.GetSpans()) != len(want) {
		t.Fatalf("%d spans, want %d", len(ss.GetSpans()), len(want))
	}
	byKey := func(a, b *commonpb.KeyValue) int { return strings.Compare(a.GetKey(), b.GetKey()) }
	for i, sp := range ss.GetSpans() {
		w := proto.CloneOf(want[i])
		slices.SortFunc(sp.Attributes, byKey)
		slices.SortFunc(w.Attributes, byKey)
		if !proto.Equal(sp, w) {
			t.Errorf("span %d:\n got %v\nwant %v", i, sp, want[i])
		}
	}
}
