package telemetry

import (
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
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

// TestBatchResetKeepsNoRecord checks that a reset batch holds none of the
// records' strings and no span, but keeps the resource and the scope.
func TestBatchResetKeepsNoRecord(t *testing.T) {
	b := newTestBuilder(t, sdktrace.AlwaysSample())
	for _, rec := range testRecords() {
		b.build(&rec)
	}
	b.batch.reset()
	bt := &b.batch
	if bt.len() != 0 || len(bt.kvPtrs)+len(bt.valPtrs)+len(bt.evPtrs) != 0 {
		t.Fatalf("reset left %d spans, %d attributes", bt.len(), len(bt.kvPtrs))
	}
	for _, c := range bt.kvs.chunks {
		for i := range c {
			if c[i].Key != "" || c[i].Value != nil {
				t.Fatalf("a reset attribute still holds %q", c[i].Key)
			}
		}
	}
	for _, c := range bt.strs.chunks {
		for _, s := range c {
			if s.StringValue != "" {
				t.Fatalf("a reset value still holds %q", s.StringValue)
			}
		}
	}
	rs := bt.resourceSpans()
	if len(rs) != 1 || len(rs[0].Resource.Attributes) == 0 || rs[0].ScopeSpans[0].Scope.Name != scopeName {
		t.Errorf("reset lost the resource or the scope")
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
	out, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: b.batch.resourceSpans()})
	if err != nil {
		t.Fatalf("the batch does not encode: %v", err)
	}
	var got coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	sp := got.GetResourceSpans()[0].GetScopeSpans()[0].GetSpans()[0]
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
