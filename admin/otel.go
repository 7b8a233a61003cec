package admin

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/trace"
)

// POST /otel/v1/traces: OpenTelemetry spans in, as calls (trace.SpanCalls
// maps them), the way Weave's trace server takes them. The body is an
// OTLP/HTTP ExportTraceServiceRequest in protobuf or in OTLP/JSON, gzipped
// or not; the answer an ExportTraceServiceResponse in the request's
// encoding, whose partial_success counts the spans refused.

const (
	protobufType = "application/x-protobuf"
	jsonType     = "application/json"

	// defaultMaxBodyBytes bounds a decompressed body when Options sets
	// none, as server.max_body_bytes defaults to.
	defaultMaxBodyBytes = 4 << 20
	// maxOTelSpans bounds the spans of one request: they are written in one
	// transaction. The OpenTelemetry SDKs export at most 512 a batch.
	maxOTelSpans = 10_000
	// maxSpanAttributesBytes bounds a span's attributes as stored JSON
	// (resource and scope included): a span over it is refused, the rest
	// of the request stored.
	maxSpanAttributesBytes = 1 << 20
	// maxReportedRejections bounds the reasons partial_success names.
	maxReportedRejections = 5
)

// otelTraces serves POST /otel/v1/traces.
func (s *Service) otelTraces(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	asJSON, e := otlpContentType(rc)
	if e != nil {
		return e
	}
	body, e := s.otlpBody(rc)
	if e != nil {
		return e
	}
	if asJSON {
		if e := s.bounds.checkJSON(body); e != nil {
			return e
		}
	}
	req, e := decodeOTLP(body, asJSON)
	if e != nil {
		return e
	}
	if n := trace.SpanCount(req); n > maxOTelSpans {
		return &apiError{status: fasthttp.StatusRequestEntityTooLarge,
			detail: "The request holds " + strconv.Itoa(n) + " spans; at most " + strconv.Itoa(maxOTelSpans) + " are taken at once"}
	}
	header := string(rc.Request.Header.Peek("project_id"))
	if reason := projectBounds(header); reason != "" {
		return invalid([]fieldError{{Loc: []any{"header", "project_id"}, Type: "value_error",
			Msg: "Value error, " + reason, Input: truncateInput(header)}})
	}
	calls, rejected := trace.SpanCalls(req)
	pc := projectCache{s: s, ctx: ctx, key: key}
	writes := make([]trace.CallWrite, 0, 2*len(calls))
	locs := make([][]any, 0, 2*len(calls))
	for i := range calls {
		c := &calls[i]
		projectID, reason := header, ""
		if projectID == "" {
			projectID, reason = resourceProject(c)
		}
		if reason == "" {
			reason = s.spanBounds(c)
		}
		if reason != "" {
			rejected = append(rejected, trace.RejectedSpan{SpanLoc: c.SpanLoc, Reason: reason})
			continue
		}
		loc := spanLoc(c.SpanLoc)
		projectLoc := []any{"header", "project_id"}
		if header == "" {
			projectLoc = loc
		}
		p, e := pc.forWrite(projectID, projectLoc)
		if e != nil {
			return e
		}
		name := key.Name
		c.Start.ProjectID, c.End.ProjectID, c.Start.SvcUserID = p.ID, p.ID, &name
		writes = append(writes, trace.CallWrite{Start: &c.Start}, trace.CallWrite{End: &c.End})
		locs = append(locs, loc, loc)
	}
	if len(writes) > 0 {
		if _, e := s.writeCalls(ctx, writes, locs); e != nil {
			return e
		}
	}
	writeOTLP(rc, asJSON, exportResponse(rejected))
	return nil
}

// otlpContentType reports whether the body is OTLP/JSON (true) or
// protobuf (false), refusing any other media type with 415.
func otlpContentType(rc *fasthttp.RequestCtx) (asJSON bool, e *apiError) {
	mediaType, _, _ := strings.Cut(string(rc.Request.Header.ContentType()), ";")
	switch strings.ToLower(strings.TrimSpace(mediaType)) {
	case protobufType:
		return false, nil
	case jsonType:
		return true, nil
	}
	return false, &apiError{status: fasthttp.StatusUnsupportedMediaType,
		detail: "Content-Type must be " + protobufType + " or " + jsonType}
}

// otlpBody is the request body, decompressed when Content-Encoding is
// gzip, and at most maxBodyBytes once decompressed.
func (s *Service) otlpBody(rc *fasthttp.RequestCtx) ([]byte, *apiError) {
	switch enc := strings.ToLower(strings.TrimSpace(string(rc.Request.Header.ContentEncoding()))); enc {
	case "", "identity":
		return rc.PostBody(), nil
	case "gzip":
	default:
		return nil, &apiError{status: fasthttp.StatusUnsupportedMediaType,
			detail: "Content-Encoding must be gzip or identity, not " + strconv.Quote(enc)}
	}
	zr, err := gzip.NewReader(bytes.NewReader(rc.PostBody()))
	if err != nil {
		return nil, notOTLP("the body is not gzip: " + err.Error())
	}
	body, err := io.ReadAll(io.LimitReader(zr, int64(s.maxBodyBytes)+1))
	if err != nil {
		return nil, notOTLP("the body is not gzip: " + err.Error())
	}
	if len(body) > s.maxBodyBytes {
		return nil, &apiError{status: fasthttp.StatusRequestEntityTooLarge,
			detail: "The decompressed body exceeds the limit of " + strconv.Itoa(s.maxBodyBytes) + " bytes"}
	}
	return body, nil
}

func notOTLP(msg string) *apiError {
	return invalid([]fieldError{{Loc: at(bodyLoc), Type: "value_error", Input: nil,
		Msg: "Value error, not an OTLP ExportTraceServiceRequest: " + msg}})
}

// decodeOTLP decodes an ExportTraceServiceRequest with the official
// protos. OTLP/JSON writes ids in hex, which protojson (reading bytes as
// base64) does not: otlpJSONIDs rewrites them first. Unknown fields are
// ignored, as OTLP receivers must.
func decodeOTLP(body []byte, asJSON bool) (*coltracepb.ExportTraceServiceRequest, *apiError) {
	req := &coltracepb.ExportTraceServiceRequest{}
	if !asJSON {
		if err := proto.Unmarshal(body, req); err != nil {
			return nil, notOTLP(err.Error())
		}
		return req, nil
	}
	doc, e := decodeBody(body, false)
	if e != nil {
		return nil, e
	}
	otlpJSONIDs(doc)
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(mustJSON(doc), req); err != nil {
		return nil, notOTLP(err.Error())
	}
	return req, nil
}

// otlpJSONIDs rewrites, in an OTLP/JSON ExportTraceServiceRequest decoded
// as doc, each span's traceId, spanId and parentSpanId, and each link's
// traceId and spanId, from the hex the OTLP/JSON mapping writes them in to
// the base64 protojson reads bytes from. An id that is not hex becomes one
// zero byte, which no id is: the span is refused for its id, not the
// request for its syntax. Fields may be named in lowerCamelCase or in the
// proto's snake_case, as protojson accepts both.
func otlpJSONIDs(doc any) {
	for _, rs := range jsonList(doc, "resourceSpans", "resource_spans") {
		for _, ss := range jsonList(rs, "scopeSpans", "scope_spans") {
			for _, span := range jsonList(ss, "spans") {
				hexToBase64(span, "traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")
				for _, link := range jsonList(span, "links") {
					hexToBase64(link, "traceId", "trace_id", "spanId", "span_id")
				}
			}
		}
	}
}

// jsonList is the first of keys in obj that is a list.
func jsonList(obj any, keys ...string) []any {
	m, _ := obj.(map[string]any)
	for _, k := range keys {
		if l, ok := m[k].([]any); ok {
			return l
		}
	}
	return nil
}

func hexToBase64(obj any, keys ...string) {
	m, _ := obj.(map[string]any)
	for _, k := range keys {
		h, ok := m[k].(string)
		if !ok || h == "" {
			continue
		}
		b, err := hex.DecodeString(h)
		if err != nil {
			b = []byte{0}
		}
		m[k] = base64.StdEncoding.EncodeToString(b)
	}
}

// resourceProject is the project a span's resource names with
// wandb.entity and wandb.project, or why it names none.
func resourceProject(c *trace.SpanCall) (string, string) {
	if c.Entity == "" || c.Project == "" {
		return "", "no project: send the header project_id: entity/project, or the resource attributes wandb.entity and wandb.project"
	}
	id := c.Entity + "/" + c.Project
	if _, _, ok := splitProjectID(id); !ok {
		return "", "wandb.entity and wandb.project must name a project entity/project"
	}
	if reason := projectBounds(id); reason != "" {
		return "", reason
	}
	return id, ""
}

// projectBounds says why a project id may not be stored ("" when it may),
// by the bounds of every trace route.
func projectBounds(id string) string {
	switch {
	case strings.IndexByte(id, 0) >= 0:
		return "the project holds a NUL character"
	case len(id) > maxIDBytes:
		return "the project is longer than " + strconv.Itoa(maxIDBytes) + " bytes"
	}
	return ""
}

// spanBounds says why a span's call may not be stored ("" when it may):
// the bounds of every trace route (NUL characters, the length of op names
// and ids, nesting) and of a span's attributes.
func (s *Service) spanBounds(c *trace.SpanCall) string {
	switch {
	case strings.IndexByte(c.Start.OpName, 0) >= 0:
		return "the span's name holds a NUL character"
	case len(c.Start.OpName) > maxOpNameBytes:
		return "the span's name is longer than " + strconv.Itoa(maxOpNameBytes) + " bytes"
	case len(c.Start.Attributes) > maxSpanAttributesBytes:
		return "the span's attributes take more than " + strconv.Itoa(maxSpanAttributesBytes) + " bytes"
	case s.bounds.refuses(c.Start.Attributes) || s.bounds.refuses(c.End.Summary):
		return "the span's attributes hold a NUL character or nest deeper than " + strconv.Itoa(s.bounds.maxDepth) + " levels"
	case c.End.Exception != nil && strings.IndexByte(*c.End.Exception, 0) >= 0:
		return "the span's status message holds a NUL character"
	case c.End.Completion != nil && (strings.IndexByte(c.End.Completion.ID, 0) >= 0 || len(c.End.Completion.ID) > maxIDBytes):
		return "gen_ai.response.id holds a NUL character or is longer than " + strconv.Itoa(maxIDBytes) + " bytes"
	}
	return ""
}

// spanLoc is where a span is in the request, for errors.
func spanLoc(l trace.SpanLoc) []any {
	return []any{"body", "resource_spans", l.Resource, "scope_spans", l.Scope, "spans", l.Span}
}

// exportResponse is the answer to a request whose spans rejected were
// refused: partial_success counts them and names the first few reasons.
func exportResponse(rejected []trace.RejectedSpan) *coltracepb.ExportTraceServiceResponse {
	resp := &coltracepb.ExportTraceServiceResponse{}
	if len(rejected) == 0 {
		return resp
	}
	var msg strings.Builder
	fmt.Fprintf(&msg, "%d spans rejected", len(rejected))
	for i, r := range rejected[:min(len(rejected), maxReportedRejections)] {
		sep := "; "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&msg, "%sresource_spans[%d].scope_spans[%d].spans[%d]: %s", sep, r.Resource, r.Scope, r.Span, r.Reason)
	}
	resp.PartialSuccess = &coltracepb.ExportTracePartialSuccess{
		RejectedSpans: int64(len(rejected)), ErrorMessage: msg.String(),
	}
	return resp
}

// writeOTLP answers 200 with resp in the request's encoding.
func writeOTLP(rc *fasthttp.RequestCtx, asJSON bool, resp *coltracepb.ExportTraceServiceResponse) {
	var out []byte
	var err error
	if asJSON {
		rc.SetContentType(jsonType)
		out, err = protojson.Marshal(resp)
	} else {
		rc.SetContentType(protobufType)
		out, err = proto.Marshal(resp)
	}
	if err != nil {
		// A response of an int64 and a string always encodes.
		rc.SetStatusCode(fasthttp.StatusInternalServerError)
		return
	}
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetBody(out)
}
