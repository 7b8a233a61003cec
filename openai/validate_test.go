package openai

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// withFields returns a minimal valid chat body with the given JSON members added, so each
// case states only what it is about.
func withFields(members string) string {
	b := `{"messages":[{"role":"user","content":"Hi"}]`
	if members != "" {
		b += "," + members
	}
	return b + "}"
}

// withMessages returns a body whose messages array holds the given JSON elements.
func withMessages(elems string) string {
	return `{"model":"m","messages":[` + elems + `]}`
}

type validateCase struct {
	name  string
	body  string
	param string // the Param of the expected error
	msg   string // a part of the expected error Message; "" means the body is valid
}

func runValidateCases(t *testing.T, cases []validateCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var req Request
			err := ValidateChat([]byte(tc.body), &req)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("body %s: unexpected error (param %q): %s", tc.body, err.Param, err.Message)
				}
				return
			}
			if err == nil {
				t.Fatalf("body %s: accepted, want an error on %q containing %q", tc.body, tc.param, tc.msg)
			}
			if err.Param != tc.param || !strings.Contains(err.Message, tc.msg) {
				t.Fatalf("body %s:\n got param %q message %q\nwant param %q message containing %q",
					tc.body, err.Param, err.Message, tc.param, tc.msg)
			}
			// Every message is a sentence a user can act on.
			if !strings.HasSuffix(err.Message, ".") {
				t.Errorf("message %q does not end a sentence", err.Message)
			}
		})
	}
}

func TestValidateChatWholeBody(t *testing.T) {
	runValidateCases(t, []validateCase{
		{"minimal", withFields(""), "", ""},
		{"surrounding whitespace", " \n\t" + withFields("") + "\r\n ", "", ""},
		{"empty", "", "", "The request body is empty"},
		{"only whitespace", " \n\t ", "", "The request body is empty"},
		{"truncated", `{"messages":[{"role":"user","content":"Hi"}]`, "", "not valid JSON"},
		{"trailing garbage", withFields("") + " x", "", "not valid JSON"},
		{"trailing comma", `{"messages":[{"role":"user","content":"Hi"}],}`, "", "not valid JSON"},
		{"single quotes", `{'messages':[]}`, "", "not valid JSON"},
		{"invalid UTF-8", `{"messages":[{"role":"user","content":"Hi ` + "\xff\xfe" + `"}]}`, "", "not valid UTF-8"},
		{"NaN", withFields(`"temperature":NaN`), "", "not valid JSON"},
		{"array", `[{"messages":[]}]`, "", "must be a JSON object, got an array."},
		{"string", `"hello"`, "", `must be a JSON object, got "hello".`},
		{"null", `null`, "", "must be a JSON object, got null."},
		{"unknown fields pass through", withFields(`"guided_json":{"a":[1,{"b":null}]},"x_custom":"v","logit_bias_v2":1`), "", ""},
		{"duplicate temperature", withFields(`"temperature":1,"temperature":0.5`), "temperature", `repeats the key "temperature"`},
		{"duplicate messages", `{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}`, "messages", "repeats the key"},
		{"duplicate model", withFields(`"model":"a","model":"b"`), "model", "repeats the key"},
		{"duplicate key spelled with an escape", withFields(`"model":"a","mod\u0065l":"b"`), "model", "repeats the key"},
		{"duplicate unknown key passes", withFields(`"x":1,"x":2`), "", ""},
		{"key spelled with an escape is known", withFields(`"temp\u0065rature":3`), "temperature", "temperature must be"},
	})
}

func TestValidateChatMessages(t *testing.T) {
	runValidateCases(t, []validateCase{
		{"missing", `{"model":"m"}`, "messages", "messages is required"},
		{"null", `{"messages":null}`, "messages", "messages must be a non-empty array of message objects, got null."},
		{"string", `{"messages":"hi"}`, "messages", `got "hi".`},
		{"empty", `{"messages":[]}`, "messages", "at least one message, got an empty array."},
		{"element not an object", withMessages(`"hi"`), "messages[0]", "messages[0] must be a message object"},
		{"second element not an object", withMessages(`{"role":"user","content":"a"},[1]`), "messages[1]", "got an array."},
		{"role missing", withMessages(`{"content":"a"}`), "messages[0].role", "messages[0].role is required"},
		{"role not a string", withMessages(`{"role":"user","content":"a"},{"role":3,"content":"b"}`), "messages[1].role", "messages[1].role must be a string, got 3."},
		{"role null", withMessages(`{"role":null,"content":"a"}`), "messages[0].role", "must be a string, got null."},
		{"custom role", withMessages(`{"role":"narrator","content":"a"}`), "", ""},
		{"all spec roles", withMessages(`{"role":"developer","content":"a"},{"role":"system","content":"a"},{"role":"user","content":"a"},{"role":"assistant","content":"a"},{"role":"tool","content":"a","tool_call_id":"c1"},{"role":"function","content":"a","name":"f"}`), "", ""},
		{"empty content string", withMessages(`{"role":"user","content":""}`), "", ""},
		{"content parts", withMessages(`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}`), "", ""},
		{"empty content parts", withMessages(`{"role":"user","content":[]}`), "", ""},
		{"content number", withMessages(`{"role":"user","content":5}`), "messages[0].content", "must be a string or an array of content parts, got 5."},
		{"content object", withMessages(`{"role":"user","content":{"type":"text"}}`), "messages[0].content", "got an object."},
		{"content missing on user", withMessages(`{"role":"user"}`), "messages[0].content", "messages[0].content is required"},
		{"content null on user", withMessages(`{"role":"user","content":null}`), "messages[0].content", "may leave it null, got null."},
		{"content null on assistant without tool calls", withMessages(`{"role":"assistant","content":null}`), "messages[0].content", "only an assistant message with tool_calls"},
		{"content null on assistant with tool_calls null", withMessages(`{"role":"assistant","content":null,"tool_calls":null}`), "messages[0].content", "got null."},
		{"content null on user with tool_calls", withMessages(`{"role":"user","content":null,"tool_calls":[{"id":"c"}]}`), "messages[0].content", "got null."},
		{"content null on assistant with tool_calls", withMessages(`{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}`), "", ""},
		{"content absent on assistant with tool_calls", withMessages(`{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}`), "", ""},
		{"content absent on assistant with function_call", withMessages(`{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}`), "", ""},
		{"assistant message as the OpenAI SDK dumps it", withMessages(`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}],"function_call":null,"refusal":null,"audio":null}`), "", ""},
		{"function_call null before tool_calls", withMessages(`{"role":"assistant","function_call":null,"tool_calls":[{"id":"c1","function":{"name":"f","arguments":""}}]}`), "", ""},
		{"content absent on tool", withMessages(`{"role":"tool","tool_call_id":"c1"}`), "messages[0].content", "is required"},
		{"part not an object", withMessages(`{"role":"user","content":["a"]}`), "messages[0].content[0]", `must be a content part object such as {"type":"text","text":"..."}, got "a".`},
		{"part without type", withMessages(`{"role":"user","content":[{"type":"text","text":"a"},{"text":"b"}]}`), "messages[0].content[1].type", "messages[0].content[1].type is required"},
		{"part type not a string", withMessages(`{"role":"user","content":[{"type":1}]}`), "messages[0].content[0].type", "must be a string, got 1."},
		{"text part without text", withMessages(`{"role":"user","content":[{"type":"text"}]}`), "messages[0].content[0].text", `required on a part of type "text"`},
		{"text part text not a string", withMessages(`{"role":"user","content":[{"type":"text","text":["a"]}]}`), "messages[0].content[0].text", "must be a string, got an array."},
		{"image part needs no text", withMessages(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}`), "", ""},
		{"name", withMessages(`{"role":"user","content":"a","name":"ann"}`), "", ""},
		{"name not a string", withMessages(`{"role":"user","content":"a","name":7}`), "messages[0].name", "messages[0].name must be a string, got 7."},
		{"name null", withMessages(`{"role":"user","content":"a","name":null}`), "messages[0].name", "got null."},
		{"unknown message fields", withMessages(`{"role":"user","content":"a","x":{"y":[1]},"reasoning_content":"r"}`), "", ""},
		{"repeated message key: last wins", withMessages(`{"role":3,"role":"user","content":"a"}`), "", ""},
		{"escaped keys in a message", withMessages(`{"r\u006fle":"assistant","c\u006fntent":null,"tool_calls":[]}`), "", ""},
	})
}

// fieldCases expands, for each field, values that must pass and values that must fail
// with an error on that field itself (errors on an element are in the nested table).
func fieldCases(field string, good, bad []string) []validateCase {
	var cases []validateCase
	for _, g := range good {
		cases = append(cases, validateCase{field + "=" + g, withFields(`"` + field + `":` + g), "", ""})
	}
	for _, b := range bad {
		cases = append(cases, validateCase{field + "=" + b, withFields(`"` + field + `":` + b), field, field + " must "})
	}
	return cases
}

func TestValidateChatFields(t *testing.T) {
	bools := []string{"true", "false"}
	notBool := []string{"null", "1", `"true"`}
	orNullBools := []string{"true", "false", "null"}
	notOrNullBool := []string{"0", `"false"`, "{}"}
	var cases []validateCase
	add := func(field string, good, bad []string) { cases = append(cases, fieldCases(field, good, bad)...) }

	add("model", []string{`"meta-llama/Llama-3.1-8B-Instruct"`, "null", `"caf\u00e9"`, `""`}, []string{"1", "{}", "[]", "true"})
	add("frequency_penalty", []string{"-2", "2", "0.5", "-2.0", "null"}, []string{"-2.01", "3", `"0"`, "false"})
	add("presence_penalty", []string{"-2", "2", "1e-3", "null"}, []string{"2.0001", "-3", `"1"`})
	add("logit_bias", []string{`{"50256":-100}`, `{"0":0.5,"1":1e2}`, "{}", "null"}, []string{"[]", `"x"`, "1"})
	add("logprobs", orNullBools, notOrNullBool)
	add("top_logprobs", []string{"0", "null", "0.0", "0e5"}, []string{"-1", "1.5", `"2"`, "1e-1"})
	add("max_tokens", []string{"1", "4096", "null", "1e3", "512.0"}, []string{"0", "-1", "1.5", "0.0", `"5"`, "9223372036854775808", "1e19", "true"})
	add("max_completion_tokens", []string{"1", "128", "null", "2.0"}, []string{"0", "2.5", `"128"`})
	add("n", []string{"1", "3", "null", "1.0"}, []string{"0", "-2", "1.5", `"1"`})
	add("seed", []string{"0", "-42", "9223372036854775807", "-9223372036854775808", "null", "1E2", "-9.223372036854775808e18"},
		[]string{"9223372036854775808", "-9223372036854775809", "9.223372036854775808e18", "1.5", `"1"`})
	add("stop", []string{`"\n"`, `["a","b"]`, "[]", "null"}, []string{"1", "{}", "true", `""`})
	add("stream", orNullBools, notOrNullBool)
	add("temperature", []string{"0", "2", "0.7", "1", "null"}, []string{"-0.01", "2.01", "3", `"1"`, "true", "1e400"})
	add("top_p", []string{"1", "0.01", "1e-9", "null"}, []string{"0", "-0", "1.01", "-0.5", `"1"`})
	add("tool_choice", []string{`"none"`, "null"}, []string{`"any"`, `"None"`, "1", "[]", "true"})
	add("reasoning_effort", []string{`"low"`, `"medium"`, `"high"`, "null"}, []string{`"max"`, `"LOW"`, "1", `""`})
	add("include_reasoning", bools, notBool)
	add("parallel_tool_calls", orNullBools, notOrNullBool)
	add("user", []string{`"user-1"`, "null"}, []string{"1", "{}"})
	add("use_beam_search", bools, notBool)
	add("top_k", []string{"-1", "0", "1", "50", "null"}, []string{"-2", "1.5", `"5"`})
	add("min_p", []string{"0", "1", "0.05", "null"}, []string{"1.1", "-0.1", `"0"`})
	add("repetition_penalty", []string{"1.1", "0.0001", "1000", "null"}, []string{"0", "-1", `"1"`})
	add("length_penalty", []string{"1", "-1.5", "0"}, []string{"null", `"1"`, "1e400"})
	add("stop_token_ids", []string{"[1,2]", "[]", "null"}, []string{"1", `"1,2"`, "{}"})
	add("include_stop_str_in_output", bools, notBool)
	add("ignore_eos", bools, notBool)
	add("min_tokens", []string{"0", "10", "1e1"}, []string{"-1", "null", "0.5"})
	add("skip_special_tokens", bools, notBool)
	add("spaces_between_special_tokens", bools, notBool)
	add("truncate_prompt_tokens", []string{"-1", "0", "100", "9223372036854775807", "null"}, []string{"-2", "1.5", "9223372036854775808"})
	add("prompt_logprobs", []string{"0", "5", "null"}, []string{"-1", "0.5", `"1"`})
	add("allowed_token_ids", []string{"[1,2]", "[3.0]", "null"}, []string{"1", `"1,2"`, "[]", "[ ]"})
	add("bad_words", []string{`["x","y z"]`, "[]"}, []string{"null", `"x"`, "{}"})
	add("echo", bools, notBool)
	add("add_generation_prompt", bools, notBool)
	add("continue_final_message", []string{"false"}, notBool)
	add("add_special_tokens", bools, notBool)
	add("documents", []string{`[{"title":"t","text":"x"}]`, `[{}]`, "[]", "null"}, []string{"{}", `"x"`})
	add("chat_template", []string{`"{{ messages }}"`, "null"}, []string{"1", "[]"})
	add("chat_template_kwargs", []string{`{"enable_thinking":false}`, "{}", "null"}, []string{"[]", `"x"`})
	add("mm_processor_kwargs", []string{`{"fps":1}`, "null"}, []string{"[]", "1"})
	add("priority", []string{"0", "-5", "10", "9223372036854775807"}, []string{"null", "1.5", `"1"`, "9223372036854775808"})
	add("request_id", []string{`"req-1"`, `""`}, []string{"null", "1"})
	add("return_tokens_as_token_ids", orNullBools, notOrNullBool)
	add("return_token_ids", orNullBools, notOrNullBool)
	add("cache_salt", []string{`"c2FsdA"`, "null"}, []string{`""`, "1", "{}"})
	add("kv_transfer_params", []string{`{"do_remote_decode":true}`, "null"}, []string{"[]", `"x"`})
	add("engine_xargs", []string{`{"a":"x","b":1,"c":["x",2.5],"d":[]}`, "{}", "null"}, []string{`"x"`, "[]"})
	add("repetition_detection", []string{`{"max_pattern_size":0,"min_pattern_size":0,"min_count":0}`, `{"max_pattern_size":8,"min_count":2,"x":null}`, "{}", "null"}, []string{`"x"`, "[]", "0"})
	add("response_format", []string{`{"type":"text"}`, `{"type":"json_object"}`, `{"type":"structural_tag","structures":[],"triggers":[]}`,
		`{"type":"json_schema","json_schema":{"name":"n","description":"d","schema":{"type":"object"},"strict":true}}`},
		[]string{"null", `"json"`, "[]"})
	add("tools", []string{"null", "[]",
		`[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object"},"strict":true}}]`,
		`[{"function":{"name":"f"}}]`}, []string{`"x"`, "{}"})
	add("structured_outputs", []string{"null", "{}", `{"json":"{}"}`, `{"json":{"type":"object"}}`, `{"regex":"a+"}`,
		`{"choice":["a","b"]}`, `{"grammar":"root ::= x"}`, `{"json_object":true}`, `{"structural_tag":"t"}`,
		`{"regex":"a","disable_fallback":true,"disable_any_whitespace":true,"disable_additional_properties":false,"whitespace_pattern":" ","_backend":"xgrammar","_backend_was_auto":false}`},
		[]string{`"x"`, "[]"})
	runValidateCases(t, cases)
}

func TestValidateChatNestedFields(t *testing.T) {
	runValidateCases(t, []validateCase{
		{"stream_options with stream", withFields(`"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false,"x":1}`), "", ""},
		{"empty stream_options with stream", withFields(`"stream":true,"stream_options":{}`), "", ""},
		{"null stream_options without stream", withFields(`"stream_options":null`), "", ""},
		{"stream_options not an object", withFields(`"stream":true,"stream_options":"usage"`), "stream_options", `stream_options must be an object or null, got "usage".`},
		{"include_usage not a boolean", withFields(`"stream":true,"stream_options":{"include_usage":"yes"}`), "stream_options.include_usage", `stream_options.include_usage must be a boolean, got "yes".`},
		{"include_usage null", withFields(`"stream":true,"stream_options":{"include_usage":null}`), "stream_options.include_usage", "got null."},
		{"continuous_usage_stats not a boolean", withFields(`"stream":true,"stream_options":{"continuous_usage_stats":1}`), "stream_options.continuous_usage_stats", "must be a boolean, got 1."},

		{"response_format type not a string", withFields(`"response_format":{"type":1}`), "response_format.type", "response_format.type must be a string, got 1."},
		{"json_schema type without json_schema", withFields(`"response_format":{"type":"json_schema"}`), "response_format.json_schema", `required when response_format.type is "json_schema"`},
		{"json_schema null", withFields(`"response_format":{"type":"json_schema","json_schema":null}`), "response_format.json_schema", "must be an object, got null."},
		{"json_schema name not a string", withFields(`"response_format":{"type":"json_schema","json_schema":{"name":1,"schema":{}}}`), "response_format.json_schema.name", "must be a string, got 1."},
		{"json_schema schema not an object", withFields(`"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":"{}"}}`), "response_format.json_schema.schema", "must be an object"},
		{"json_schema strict not a boolean", withFields(`"response_format":{"type":"json_schema","json_schema":{"name":"n","strict":"yes"}}`), "response_format.json_schema.strict", "must be a boolean"},
		{"json_schema description not a string", withFields(`"response_format":{"type":"json_schema","json_schema":{"description":false}}`), "response_format.json_schema.description", "must be a string, got false."},

		{"tool not an object", withFields(`"tools":[1]`), "tools[0]", `tools[0] must be an object with "type": "function"`},
		{"tool of another type", withFields(`"tools":[{"type":"function","function":{"name":"a"}},{"type":"retrieval","function":{"name":"f"}}]`), "tools[1].type", `tools[1].type must be "function", got "retrieval".`},
		{"tool type not a string", withFields(`"tools":[{"type":1,"function":{"name":"f"}}]`), "tools[0].type", "got 1."},
		{"tool without function", withFields(`"tools":[{"type":"function"}]`), "tools[0].function", "tools[0].function is required"},
		{"tool function not an object", withFields(`"tools":[{"type":"function","function":"f"}]`), "tools[0].function", `must be an object with at least a name, got "f".`},
		{"tool function without name", withFields(`"tools":[{"type":"function","function":{"description":"d"}}]`), "tools[0].function.name", "tools[0].function.name is required"},
		{"tool function name not a string", withFields(`"tools":[{"type":"function","function":{"name":1}}]`), "tools[0].function.name", "must be a string, got 1."},
		{"tool function description not a string", withFields(`"tools":[{"type":"function","function":{"name":"f","description":null}}]`), "tools[0].function.description", "must be a string, got null."},
		{"tool function parameters not an object", withFields(`"tools":[{"type":"function","function":{"name":"f","parameters":"{}"}}]`), "tools[0].function.parameters", `must be an object (a JSON Schema), got "{}".`},

		{"structured_outputs json not a string or object", withFields(`"structured_outputs":{"json":1}`), "structured_outputs.json", "structured_outputs.json must be a string or an object, got 1."},
		{"structured_outputs regex not a string", withFields(`"structured_outputs":{"regex":1}`), "structured_outputs.regex", "must be a string"},
		{"structured_outputs choice not an array", withFields(`"structured_outputs":{"choice":"a"}`), "structured_outputs.choice", "must be an array of strings"},
		{"structured_outputs choice element", withFields(`"structured_outputs":{"choice":["a",1]}`), "structured_outputs.choice[1]", "structured_outputs.choice[1] must be a string, got 1."},
		{"structured_outputs json_object not a boolean", withFields(`"structured_outputs":{"json_object":"yes"}`), "structured_outputs.json_object", "must be a boolean"},
		{"structured_outputs _backend not a string", withFields(`"structured_outputs":{"regex":"a","_backend":1}`), "structured_outputs._backend", "must be a string"},
		{"structured_outputs inner null", withFields(`"structured_outputs":{"regex":null}`), "structured_outputs.regex", "got null."},
		{"structured_outputs two kinds", withFields(`"structured_outputs":{"regex":"a","choice":["a"]}`), "structured_outputs", "may set only one of json, regex, choice, grammar, json_object and structural_tag, got regex and choice."},
		{"structured_outputs json_object false still counts", withFields(`"structured_outputs":{"json_object":false,"grammar":"g"}`), "structured_outputs", "got grammar and json_object."},
		{"structured_outputs three kinds", withFields(`"structured_outputs":{"json":{},"structural_tag":"t","regex":"r"}`), "structured_outputs", "got json and regex and structural_tag."},

		{"engine_xargs bool value", withFields(`"engine_xargs":{"a":true}`), "engine_xargs.a", "engine_xargs.a must be a string, a number or an array of strings and numbers, got true."},
		{"engine_xargs null value", withFields(`"engine_xargs":{"a":null}`), "engine_xargs.a", "got null."},
		{"engine_xargs object value", withFields(`"engine_xargs":{"a":{}}`), "engine_xargs.a", "got an object."},
		{"engine_xargs nested array", withFields(`"engine_xargs":{"a":["x",[1]]}`), "engine_xargs.a[1]", "engine_xargs.a[1] must be a string or a number, got an array."},

		{"repetition_detection negative", withFields(`"repetition_detection":{"min_count":-1}`), "repetition_detection.min_count", "repetition_detection.min_count must be an integer of at least 0, got -1."},
		{"repetition_detection fraction", withFields(`"repetition_detection":{"max_pattern_size":1.5}`), "repetition_detection.max_pattern_size", "got 1.5."},
		{"repetition_detection null inner", withFields(`"repetition_detection":{"min_pattern_size":null}`), "repetition_detection.min_pattern_size", "got null."},

		{"stop element", withFields(`"stop":["a",1]`), "stop[1]", "stop[1] must be a string, got 1."},
		{"stop null element", withFields(`"stop":["a",null]`), "stop[1]", "got null."},
		{"stop_token_ids string element", withFields(`"stop_token_ids":["1"]`), "stop_token_ids[0]", `must be an integer, got "1".`},
		{"stop_token_ids null element", withFields(`"stop_token_ids":[null]`), "stop_token_ids[0]", "got null."},
		{"allowed_token_ids bool element", withFields(`"allowed_token_ids":[true]`), "allowed_token_ids[0]", "must be an integer, got true."},
		{"stop_token_ids element", withFields(`"stop_token_ids":[1,2.5]`), "stop_token_ids[1]", "stop_token_ids[1] must be an integer, got 2.5."},
		{"allowed_token_ids overflow", withFields(`"allowed_token_ids":[99999999999999999999]`), "allowed_token_ids[0]", "must fit in a signed 64-bit integer"},
		{"documents element", withFields(`"documents":[{"text":"x"},"y"]`), "documents[1]", `documents[1] must be an object, got "y".`},
		{"bad_words element", withFields(`"bad_words":[["x"]]`), "bad_words[0]", "must be a string, got an array."},
	})
}

func TestValidateChatCrossFieldRules(t *testing.T) {
	runValidateCases(t, []validateCase{
		{"stream_options with stream false", withFields(`"stream":false,"stream_options":{"include_usage":true}`), "stream_options", "stream_options is only allowed when stream is true"},
		{"stream_options without stream", withFields(`"stream_options":{"include_usage":true}`), "stream_options", "only allowed when stream is true"},
		{"stream_options with stream null", withFields(`"stream":null,"stream_options":{}`), "stream_options", "only allowed when stream is true"},
		{"stream_options after stream", withFields(`"stream_options":{"include_usage":true},"stream":true`), "", ""},

		{"continue_final_message alone", withFields(`"continue_final_message":true`), "continue_final_message", "add_generation_prompt, which defaults to true"},
		{"continue_final_message with add_generation_prompt", withFields(`"continue_final_message":true,"add_generation_prompt":true`), "continue_final_message", "cannot both be true"},
		{"continue_final_message with add_generation_prompt false", withFields(`"add_generation_prompt":false,"continue_final_message":true`), "", ""},
		{"add_generation_prompt alone", withFields(`"add_generation_prompt":true`), "", ""},

		{"top_logprobs without logprobs", withFields(`"top_logprobs":5`), "top_logprobs", `top_logprobs is 5, which requires "logprobs": true`},
		{"top_logprobs with logprobs false", withFields(`"top_logprobs":1,"logprobs":false`), "top_logprobs", "requires"},
		{"top_logprobs with logprobs null", withFields(`"top_logprobs":1,"logprobs":null`), "top_logprobs", "requires"},
		{"top_logprobs with logprobs true", withFields(`"logprobs":true,"top_logprobs":5`), "", ""},
		{"top_logprobs 0 without logprobs", withFields(`"top_logprobs":0`), "", ""},

		{"prompt_logprobs with stream", withFields(`"stream":true,"prompt_logprobs":1`), "prompt_logprobs", "prompt_logprobs is not available when stream is true"},
		{"prompt_logprobs 0 with stream", withFields(`"stream":true,"prompt_logprobs":0`), "", ""},
		{"prompt_logprobs without stream", withFields(`"stream":false,"prompt_logprobs":3`), "", ""},

		{"structured_outputs one kind and options", withFields(`"structured_outputs":{"choice":["a"],"disable_fallback":true}`), "", ""},
		{"response_format json_schema carried", withFields(`"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}`), "", ""},
		{"priority is only reported", withFields(`"priority":7`), "", ""},
	})
}

// TestValidateChatMessagesExact pins whole messages, since users read them.
func TestValidateChatMessagesExact(t *testing.T) {
	cases := []struct{ body, message string }{
		{withFields(`"temperature":3`), "temperature must be a number between 0 and 2 or null, got 3."},
		{withFields(`"n":0`), "n must be an integer of at least 1, or null, got 0."},
		{withFields(`"top_k":-3`), "top_k must be -1, 0 (both turn top-k off) or an integer of at least 1, or null, got -3."},
		{withFields(`"seed":9223372036854775808`), "seed must fit in a signed 64-bit integer (-9223372036854775808 to 9223372036854775807), got 9223372036854775808."},
		{withFields(`"stream":"yes"`), `stream must be a boolean or null, got "yes".`},
		{withFields(`"tool_choice":"auto"`), `tool_choice "auto" needs tools: send the tools the model may call, or leave tool_choice out.`},
		{withFields(`"tool_choice":"any"`), `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": "..."}}, got "any".`},
		{withFields(`"n":2,"temperature":0`), "n is 2, but temperature 0 means greedy sampling, which gives a single answer; send n 1, or a temperature above 0 for several answers."},
		{withFields(`"min_tokens":20,"max_tokens":10`), "min_tokens is 20, more than max_tokens (10); send a min_tokens of at most 10."},
		{withFields(`"max_tokens":1.5`), "max_tokens must be an integer of at least 1, or null, got 1.5."},
		{withFields(`"logit_bias":{"hello":1}`), `logit_bias keys must be token ids written as integer strings, such as "50256", got "hello".`},
		{withFields(`"stream":["` + strings.Repeat("x", 100) + `"]`), "stream must be a boolean or null, got an array."},
		{withFields(`"stream":"` + strings.Repeat("x", 100) + `"`), "stream must be a boolean or null, got a string of 100 bytes."},
	}
	for _, tc := range cases {
		t.Run(tc.message, func(t *testing.T) {
			var req Request
			err := ValidateChat([]byte(tc.body), &req)
			if err == nil {
				t.Fatalf("body %s accepted", tc.body)
			}
			if err.Message != tc.message {
				t.Fatalf("got  %q\nwant %q", err.Message, tc.message)
			}
			if err.Error() != err.Message {
				t.Fatalf("Error() = %q, want the message", err.Error())
			}
		})
	}
}

func TestValidateChatFillsRequest(t *testing.T) {
	cases := []struct {
		name string
		body string
		want Request // Model is compared as a string, modelBuf ignored
	}{
		{"defaults", withFields(""), Request{N: 1, Messages: 1, PromptBytes: 2}},
		{"stream with usage",
			withFields(`"model":"m1","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`),
			Request{Model: []byte("m1"), Stream: true, StreamOptions: true, IncludeUsage: true, ContinuousUsage: true, N: 1, Messages: 1, PromptBytes: 2}},
		{"include_usage false",
			withFields(`"stream":true,"stream_options":{"include_usage":false}`),
			Request{Stream: true, StreamOptions: true, N: 1, Messages: 1, PromptBytes: 2}},
		{"null stream_options", withFields(`"stream":true,"stream_options":null`), Request{Stream: true, N: 1, Messages: 1, PromptBytes: 2}},
		{"max_tokens", withFields(`"max_tokens":100`), Request{MaxTokens: 100, N: 1, Messages: 1, PromptBytes: 2}},
		{"max_completion_tokens wins", withFields(`"max_completion_tokens":50,"max_tokens":100`), Request{MaxTokens: 50, N: 1, Messages: 1, PromptBytes: 2}},
		{"null max_completion_tokens", withFields(`"max_completion_tokens":null,"max_tokens":100`), Request{MaxTokens: 100, N: 1, Messages: 1, PromptBytes: 2}},
		{"n", withFields(`"n":4`), Request{N: 4, Messages: 1, PromptBytes: 2}},
		{"null n", withFields(`"n":null`), Request{N: 1, Messages: 1, PromptBytes: 2}},
		{"priority", withFields(`"priority":-3`), Request{N: 1, Priority: -3, Messages: 1, PromptBytes: 2}},
		{"null model", withFields(`"model":null`), Request{N: 1, Messages: 1, PromptBytes: 2}},
		{"escaped model", withFields(`"model":"caf\u00e9\/x"`), Request{Model: []byte("café/x"), N: 1, Messages: 1, PromptBytes: 2}},
		{"long escaped model", withFields(`"model":"` + strings.Repeat(`a\/`, 40) + `"`), Request{Model: []byte(strings.Repeat("a/", 40)), N: 1, Messages: 1, PromptBytes: 2}},
		{"prompt bytes count strings and text parts as sent", withMessages(
			`{"role":"system","content":"abc"},{"role":"user","content":[{"type":"text","text":"de"},{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"f\ng"}]},{"role":"assistant","tool_calls":[]}`),
			Request{Model: []byte("m"), N: 1, Messages: 3, Instructions: 1, PromptBytes: 3 + 2 + 4}},
		{"repeated content counts the last copy", withMessages(`{"role":"user","content":"abcdef","content":"ab"}`),
			Request{Model: []byte("m"), N: 1, Messages: 1, PromptBytes: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := Request{Model: []byte("stale"), Priority: 9, Messages: 99} // leftovers must not survive
			if err := ValidateChat([]byte(tc.body), &req); err != nil {
				t.Fatal(err)
			}
			if string(req.Model) != string(tc.want.Model) || (req.Model == nil) != (tc.want.Model == nil) {
				t.Errorf("Model = %q, want %q", req.Model, tc.want.Model)
			}
			if sys, p := req.Prompt([]byte(tc.body)); sys != nil || len(p) < 2 || p[0] != '[' || p[len(p)-1] != ']' {
				t.Errorf("Prompt = %q, want the messages array", p)
			}
			got, want := req, tc.want
			got.Model, want.Model = nil, nil
			got.ModelStart, got.ModelEnd, got.StreamOptionsStart, got.StreamOptionsEnd = 0, 0, 0, 0
			got.PromptStart, got.PromptEnd, got.InstructionsEnd = 0, 0, 0
			got.modelBuf = [64]byte{}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestValidateChatOffsets checks that the offsets delimit the exact value tokens, whatever
// the spacing, so the handler can splice a rewritten value into the body.
func TestValidateChatOffsets(t *testing.T) {
	cases := []struct {
		name       string
		body       string
		model      string // the text at ModelStart:ModelEnd, "" when absent
		streamOpts string // the text at StreamOptionsStart:StreamOptionsEnd, "" when absent
	}{
		{"compact", `{"model":"m1","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`, `"m1"`, `{"include_usage":true}`},
		{"spaced", "{ \"messages\" : [ { \"role\" : \"user\" , \"content\" : \"x\" } ] ,\n  \"model\"\t:  \"m\\\"2\"  ,\"stream\":true, \"stream_options\" :\n{ \"include_usage\" : false }\n}", `"m\"2"`, `{ "include_usage" : false }`},
		{"model first after whitespace", "  {\"model\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", `"a"`, ""},
		{"null model and stream_options", `{"messages":[{"role":"user","content":"x"}],"model":null,"stream_options":null}`, "null", "null"},
		{"absent", `{"messages":[{"role":"user","content":"x"}]}`, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			var req Request
			if err := ValidateChat(body, &req); err != nil {
				t.Fatal(err)
			}
			if got := string(body[req.ModelStart:req.ModelEnd]); got != tc.model {
				t.Errorf("body[ModelStart:ModelEnd] = %q, want %q", got, tc.model)
			}
			if got := string(body[req.StreamOptionsStart:req.StreamOptionsEnd]); got != tc.streamOpts {
				t.Errorf("body[StreamOptionsStart:StreamOptionsEnd] = %q, want %q", got, tc.streamOpts)
			}
		})
	}
}

// TestValidateChatModelDoesNotExposeBody checks that appending to Model cannot overwrite
// the bytes after it in the body, which Model shares.
func TestValidateChatModelDoesNotExposeBody(t *testing.T) {
	body := []byte(withFields(`"model":"abc","user":"u"`))
	before := string(body)
	var req Request
	if err := ValidateChat(body, &req); err != nil {
		t.Fatal(err)
	}
	if cap(req.Model) != len(req.Model) {
		t.Fatalf("cap(Model) = %d, want %d", cap(req.Model), len(req.Model))
	}
	_ = append(req.Model, "XYZ"...)
	if string(body) != before {
		t.Fatalf("appending to Model changed the body to %s", body)
	}
}

// TestValidateChatErrorOutlivesBody checks that errors own their text: fasthttp reuses a
// body's buffer once the handler returns, and the validator reads the body through b2s.
func TestValidateChatErrorOutlivesBody(t *testing.T) {
	bodies := []string{
		withFields(`"temperature":"hot"`),
		withFields(`"engine_xargs":{"my_key":true}`),
		withMessages(`{"role":"user","content":[{"type":"text","text":12345}]}`),
		`"just a string"`,
	}
	for _, b := range bodies {
		body := []byte(b)
		var req Request
		err := ValidateChat(body, &req)
		if err == nil {
			t.Fatalf("body %s accepted", b)
		}
		param, message := strings.Clone(err.Param), strings.Clone(err.Message)
		for i := range body {
			body[i] = '#'
		}
		if err.Param != param || err.Message != message {
			t.Fatalf("error changed with the body: %q %q, was %q %q", err.Param, err.Message, param, message)
		}
	}
}

// TestValidateChatFieldsTable keeps the key switch and the field table in step.
func TestValidateChatFieldsTable(t *testing.T) {
	for id := range numChatFields {
		f := chatFields[id]
		if f.param == "" {
			t.Fatalf("field id %d has no table row", id)
		}
		if got := fieldID(f.param); got != id {
			t.Errorf("fieldID(%q) = %d, want %d", f.param, got, id)
		}
		if f.key != f.param {
			t.Errorf("top-level field %q has key %q", f.param, f.key)
		}
	}
	if fieldID("guided_json") != -1 {
		t.Errorf("an unknown key has a field id")
	}
}

// TestValidateChatDepth checks the nesting bound that keeps gjson.Valid's recursion, and
// so the stack, small whatever the body.
func TestValidateChatDepth(t *testing.T) {
	nested := func(levels int) string { // a value that adds levels to the depth
		return strings.Repeat("[", levels) + strings.Repeat("]", levels)
	}
	manyBrackets := strings.TrimSuffix(strings.Repeat("[[]],", 2*maxDepth), ",")
	runValidateCases(t, []validateCase{
		// The top-level object is one level.
		{"at the bound", withFields(`"x":` + nested(maxDepth-1)), "", ""},
		{"past the bound", withFields(`"x":` + nested(maxDepth)), "", "more than 1000 levels deep"},
		{"many shallow brackets", withFields(`"x":[` + manyBrackets + `]`), "", ""},
		{"brackets inside strings do not nest", withFields(`"x":"` + strings.Repeat("[{", 2*maxDepth) + `"`), "", ""},
		{"escaped quotes inside strings", withFields(`"x":["\"` + strings.Repeat("[", 2*maxDepth) + `"]`), "", ""},
		{"deep and invalid", strings.Repeat("[", 1<<20), "", "more than 1000 levels deep"},
	})
}

// TestValidateChatConfiguredDepth checks the server's max_json_depth.
func TestValidateChatConfiguredDepth(t *testing.T) {
	nested := `{"messages":[{"role":"user","content":"x"}],"x":` + strings.Repeat(`{"a":`, 9) + "1" + strings.Repeat("}", 9) + "}"
	var req Request
	if err := validateChatDepth([]byte(nested), &req, 64); err != nil {
		t.Fatalf("depth 10 under a limit of 64: %v", err)
	}
	err := validateChatDepth([]byte(nested), &req, 8)
	if err == nil || !strings.Contains(err.Message, "more than 8 levels") {
		t.Fatalf("depth 10 under a limit of 8: %v", err)
	}
}

func TestLaxInt(t *testing.T) {
	cases := []struct {
		raw                string
		n                  int64
		integral, overflow bool
	}{
		{"0", 0, true, false},
		{"-0", 0, true, false},
		{"-0.0", 0, true, false},
		{"0e999999999999999999999", 0, true, false},
		{"5", 5, true, false},
		{"5.0", 5, true, false},
		{"5.000", 5, true, false},
		{"1e1", 10, true, false},
		{"1E+1", 10, true, false},
		{"1.5e1", 15, true, false},
		{"150e-1", 15, true, false},
		{"100e-2", 1, true, false},
		{"-42", -42, true, false},
		{"-4.2e1", -42, true, false},
		{"5.5", 0, false, false},
		{"1e-1", 0, false, false},
		{"1.0000000000000001", 0, false, false},
		{"15e-1", 0, false, false},
		{"1e-999999999999999999999", 0, false, false},
		{"9223372036854775807", 9223372036854775807, true, false},
		{"9223372036854775807.0", 9223372036854775807, true, false},
		{"9223372036854775808", 0, true, true},
		{"-9223372036854775808", -9223372036854775808, true, false},
		{"-9223372036854775809", 0, true, true},
		{"9.223372036854775807e18", 9223372036854775807, true, false},
		{"1e19", 0, true, true},
		{"1e18", 1000000000000000000, true, false},
		{"99999999999999999999999", 0, true, true},
		{"1e400", 0, true, true},
		{"1e999999999999999999999", 0, true, true},
		{"0.00000000000000000000001e23", 1, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.raw, func(t *testing.T) {
			n, integral, overflow := laxInt(tc.raw)
			if n != tc.n || integral != tc.integral || overflow != tc.overflow {
				t.Fatalf("laxInt(%s) = %d, %v, %v; want %d, %v, %v", tc.raw, n, integral, overflow, tc.n, tc.integral, tc.overflow)
			}
		})
	}
}

// TestValidateChatLaxIntegers checks that integer fields take what the backend's pydantic
// models take, everywhere integers are read, and report the value.
func TestValidateChatLaxIntegers(t *testing.T) {
	runValidateCases(t, []validateCase{
		{"stop_token_ids elements", withFields(`"stop_token_ids":[1.0,2e0,3]`), "", ""},
		{"stop_token_ids fraction", withFields(`"stop_token_ids":[1,2.5]`), "stop_token_ids[1]", "stop_token_ids[1] must be an integer, got 2.5."},
		{"allowed_token_ids exponent", withFields(`"allowed_token_ids":[1e3]`), "", ""},
		{"allowed_token_ids overflow", withFields(`"allowed_token_ids":[1e20]`), "allowed_token_ids[0]", "must fit in a signed 64-bit integer"},
		{"repetition_detection exponent", withFields(`"repetition_detection":{"max_pattern_size":1e1,"min_pattern_size":2.0,"min_count":3}`), "", ""},
		{"priority exponent", withFields(`"priority":1e2`), "", ""},
		{"top_logprobs exponent", withFields(`"logprobs":true,"top_logprobs":1e1`), "", ""},
		{"top_logprobs exponent without logprobs", withFields(`"top_logprobs":2.0`), "top_logprobs", "top_logprobs is 2, which requires"},
		{"truncate_prompt_tokens -1.0", withFields(`"truncate_prompt_tokens":-1.0`), "", ""},
		{"top_k -2.0", withFields(`"top_k":-2.0`), "top_k", "got -2.0."},
	})
	var req Request
	if err := ValidateChat([]byte(withFields(`"max_tokens":1.5e2,"n":2.0,"priority":-1e1`)), &req); err != nil {
		t.Fatal(err)
	}
	if req.MaxTokens != 150 || req.N != 2 || req.Priority != -10 {
		t.Fatalf("MaxTokens %d N %d Priority %d, want 150 2 -10", req.MaxTokens, req.N, req.Priority)
	}
}

// TestValidateChatVLLMRules covers the rest of vLLM's request rules, each both ways.
func TestValidateChatVLLMRules(t *testing.T) {
	runValidateCases(t, []validateCase{
		{"response_format type missing", withFields(`"response_format":{}`), "response_format.type", `response_format.type is required: "text", "json_object", "json_schema" or "structural_tag".`},
		{"response_format type missing with a schema", withFields(`"response_format":{"json_schema":{"name":"n"}}`), "response_format.type", "is required"},
		{"response_format type unknown", withFields(`"response_format":{"type":"json"}`), "response_format.type", `must be "text", "json_object", "json_schema" or "structural_tag", got "json".`},
		{"response_format type upper case", withFields(`"response_format":{"type":"TEXT"}`), "response_format.type", `got "TEXT".`},
		{"response_format type null", withFields(`"response_format":{"type":null}`), "response_format.type", "must be a string, got null."},
		{"response_format structural_tag", withFields(`"response_format":{"type":"structural_tag","format":{"type":"triggered_tags"}}`), "", ""},
		{"json_schema name missing", withFields(`"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}}`), "response_format.json_schema.name", "response_format.json_schema.name is required"},
		{"json_schema name missing on json_object", withFields(`"response_format":{"type":"json_object","json_schema":{}}`), "response_format.json_schema.name", "is required"},
		{"json_schema as the OpenAI SDK sends it", withFields(`"response_format":{"type":"json_schema","json_schema":{"name":"Answer","strict":true,"schema":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}}}`), "", ""},
		{"json_schema as the AI SDK sends it", withFields(`"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"},"strict":true,"name":"response"}}`), "", ""},

		{"greedy with n 2", withFields(`"temperature":0,"n":2`), "n", "n is 2, but temperature 0 means greedy sampling"},
		{"greedy with n 2, n first", withFields(`"n":2,"temperature":0.0`), "n", "greedy sampling"},
		{"near-greedy with n 3", withFields(`"temperature":0.000001,"n":3`), "n", "temperature 1e-06 means greedy sampling"},
		{"greedy with n 1", withFields(`"temperature":0,"n":1`), "", ""},
		{"greedy with n null", withFields(`"temperature":0,"n":null`), "", ""},
		{"sampling with n 2", withFields(`"temperature":0.7,"n":2`), "", ""},
		{"no temperature with n 2", withFields(`"n":2`), "", ""},
		{"null temperature with n 2", withFields(`"temperature":null,"n":2`), "", ""},
		{"greedy beam search with n 2", withFields(`"temperature":0,"n":2,"use_beam_search":true`), "", ""},

		{"min_tokens above max_tokens", withFields(`"min_tokens":20,"max_tokens":10`), "min_tokens", "min_tokens is 20, more than max_tokens (10)"},
		{"min_tokens above max_completion_tokens", withFields(`"max_tokens":100,"max_completion_tokens":10,"min_tokens":11`), "min_tokens", "more than max_completion_tokens (10)"},
		{"min_tokens equal to max_tokens", withFields(`"min_tokens":10,"max_tokens":10`), "", ""},
		{"min_tokens without max_tokens", withFields(`"min_tokens":1000`), "", ""},
		{"min_tokens with null max_tokens", withFields(`"min_tokens":1000,"max_tokens":null`), "", ""},

		{"empty stop string", withFields(`"stop":""`), "stop", "stop must not be an empty string"},
		{"empty string in stop", withFields(`"stop":["a",""]`), "stop[1]", "stop[1] is an empty string"},
		{"stop of spaces", withFields(`"stop":[" ","\n"]`), "", ""},

		{"allowed_token_ids empty", withFields(`"allowed_token_ids":[]`), "allowed_token_ids", "allowed_token_ids must not be empty; send null, or leave it out, to allow every token."},
		{"allowed_token_ids not an array", withFields(`"allowed_token_ids":{}`), "allowed_token_ids", "allowed_token_ids must be an array of integers or null, got an object."},
		{"allowed_token_ids element", withFields(`"allowed_token_ids":[1,"2"]`), "allowed_token_ids[1]", `must be an integer, got "2".`},

		{"logit_bias key not a number", withFields(`"logit_bias":{"50256":1,"abc":2}`), "logit_bias", `logit_bias keys must be token ids written as integer strings, such as "50256", got "abc".`},
		{"logit_bias negative key", withFields(`"logit_bias":{"-1":2}`), "logit_bias", `got "-1".`},
		{"logit_bias fraction key", withFields(`"logit_bias":{"1.5":2}`), "logit_bias", `got "1.5".`},
		{"logit_bias empty key", withFields(`"logit_bias":{"":2}`), "logit_bias", `got "".`},
		{"logit_bias huge key", withFields(`"logit_bias":{"99999999999999999999":2}`), "logit_bias", "got"},
		{"logit_bias escaped key", withFields(`"logit_bias":{"\u0035":2}`), "", ""},
		{"logit_bias string value", withFields(`"logit_bias":{"50256":"-100"}`), "logit_bias.50256", `logit_bias.50256 must be a number, got "-100".`},
		{"logit_bias null value", withFields(`"logit_bias":{"1":null}`), "logit_bias.1", "got null."},
		{"logit_bias large value", withFields(`"logit_bias":{"1":1e300,"2":-1e300}`), "", ""},

		{"repetition_detection min above max", withFields(`"repetition_detection":{"max_pattern_size":4,"min_pattern_size":5,"min_count":3}`), "repetition_detection.min_pattern_size", "repetition_detection.min_pattern_size is 5, more than max_pattern_size (4)"},
		{"repetition_detection count 1", withFields(`"repetition_detection":{"max_pattern_size":4,"min_count":1}`), "repetition_detection.min_count", "repetition_detection.min_count must be at least 2 when max_pattern_size is above 0, got 1."},
		{"repetition_detection count missing", withFields(`"repetition_detection":{"max_pattern_size":4}`), "repetition_detection.min_count", "got 0."},
		{"repetition_detection off ignores the rest", withFields(`"repetition_detection":{"max_pattern_size":0,"min_pattern_size":9,"min_count":0}`), "", ""},
		{"repetition_detection on", withFields(`"repetition_detection":{"max_pattern_size":4,"min_pattern_size":4,"min_count":2}`), "", ""},

		{"document value not a string", withFields(`"documents":[{"title":"t","text":"x"},{"title":"u","year":2020}]`), "documents[1].year", "documents[1].year must be a string, got 2020."},
		{"document value null", withFields(`"documents":[{"text":null}]`), "documents[0].text", "got null."},
		{"document value object", withFields(`"documents":[{"meta":{}}]`), "documents[0].meta", "got an object."},
		{"document not an object", withFields(`"documents":[{"text":"x"},"y"]`), "documents[1]", `documents[1] must be an object, got "y".`},
	})
}

// TestValidateChatToolChoice checks that tool_choice is reported as sent, and that its
// shape and its relation to tools are checked whatever the model.
func TestValidateChatToolChoice(t *testing.T) {
	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}},{"type":"function","function":{"name":"get_time"}}]`
	cases := []struct {
		name       string
		body       string
		choice     ToolChoice
		choiceName string
		param, msg string // the expected error, if any
	}{
		{"absent", withFields(tools), ToolChoiceAbsent, "", "", ""},
		{"null", withFields(tools + `,"tool_choice":null`), ToolChoiceAbsent, "", "", ""},
		{"none", withFields(tools + `,"tool_choice":"none"`), ToolChoiceNone, "", "", ""},
		{"none without tools", withFields(`"tool_choice":"none"`), ToolChoiceNone, "", "", ""},
		{"auto", withFields(tools + `,"tool_choice":"auto"`), ToolChoiceAuto, "", "", ""},
		{"auto before tools", withFields(`"tool_choice":"auto",` + tools), ToolChoiceAuto, "", "", ""},
		{"auto with empty tools", withFields(`"tools":[],"tool_choice":"auto"`), ToolChoiceAuto, "", "", ""},
		{"required", withFields(tools + `,"tool_choice":"required"`), ToolChoiceRequired, "", "", ""},
		{"named", withFields(tools + `,"tool_choice":{"type":"function","function":{"name":"get_time"}}`), ToolChoiceNamed, "get_time", "", ""},
		{"named before tools", withFields(`"tool_choice":{"type":"function","function":{"name":"get_weather"}},` + tools), ToolChoiceNamed, "get_weather", "", ""},
		{"named without type", withFields(tools + `,"tool_choice":{"function":{"name":"get_time"}}`), ToolChoiceNamed, "get_time", "", ""},
		{"named with escapes", withFields(tools + `,"tool_choice":{"type":"function","function":{"name":"get_\u0074ime"}}`), ToolChoiceNamed, "get_time", "", ""},
		{"named with extra members", withFields(tools + `,"tool_choice":{"type":"function","function":{"name":"get_time","x":1},"y":2}`), ToolChoiceNamed, "get_time", "", ""},
		{"named with parallel_tool_calls", withFields(tools + `,"tool_choice":{"type":"function","function":{"name":"get_time"}},"parallel_tool_calls":false`), ToolChoiceNamed, "get_time", "", ""},

		{"unknown string", withFields(tools + `,"tool_choice":"any"`), 0, "", "tool_choice", `got "any".`},
		{"number", withFields(tools + `,"tool_choice":1`), 0, "", "tool_choice", "got 1."},
		{"auto without tools", withFields(`"tool_choice":"auto"`), 0, "", "tool_choice", `tool_choice "auto" needs tools`},
		{"auto with null tools", withFields(`"tools":null,"tool_choice":"auto"`), 0, "", "tool_choice", `tool_choice "auto" needs tools`},
		{"required without tools", withFields(`"tool_choice":"required"`), 0, "", "tool_choice", `tool_choice "required" needs a non-empty tools array`},
		{"required with empty tools", withFields(`"tools":[],"tool_choice":"required"`), 0, "", "tool_choice", "needs a non-empty tools array"},
		{"named without tools", withFields(`"tool_choice":{"type":"function","function":{"name":"f"}}`), 0, "", "tool_choice", `tool_choice names the function "f", which needs a non-empty tools array that declares it.`},
		{"named undeclared", withFields(tools + `,"tool_choice":{"type":"function","function":{"name":"get_news"}}`), 0, "", "tool_choice.function.name", `tool_choice names the function "get_news", which none of the tools declares`},
		{"named case differs", withFields(tools + `,"tool_choice":{"type":"function","function":{"name":"Get_Time"}}`), 0, "", "tool_choice.function.name", "none of the tools declares"},
		{"object without function", withFields(tools + `,"tool_choice":{"type":"function"}`), 0, "", "tool_choice", "tool_choice is an object without a function"},
		{"allowed_tools", withFields(tools + `,"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}}`), 0, "", "tool_choice.type", `tool_choice.type must be "function", got "allowed_tools"`},
		{"type not a string", withFields(tools + `,"tool_choice":{"type":1,"function":{"name":"get_time"}}`), 0, "", "tool_choice.type", "got 1;"},
		{"function a string", withFields(tools + `,"tool_choice":{"type":"function","function":"get_time"}`), 0, "", "tool_choice.function", `tool_choice.function must be an object with the function's name, such as {"name": "get_weather"}, got "get_time".`},
		{"name missing", withFields(tools + `,"tool_choice":{"type":"function","function":{}}`), 0, "", "tool_choice.function.name", "tool_choice.function.name is required"},
		{"name not a string", withFields(tools + `,"tool_choice":{"type":"function","function":{"name":["get_time"]}}`), 0, "", "tool_choice.function.name", "tool_choice.function.name must be a string, got an array."},
		{"name empty", withFields(tools + `,"tool_choice":{"type":"function","function":{"name":""}}`), 0, "", "tool_choice.function.name", "must not be empty"},
		{"duplicate tool_choice", withFields(tools + `,"tool_choice":"none","tool_choice":"auto"`), 0, "", "tool_choice", `repeats the key "tool_choice"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := Request{ToolChoice: ToolChoiceRequired, ToolChoiceName: []byte("stale")}
			err := ValidateChat([]byte(tc.body), &req)
			if tc.msg != "" {
				if err == nil {
					t.Fatalf("body %s accepted, want an error on %q containing %q", tc.body, tc.param, tc.msg)
				}
				if err.Param != tc.param || !strings.Contains(err.Message, tc.msg) || !strings.HasSuffix(err.Message, ".") {
					t.Fatalf("got param %q message %q\nwant param %q message containing %q", err.Param, err.Message, tc.param, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("body %s: unexpected error (param %q): %s", tc.body, err.Param, err.Message)
			}
			if req.ToolChoice != tc.choice || string(req.ToolChoiceName) != tc.choiceName {
				t.Fatalf("ToolChoice %v name %q, want %v %q", req.ToolChoice, req.ToolChoiceName, tc.choice, tc.choiceName)
			}
		})
	}
}

// TestValidateChatToolMessages checks the shape of tool calls carried back in an
// assistant message and of the tool messages that answer them.
func TestValidateChatToolMessages(t *testing.T) {
	const user = `{"role":"user","content":"Weather in Paris?"},`
	call := func(c string) string {
		return withMessages(user + `{"role":"assistant","content":null,"tool_calls":[` + c + `]}`)
	}
	const good = `{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}`
	runValidateCases(t, []validateCase{
		{"round trip as the OpenAI SDK sends it", withMessages(user +
			`{"role":"assistant","content":null,"refusal":null,"tool_calls":[` + good + `]},` +
			`{"role":"tool","tool_call_id":"call_1","content":"18 degrees"}`), "", ""},
		{"round trip as the AI SDK sends it", withMessages(user +
			`{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"},"extra_content":{"google":{"thought_signature":"x"}}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"{\"t\":18}"}`), "", ""},
		{"parallel calls", call(good + `,{"id":"call_2","type":"function","function":{"name":"get_time","arguments":""}}`), "", ""},
		{"content absent", withMessages(user + `{"role":"assistant","tool_calls":[` + good + `]}`), "", ""},
		{"type left out", call(`{"id":"c","function":{"name":"f","arguments":"{}"}}`), "", ""},
		{"empty tool_calls", withMessages(user + `{"role":"assistant","content":"a","tool_calls":[]}`), "", ""},
		{"null tool_calls", withMessages(user + `{"role":"assistant","content":"a","tool_calls":null}`), "", ""},

		{"tool_calls not an array", withMessages(user + `{"role":"assistant","content":"a","tool_calls":{}}`), "messages[1].tool_calls", "messages[1].tool_calls must be an array of tool calls or null, got an object."},
		{"call not an object", call(`"call_1"`), "messages[1].tool_calls[0]", `messages[1].tool_calls[0] must be a tool call object such as`},
		{"id missing", call(`{"type":"function","function":{"name":"f","arguments":"{}"}}`), "messages[1].tool_calls[0].id", "messages[1].tool_calls[0].id is required"},
		{"id not a string", call(`{"id":7,"type":"function","function":{"name":"f","arguments":"{}"}}`), "messages[1].tool_calls[0].id", "must be a string, got 7."},
		{"type not function", call(`{"id":"c","type":"custom","function":{"name":"f","arguments":"{}"}}`), "messages[1].tool_calls[0].type", `messages[1].tool_calls[0].type must be "function", got "custom".`},
		{"function missing", call(`{"id":"c","type":"function"}`), "messages[1].tool_calls[0].function", "messages[1].tool_calls[0].function is required"},
		{"function not an object", call(`{"id":"c","type":"function","function":"f"}`), "messages[1].tool_calls[0].function", `got "f".`},
		{"name missing", call(`{"id":"c","type":"function","function":{"arguments":"{}"}}`), "messages[1].tool_calls[0].function.name", "messages[1].tool_calls[0].function.name is required"},
		{"name not a string", call(`{"id":"c","type":"function","function":{"name":null,"arguments":"{}"}}`), "messages[1].tool_calls[0].function.name", "got null."},
		{"arguments missing", call(`{"id":"c","type":"function","function":{"name":"f"}}`), "messages[1].tool_calls[0].function.arguments", "messages[1].tool_calls[0].function.arguments is required"},
		{"arguments an object", call(`{"id":"c","type":"function","function":{"name":"f","arguments":{"city":"Paris"}}}`), "messages[1].tool_calls[0].function.arguments", "must be a string (the arguments as JSON text"},
		{"second call wrong", call(good + `,{"id":"c2","type":"function","function":{"name":"f","arguments":1}}`), "messages[1].tool_calls[1].function.arguments", "got 1."},

		{"tool message without tool_call_id, as vLLM accepts it", withMessages(user + `{"role":"tool","content":"18"}`), "", ""},
		{"tool message tool_call_id null, as vLLM accepts it", withMessages(user + `{"role":"tool","tool_call_id":null,"content":"18"}`), "", ""},
		{"tool message tool_call_id number", withMessages(user + `{"role":"tool","tool_call_id":1,"content":"18"}`), "messages[1].tool_call_id", "messages[1].tool_call_id must be a string or null, got 1."},
		{"tool_call_id on another role", withMessages(`{"role":"user","content":"a","tool_call_id":["x"]}`), "messages[0].tool_call_id", "must be a string or null, got an array."},
		{"tool_call_id null on another role", withMessages(`{"role":"user","content":"a","tool_call_id":null}`), "", ""},
	})
}

// TestValidateChatLimits checks server.max_stop_strings and server.max_logit_bias: at
// the limit a body passes, past it the error names the field, and the defaults apply to
// zero limits.
func TestValidateChatLimits(t *testing.T) {
	stops := func(n int) string {
		return `"stop":[` + strings.TrimSuffix(strings.Repeat(`"x",`, n), ",") + `]`
	}
	bias := func(n int) string {
		var b strings.Builder
		b.WriteString(`"logit_bias":{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"` + strconv.Itoa(i) + `":-100`)
		}
		return b.String() + "}"
	}
	cases := []struct {
		name       string
		body       string
		lim        BodyLimits
		param, msg string
	}{
		{"stop at the limit", withFields(stops(4)), BodyLimits{MaxStopStrings: 4}, "", ""},
		{"stop past the limit", withFields(stops(5)), BodyLimits{MaxStopStrings: 4}, "stop", "stop has more than 4 strings, the most the gateway accepts."},
		{"a stop string is one", withFields(`"stop":"x"`), BodyLimits{MaxStopStrings: 1}, "", ""},
		{"stop at the default", withFields(stops(defaultMaxStopStrings)), BodyLimits{}, "", ""},
		{"stop past the default", withFields(stops(defaultMaxStopStrings + 1)), BodyLimits{}, "stop", "more than 64 strings"},
		{"100,000 stop strings", withFields(stops(100000)), BodyLimits{}, "stop", "more than 64 strings"},
		{"logit_bias at the limit", withFields(bias(3)), BodyLimits{MaxLogitBias: 3}, "", ""},
		{"logit_bias past the limit", withFields(bias(4)), BodyLimits{MaxLogitBias: 3}, "logit_bias", "logit_bias has more than 3 entries, the most the gateway accepts."},
		{"50,000 bias entries under a limit of 1,000", withFields(bias(50000)), BodyLimits{MaxLogitBias: 1000}, "logit_bias", "more than 1000 entries"},
		{"a vocabulary's worth at the default", withFields(bias(262144)), BodyLimits{}, "", ""},
		{"past the default", withFields(bias(defaultMaxLogitBias + 1)), BodyLimits{}, "logit_bias", "more than 300000 entries"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var req Request
			err := ValidateChatLimits([]byte(tc.body), &req, tc.lim)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("unexpected error (param %q): %s", err.Param, err.Message)
				}
				return
			}
			if err == nil || err.Param != tc.param || !strings.Contains(err.Message, tc.msg) {
				t.Fatalf("got %+v, want param %q message containing %q", err, tc.param, tc.msg)
			}
		})
	}
}

// TestSharedFieldRules checks that the rules of logit_bias, allowed_token_ids and stop
// live in the shared field table and checks, so they hold wherever a validator takes its
// fields from chatFields, as /v1/completions does.
func TestSharedFieldRules(t *testing.T) {
	cases := []struct {
		members, param, msg string
	}{
		{`"logit_bias":{"50256":-100}`, "", ""},
		{`"logit_bias":{"x":1}`, "logit_bias", `logit_bias keys must be token ids written as integer strings, such as "50256", got "x".`},
		{`"logit_bias":{"1":"1"}`, "logit_bias.1", `logit_bias.1 must be a number, got "1".`},
		{`"allowed_token_ids":[]`, "allowed_token_ids", "allowed_token_ids must not be empty; send null, or leave it out, to allow every token."},
		{`"allowed_token_ids":[1.0]`, "", ""},
		{`"stop":["a",""]`, "stop[1]", "stop[1] is an empty string; every stop string must have at least one character."},
	}
	for _, tc := range cases {
		t.Run(tc.members, func(t *testing.T) {
			err := ValidateCompletions([]byte(`{"model":"m","prompt":"Hi",`+tc.members+`}`), new(Request), unbounded())
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("unexpected error (param %q): %s", err.Param, err.Message)
				}
				return
			}
			if err == nil || err.Param != tc.param || err.Message != tc.msg {
				t.Fatalf("got %+v, want param %q message %q", err, tc.param, tc.msg)
			}
		})
	}
}

// keyEndByBytes is keyEnd as a loop over every byte, as it was written
// before it read eight bytes at a time.
func keyEndByBytes(s string, i int) (end int, esc bool) {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '"':
			return j + 1, esc
		case '\\':
			esc = true
			j++
		}
	}
	return len(s), esc
}

// TestKeyEndMatchesBytes compares keyEnd with the byte loop on random
// texts of quotes, backslashes, bytes one off from them, and others,
// from every start, so that each byte is met at every place of a word and
// at the end of the text.
func TestKeyEndMatchesBytes(t *testing.T) {
	pieces := []string{`"`, `\`, `\"`, `\\`, "!", "#", "[", "]", "a", "key_name", "\x00", "\xff", "\xa2", "\xdc", " "}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		var b strings.Builder
		b.WriteByte('"')
		for n := rng.IntN(16); n > 0; n-- {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		s := b.String()
		for i := range len(s) {
			gotEnd, gotEsc := keyEnd(s, i)
			wantEnd, wantEsc := keyEndByBytes(s, i)
			if gotEnd != wantEnd || gotEsc != wantEsc {
				t.Fatalf("keyEnd(%q, %d) = %d, %v; byte loop %d, %v", s, i, gotEnd, gotEsc, wantEnd, wantEsc)
			}
		}
	}
}
