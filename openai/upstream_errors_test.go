package openai

import "testing"

func TestScrubAddresses(t *testing.T) {
	tests := []struct{ in, want string }{
		{"max_tokens is too large for the model at 10.0.0.7:8000", "max_tokens is too large for the model at [address]"},
		{"see http://vllm-3.internal:8000/v1/models", "see [address]"},
		{"worker [fd00::12]:9000 failed", "worker [address] failed"},
		{"connect to gpu-node-4:8001 refused", "connect to [address] refused"},
		{"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.", "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."},
		{"temperature must be in [0, 2]", "temperature must be in [0, 2]"},
	}
	for _, tt := range tests {
		if got := scrubAddresses(tt.in); got != tt.want {
			t.Errorf("scrubAddresses(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
