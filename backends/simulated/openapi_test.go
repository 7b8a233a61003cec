package simulated

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// openAPI holds the schemas of OpenAI's spec (the trimmed copy, see openapi_subset_test.go)
// that the replies of this backend are checked against.
type openAPI struct {
	compiler *jsonschema.Compiler
	schemas  map[string]*jsonschema.Schema
	// eventSchemas names, for each type of Responses stream event, the variant of
	// ResponseStreamEvent that describes it.
	eventSchemas map[string]string
}

func loadOpenAPI(t *testing.T) *openAPI {
	t.Helper()
	f, err := os.Open(openAPISubsetPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("openai.json", doc); err != nil {
		t.Fatal(err)
	}
	o := &openAPI{compiler: c, schemas: map[string]*jsonschema.Schema{}, eventSchemas: map[string]string{}}
	all := doc.(map[string]any)["components"].(map[string]any)["schemas"].(map[string]any)
	for _, variant := range all["ResponseStreamEvent"].(map[string]any)["anyOf"].([]any) {
		name := strings.TrimPrefix(variant.(map[string]any)["$ref"].(string), "#/components/schemas/")
		typ := all[name].(map[string]any)["properties"].(map[string]any)["type"].(map[string]any)["enum"].([]any)[0].(string)
		o.eventSchemas[typ] = name
	}
	return o
}

// check fails t unless body is valid against the named schema.
func (o *openAPI) check(t *testing.T, schema, body string) {
	t.Helper()
	sch, ok := o.schemas[schema]
	if !ok {
		var err error
		if sch, err = o.compiler.Compile("openai.json#/components/schemas/" + schema); err != nil {
			t.Fatal(err)
		}
		o.schemas[schema] = sch
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(body))
	if err != nil {
		t.Fatalf("not JSON: %v: %s", err, body)
	}
	if err := sch.Validate(v); err != nil {
		t.Errorf("not a valid %s: %v\nbody: %s", schema, err, body)
	}
}

// TestRepliesMatchOpenAISpec checks every kind of reply this backend gives on success, plain and
// streamed event by event, against the schema OpenAI's spec gives it: the example config serves
// this backend to every newcomer, whose OpenAI client expects what the spec promises. Not
// checked, because the spec does not describe them as sent: base64 embeddings (the spec types
// an embedding as numbers only), the DELETE of a stored response (no schema in the spec), and
// errors, which take vLLM's shape on purpose and which the gateway rewrites into OpenAI's.
func TestRepliesMatchOpenAISpec(t *testing.T) {
	spec := loadOpenAPI(t)
	h := start(t, Options{Tokens: 4}, false)
	chatTools := `"tools":[` + weatherTool + `,` + orderTool + `]`
	respTools := `"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`

	plain := []struct {
		name, path, body, schema string
	}{
		{"chat", "/v1/chat/completions", `{` + hello + `}`, "CreateChatCompletionResponse"},
		{"chat cut by max_tokens", "/v1/chat/completions", `{` + hello + `,"max_tokens":2}`, "CreateChatCompletionResponse"},
		{"chat n, seed and stop", "/v1/chat/completions", `{` + hello + `,"n":2,"seed":7,"stop":["tok2"]}`, "CreateChatCompletionResponse"},
		{"chat logprobs", "/v1/chat/completions", `{` + hello + `,"logprobs":true,"top_logprobs":2}`, "CreateChatCompletionResponse"},
		{"chat json_schema", "/v1/chat/completions", `{` + hello + `,"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}}`, "CreateChatCompletionResponse"},
		{"chat tool call", "/v1/chat/completions", `{` + hello + `,` + chatTools + `,"tool_choice":"required"}`, "CreateChatCompletionResponse"},
		{"completion", "/v1/completions", `{"prompt":"Say hi"}`, "CreateCompletionResponse"},
		{"completion n, echo and logprobs", "/v1/completions", `{"prompt":["a b","c"],"n":2,"echo":true,"logprobs":2}`, "CreateCompletionResponse"},
		{"embeddings", "/v1/embeddings", `{"input":["hello","world"]}`, "CreateEmbeddingResponse"},
		{"response", "/v1/responses", `{"input":"hello there","instructions":"be brief","metadata":{"k":"v"}}`, "Response"},
		{"response cut by max_output_tokens", "/v1/responses", `{"input":"hello","max_output_tokens":2}`, "Response"},
		{"response json_schema", "/v1/responses", `{"input":"hello","text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}}}}`, "Response"},
		{"response function call", "/v1/responses", `{"input":"call get_weather please",` + respTools + `}`, "Response"},
	}
	for _, tt := range plain {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, "POST", tt.path, tt.body)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			spec.check(t, tt.schema, string(r.body))
		})
	}

	t.Run("models", func(t *testing.T) {
		r := h.do(t, "GET", "/v1/models", "")
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		spec.check(t, "ListModelsResponse", string(r.body))
	})

	t.Run("stored response: follow-up, GET and cancel", func(t *testing.T) {
		first := h.do(t, "POST", "/v1/responses", `{"input":"hello"}`)
		id := gjson.GetBytes(first.body, "id").Str
		next := h.do(t, "POST", "/v1/responses", `{"input":"more","previous_response_id":"`+id+`"}`)
		spec.check(t, "Response", string(next.body))
		spec.check(t, "Response", string(h.do(t, "GET", "/v1/responses/"+id, "").body))
		bg := gjson.GetBytes(h.do(t, "POST", "/v1/responses", `{"input":"x","background":true}`).body, "id").Str
		spec.check(t, "Response", string(h.do(t, "POST", "/v1/responses/"+bg+"/cancel", "").body))
	})

	t.Run("background response queued, in progress and cancelled", func(t *testing.T) {
		slow := start(t, Options{TimeToFirstToken: time.Hour, Tokens: 2}, false)
		r := slow.do(t, "POST", "/v1/responses", `{"input":"x","background":true}`)
		spec.check(t, "Response", string(r.body))
		id := gjson.GetBytes(r.body, "id").Str
		spec.check(t, "Response", string(slow.do(t, "GET", "/v1/responses/"+id, "").body))
		spec.check(t, "Response", string(slow.do(t, "POST", "/v1/responses/"+id+"/cancel", "").body))
	})

	chunks := []struct{ name, path, body, schema string }{
		{"chat stream", "/v1/chat/completions", `{` + hello + `,"stream":true,"stream_options":{"include_usage":true}}`, "CreateChatCompletionStreamResponse"},
		{"chat stream continuous usage", "/v1/chat/completions", `{` + hello + `,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, "CreateChatCompletionStreamResponse"},
		{"chat stream n and logprobs", "/v1/chat/completions", `{` + hello + `,"stream":true,"n":2,"logprobs":true,"top_logprobs":1,"max_tokens":2}`, "CreateChatCompletionStreamResponse"},
		{"chat stream tool call", "/v1/chat/completions", `{` + hello + `,"stream":true,` + chatTools + `,"tool_choice":"required","stream_options":{"include_usage":true}}`, "CreateChatCompletionStreamResponse"},
		// OpenAI streams a completion as CreateCompletionResponse objects (the spec gives the
		// stream no schema of its own), whose finish_reason is null until the choice ends.
		{"completion stream", "/v1/completions", `{"prompt":"Say hi","stream":true,"stream_options":{"include_usage":true}}`, "CreateCompletionResponse"},
		{"completion stream logprobs", "/v1/completions", `{"prompt":"Say hi","stream":true,"logprobs":1,"n":2}`, "CreateCompletionResponse"},
	}
	for _, tt := range chunks {
		t.Run(tt.name, func(t *testing.T) {
			data, _ := h.events(t, tt.path, tt.body)
			if len(data) < 2 || data[len(data)-1] != "[DONE]" {
				t.Fatalf("stream does not end with [DONE]: %q", data)
			}
			for _, d := range data[:len(data)-1] {
				if tt.schema == "CreateCompletionResponse" {
					d = endedChoices(t, d)
				}
				spec.check(t, tt.schema, d)
			}
		})
	}

	// Each Responses event is checked against ResponseStreamEvent and against the variant its
	// type names, and every type this backend can send must have been seen.
	seen := map[string]bool{}
	respStreams := []struct {
		name, body string
		headers    []string
		last       string
	}{
		{"response stream", `{"input":"hello","stream":true}`, nil, "response.completed"},
		{"response stream cut by max_output_tokens", `{"input":"hello","stream":true,"max_output_tokens":2}`, nil, "response.incomplete"},
		{"response stream function call", `{"input":"call get_weather please","stream":true,` + respTools + `}`, nil, "response.completed"},
		{"response stream failing", `{"input":"hello","stream":true}`, []string{"X-Mock-Fail-After", "1"}, "error"},
	}
	for _, tt := range respStreams {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, "POST", "/v1/responses", tt.body, tt.headers...)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			var types []string
			for _, ev := range strings.Split(strings.TrimSuffix(string(r.body), "\n\n"), "\n\n") {
				name, data, ok := strings.Cut(strings.TrimPrefix(ev, "event: "), "\ndata: ")
				typ := gjson.Get(data, "type").Str
				if !ok || name != typ {
					t.Fatalf("event %q: want an event: line naming the data's type", ev)
				}
				variant, known := spec.eventSchemas[typ]
				if !known {
					t.Fatalf("event type %q is not in the spec's ResponseStreamEvent", typ)
				}
				spec.check(t, "ResponseStreamEvent", data)
				spec.check(t, variant, data)
				seen[typ] = true
				types = append(types, typ)
			}
			if types[len(types)-1] != tt.last {
				t.Errorf("stream ends with %s, want %s: %v", types[len(types)-1], tt.last, types)
			}
		})
	}
	want := []string{
		"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.function_call_arguments.delta", "response.function_call_arguments.done",
		"response.completed", "response.incomplete", "error",
	}
	for _, typ := range want {
		if !seen[typ] {
			t.Errorf("no %s event was checked; seen: %v", typ, sortedKeys(seen))
		}
	}
	if len(seen) != len(want) {
		t.Errorf("event types seen %v, want exactly %v: a type this test does not list", sortedKeys(seen), want)
	}
}

// endedChoices returns the completion chunk with each null finish_reason made "length". OpenAI
// sends null there until a choice ends, which CreateCompletionResponse, written for the whole
// reply, does not allow; the rest of the chunk is checked as it came.
func endedChoices(t *testing.T, chunk string) string {
	t.Helper()
	for i, c := range gjson.Get(chunk, "choices").Array() {
		if f := c.Get("finish_reason"); f.Type != gjson.Null || !f.Exists() {
			continue
		}
		var err error
		if chunk, err = sjson.Set(chunk, fmt.Sprintf("choices.%d.finish_reason", i), "length"); err != nil {
			t.Fatal(err)
		}
	}
	return chunk
}

// TestOpenAPISubsetLoads checks the trimmed spec compiles and knows the event types the
// Responses stream sends, so that a broken regeneration fails here and not as a puzzling
// validation error.
func TestOpenAPISubsetLoads(t *testing.T) {
	o := loadOpenAPI(t)
	for _, name := range openAPIRoots {
		if _, err := o.compiler.Compile("openai.json#/components/schemas/" + name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if got := o.eventSchemas["response.incomplete"]; got != "ResponseIncompleteEvent" {
		t.Errorf("response.incomplete is described by %q, want ResponseIncompleteEvent", got)
	}
	// A reply missing a required member must fail, or the checks above prove nothing.
	var bad map[string]any
	if err := json.Unmarshal([]byte(`{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi"}}]}`), &bad); err != nil {
		t.Fatal(err)
	}
	sch, _ := o.compiler.Compile("openai.json#/components/schemas/CreateChatCompletionResponse")
	if err := sch.Validate(bad); err == nil || !strings.Contains(fmt.Sprint(err), "refusal") {
		t.Errorf("a message without refusal passed or failed for another reason: %v", err)
	}
}
