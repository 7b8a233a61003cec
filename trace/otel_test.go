package trace

import (
	"testing"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
)

func kv(k string, v any) *commonpb.KeyValue {
	switch x := v.(type) {
	case string:
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: x}}}
	case int:
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(x)}}}
	case float64:
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: x}}}
	}
	panic("kv")
}

// TestSpanSummary: each convention's usage attributes give the call's
// usage under its model.
func TestSpanSummary(t *testing.T) {
	for _, tt := range []struct {
		name  string
		attrs []*commonpb.KeyValue
		want  string
	}{
		{"gen_ai", []*commonpb.KeyValue{kv("gen_ai.request.model", "req"), kv("gen_ai.response.model", "resp"),
			kv("gen_ai.usage.input_tokens", 3), kv("gen_ai.usage.output_tokens", 4)},
			`{"usage":{"resp":{"completion_tokens":4,"prompt_tokens":3,"requests":1,"total_tokens":7}}}`},
		{"older gen_ai", []*commonpb.KeyValue{kv("gen_ai.request.model", "req"),
			kv("gen_ai.usage.prompt_tokens", 3), kv("gen_ai.usage.completion_tokens", 4)},
			`{"usage":{"req":{"completion_tokens":4,"prompt_tokens":3,"requests":1,"total_tokens":7}}}`},
		{"AI SDK", []*commonpb.KeyValue{kv("ai.model.id", "gpt"), kv("ai.usage.promptTokens", 5), kv("ai.usage.completionTokens", 1.0)},
			`{"usage":{"gpt":{"completion_tokens":1,"prompt_tokens":5,"requests":1,"total_tokens":6}}}`},
		{"OpenInference", []*commonpb.KeyValue{kv("llm.model_name", "oi"), kv("llm.token_count.prompt", 2),
			kv("llm.token_count.completion", 2), kv("llm.token_count.total", 5)},
			`{"usage":{"oi":{"completion_tokens":2,"prompt_tokens":2,"requests":1,"total_tokens":5}}}`},
		{"no model", []*commonpb.KeyValue{kv("gen_ai.usage.input_tokens", "9")},
			`{"usage":{"unknown":{"completion_tokens":0,"prompt_tokens":9,"requests":1,"total_tokens":9}}}`},
		{"no usage", []*commonpb.KeyValue{kv("gen_ai.request.model", "m")}, `{}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(spanSummary(attributeMap(tt.attrs))); got != tt.want {
				t.Fatalf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestNestAttributes: dotted keys nest; a key that would nest under a
// value is kept whole, whichever order the attributes come in.
func TestNestAttributes(t *testing.T) {
	got := string(mustMarshal(nestAttributes([]*commonpb.KeyValue{
		kv("a.b.c", 1), kv("a", "x"), kv("gen_ai.usage.input_tokens", 2), kv("gen_ai.system", "openai"), kv("plain", 3),
	})))
	want := `{"a":"x","a.b.c":1,"gen_ai":{"system":"openai","usage":{"input_tokens":2}},"plain":3}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}
