package openai

import (
	"strings"
	"testing"
)

// unbounded sets no request bounds: the validators' defaults apply.
func unbounded() BodyLimits { return BodyLimits{} }

// endpointCase is one body for an endpoint's validator: valid when param
// and msg are empty, else refused naming param with a message containing
// msg.
type endpointCase struct {
	name, body string
	param, msg string
}

func runEndpointCases(t *testing.T, validate func([]byte, *Request, BodyLimits) *ValidationError, cases []endpointCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			req := new(Request)
			err := validate([]byte(tt.body), req, unbounded())
			if tt.msg == "" {
				if err != nil {
					t.Fatalf("refused a valid body: %v (param %q)", err, err.Param)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted %s, want an error on %q", tt.body, tt.param)
			}
			if err.Param != tt.param || !strings.Contains(err.Message, tt.msg) {
				t.Fatalf("got param %q message %q, want param %q message containing %q", err.Param, err.Message, tt.param, tt.msg)
			}
		})
	}
}

func TestValidateCompletions(t *testing.T) {
	runEndpointCases(t, ValidateCompletions, []endpointCase{
		{name: "string prompt", body: `{"model":"demo","prompt":"Say hi"}`},
		{name: "strings", body: `{"model":"demo","prompt":["a","b"]}`},
		{name: "token ids", body: `{"model":"demo","prompt":[1,2,3]}`},
		{name: "lists of token ids", body: `{"model":"demo","prompt":[[1,2],[3]]}`},
		{name: "all options", body: `{"model":"demo","prompt":"x","echo":true,"suffix":null,"best_of":3,"n":2,"logprobs":5,
			"max_tokens":10,"temperature":0.5,"top_p":1,"stop":["\n"],"stream":true,"stream_options":{"include_usage":true},"seed":1,"user":"u"}`},
		{name: "logprobs null", body: `{"prompt":"x","logprobs":null}`},
		{name: "logprobs 20", body: `{"prompt":"x","logprobs":20}`},
		{name: "unknown field passes", body: `{"prompt":"x","vendor_extension":{"a":1}}`},

		{name: "empty body", body: ``, msg: `"prompt"`},
		{name: "not an object", body: `[1]`, msg: "must be a JSON object"},
		{name: "missing prompt", body: `{"model":"demo"}`, param: "prompt", msg: "prompt is required"},
		{name: "empty string prompt", body: `{"prompt":""}`, param: "prompt", msg: "must not be empty"},
		{name: "empty array prompt", body: `{"prompt":[]}`, param: "prompt", msg: "must not be an empty array"},
		{name: "empty inner list", body: `{"prompt":[[1],[]]}`, param: "prompt[1]", msg: "must not be an empty array"},
		{name: "mixed prompt", body: `{"prompt":["a",1]}`, param: "prompt[1]", msg: "a string like the other elements"},
		{name: "negative token", body: `{"prompt":[1,-2]}`, param: "prompt[1]", msg: "token id"},
		{name: "float token", body: `{"prompt":[[1.5]]}`, param: "prompt[0][0]", msg: "token id"},
		{name: "object prompt", body: `{"prompt":{"a":1}}`, param: "prompt", msg: "non-empty string"},
		{name: "logprobs over 20", body: `{"prompt":"x","logprobs":21}`, param: "logprobs", msg: "between 0 and 20"},
		{name: "logprobs bool", body: `{"prompt":"x","logprobs":true}`, param: "logprobs", msg: "between 0 and 20"},
		{name: "n without best_of", body: `{"prompt":"x","n":3}`},
		{name: "n with best_of null", body: `{"prompt":"x","n":3,"best_of":null}`},
		{name: "best_of below n", body: `{"prompt":"x","n":3,"best_of":2}`, param: "best_of", msg: "at least n (3)"},
		{name: "best_of 1 below n", body: `{"prompt":"x","n":2,"best_of":1}`, param: "best_of", msg: "at least n (2), got 1"},
		{name: "best_of zero", body: `{"prompt":"x","best_of":0}`, param: "best_of", msg: "at least 1"},
		{name: "echo string", body: `{"prompt":"x","echo":"yes"}`, param: "echo", msg: "a boolean"},
		{name: "suffix number", body: `{"prompt":"x","suffix":3}`, param: "suffix", msg: "a string"},
		{name: "temperature as chat", body: `{"prompt":"x","temperature":3}`, param: "temperature", msg: "a number between 0 and 2 or null, got 3"},
		{name: "top_p as chat", body: `{"prompt":"x","top_p":0}`, param: "top_p", msg: "greater than 0"},
		{name: "stop as chat", body: `{"prompt":"x","stop":[1]}`, param: "stop[0]", msg: "a string"},
		{name: "stream_options without stream", body: `{"prompt":"x","stream_options":{"include_usage":true}}`, param: "stream_options", msg: "only allowed when stream is true"},
		{name: "repeated key", body: `{"prompt":"x","prompt":"y"}`, param: "prompt", msg: "repeats the key"},
		{name: "model number", body: `{"prompt":"x","model":1}`, param: "model", msg: "a string"},
	})
}

func TestValidateCompletionsFills(t *testing.T) {
	req := new(Request)
	body := `{"model":"demo","prompt":[[1,2,3],[4]],"n":2,"best_of":5,"max_tokens":7,"stream":true}`
	if err := ValidateCompletions([]byte(body), req, unbounded()); err != nil {
		t.Fatal(err)
	}
	if string(req.Model) != "demo" || body[req.ModelStart:req.ModelEnd] != `"demo"` {
		t.Errorf("model %q at %d..%d", req.Model, req.ModelStart, req.ModelEnd)
	}
	if !req.Stream || req.IncludeUsage || req.MaxTokens != 7 || req.N != 5 || req.PromptBytes != 16 {
		t.Errorf("got stream %v include_usage %v max_tokens %d n %d prompt bytes %d; want true false 7 5 16",
			req.Stream, req.IncludeUsage, req.MaxTokens, req.N, req.PromptBytes)
	}
}

// TestValidateCompletionsBestOfDefaultsToN checks that a body with n and no
// best_of passes and reserves n sequences, as vLLM defaults best_of to n.
func TestValidateCompletionsBestOfDefaultsToN(t *testing.T) {
	req := new(Request)
	if err := ValidateCompletions([]byte(`{"model":"demo","prompt":"x","n":3}`), req, unbounded()); err != nil {
		t.Fatalf("refused n without best_of: %v (param %q)", err, err.Param)
	}
	if req.N != 3 {
		t.Fatalf("sequences reserved: got %d, want 3", req.N)
	}
}

func TestValidateEmbeddings(t *testing.T) {
	runEndpointCases(t, ValidateEmbeddings, []endpointCase{
		{name: "string", body: `{"model":"embed","input":"hello"}`},
		{name: "strings", body: `{"model":"embed","input":["a","b"],"encoding_format":"base64","dimensions":64,"user":"u"}`},
		{name: "token ids", body: `{"input":[1,2]}`},
		{name: "lists of token ids", body: `{"input":[[1],[2,3]],"encoding_format":"float"}`},
		{name: "null format", body: `{"input":"a","encoding_format":null,"dimensions":null}`},

		{name: "missing input", body: `{"model":"embed"}`, param: "input", msg: "input is required"},
		{name: "empty input", body: `{"input":""}`, param: "input", msg: "must not be empty"},
		{name: "empty array", body: `{"input":[]}`, param: "input", msg: "must not be an empty array"},
		{name: "empty element", body: `{"input":["a",""]}`, param: "input[1]", msg: "must not be empty"},
		{name: "bad format", body: `{"input":"a","encoding_format":"int8"}`, param: "encoding_format", msg: `"float", "base64" or null`},
		{name: "dimensions zero", body: `{"input":"a","dimensions":0}`, param: "dimensions", msg: "at least 1"},
		{name: "dimensions float", body: `{"input":"a","dimensions":1.5}`, param: "dimensions", msg: "at least 1"},
		{name: "user number", body: `{"input":"a","user":5}`, param: "user", msg: "a string"},
		{name: "input object", body: `{"input":{"text":"a"}}`, param: "input", msg: "non-empty string"},
	})
}

func TestValidateResponses(t *testing.T) {
	runEndpointCases(t, ValidateResponses, []endpointCase{
		{name: "string input", body: `{"model":"demo","input":"hi"}`},
		{name: "items", body: `{"model":"demo","input":[{"role":"user","content":"hi"}],"instructions":"be brief","max_output_tokens":5,"stream":true,"store":true}`},
		{name: "previous response", body: `{"input":"more","previous_response_id":"resp_abc"}`},

		{name: "missing input", body: `{"model":"demo"}`, param: "input", msg: "input is required"},
		{name: "empty input", body: `{"input":""}`, param: "input", msg: "must not be empty"},
		{name: "empty items", body: `{"input":[ ]}`, param: "input", msg: "must not be an empty array"},
		{name: "item not object", body: `{"input":["hi"]}`, param: "input[0]", msg: "an object"},
		{name: "max_output_tokens zero", body: `{"input":"a","max_output_tokens":0}`, param: "max_output_tokens", msg: "at least 1"},
		{name: "previous id empty", body: `{"input":"a","previous_response_id":""}`, param: "previous_response_id", msg: "non-empty string"},
		{name: "temperature as chat", body: `{"input":"a","temperature":-1}`, param: "temperature", msg: "between 0 and 2"},
		{name: "top_logprobs over 20", body: `{"input":"a","top_logprobs":21}`, param: "top_logprobs", msg: "between 0 and 20"},
	})
	req := new(Request)
	if err := ValidateResponses([]byte(`{"input":"more","previous_response_id":"resp_abc","max_output_tokens":9}`), req, unbounded()); err != nil {
		t.Fatal(err)
	}
	if req.PreviousResponseID != "resp_abc" || req.MaxTokens != 9 {
		t.Errorf("previous response %q, max tokens %d; want resp_abc, 9", req.PreviousResponseID, req.MaxTokens)
	}
}

// TestEndpointsConfiguredBounds checks that completions, embeddings and the
// Responses API hold their bodies to the configured bounds as chat does:
// stop strings and logit_bias entries (server.max_stop_strings and
// max_logit_bias), nesting (max_json_depth) and Responses API input items
// (max_messages), and that the defaults apply when nothing is configured.
func TestEndpointsConfiguredBounds(t *testing.T) {
	tight := BodyLimits{MaxStopStrings: 2, MaxLogitBias: 2, MaxDepth: 4, MaxInputItems: 2}
	type validateFunc = func([]byte, *Request, BodyLimits) *ValidationError
	tests := []struct {
		name       string
		validate   validateFunc
		lim        BodyLimits
		body       string
		param, msg string // empty: accepted
	}{
		{"completions stop within", ValidateCompletions, tight, `{"prompt":"x","stop":["a","b"]}`, "", ""},
		{"completions stop over", ValidateCompletions, tight, `{"prompt":"x","stop":["a","b","c"]}`, "stop", "stop has more than 2 strings"},
		{"completions stop default", ValidateCompletions, unbounded(), `{"prompt":"x","stop":["a","b","c"]}`, "", ""},
		{"completions logit_bias within", ValidateCompletions, tight, `{"prompt":"x","logit_bias":{"1":1,"2":-1}}`, "", ""},
		{"completions logit_bias over", ValidateCompletions, tight, `{"prompt":"x","logit_bias":{"1":1,"2":-1,"3":0}}`, "logit_bias", "logit_bias has more than 2 entries"},
		{"completions logit_bias default", ValidateCompletions, unbounded(), `{"prompt":"x","logit_bias":{"1":1,"2":-1,"3":0}}`, "", ""},
		{"completions depth", ValidateCompletions, tight, `{"prompt":"x","vendor":{"a":{"b":{"c":{}}}}}`, "", "nest"},
		{"embeddings depth", ValidateEmbeddings, tight, `{"input":"x","vendor":{"a":{"b":{"c":{}}}}}`, "", "nest"},
		{"responses depth", ValidateResponses, tight, `{"input":"x","metadata":{"a":{"b":{"c":{}}}}}`, "", "nest"},
		{"responses items within", ValidateResponses, tight, `{"input":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`, "", ""},
		{"responses items over", ValidateResponses, tight, `{"input":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}`,
			"input", "input has more than 2 items; the gateway accepts at most 2."},
		{"responses items over, not objects", ValidateResponses, tight, `{"input":[{},{},"x"]}`, "input", "more than 2 items"},
		{"responses items default", ValidateResponses, unbounded(), `{"input":[{},{},{}]}`, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := new(Request)
			err := tt.validate([]byte(tt.body), req, tt.lim)
			if tt.msg == "" {
				if err != nil {
					t.Fatalf("refused: %s (param %q)", err.Message, err.Param)
				}
				return
			}
			if err == nil || err.Param != tt.param || !strings.Contains(err.Message, tt.msg) {
				t.Fatalf("got %+v, want param %q and a message containing %q", err, tt.param, tt.msg)
			}
		})
	}
}
