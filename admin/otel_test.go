package admin_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-dev/tollgate/accounting"
)

// otelT0 is when the spans of these tests start.
var otelT0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

const (
	otelTraceHex = "0af7651916cd43dd8448eb211c80319c"
	otelTraceID  = "0af76519-16cd-43dd-8448-eb211c80319c"
)

func strAttr(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

func intAttr(k string, v int64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
}

func hexBytes(t *testing.T, s string) []byte {
	t.Helper()
	var b []byte
	if _, err := fmt.Sscanf(s, "%x", &b); err != nil {
		t.Fatal(err)
	}
	return b
}

// otelSpan is a span of trace otelTraceHex, from otelT0+start for d.
func otelSpan(t *testing.T, id, parent, name string, start, d time.Duration, attrs ...*commonpb.KeyValue) *tracepb.Span {
	t.Helper()
	s := &tracepb.Span{
		TraceId: hexBytes(t, otelTraceHex), SpanId: hexBytes(t, id), Name: name, Kind: tracepb.Span_SPAN_KIND_CLIENT,
		StartTimeUnixNano: uint64(otelT0.Add(start).UnixNano()), EndTimeUnixNano: uint64(otelT0.Add(start + d).UnixNano()),
		Attributes: attrs,
	}
	if parent != "" {
		s.ParentSpanId = hexBytes(t, parent)
	}
	return s
}

// otelRequest is an export of spans from a resource naming entity/project
// (none when entity is "").
func otelRequest(entity, project string, spans ...*tracepb.Span) *coltracepb.ExportTraceServiceRequest {
	res := &resourcepb.Resource{Attributes: []*commonpb.KeyValue{strAttr("service.name", "app")}}
	if entity != "" {
		res.Attributes = append(res.Attributes, strAttr("wandb.entity", entity), strAttr("wandb.project", project))
	}
	return &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource:   res,
		ScopeSpans: []*tracepb.ScopeSpans{{Scope: &commonpb.InstrumentationScope{Name: "test", Version: "1"}, Spans: spans}},
	}}}
}

// agentTrace is an agent span over a chat span with GenAI usage, as the
// GenAI conventions' instrumentations export them (the agent repeats its
// chat's usage), and a failed tool span under the agent.
func agentTrace(t *testing.T) []*tracepb.Span {
	return []*tracepb.Span{
		otelSpan(t, "00f067aa0ba902b7", "", "invoke_agent helper", 0, 3*time.Second,
			strAttr("gen_ai.operation.name", "invoke_agent"), strAttr("gen_ai.request.model", "m"),
			intAttr("gen_ai.usage.input_tokens", 11), intAttr("gen_ai.usage.output_tokens", 7)),
		otelSpan(t, "b7ad6b7169203331", "00f067aa0ba902b7", "chat m", time.Second, time.Second,
			strAttr("gen_ai.operation.name", "chat"), strAttr("gen_ai.request.model", "m-request"),
			strAttr("gen_ai.response.model", "m"),
			intAttr("gen_ai.usage.input_tokens", 11), intAttr("gen_ai.usage.output_tokens", 7)),
		func() *tracepb.Span {
			s := otelSpan(t, "c1c2c3c4c5c6c7c8", "00f067aa0ba902b7", "execute_tool search", 2*time.Second, 500*time.Millisecond)
			s.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "search backend down"}
			return s
		}(),
	}
}

// postOTLP posts body to /otel/v1/traces with the headers (name, value
// pairs); chunked sends it with chunked transfer coding.
func (e *env) postOTLP(t *testing.T, authz, contentType string, body []byte, chunked bool, headers ...string) response {
	t.Helper()
	conn, err := e.ln.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI("http://tollgate/otel/v1/traces")
	if authz != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, authz)
	}
	req.Header.SetContentType(contentType)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	if chunked {
		req.SetBodyStream(bytes.NewReader(body), -1)
	} else {
		req.SetBody(body)
	}
	req.SetConnectionClose()
	bw := bufio.NewWriter(conn)
	if err := req.Write(bw); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(conn)); err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode(), body: append([]byte(nil), resp.Body()...), contentType: string(resp.Header.ContentType())}
}

func marshalProto(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// exportAnswer decodes an ExportTraceServiceResponse in the encoding of
// the response's content type.
func exportAnswer(t *testing.T, r response) *coltracepb.ExportTraceServiceResponse {
	t.Helper()
	if r.status != fasthttp.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	out := &coltracepb.ExportTraceServiceResponse{}
	var err error
	switch r.contentType {
	case "application/x-protobuf":
		err = proto.Unmarshal(r.body, out)
	case "application/json":
		err = protojson.Unmarshal(r.body, out)
	default:
		t.Fatalf("content type %q", r.contentType)
	}
	if err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
	return out
}

// callsByID reads the project's calls from /calls/stream_query.
func (e *env) callsByID(t *testing.T, project string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, c := range e.ok("POST", "/calls/stream_query", bearer(aliceKey), `{"project_id":"`+project+`"}`).lines(t) {
		out[c["id"].(string)] = c
	}
	return out
}

// TestOTelIngestEncodings: the same agent trace posted as protobuf, as
// gzipped protobuf in chunks, and as OTLP/JSON with hex ids gives the same
// calls: ids and parents from the span ids, the trace id in the trace
// service's form, op names, times, nested attributes, usage under the
// model, and the failed span's status as its exception.
func TestOTelIngestEncodings(t *testing.T) {
	pb := func(t *testing.T) []byte { return marshalProto(t, otelRequest("team-a", "p", agentTrace(t)...)) }
	for _, tt := range []struct {
		name        string
		contentType string
		body        func(t *testing.T) []byte
		chunked     bool
		headers     []string
	}{
		{name: "protobuf", contentType: "application/x-protobuf", body: pb},
		{name: "gzip chunked", contentType: "application/x-protobuf", chunked: true,
			body: func(t *testing.T) []byte { return gzipped(t, pb(t)) }, headers: []string{"Content-Encoding", "gzip"}},
		{name: "json hex ids", contentType: "application/json", body: func(t *testing.T) []byte { return []byte(agentTraceJSON) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			got := exportAnswer(t, e.postOTLP(t, basic(aliceKey), tt.contentType, tt.body(t), tt.chunked, tt.headers...))
			if got.GetPartialSuccess().GetRejectedSpans() != 0 {
				t.Fatalf("rejected: %v", got)
			}
			calls := e.callsByID(t, "team-a/p")
			if len(calls) != 3 {
				t.Fatalf("calls %v", calls)
			}
			agent, chat, tool := calls["00f067aa0ba902b7"], calls["b7ad6b7169203331"], calls["c1c2c3c4c5c6c7c8"]
			for _, c := range []map[string]any{agent, chat, tool} {
				if c["trace_id"] != otelTraceID {
					t.Errorf("trace_id %v, want %s", c["trace_id"], otelTraceID)
				}
			}
			if agent["parent_id"] != nil || chat["parent_id"] != "00f067aa0ba902b7" || tool["parent_id"] != "00f067aa0ba902b7" {
				t.Errorf("parents %v %v %v", agent["parent_id"], chat["parent_id"], tool["parent_id"])
			}
			if chat["op_name"] != "chat m" || chat["started_at"] != "2026-11-21T10:00:01.000000Z" || chat["ended_at"] != "2026-11-21T10:00:02.000000Z" {
				t.Errorf("chat %v %v %v", chat["op_name"], chat["started_at"], chat["ended_at"])
			}
			if tool["exception"] != "search backend down" || chat["exception"] != nil {
				t.Errorf("exceptions %v %v", tool["exception"], chat["exception"])
			}
			attrs := compact(t, chat["attributes"])
			for _, want := range []string{`"gen_ai":{"operation":{"name":"chat"}`, `"usage":{"input_tokens":11,"output_tokens":7}`,
				`"weave":{"source":"otel"}`, `"kind":"SPAN_KIND_CLIENT"`, `"scope":{"name":"test","version":"1"}`,
				`"service":{"name":"app"}`} {
				if !strings.Contains(attrs, want) {
					t.Errorf("attributes %s lack %s", attrs, want)
				}
			}
			if got := compact(t, chat["summary"]); got != `{"usage":{"m":{"completion_tokens":7,"prompt_tokens":11,"requests":1,"total_tokens":18}}}` {
				t.Errorf("chat summary %s", got)
			}
		})
	}
}

// agentTraceJSON is agentTrace in OTLP/JSON: ids in hex, enums as names
// and as numbers, 64-bit integers as strings, as the exporters write them.
const agentTraceJSON = `{"resourceSpans":[{"resource":{"attributes":[
  {"key":"service.name","value":{"stringValue":"app"}},
  {"key":"wandb.entity","value":{"stringValue":"team-a"}},{"key":"wandb.project","value":{"stringValue":"p"}}]},
 "scopeSpans":[{"scope":{"name":"test","version":"1"},"spans":[
  {"traceId":"` + otelTraceHex + `","spanId":"00f067aa0ba902b7","name":"invoke_agent helper","kind":3,
   "startTimeUnixNano":"1795255200000000000","endTimeUnixNano":"1795255203000000000",
   "attributes":[{"key":"gen_ai.operation.name","value":{"stringValue":"invoke_agent"}},
    {"key":"gen_ai.request.model","value":{"stringValue":"m"}},
    {"key":"gen_ai.usage.input_tokens","value":{"intValue":"11"}},{"key":"gen_ai.usage.output_tokens","value":{"intValue":7}}]},
  {"traceId":"` + otelTraceHex + `","spanId":"b7ad6b7169203331","parentSpanId":"00f067aa0ba902b7","name":"chat m","kind":"SPAN_KIND_CLIENT",
   "startTimeUnixNano":"1795255201000000000","endTimeUnixNano":1795255202000000000,
   "attributes":[{"key":"gen_ai.operation.name","value":{"stringValue":"chat"}},
    {"key":"gen_ai.request.model","value":{"stringValue":"m-request"}},{"key":"gen_ai.response.model","value":{"stringValue":"m"}},
    {"key":"gen_ai.usage.input_tokens","value":{"intValue":"11"}},{"key":"gen_ai.usage.output_tokens","value":{"intValue":"7"}}]},
  {"traceId":"` + otelTraceHex + `","spanId":"c1c2c3c4c5c6c7c8","parentSpanId":"00f067aa0ba902b7","name":"execute_tool search","kind":"SPAN_KIND_CLIENT",
   "startTimeUnixNano":"1795255202000000000","endTimeUnixNano":"1795255202500000000",
   "status":{"code":"STATUS_CODE_ERROR","message":"search backend down"}}]}]}]}`

// TestOTelUsageCountedOnce: the agent span repeats its chat's usage, and
// a gateway completion sent with the chat span's traceparent (no
// gen_ai.response.id to fold it by) is the chat's request: /calls/usage
// and /trace/usage give the root the chat's tokens once.
func TestOTelUsageCountedOnce(t *testing.T) {
	e := newEnv(t)
	exportAnswer(t, e.postOTLP(t, bearer(aliceKey), "application/x-protobuf", marshalProto(t, otelRequest("team-a", "p", agentTrace(t)...)), false))

	root := decodeUsage(t, e.ok("POST", "/calls/usage", bearer(aliceKey), `{"project_id":"team-a/p","call_ids":["00f067aa0ba902b7"]}`))
	if want := u(1, 11, 7); !reflect.DeepEqual(root.CallUsage["00f067aa0ba902b7"], want) {
		t.Fatalf("root usage %+v, want %+v", root.CallUsage, want)
	}

	// The gateway's own call of the chat's completion, a child of the chat
	// span (the traceparent it was sent with), with the same tokens.
	rec := accounting.Record{RequestID: "req-gw", CallID: "gw-1", TraceID: otelTraceID, ParentID: "b7ad6b7169203331",
		KeyName: "alice", Team: "team-a", Project: "p", Model: "m", ServedModel: "m", Backend: "sim", Status: 200,
		PromptTokens: 11, CompletionTokens: 7, TotalTokens: 18, Started: otelT0.Add(time.Second), Ended: otelT0.Add(2 * time.Second)}
	if err := e.db.InsertRecords(context.Background(), []accounting.Record{rec}); err != nil {
		t.Fatal(err)
	}
	if calls := e.callsByID(t, "team-a/p"); calls["gw-1"]["parent_id"] != "b7ad6b7169203331" || calls["gw-1"]["trace_id"] != otelTraceID {
		t.Fatalf("the gateway's call did not join the span's trace: %v", calls["gw-1"])
	}
	root = decodeUsage(t, e.ok("POST", "/calls/usage", bearer(aliceKey), `{"project_id":"team-a/p","call_ids":["00f067aa0ba902b7"]}`))
	if want := u(1, 11, 7); !reflect.DeepEqual(root.CallUsage["00f067aa0ba902b7"], want) {
		t.Fatalf("root usage with the gateway's call %+v, want %+v", root.CallUsage, want)
	}
	all := decodeUsage(t, e.ok("POST", "/trace/usage", bearer(aliceKey), `{"project_id":"team-a/p"}`))
	if got, want := all.CallUsage["00f067aa0ba902b7"], u(1, 11, 7); !reflect.DeepEqual(got, want) {
		t.Fatalf("trace usage of the root %+v, want %+v", got, want)
	}
}

// TestOTelFoldsGatewayCompletion: a span reporting the completion id the
// gateway recorded (gen_ai.response.id) folds the gateway's call into
// itself, whichever is stored first, as a Weave SDK's call does.
func TestOTelFoldsGatewayCompletion(t *testing.T) {
	for _, gatewayFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("gateway first %v", gatewayFirst), func(t *testing.T) {
			e := newEnv(t)
			rec := accounting.Record{RequestID: "req-gw", CallID: "gw-1", TraceID: "gw-trace",
				KeyName: "alice", Team: "team-a", Project: "p", Model: "m", ServedModel: "m", Backend: "sim", Status: 200,
				CompletionID: "chatcmpl-42", CompletionCreated: otelT0.Add(time.Second).Unix(),
				PromptTokens: 11, CompletionTokens: 7, TotalTokens: 18, Started: otelT0.Add(time.Second), Ended: otelT0.Add(2 * time.Second)}
			spans := []*tracepb.Span{
				otelSpan(t, "00f067aa0ba902b7", "", "generate", 0, 3*time.Second),
				otelSpan(t, "b7ad6b7169203331", "00f067aa0ba902b7", "chat m", time.Second, time.Second,
					strAttr("gen_ai.response.model", "m"), strAttr("gen_ai.response.id", "chatcmpl-42"),
					intAttr("gen_ai.usage.input_tokens", 11), intAttr("gen_ai.usage.output_tokens", 7)),
			}
			insert := func() {
				if err := e.db.InsertRecords(context.Background(), []accounting.Record{rec}); err != nil {
					t.Fatal(err)
				}
			}
			if gatewayFirst {
				insert()
			}
			exportAnswer(t, e.postOTLP(t, bearer(aliceKey), "application/x-protobuf", marshalProto(t, otelRequest("team-a", "p", spans...)), false))
			if !gatewayFirst {
				insert()
			}
			calls := e.callsByID(t, "team-a/p")
			if len(calls) != 2 || calls["gw-1"] != nil {
				t.Fatalf("calls %v, want the two spans' only", calls)
			}
			gw, _ := calls["b7ad6b7169203331"]["attributes"].(map[string]any)["gateway"].(map[string]any)
			if gw["call_id"] != "gw-1" || gw["backend"] != "sim" {
				t.Fatalf("the chat span lacks the gateway's attributes: %v", calls["b7ad6b7169203331"]["attributes"])
			}
			root := decodeUsage(t, e.ok("POST", "/calls/usage", bearer(aliceKey), `{"project_id":"team-a/p","call_ids":["00f067aa0ba902b7"]}`))
			if want := u(1, 11, 7); !reflect.DeepEqual(root.CallUsage["00f067aa0ba902b7"], want) {
				t.Fatalf("root usage %+v, want %+v", root.CallUsage, want)
			}
		})
	}
}

// TestOTelPartialSuccess: spans with bad ids, over the bounds or without a
// project are refused and counted; the others are stored.
func TestOTelPartialSuccess(t *testing.T) {
	e := newEnv(t)
	good := otelSpan(t, "00f067aa0ba902b7", "", "fine", 0, time.Second)
	shortID := otelSpan(t, "00f067aa0ba902b7", "", "short id", 0, time.Second)
	shortID.SpanId = []byte{1, 2, 3}
	zeroTrace := otelSpan(t, "1111111111111111", "", "zero trace", 0, time.Second)
	zeroTrace.TraceId = make([]byte, 16)
	nul := otelSpan(t, "2222222222222222", "", "nul", 0, time.Second, strAttr("x", "a\x00b"))
	long := otelSpan(t, "3333333333333333", "", strings.Repeat("n", 1025), 0, time.Second)
	big := otelSpan(t, "4444444444444444", "", "big", 0, time.Second, strAttr("x", strings.Repeat("a", 1<<20)))
	req := otelRequest("team-a", "p", good, shortID, zeroTrace, nul, long, big)
	req.ResourceSpans = append(req.ResourceSpans, otelRequest("", "", otelSpan(t, "5555555555555555", "", "nowhere", 0, time.Second)).ResourceSpans...)

	got := exportAnswer(t, e.postOTLP(t, bearer(aliceKey), "application/x-protobuf", marshalProto(t, req), false))
	ps := got.GetPartialSuccess()
	if ps.GetRejectedSpans() != 6 {
		t.Fatalf("rejected %d, want 6: %s", ps.GetRejectedSpans(), ps.GetErrorMessage())
	}
	for _, want := range []string{"6 spans rejected", "spans[1]: span_id must be 8 bytes", "spans[2]: trace_id must be 16 bytes",
		"spans[3]: the span's attributes hold a NUL character", "spans[4]: the span's name is longer than 1024 bytes",
		"spans[5]: the span's attributes take more than"} {
		if !strings.Contains(ps.GetErrorMessage(), want) {
			t.Errorf("error message %q lacks %q", ps.GetErrorMessage(), want)
		}
	}
	calls := e.callsByID(t, "team-a/p")
	if len(calls) != 1 || calls["00f067aa0ba902b7"]["op_name"] != "fine" {
		t.Fatalf("calls %v, want the good span's only", calls)
	}

	// In JSON the answer is JSON, and an id that is not hex is a bad id.
	body := strings.Replace(agentTraceJSON, `"spanId":"c1c2c3c4c5c6c7c8"`, `"spanId":"not-hex!"`, 1)
	r := e.postOTLP(t, bearer(aliceKey), "application/json", []byte(body), false)
	if ps := exportAnswer(t, r).GetPartialSuccess(); ps.GetRejectedSpans() != 1 || !strings.Contains(ps.GetErrorMessage(), "spans[2]: span_id") {
		t.Fatalf("partial success %v", ps)
	}
	if !strings.Contains(string(r.body), `"rejectedSpans":"1"`) {
		t.Fatalf("JSON answer %s", r.body)
	}
}

// TestOTelProjectHeader: the project_id header names the project for
// every span, as Weave's OTLP route takes it.
func TestOTelProjectHeader(t *testing.T) {
	e := newEnv(t)
	req := otelRequest("", "", otelSpan(t, "00f067aa0ba902b7", "", "headed", 0, time.Second))
	exportAnswer(t, e.postOTLP(t, bearer(aliceKey), "application/x-protobuf", marshalProto(t, req), false, "project_id", "team-a/headed"))
	if calls := e.callsByID(t, "team-a/headed"); calls["00f067aa0ba902b7"]["op_name"] != "headed" {
		t.Fatalf("calls %v", calls)
	}
}

// TestOTelAuthAndBounds: the route authenticates and isolates teams as
// every trace route does, and refuses what is over its bounds whole.
func TestOTelAuthAndBounds(t *testing.T) {
	e := newEnv(t)
	pb := marshalProto(t, otelRequest("team-a", "p", otelSpan(t, "00f067aa0ba902b7", "", "x", 0, time.Second)))
	many := make([]*tracepb.Span, 10_001)
	for i := range many {
		many[i] = &tracepb.Span{}
	}
	deep := `{"resourceSpans":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`
	bomb := gzipped(t, make([]byte, 5<<20))
	for _, tt := range []struct {
		name        string
		authz       string
		contentType string
		body        []byte
		headers     []string
		status      int
		detail      string
	}{
		{"no key", "", "application/x-protobuf", pb, nil, fasthttp.StatusUnauthorized, "Missing or invalid API key"},
		{"wrong key", bearer("sk-wrong"), "application/x-protobuf", pb, nil, fasthttp.StatusUnauthorized, "Missing or invalid API key"},
		{"other team", bearer(bobKey), "application/x-protobuf", pb, nil, fasthttp.StatusForbidden, `may not use entity \"team-a\"`},
		{"other team by header", bearer(aliceKey), "application/x-protobuf", pb, []string{"project_id", "team-b/p"}, fasthttp.StatusForbidden, `may not use entity \"team-b\"`},
		{"too many spans", bearer(aliceKey), "application/x-protobuf", marshalProto(t, otelRequest("team-a", "p", many...)), nil,
			fasthttp.StatusRequestEntityTooLarge, "10001 spans; at most 10000"},
		{"gzip over the body bound", bearer(aliceKey), "application/x-protobuf", bomb, []string{"Content-Encoding", "gzip"},
			fasthttp.StatusRequestEntityTooLarge, "decompressed body exceeds"},
		{"json too deep", bearer(aliceKey), "application/json", []byte(deep), nil, fasthttp.StatusUnprocessableEntity, "nested deeper than 64"},
		{"json NUL", bearer(aliceKey), "application/json", []byte(`{"resourceSpans":[],"x":"a\u0000"}`), nil, fasthttp.StatusUnprocessableEntity, "no NUL character"},
		{"gzip json NUL", bearer(aliceKey), "application/json", gzipped(t, []byte(`{"resourceSpans":[],"x":"a\u0000"}`)),
			[]string{"Content-Encoding", "gzip"}, fasthttp.StatusUnprocessableEntity, "no NUL character"},
		{"not protobuf", bearer(aliceKey), "application/x-protobuf", []byte("\xff\xff\xff"), nil, fasthttp.StatusUnprocessableEntity, "not an OTLP ExportTraceServiceRequest"},
		{"header too long", bearer(aliceKey), "application/x-protobuf", pb, []string{"project_id", "team-a/" + strings.Repeat("p", 600)},
			fasthttp.StatusUnprocessableEntity, "longer than 512 bytes"},
		{"other media type", bearer(aliceKey), "text/plain", pb, nil, fasthttp.StatusUnsupportedMediaType, "Content-Type must be"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := e.postOTLP(t, tt.authz, tt.contentType, tt.body, false, tt.headers...)
			if r.status != tt.status || !strings.Contains(string(r.body), tt.detail) {
				t.Fatalf("status %d %s, want %d with %q", r.status, r.body, tt.status, tt.detail)
			}
			var v map[string]any
			if err := json.Unmarshal(r.body, &v); err != nil || v["detail"] == nil {
				t.Fatalf("not the trace service's error shape: %s", r.body)
			}
		})
	}
	if calls := e.callsByID(t, "team-a/p"); len(calls) != 0 {
		t.Fatalf("a refused request stored calls: %v", calls)
	}
}
