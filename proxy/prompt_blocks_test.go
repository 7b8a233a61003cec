package proxy

import (
	"testing"

	"github.com/tollgate-dev/tollgate/backends"
)

// TestPromptMessages checks that the prompt the prefix signal hashes is the value as written,
// wherever the field stands in the body, and that it costs no allocation.
func TestPromptMessages(t *testing.T) {
	msgs := `[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`
	tests := []struct {
		name, body, want string
	}{
		{"messages first", `{"messages":` + msgs + `,"model":"m"}`, msgs},
		{"messages last", `{"model":"m","temperature":0.5,"stream":true,"messages":` + msgs + `}`, msgs},
		{"messages with spaces", `{ "model" : "m" , "messages" : ` + msgs + ` }`, msgs},
		{"completions prompt", `{"model":"m","prompt":"Once upon a time"}`, `"Once upon a time"`},
		{"responses input", `{"model":"m","input":[{"role":"user","content":"x"}]}`, `[{"role":"user","content":"x"}]`},
		{"no prompt", `{"model":"m"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(promptMessages([]byte(tt.body))); got != tt.want {
				t.Errorf("promptMessages = %q, want %q", got, tt.want)
			}
		})
	}
	body := []byte(`{"model":"m","messages":` + msgs + `}`)
	var arr [backends.MaxPrefixBlocks]uint64
	if n := testing.AllocsPerRun(100, func() { _ = backends.AppendBlockChain(arr[:0], promptMessages(body)) }); n != 0 {
		t.Errorf("the block chain of a body allocates %v times", n)
	}
}
