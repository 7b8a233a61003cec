package admin

import (
	"testing"
)

// TestOTLPJSONIDs: the hex ids of OTLP/JSON become the base64 protojson
// reads, in camelCase and snake_case fields, spans and links; an id that
// is not hex becomes one zero byte (a bad id, refused per span); other
// fields are left alone.
func TestOTLPJSONIDs(t *testing.T) {
	for _, tt := range []struct {
		name, in, want string
	}{
		{"span ids",
			`{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"00f067aa0ba902b7","parentSpanId":"b7ad6b7169203331","name":"00f067aa0ba902b7"}]}]}]}`,
			`{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"00f067aa0ba902b7","parentSpanId":"t61rcWkgMzE=","spanId":"APBnqgupArc=","traceId":"CvdlGRbNQ92ESOshHIAxnA=="}]}]}]}`},
		{"snake case and links",
			`{"resource_spans":[{"scope_spans":[{"spans":[{"trace_id":"0af7651916cd43dd8448eb211c80319c","span_id":"00f067aa0ba902b7","links":[{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203331"}]}]}]}]}`,
			`{"resource_spans":[{"scope_spans":[{"spans":[{"links":[{"spanId":"t61rcWkgMzE=","traceId":"CvdlGRbNQ92ESOshHIAxnA=="}],"span_id":"APBnqgupArc=","trace_id":"CvdlGRbNQ92ESOshHIAxnA=="}]}]}]}`},
		{"not hex, empty, not a string",
			`{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"xyz","spanId":"","parentSpanId":7}]}]}]}`,
			`{"resourceSpans":[{"scopeSpans":[{"spans":[{"parentSpanId":7,"spanId":"","traceId":"AA=="}]}]}]}`},
		{"no spans", `{"resourceSpans":[{"resource":{}}]}`, `{"resourceSpans":[{"resource":{}}]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			doc, e := decodeBody([]byte(tt.in), true)
			if e != nil {
				t.Fatal(e)
			}
			otlpJSONIDs(doc)
			if got := string(mustJSON(doc)); got != tt.want {
				t.Fatalf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}
