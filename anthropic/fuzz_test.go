package anthropic

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzValidate checks that no body makes the validator panic, that every
// refusal is an invalid_request_error with a message, and that what it accepts
// is a JSON object whose model offsets frame the model's token.
func FuzzValidate(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.json"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]}]}]}`))
	f.Add([]byte(`[[[[[[[[`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, validate := range []func([]byte, *Request, Limits) *Error{Validate, ValidateCountTokens} {
			var r Request
			err := validate(body, &r, Limits{MaxDepth: 32})
			if err != nil {
				if err.Type != InvalidRequest || err.Message == "" {
					t.Fatalf("refusal %+v", err)
				}
				continue
			}
			var top map[string]json.RawMessage
			if jerr := json.Unmarshal(body, &top); jerr != nil {
				t.Fatalf("accepted a body encoding/json refuses: %v", jerr)
			}
			var model string
			if json.Unmarshal(body[r.ModelStart:r.ModelEnd], &model) != nil || model != string(r.Model) {
				t.Fatalf("model offsets %d..%d do not frame %q", r.ModelStart, r.ModelEnd, r.Model)
			}
		}
	})
}
