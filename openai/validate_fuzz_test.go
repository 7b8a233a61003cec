package openai

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// chatFuzzSeeds are chat bodies, valid and not, that the fuzz targets of
// ValidateChat start from.
func chatFuzzSeeds() []string {
	return []string{
		string(typicalChatBody),
		withFields(""),
		withFields(`"model":"caf\u00e9","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_completion_tokens":5,"max_tokens":9,"n":2,"priority":-1`),
		withFields(`"model":null,"stream_options":null,"seed":-9223372036854775808,"top_k":-1`),
		withFields(`"temperature":3`),
		withFields(`"temperature":1,"temperature":1`),
		withFields(`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}],"tool_choice":"none"`),
		withFields(`"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{},"strict":true}}`),
		withFields(`"structured_outputs":{"regex":"a","choice":["a"]}`),
		withFields(`"engine_xargs":{"a":["x",1]},"repetition_detection":{"min_count":0}`),
		withFields(`"stop":["\"","\\"],"stop_token_ids":[1,2],"bad_words":[]`),
		withFields(`"continue_final_message":true,"add_generation_prompt":false`),
		withMessages(`{"role":"user","content":[{"type":"text","text":"a\"b\\"},{"type":"image_url","image_url":{"url":"u"}}]},{"role":"assistant","content":null,"tool_calls":[]}`),
		withMessages(`{"r\u006fle":"user","content":"\ud83d\ude00 \u0000"}`),
		`{"messages":[{"role":"user","content":"x"}],"model":"\ud800"}`,
		`{"messages":[{"role":"user","content":"x"}],"model":"` + "\xff\xfe" + `"}`,
		"{\"messages\" :\n[ {\"role\" : \"user\" , \"content\" : \"x\"} ] , \"model\" : \"m\" }",
		`{"messages":[[[[[[[[[[]]]]]]]]]]}`,
		`{"messages":[{"role":"user","content":"x"}],"x":[{"}":"]"},"\\\"",{"a":[]}]}`,
		`[]`, `""`, `{`, `{"messages":[`, "", " ", `{"messages":[{"role":"user","content":"x"}]} {}`,
		`{"messages":1e5}`, `{"messages":[{"role":"user","content":"x"}],"n":-0}`,
		string(toolChatBody),
		withFields(`"tools":[{"function":{"name":"f"}}],"tool_choice":"auto","parallel_tool_calls":true`),
		withFields(`"tools":[{"type":"function","function":{"name":"f\u00e9"}}],"tool_choice":{"function":{"name":"f\u00e9"}}`),
		withFields(`"tools":[],"tool_choice":"required"`),
		withFields(`"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}}`),
		withMessages(`{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}`),
		withMessages(`{"role":"assistant","content":null,"tool_calls":[{"id":1,"function":{"name":"f","arguments":{}}}]},{"role":"tool","content":"r"}`),
		withFields(`"max_tokens":1e3,"n":2.0,"seed":-9.223372036854775808e18,"min_tokens":5.5,"top_k":1E1`),
		withFields(`"temperature":0,"n":2,"min_tokens":9,"max_tokens":3`),
		withFields(`"response_format":{"type":"json_schema","json_schema":{"schema":{}}},"stop":["",""],"allowed_token_ids":[]`),
		withFields(`"logit_bias":{"1":-100,"x":1,"2":"3"},"documents":[{"title":1}],"repetition_detection":{"max_pattern_size":2,"min_pattern_size":3,"min_count":1}`),
	}
}

// FuzzValidateChat checks, on arbitrary bodies, that ValidateChat never panics and that
// what it accepts and reports agrees with a full decode by encoding/json: the accepted
// body is valid JSON, and the model, stream flags, counts and offsets it reports match the
// decoded body. Duplicate known keys are refused, so "last copy wins" in encoding/json
// cannot make the two disagree.
func FuzzValidateChat(f *testing.F) {
	for _, s := range chatFuzzSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		var req Request
		verr := ValidateChat(body, &req)
		if !bytes.Equal(body, orig) {
			t.Fatalf("ValidateChat modified the body")
		}
		if verr != nil {
			if verr.Message == "" || !strings.HasSuffix(verr.Message, ".") {
				t.Fatalf("error message %q is not a sentence", verr.Message)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted a body encoding/json calls invalid: %q", body)
		}
		var doc map[string]any
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("accepted a body that is not an object: %v", err)
		}

		msgs, ok := doc["messages"].([]any)
		if !ok || len(msgs) == 0 || len(msgs) != req.Messages {
			t.Fatalf("Messages = %d, decoded messages %v", req.Messages, doc["messages"])
		}
		if req.N < 1 || req.MaxTokens < 0 || req.PromptBytes < 0 {
			t.Fatalf("impossible counts: N %d MaxTokens %d PromptBytes %d", req.N, req.MaxTokens, req.PromptBytes)
		}
		if req.Stream != (doc["stream"] == true) {
			t.Fatalf("Stream = %v, decoded %v", req.Stream, doc["stream"])
		}

		model, present := doc["model"]
		switch {
		case !present:
			if req.ModelStart != 0 || req.ModelEnd != 0 || req.Model != nil {
				t.Fatalf("model absent but reported at %d:%d as %q", req.ModelStart, req.ModelEnd, req.Model)
			}
		default:
			if !reflect.DeepEqual(decodeValue(t, body[req.ModelStart:req.ModelEnd]), model) {
				t.Fatalf("body[ModelStart:ModelEnd] = %q, decoded model %q", body[req.ModelStart:req.ModelEnd], model)
			}
			// encoding/json replaces invalid UTF-8 with U+FFFD; Model keeps the bytes sent.
			if s, isString := model.(string); isString && utf8.Valid(req.Model) && string(req.Model) != s {
				t.Fatalf("Model = %q, decoded %q", req.Model, s)
			}
			if model == nil && req.Model != nil {
				t.Fatalf("null model reported as %q", req.Model)
			}
		}

		checkToolChoice(t, doc, &req)

		so, present := doc["stream_options"]
		if present {
			if !reflect.DeepEqual(decodeValue(t, body[req.StreamOptionsStart:req.StreamOptionsEnd]), so) {
				t.Fatalf("body[StreamOptionsStart:StreamOptionsEnd] = %q, decoded %v", body[req.StreamOptionsStart:req.StreamOptionsEnd], so)
			}
			if opts, isObject := so.(map[string]any); isObject {
				if !req.StreamOptions || req.IncludeUsage != (opts["include_usage"] == true) || req.ContinuousUsage != (opts["continuous_usage_stats"] == true) {
					t.Fatalf("stream options %v reported as %+v", opts, req)
				}
			}
		} else if req.StreamOptions || req.StreamOptionsStart != 0 || req.StreamOptionsEnd != 0 {
			t.Fatalf("stream_options absent but reported")
		}
	})
}

func decodeValue(t *testing.T, raw []byte) any {
	t.Helper()
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("offsets delimit %q, which does not decode: %v", raw, err)
	}
	return v
}

// checkToolChoice checks what an accepted body reports of tool_choice against its
// decoded form: the kind, a named choice's name, and that the name is among the tools.
func checkToolChoice(t *testing.T, doc map[string]any, req *Request) {
	t.Helper()
	choice := doc["tool_choice"]
	want := map[any]ToolChoice{nil: ToolChoiceAbsent, "none": ToolChoiceNone, "auto": ToolChoiceAuto, "required": ToolChoiceRequired}
	obj, named := choice.(map[string]any)
	if !named {
		if req.ToolChoice != want[choice] {
			t.Fatalf("tool_choice %v reported as %v", choice, req.ToolChoice)
		}
		return
	}
	name, _ := obj["function"].(map[string]any)["name"].(string)
	if req.ToolChoice != ToolChoiceNamed || utf8.Valid(req.ToolChoiceName) && string(req.ToolChoiceName) != name {
		t.Fatalf("tool_choice %v reported as %v %q", obj, req.ToolChoice, req.ToolChoiceName)
	}
	tools, _ := doc["tools"].([]any)
	for _, tool := range tools {
		if fn, _ := tool.(map[string]any)["function"].(map[string]any); fn["name"] == name {
			return
		}
	}
	t.Fatalf("named tool_choice %q accepted without a tool of that name in %v", name, tools)
}

// onePassLimits are the limits the differential tests of the one-pass
// walk run under: the defaults, and limits tight enough that the seeds
// reach them.
var onePassLimits = []BodyLimits{
	{},
	{MaxDepth: 4, MaxStopStrings: 1, MaxLogitBias: 1},
}

// checkOnePass compares ValidateChatLimits, which accepts a body in one
// walk that checks the syntax as it goes, with the syntax pass followed by
// the walk (validateChatTwoPasses): the same error, or the same request.
func checkOnePass(t *testing.T, body []byte, lim BodyLimits) {
	t.Helper()
	var got, want Request
	gotErr := ValidateChatLimits(body, &got, lim)
	wantErr := validateChatTwoPasses(body, &want, lim)
	switch {
	case (gotErr == nil) != (wantErr == nil):
		t.Fatalf("body %q, limits %+v: one pass says %v, two passes %v", body, lim, gotErr, wantErr)
	case gotErr != nil && *gotErr != *wantErr:
		t.Fatalf("body %q, limits %+v: one pass says %+v, two passes %+v", body, lim, *gotErr, *wantErr)
	case gotErr == nil && !reflect.DeepEqual(got, want):
		t.Fatalf("body %q, limits %+v: one pass reads %+v, two passes %+v", body, lim, got, want)
	}
}

// FuzzValidateChatOnePass compares the one-pass check with the two passes
// on arbitrary bodies.
func FuzzValidateChatOnePass(f *testing.F) {
	for _, s := range chatFuzzSeeds() {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, body []byte, lim uint8) {
		checkOnePass(t, body, onePassLimits[int(lim)%len(onePassLimits)])
	})
}

// TestValidateChatOnePassMutations runs the comparison of
// FuzzValidateChatOnePass on every seed and on many mutations of each:
// bytes deleted, replaced or inserted (JSON's structural bytes most often),
// spans repeated, the body cut short. Most mutations break the syntax in
// one place while the walk still reads the rest, which is what the one
// pass must not get wrong.
func TestValidateChatOnePassMutations(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 17))
	const alphabet = "{}[],:\" \\\n0-1e.tfnux\x00\x7f\xc3\xa9\xff"
	for _, seed := range chatFuzzSeeds() {
		for _, lim := range onePassLimits {
			checkOnePass(t, []byte(seed), lim)
		}
		for range 400 {
			b := []byte(seed)
			for range 1 + r.IntN(3) {
				if len(b) == 0 {
					break
				}
				i := r.IntN(len(b))
				switch r.IntN(5) {
				case 0:
					b = append(b[:i], b[i+1:]...)
				case 1:
					b[i] = alphabet[r.IntN(len(alphabet))]
				case 2:
					b = append(b[:i], append([]byte{alphabet[r.IntN(len(alphabet))]}, b[i:]...)...)
				case 3:
					j := min(len(b), i+1+r.IntN(8))
					b = append(b[:j], append(bytes.Clone(b[i:j]), b[j:]...)...)
				case 4:
					b = b[:i]
				}
			}
			checkOnePass(t, b, onePassLimits[r.IntN(len(onePassLimits))])
		}
	}
}
