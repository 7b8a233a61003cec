package config

import "testing"

func TestValidateModelEndpoints(t *testing.T) {
	refused := []struct {
		name      string
		endpoints []string
		path, msg string
	}{
		{"unknown name", []string{"chat", "audio"}, "models[0].endpoints[1]", `want one of chat, completions, embeddings, responses, messages, got "audio"`},
		{"the OpenAI path is not a name", []string{"chat.completions"}, "models[0].endpoints[0]", `got "chat.completions"`},
		{"listed twice", []string{"embeddings", "chat", "embeddings"}, "models[0].endpoints[2]", `endpoint "embeddings" is listed twice (also models[0].endpoints[0])`},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig(t)
			cfg.Models[0].Endpoints = tt.endpoints
			requireFieldError(t, cfg.Validate(), tt.path, tt.msg)
		})
	}
	for _, endpoints := range [][]string{nil, {"embeddings"}, ModelEndpoints()} {
		cfg := validConfig(t)
		cfg.Models[0].Endpoints = endpoints
		if err := cfg.Validate(); err != nil {
			t.Errorf("endpoints %v: %v", endpoints, err)
		}
	}
}

func TestParseModelEndpoints(t *testing.T) {
	cfg, err := Parse([]byte(`
auth: {keys: [{name: k, key: sk-test-0001}]}
backends: [{name: b, url: "http://127.0.0.1:8000/v1"}]
models: [{name: embed, backends: [b], endpoints: [embeddings]}]
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Models[0].Endpoints; len(got) != 1 || got[0] != "embeddings" {
		t.Errorf("endpoints %v, want [embeddings]", got)
	}
}

// TestValidateMessagesModes accepts "native", "translate" or nothing for
// how a model or backend serves the Messages API, and refuses the rest.
func TestValidateMessagesModes(t *testing.T) {
	for _, mode := range []string{"", MessagesNative, MessagesTranslate} {
		cfg := validConfig(t)
		cfg.Models[0].Messages, cfg.Backends[0].Messages = mode, mode
		if err := cfg.Validate(); err != nil {
			t.Errorf("messages %q: %v", mode, err)
		}
	}
	for _, tt := range []struct {
		name, path string
		set        func(*Config)
	}{
		{"model", "models[0].messages", func(c *Config) { c.Models[0].Messages = "passthrough" }},
		{"backend", "backends[0].messages", func(c *Config) { c.Backends[0].Messages = "passthrough" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig(t)
			tt.set(cfg)
			requireFieldError(t, cfg.Validate(), tt.path, `want "native", "translate" or nothing, got "passthrough"`)
		})
	}
	cfg := validConfig(t)
	cfg.Models[0].MaxOutputTokens = -1
	requireFieldError(t, cfg.Validate(), "models[0].max_output_tokens", "")
}

// TestValidateReasoning accepts "none", "effort", "template" or nothing
// for how a translated Messages request asks a model to think, and
// refuses the rest.
func TestValidateReasoning(t *testing.T) {
	for _, mode := range []string{"", ReasoningNone, ReasoningEffort, ReasoningTemplate} {
		cfg := validConfig(t)
		cfg.Models[0].Reasoning = mode
		if err := cfg.Validate(); err != nil {
			t.Errorf("reasoning %q: %v", mode, err)
		}
	}
	cfg := validConfig(t)
	cfg.Models[0].Reasoning = "enable_thinking"
	requireFieldError(t, cfg.Validate(), "models[0].reasoning", `want one of "none", "effort", "template", got "enable_thinking"`)
}
