package trace

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// OpenTelemetry spans as calls, the way Weave's trace server maps what it
// receives at /otel/v1/traces: the call's id is the span id in hex, its
// trace id the span's trace id, its parent the parent span, its op name the
// span's name, its attributes the span's with dotted keys nested
// ("gen_ai.usage.input_tokens" under gen_ai, usage), an ERROR status its
// exception, and the GenAI usage attributes its summary.usage under its
// model.

// OTelSource is the attributes.weave.source of an ingested span's call
// (fold.OTelSource: this package imports nothing of the module).
const OTelSource = "otel"

// SpanCall is an OpenTelemetry span as a call: a start and an end whose
// ProjectID is still to be set, for the project its resource names.
type SpanCall struct {
	SpanLoc
	// Entity and Project are the resource's wandb.entity and
	// wandb.project attributes, "" when absent.
	Entity, Project string
	Start           CallStart
	End             CallEnd
}

// SpanLoc locates a span in a request: the indexes of its resource_spans,
// scope_spans and spans.
type SpanLoc struct {
	Resource, Scope, Span int
}

// RejectedSpan is a span that cannot be a call, and why.
type RejectedSpan struct {
	SpanLoc
	Reason string
}

// SpanCount is how many spans req holds.
func SpanCount(req *coltracepb.ExportTraceServiceRequest) int {
	n := 0
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			n += len(ss.GetSpans())
		}
	}
	return n
}

// SpanCalls maps the spans of req to calls, in the request's order, and
// lists those that cannot be one: a trace id that is not 16 bytes, a span
// id or parent span id that is not 8 (or is all zeros), no start time.
func SpanCalls(req *coltracepb.ExportTraceServiceRequest) ([]SpanCall, []RejectedSpan) {
	var calls []SpanCall
	var rejected []RejectedSpan
	for ri, rs := range req.GetResourceSpans() {
		resource := attributeMap(rs.GetResource().GetAttributes())
		entity, project := stringAttr(resource, "wandb.entity"), stringAttr(resource, "wandb.project")
		resourceAttrs := nestAttributes(rs.GetResource().GetAttributes())
		for si, ss := range rs.GetScopeSpans() {
			scope := map[string]any{"name": ss.GetScope().GetName(), "version": ss.GetScope().GetVersion()}
			for pi, span := range ss.GetSpans() {
				loc := SpanLoc{Resource: ri, Scope: si, Span: pi}
				c, reason := spanCall(span, resourceAttrs, scope)
				if reason != "" {
					rejected = append(rejected, RejectedSpan{SpanLoc: loc, Reason: reason})
					continue
				}
				c.SpanLoc, c.Entity, c.Project = loc, entity, project
				calls = append(calls, c)
			}
		}
	}
	return calls, rejected
}

func spanCall(span *tracepb.Span, resource, scope map[string]any) (SpanCall, string) {
	traceID, spanID, parentID := span.GetTraceId(), span.GetSpanId(), span.GetParentSpanId()
	switch {
	case len(traceID) != 16 || allZero(traceID):
		return SpanCall{}, "trace_id must be 16 bytes, not all zero"
	case len(spanID) != 8 || allZero(spanID):
		return SpanCall{}, "span_id must be 8 bytes, not all zero"
	case len(parentID) != 0 && (len(parentID) != 8 || allZero(parentID)):
		return SpanCall{}, "parent_span_id must be empty or 8 bytes, not all zero"
	case span.GetStartTimeUnixNano() == 0:
		return SpanCall{}, "start_time_unix_nano is missing"
	}
	started := time.Unix(0, int64(span.GetStartTimeUnixNano())).UTC()
	ended := started
	if e := span.GetEndTimeUnixNano(); e > span.GetStartTimeUnixNano() {
		ended = time.Unix(0, int64(e)).UTC()
	}
	flat := attributeMap(span.GetAttributes())
	attrs := nestAttributes(span.GetAttributes())
	attrs["weave"] = mergeObject(attrs["weave"], map[string]any{"source": OTelSource})
	attrs["otel"] = mergeObject(attrs["otel"], map[string]any{
		"kind": span.GetKind().String(), "scope": scope, "resource": resource,
	})
	c := SpanCall{
		Start: CallStart{
			ID: hex.EncodeToString(spanID), OpName: span.GetName(), TraceID: UUIDForm(traceID),
			StartedAt: started, Attributes: mustMarshal(attrs), Inputs: json.RawMessage("{}"),
		},
		End: CallEnd{ID: hex.EncodeToString(spanID), EndedAt: ended, Summary: spanSummary(flat)},
	}
	if len(parentID) != 0 {
		p := hex.EncodeToString(parentID)
		c.Start.ParentID = &p
	}
	if span.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		ex := spanException(span)
		c.End.Exception = &ex
	}
	if id := stringAttr(flat, "gen_ai.response.id"); id != "" {
		c.End.Completion = &SpanCompletion{ID: id, Created: responseDate(flat), StartedAt: started}
	}
	return c, ""
}

// UUIDForm writes a 16-byte trace id as the trace service writes trace
// ids: lower-case hex in the 8-4-4-4-12 form of a UUID, as the gateway
// writes a W3C traceparent's trace id, so that a completion sent with the
// traceparent of an ingested span joins the span's trace.
func UUIDForm(id []byte) string {
	h := hex.EncodeToString(id)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// spanException is the exception of a span with an ERROR status: the
// status message, else the last exception event's type and message.
func spanException(span *tracepb.Span) string {
	if m := span.GetStatus().GetMessage(); m != "" {
		return m
	}
	events := span.GetEvents()
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].GetName() != "exception" {
			continue
		}
		ev := attributeMap(events[i].GetAttributes())
		typ, msg := stringAttr(ev, "exception.type"), stringAttr(ev, "exception.message")
		switch {
		case typ != "" && msg != "":
			return typ + ": " + msg
		case typ != "" || msg != "":
			return typ + msg
		}
	}
	return "ERROR"
}

// The GenAI usage attributes, by convention: each list is read in order
// and the first present wins.
var (
	modelAttrs      = []string{"gen_ai.response.model", "gen_ai.request.model", "ai.model.id", "llm.model_name"}
	promptAttrs     = []string{"gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "ai.usage.inputTokens", "ai.usage.promptTokens", "llm.token_count.prompt"}
	completionAttrs = []string{"gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "ai.usage.outputTokens", "ai.usage.completionTokens", "llm.token_count.completion"}
	totalAttrs      = []string{"llm.token_count.total", "ai.usage.totalTokens"}
)

// unknownModel is the model of a span with usage but no model attribute.
const unknownModel = "unknown"

// spanSummary is the summary of a span's call: {"usage": {model: counts}}
// when it carries GenAI usage attributes, in the shape the Weave SDKs
// write (the roll-up reads requests, prompt_tokens, completion_tokens and
// total_tokens), else {}.
func spanSummary(flat map[string]*commonpb.AnyValue) json.RawMessage {
	prompt, okP := firstInt(flat, promptAttrs)
	completion, okC := firstInt(flat, completionAttrs)
	total, okT := firstInt(flat, totalAttrs)
	if !okP && !okC && !okT {
		return json.RawMessage("{}")
	}
	if !okT {
		total = prompt + completion
	}
	model := unknownModel
	for _, k := range modelAttrs {
		if m := stringAttr(flat, k); m != "" {
			model = m
			break
		}
	}
	return mustMarshal(map[string]any{"usage": map[string]any{model: map[string]int64{
		"requests": 1, "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total,
	}}})
}

// responseDate is the completion's own date when the span carries it (the
// AI SDK's ai.response.timestamp), in unix seconds; 0 otherwise.
func responseDate(flat map[string]*commonpb.AnyValue) int64 {
	ts := stringAttr(flat, "ai.response.timestamp")
	if ts == "" {
		return 0
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return 0
	}
	return t.Unix()
}

func firstInt(flat map[string]*commonpb.AnyValue, keys []string) (int64, bool) {
	for _, k := range keys {
		v, ok := flat[k]
		if !ok {
			continue
		}
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_IntValue:
			return max(x.IntValue, 0), true
		case *commonpb.AnyValue_DoubleValue:
			if f := x.DoubleValue; f >= 0 && f < math.MaxInt64 {
				return int64(f), true
			}
		case *commonpb.AnyValue_StringValue:
			if n, err := strconv.ParseInt(x.StringValue, 10, 64); err == nil && n >= 0 {
				return n, true
			}
		}
	}
	return 0, false
}

func attributeMap(kvs []*commonpb.KeyValue) map[string]*commonpb.AnyValue {
	m := make(map[string]*commonpb.AnyValue, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = kv.GetValue()
	}
	return m
}

func stringAttr(m map[string]*commonpb.AnyValue, key string) string {
	return m[key].GetStringValue()
}

// nestAttributes turns attributes into a JSON object, nesting dotted keys
// as Weave does: "gen_ai.usage.input_tokens" goes under "gen_ai", "usage".
// Keys are placed shallowest first, so that a key that would nest under a
// value that is not an object (both "a" and "a.b" set) is the deeper one,
// kept whole at the top level instead.
func nestAttributes(kvs []*commonpb.KeyValue) map[string]any {
	out := make(map[string]any, len(kvs))
	sorted := slices.Clone(kvs)
	slices.SortStableFunc(sorted, func(a, b *commonpb.KeyValue) int {
		return strings.Count(a.GetKey(), ".") - strings.Count(b.GetKey(), ".")
	})
	for _, kv := range sorted {
		parts := strings.Split(kv.GetKey(), ".")
		node, ok := out, true
		for _, p := range parts[:len(parts)-1] {
			switch next := node[p].(type) {
			case nil:
				m := make(map[string]any)
				node[p], node = m, m
			case map[string]any:
				node = next
			default:
				ok = false
			}
			if !ok {
				break
			}
		}
		if !ok {
			out[kv.GetKey()] = anyValue(kv.GetValue())
			continue
		}
		node[parts[len(parts)-1]] = anyValue(kv.GetValue())
	}
	return out
}

// anyValue is an attribute value as JSON: key-value lists become objects
// (their keys are not nested), bytes base64, and a double that JSON cannot
// hold (NaN, ±Inf) its text.
func anyValue(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		if math.IsNaN(x.DoubleValue) || math.IsInf(x.DoubleValue, 0) {
			return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
		}
		return x.DoubleValue
	case *commonpb.AnyValue_BytesValue:
		return base64.StdEncoding.EncodeToString(x.BytesValue)
	case *commonpb.AnyValue_ArrayValue:
		out := make([]any, 0, len(x.ArrayValue.GetValues()))
		for _, item := range x.ArrayValue.GetValues() {
			out = append(out, anyValue(item))
		}
		return out
	case *commonpb.AnyValue_KvlistValue:
		out := make(map[string]any, len(x.KvlistValue.GetValues()))
		for _, kv := range x.KvlistValue.GetValues() {
			out[kv.GetKey()] = anyValue(kv.GetValue())
		}
		return out
	}
	return nil
}

// mergeObject sets the keys of add in base when base is an object (a span
// attribute such as "weave.x" made it one), and is add otherwise.
func mergeObject(base any, add map[string]any) map[string]any {
	m, ok := base.(map[string]any)
	if !ok {
		return add
	}
	for k, v := range add {
		m[k] = v
	}
	return m
}

// mustMarshal encodes a value built of maps, slices, strings, numbers and
// booleans, which always encode, without HTML escaping.
func mustMarshal(v any) json.RawMessage {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return json.RawMessage("{}")
	}
	return json.RawMessage(strings.TrimRight(b.String(), "\n"))
}
