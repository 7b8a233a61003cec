package proxy

import (
	"testing"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
)

// TestSecretValuesRedact checks redaction by value: every configured
// backend key and plaintext client key, whole or as the start a clip left
// at the end of the text; a key holding another is replaced whole; text
// without a secret is unchanged, and a record without an error untouched.
func TestSecretValuesRedact(t *testing.T) {
	cfg := &config.Config{
		Backends: []config.Backend{{APIKey: "abcd1234"}, {APIKey: "abcd1234-long-key"}, {}},
		Auth:     config.Auth{Keys: []config.Key{{Key: "client-key-42"}, {KeySHA256: "ff"}}},
	}
	v := newSecretValues(cfg)
	tests := []struct{ in, want string }{
		{"no secret here", "no secret here"},
		{"backend said abcd1234 twice: abcd1234", "backend said [redacted] twice: [redacted]"},
		{"key abcd1234-long-key refused", "key [redacted] refused"},
		{"client-key-42", "[redacted]"},
		{"clipped at abcd-lo…", "clipped at abcd-lo…"},
		{"clipped at abcd1234-lo…", "clipped at [redacted]…"},
		{"clipped at client-ke…", "clipped at [redacted]…"},
		{"ends in abc", "ends in abc"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := v.redact(tt.in); got != tt.want {
			t.Errorf("redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	var none *secretValues
	if got := none.redact("abcd1234"); got != "abcd1234" {
		t.Errorf("a nil redactor changed the text: %q", got)
	}
	ok := accounting.Record{Output: []byte(`{"echo":"abcd1234"}`)}
	v.record(&ok)
	if string(ok.Output) != `{"echo":"abcd1234"}` {
		t.Errorf("a successful record's output changed: %s", ok.Output)
	}
	failed := accounting.Record{Error: "failed: abcd1234", Output: []byte(`{"error":"abcd1234"}`)}
	v.record(&failed)
	if failed.Error != "failed: [redacted]" || string(failed.Output) != `{"error":"[redacted]"}` {
		t.Errorf("failed record = %q, %s", failed.Error, failed.Output)
	}
}
