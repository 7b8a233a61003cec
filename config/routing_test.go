package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestLoadRouting loads the scheduler's settings: each signal on, off or
// left out (on), the queue cost, a backend's metrics, and the older
// affinity: prefix, which still loads and means the prefix signal on.
func TestLoadRouting(t *testing.T) {
	tests := []struct {
		name        string
		model       string // appended to the model demo's mapping
		backend     string // appended to the backend demo's mapping
		wantRouting Routing
		wantMetrics BackendMetrics
		wantPrefix  bool
	}{
		{
			name:        "nothing set: every signal on",
			wantRouting: Routing{QueueCostTokens: 2048},
			wantMetrics: BackendMetrics{Path: "/metrics", Interval: 250 * time.Millisecond, Timeout: time.Second, StaleAfter: time.Second},
			wantPrefix:  true,
		},
		{
			name:        "every signal off",
			model:       "    routing: {prefix: off, queue: off, kv: off, lora: off, spread: off, queue_cost_tokens: 512}\n",
			wantRouting: Routing{Prefix: SignalOff, Queue: SignalOff, KV: SignalOff, LoRA: SignalOff, Spread: SignalOff, QueueCostTokens: 512},
			wantMetrics: BackendMetrics{Path: "/metrics", Interval: 250 * time.Millisecond, Timeout: time.Second, StaleAfter: time.Second},
		},
		{
			name:        "on spelled out",
			model:       "    routing: {prefix: on, kv: on}\n",
			wantRouting: Routing{Prefix: SignalOn, KV: SignalOn, QueueCostTokens: 2048},
			wantMetrics: BackendMetrics{Path: "/metrics", Interval: 250 * time.Millisecond, Timeout: time.Second, StaleAfter: time.Second},
			wantPrefix:  true,
		},
		{
			name:        "the older affinity: prefix",
			model:       "    affinity: prefix\n",
			wantRouting: Routing{QueueCostTokens: 2048},
			wantMetrics: BackendMetrics{Path: "/metrics", Interval: 250 * time.Millisecond, Timeout: time.Second, StaleAfter: time.Second},
			wantPrefix:  true,
		},
		{
			name:        "metrics read elsewhere, slower; stale_after follows the interval",
			backend:     "    metrics: {path: /stats, interval: 1s}\n",
			wantRouting: Routing{QueueCostTokens: 2048},
			wantMetrics: BackendMetrics{Path: "/stats", Interval: time.Second, Timeout: time.Second, StaleAfter: 4 * time.Second},
			wantPrefix:  true,
		},
		{
			name:        "metrics off",
			backend:     "    metrics: {path: off}\n",
			wantRouting: Routing{QueueCostTokens: 2048},
			wantMetrics: BackendMetrics{Path: "off", Interval: 250 * time.Millisecond, Timeout: time.Second, StaleAfter: time.Second},
			wantPrefix:  true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yaml := "auth:\n  keys:\n    - {name: dev, key: sk-test-0001}\nbackends:\n  - name: demo\n    simulated: {}\n" +
				tt.backend + "models:\n  - name: demo\n    backends: [demo]\n" + tt.model
			cfg, err := Parse([]byte(yaml), "test.yaml")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := cfg.Models[0].Routing; got != tt.wantRouting {
				t.Errorf("routing = %+v, want %+v", got, tt.wantRouting)
			}
			if got := cfg.Backends[0].Metrics; got != tt.wantMetrics {
				t.Errorf("metrics = %+v, want %+v", got, tt.wantMetrics)
			}
			if got := cfg.Models[0].PrefixSignal(); got != tt.wantPrefix {
				t.Errorf("PrefixSignal = %v, want %v", got, tt.wantPrefix)
			}
		})
	}
}

func TestValidateRouting(t *testing.T) {
	tests := []struct {
		name  string
		extra string // appended to minimalYAML's model
		path  string
		msg   string
	}{
		{"unknown signal value", "    routing: {kv: maybe}\n", "models[0].routing.kv", `want on or off, got "maybe"`},
		{"unknown spread value", "    routing: {spread: always}\n", "models[0].routing.spread", `want on or off, got "always"`},
		{"negative queue cost", "    routing: {queue_cost_tokens: -1}\n", "models[0].routing.queue_cost_tokens", "must be positive"},
		{"affinity prefix with the prefix signal off", "    affinity: prefix\n    routing: {prefix: off}\n", "models[0].affinity", "routing.prefix: off"},
		{"metrics path without a slash", "backends_metrics", "backends[0].metrics.path", `want a path starting with /, or off, got "metrics"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yaml := minimalYAML + tt.extra
			if tt.extra == "backends_metrics" {
				yaml = strings.Replace(minimalYAML, "simulated: {}\n", "simulated: {}\n    metrics: {path: metrics}\n", 1)
			}
			_, err := Parse([]byte(yaml), "test.yaml")
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Parse error = %v, want a FieldError at %s", err, tt.path)
			}
			if !strings.Contains(err.Error(), tt.path) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error = %q, want %s: %s", err, tt.path, tt.msg)
			}
		})
	}
}

// TestLoadPriorityScheduling loads models[].priority_scheduling: zero means false.
func TestLoadPriorityScheduling(t *testing.T) {
	for _, tt := range []struct {
		name, model string
		want        bool
	}{
		{"left out", "", false},
		{"false", "    priority_scheduling: false\n", false},
		{"true", "    priority_scheduling: true\n", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimalYAML+tt.model), "test.yaml")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := cfg.Models[0].PriorityScheduling; got != tt.want {
				t.Errorf("priority_scheduling = %v, want %v", got, tt.want)
			}
		})
	}
}
