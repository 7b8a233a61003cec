package openai

import (
	"testing"
)

// TestRequestPrompt checks that each endpoint's validation finds its
// prompt's whole value as written, wherever the field stands in the body,
// without copying it.
func TestRequestPrompt(t *testing.T) {
	msgs := `[{"role":"system","content":"be brief"},{"role":"user","content":"hi \"there\""}]`
	chat := func(body []byte, req *Request) *ValidationError { return ValidateChat(body, req) }
	tests := []struct {
		name     string
		validate func([]byte, *Request) *ValidationError
		body     string
		want     string
	}{
		{"messages first", chat, `{"messages":` + msgs + `,"model":"m"}`, msgs},
		{"messages last", chat, `{"model":"m","temperature":0.5,"stream":true,"messages":` + msgs + `}`, msgs},
		{"messages with spaces", chat, `{ "model" : "m" , "messages" : ` + msgs + ` }`, msgs},
		{"messages after a decoy", chat, `{"model":"m","x":{"messages":[]},"y":"\"messages\":[]","messages":` + msgs + `}`, msgs},
		{"completions prompt", limited(ValidateCompletions), `{"model":"m","prompt":"Once upon a time","max_tokens":3}`, `"Once upon a time"`},
		{"completions prompt array", limited(ValidateCompletions), `{"prompt":[[1,2],[3]],"model":"m"}`, `[[1,2],[3]]`},
		{"embeddings input", limited(ValidateEmbeddings), `{"input":["a","b"],"model":"m"}`, `["a","b"]`},
		{"responses input", limited(ValidateResponses), `{"model":"m","input":[{"role":"user","content":"x"}]}`, `[{"role":"user","content":"x"}]`},
		{"responses input string", limited(ValidateResponses), `{"input":"hello","model":"m"}`, `"hello"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req Request
			body := []byte(tt.body)
			if err := tt.validate(body, &req); err != nil {
				t.Fatalf("validate: %v", err)
			}
			system, got := req.Prompt(body)
			if string(got) != tt.want || system != nil {
				t.Fatalf("Prompt = %q, %q; want no system, %q", system, got, tt.want)
			}
			if &got[0] != &body[req.PromptStart] {
				t.Error("Prompt copied the body")
			}
		})
	}
	t.Run("none", func(t *testing.T) {
		var req Request
		if system, got := req.Prompt([]byte(`{"model":"m"}`)); got != nil || system != nil {
			t.Errorf("Prompt of an empty Request = %q, %q; want nil", system, got)
		}
		req.PromptStart, req.PromptEnd, req.SystemStart, req.SystemEnd = 2, 40, 1, 50
		if system, got := req.Prompt([]byte(`{"model":"m"}`)); got != nil || system != nil {
			t.Errorf("Prompt past the body's end = %q, %q; want nil", system, got)
		}
	})
	t.Run("system apart", func(t *testing.T) {
		body := []byte(`{"system":"be brief","messages":[]}`)
		req := Request{SystemStart: 10, SystemEnd: 20, PromptStart: 32, PromptEnd: 34}
		if system, got := req.Prompt(body); string(system) != `"be brief"` || string(got) != "[]" {
			t.Errorf("Prompt = %q, %q", system, got)
		}
	})
	t.Run("refill", func(t *testing.T) {
		var req Request
		if err := ValidateChat([]byte(`{"model":"m","messages":`+msgs+`}`), &req); err != nil {
			t.Fatal(err)
		}
		body := []byte(`{"model":"m","input":"x"}`)
		if err := ValidateEmbeddings(body, &req, BodyLimits{}); err != nil {
			t.Fatal(err)
		}
		if _, got := req.Prompt(body); string(got) != `"x"` {
			t.Errorf("Prompt after a second validation = %q, want %q", got, `"x"`)
		}
	})
}

func limited(f func([]byte, *Request, BodyLimits) *ValidationError) func([]byte, *Request) *ValidationError {
	return func(body []byte, req *Request) *ValidationError { return f(body, req, BodyLimits{}) }
}

// TestRequestInstructions checks where chat validation finds the end of
// the leading system and developer messages, the instructions an app's
// conversations share, wherever messages stand in the body.
func TestRequestInstructions(t *testing.T) {
	const (
		sys  = `{"role":"system","content":"be brief"}`
		dev  = `{"role":"developer","content":"use SI units"}`
		user = `{"role":"user","content":"hi"}`
		asst = `{"role":"assistant","content":"hello"}`
	)
	tests := []struct {
		name     string
		messages string
		want     string // the messages array up to the instructions' end; "" for none
		count    int    // the instructions' messages
	}{
		{"a system message first", `[` + sys + `,` + user + `]`, `[` + sys, 1},
		{"system then developer", `[` + sys + `, ` + dev + `,` + user + `]`, `[` + sys + `, ` + dev, 2},
		{"a developer message alone first", `[` + dev + `,` + user + `,` + asst + `]`, `[` + dev, 1},
		{"only instructions", `[` + sys + `]`, `[` + sys, 1},
		{"a user message first", `[` + user + `,` + sys + `]`, "", 0},
		{"a system message after the first turn is not leading", `[` + sys + `,` + user + `,` + sys + `]`, `[` + sys, 1},
		{"a role with an escape", `[{"role":"syst\u0065m","content":"x"},` + user + `]`, `[{"role":"syst\u0065m","content":"x"}`, 1},
	}
	for _, tt := range tests {
		for _, body := range []string{
			`{"messages":` + tt.messages + `,"model":"m"}`,
			`{"model":"m","metadata":{"messages":[` + sys + `]},"messages":` + tt.messages + `}`,
		} {
			t.Run(tt.name, func(t *testing.T) {
				var req Request
				if err := ValidateChat([]byte(body), &req); err != nil {
					t.Fatalf("validate: %v", err)
				}
				got := ""
				if req.InstructionsEnd > 0 {
					got = body[req.PromptStart:req.InstructionsEnd]
				}
				if got != tt.want || req.Instructions != tt.count {
					t.Errorf("instructions = %d messages, %q; want %d, %q", req.Instructions, got, tt.count, tt.want)
				}
			})
		}
	}
}
