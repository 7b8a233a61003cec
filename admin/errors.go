package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/trace"
	"github.com/tollgate-dev/tollgate/weave"
)

// fieldError is one entry of a FastAPI validation error body. Clients (the
// Weave SDK, FastAPI-generated clients) read loc, msg and type; input and
// ctx are there for people reading the body.
type fieldError struct {
	Loc   []any          `json:"loc"`
	Msg   string         `json:"msg"`
	Type  string         `json:"type"`
	Input any            `json:"input"`
	Ctx   map[string]any `json:"ctx,omitempty"`
}

// apiError is a failed request: a status with either a plain detail message
// or the validation entries of a 422. cause, when set, is logged and never
// shown to the client.
type apiError struct {
	status int
	detail string
	fields []fieldError
	cause  error
}

func (e *apiError) Error() string {
	if e.cause != nil {
		return e.detail + ": " + e.cause.Error()
	}
	return e.detail
}

func unauthorized() *apiError {
	return &apiError{status: fasthttp.StatusUnauthorized, detail: "Missing or invalid API key: send Authorization: Basic base64(user:KEY) or Bearer KEY"}
}

func forbidden(entity string) *apiError {
	return &apiError{status: fasthttp.StatusForbidden, detail: "The API key may not use entity " + strconv.Quote(entity)}
}

func notFound(what string) *apiError {
	return &apiError{status: fasthttp.StatusNotFound, detail: what + " not found"}
}

// lookupError is the answer to err from reading or changing what a store
// holds: a 404 naming what when the store has no such thing, a 500 for any
// other error, nil for none.
func lookupError(err error, what string) *apiError {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, weave.ErrNotFound), errors.Is(err, trace.ErrNotFound):
		return notFound(what)
	default:
		return internalError(err)
	}
}

func internalError(cause error) *apiError {
	return &apiError{status: fasthttp.StatusInternalServerError, detail: "Internal server error", cause: cause}
}

func invalid(fields []fieldError) *apiError {
	return &apiError{status: fasthttp.StatusUnprocessableEntity, fields: fields}
}

// writeError answers with e. Server errors are logged here, once.
func (s *Service) writeError(ctx *fasthttp.RequestCtx, e *apiError) {
	if e.status >= 500 {
		s.log.Error("service api request failed",
			zap.ByteString("method", ctx.Method()), zap.ByteString("path", ctx.Path()), zap.Error(e.cause))
	}
	if e.status == fasthttp.StatusUnauthorized {
		ctx.Response.Header.Set("WWW-Authenticate", `Basic realm="tollgate"`)
	}
	if e.status == fasthttp.StatusUnprocessableEntity {
		writeJSON(ctx, e.status, struct {
			Detail []fieldError `json:"detail"`
		}{e.fields})
		return
	}
	writeJSON(ctx, e.status, struct {
		Detail string `json:"detail"`
	}{e.detail})
}

// call runs h, turning a panic into a 500 logged with its stack rather
// than the end of the process: handlers read bytes from clients and from
// the store.
func (s *Service) call(h handler, ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, p pathParams) (e *apiError) {
	defer func() {
		if x := recover(); x != nil {
			rc.ResetBody()
			e = internalError(fmt.Errorf("handler panicked: %v\n%s", x, debug.Stack()))
		}
	}()
	return h(ctx, rc, key, p)
}

// writeJSON answers with v encoded as JSON. HTML escaping is off so that
// stored payloads come back byte for byte as they were sent.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	enc := json.NewEncoder(ctx)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Every value written here is built from decoded JSON and plain
		// types, so this cannot happen short of a programming error.
		ctx.ResetBody()
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetBodyString(`{"detail":"Internal server error"}`)
	}
}

// validation collects the errors of one request, as FastAPI reports all of
// them at once rather than the first.
type validation struct {
	errs []fieldError
}

func (v *validation) add(loc []any, typ, msg string, input any) {
	v.errs = append(v.errs, fieldError{Loc: loc, Msg: msg, Type: typ, Input: input})
}

func (v *validation) addCtx(loc []any, typ, msg string, input any, c map[string]any) {
	v.errs = append(v.errs, fieldError{Loc: loc, Msg: msg, Type: typ, Input: input, Ctx: c})
}

func (v *validation) failed() bool { return len(v.errs) > 0 }

func (v *validation) err() *apiError { return invalid(v.errs) }

// at returns loc extended by more, never sharing loc's backing array, so
// that sibling locations built from one parent stay independent.
func at(loc []any, more ...any) []any {
	out := make([]any, 0, len(loc)+len(more))
	out = append(out, loc...)
	return append(out, more...)
}

var bodyLoc = []any{"body"}

// decodeBody parses a request body as JSON. Numbers stay json.Number so
// that integers are not rounded through float64. An empty body is "missing"
// when required, and nil otherwise.
func decodeBody(body []byte, required bool) (any, *apiError) {
	if len(bytes.TrimSpace(body)) == 0 {
		if !required {
			return nil, nil
		}
		return nil, invalid([]fieldError{{Loc: at(bodyLoc), Msg: "Field required", Type: "missing"}})
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		// A truncated document fails at its end, as Python's json reports.
		return nil, jsonInvalid(err, int64(len(body)))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, invalid([]fieldError{{
			Loc: at(bodyLoc, dec.InputOffset()), Msg: "JSON decode error", Type: "json_invalid",
			Input: map[string]any{}, Ctx: map[string]any{"error": "Extra data"},
		}})
	}
	return v, nil
}

func jsonInvalid(err error, offset int64) *apiError {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		offset = syn.Offset
	}
	msg := err.Error()
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		msg = "unexpected end of JSON input"
	}
	return invalid([]fieldError{{
		Loc: at(bodyLoc, offset), Msg: "JSON decode error", Type: "json_invalid",
		Input: map[string]any{}, Ctx: map[string]any{"error": msg},
	}})
}

// bodyObject decodes a body that must be a JSON object, answering FastAPI's
// model_attributes_type otherwise.
func bodyObject(body []byte, required bool) (map[string]any, *apiError) {
	v, e := decodeBody(body, required)
	if e != nil || v == nil {
		return nil, e
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, invalid([]fieldError{{
			Loc: at(bodyLoc), Msg: "Input should be a valid dictionary or object to extract fields from",
			Type: "model_attributes_type", Input: v,
		}})
	}
	return m, nil
}

// object returns raw as a nested model's object, or reports model_type.
func (v *validation) object(raw any, loc []any, model string) (map[string]any, bool) {
	m, ok := raw.(map[string]any)
	if !ok {
		v.addCtx(loc, "model_type", "Input should be a valid dictionary or instance of "+model, raw,
			map[string]any{"class_name": model})
	}
	return m, ok
}

// strict reports every key of obj not in allowed as extra_forbidden, in
// sorted order so that the body is deterministic.
func (v *validation) strict(obj map[string]any, loc []any, allowed ...string) {
	var extra []string
	for k := range obj {
		known := false
		for _, a := range allowed {
			if k == a {
				known = true
				break
			}
		}
		if !known {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	for _, k := range extra {
		v.add(at(loc, k), "extra_forbidden", "Extra inputs are not permitted", obj[k])
	}
}

// reqString reads a required string field.
func (v *validation) reqString(obj map[string]any, key string, loc []any) (string, bool) {
	raw, ok := obj[key]
	if !ok {
		v.add(at(loc, key), "missing", "Field required", obj)
		return "", false
	}
	return v.str(raw, at(loc, key))
}

func (v *validation) str(raw any, loc []any) (string, bool) {
	s, ok := raw.(string)
	if !ok {
		v.add(loc, "string_type", "Input should be a valid string", raw)
	}
	return s, ok
}

// optString reads an optional string field; absent and null give nil.
func (v *validation) optString(obj map[string]any, key string, loc []any) *string {
	raw, ok := obj[key]
	if !ok || raw == nil {
		return nil
	}
	s, ok := v.str(raw, at(loc, key))
	if !ok {
		return nil
	}
	return &s
}

// reqList reads a required list, of which null is not one; it returns nil
// when the list is missing or is no list.
func (v *validation) reqList(obj map[string]any, key string, loc []any) []any {
	raw := obj[key]
	if raw == nil {
		v.add(at(loc, key), "missing", "Field required", obj)
		return nil
	}
	list, ok := raw.([]any)
	if !ok {
		v.add(at(loc, key), "list_type", "Input should be a valid list", raw)
	}
	return list
}

// reqStringList reads a required list of strings of at most limit items
// (the general bound on lists applies besides).
func (v *validation) reqStringList(obj map[string]any, key string, loc []any, limit int) []string {
	raw, ok := obj[key]
	if !ok {
		v.add(at(loc, key), "missing", "Field required", obj)
		return nil
	}
	list := v.stringList(raw, at(loc, key))
	if len(list) > limit {
		v.tooLongList(at(loc, key), len(list), limit)
	}
	return list
}

// optStringList reads an optional list of strings; absent and null give nil.
func (v *validation) optStringList(obj map[string]any, key string, loc []any) []string {
	raw, ok := obj[key]
	if !ok || raw == nil {
		return nil
	}
	return v.stringList(raw, at(loc, key))
}

func (v *validation) stringList(raw any, loc []any) []string {
	list, ok := raw.([]any)
	if !ok {
		v.add(loc, "list_type", "Input should be a valid list", raw)
		return nil
	}
	if len(list) > maxListItems {
		v.tooLongList(loc, len(list), maxListItems)
		return nil
	}
	out := make([]string, 0, len(list))
	for i, item := range list {
		if s, ok := v.str(item, at(loc, i)); ok {
			out = append(out, s)
		}
	}
	return out
}

// optDict reads an optional JSON object field as compact JSON text; absent
// and null give nil.
func (v *validation) optDict(obj map[string]any, key string, loc []any) json.RawMessage {
	raw, ok := obj[key]
	if !ok || raw == nil {
		return nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		v.add(at(loc, key), "dict_type", "Input should be a valid dictionary", raw)
		return nil
	}
	return mustJSON(m)
}

// mustJSON encodes a value decoded from JSON back to JSON text. Such values
// (maps, slices, strings, json.Number, bools, nil) always encode.
func mustJSON(x any) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return json.RawMessage("null")
	}
	return json.RawMessage(bytes.TrimRight(buf.Bytes(), "\n"))
}

// optBool reads an optional boolean the way pydantic's lax mode does:
// true/false, 0/1 and the usual words ("yes", "off", ...).
func (v *validation) optBool(obj map[string]any, key string, loc []any, def bool) bool {
	raw, ok := obj[key]
	if !ok || raw == nil {
		return def
	}
	return v.boolean(raw, at(loc, key))
}

func (v *validation) boolean(raw any, loc []any) bool {
	switch x := raw.(type) {
	case bool:
		return x
	case json.Number:
		switch f, err := x.Float64(); {
		case err == nil && f == 0:
			return false
		case err == nil && f == 1:
			return true
		}
		v.add(loc, "bool_parsing", "Input should be a valid boolean, unable to interpret input", raw)
	case string:
		switch strings.ToLower(strings.TrimSpace(x)) {
		case "0", "off", "f", "false", "n", "no":
			return false
		case "1", "on", "t", "true", "y", "yes":
			return true
		}
		v.add(loc, "bool_parsing", "Input should be a valid boolean, unable to interpret input", raw)
	default:
		v.add(loc, "bool_type", "Input should be a valid boolean", raw)
	}
	return false
}

// optNonNegInt reads an optional integer that must be >= 0, in pydantic's
// lax mode (a numeric string is accepted). Absent and null give def.
func (v *validation) optNonNegInt(obj map[string]any, key string, loc []any, def int) int {
	raw, ok := obj[key]
	if !ok || raw == nil {
		return def
	}
	loc = at(loc, key)
	var n int64
	switch x := raw.(type) {
	case json.Number:
		i, err := x.Int64()
		if err != nil {
			f, ferr := x.Float64()
			switch {
			case ferr != nil || math.IsInf(f, 0) || f > math.MaxInt64 || f < math.MinInt64:
				v.add(loc, "int_parsing", "Input should be a valid integer, unable to parse string as an integer", raw)
				return def
			case f != math.Trunc(f):
				v.add(loc, "int_from_float", "Input should be a valid integer, got a number with a fractional part", raw)
				return def
			}
			i = int64(f)
		}
		n = i
	case string:
		i, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		if err != nil {
			v.add(loc, "int_parsing", "Input should be a valid integer, unable to parse string as an integer", raw)
			return def
		}
		n = i
	default:
		v.add(loc, "int_type", "Input should be a valid integer", raw)
		return def
	}
	if n < 0 {
		v.addCtx(loc, "greater_than_equal", "Input should be greater than or equal to 0", raw, map[string]any{"ge": 0})
		return def
	}
	if n > math.MaxInt32 {
		// Larger values mean "everything" in practice; clamping keeps the
		// arithmetic on limits and offsets far from overflow.
		n = math.MaxInt32
	}
	return int(n)
}

// queryNonNegInt reads an optional non-negative integer query parameter,
// as FastAPI validates `limit: int | None = Query(None, ge=0)`.
func queryNonNegInt(v *validation, args *fasthttp.Args, key string) (int, bool) {
	if !args.Has(key) {
		return 0, false
	}
	raw := args.Peek(key)
	loc := []any{"query", key}
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		v.add(loc, "int_parsing", "Input should be a valid integer, unable to parse string as an integer", string(raw))
		return 0, false
	}
	if n < 0 {
		v.addCtx(loc, "greater_than_equal", "Input should be greater than or equal to 0", string(raw), map[string]any{"ge": 0})
		return 0, false
	}
	if n > math.MaxInt32 {
		n = math.MaxInt32
	}
	return int(n), true
}
