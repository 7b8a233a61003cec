package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fullYAML is the example configuration users start from.
const fullYAML = `listen: "127.0.0.1:8080"
log: {level: info, format: json}
auth:
  keys:
    - name: dev
      key: "${TOLLGATE_DEV_KEY:-sk-tollgate-demo}"
      teams: ["*"]
      default_team: acme
      admin: true
backends:
  - name: vllm-a
    url: "http://10.0.0.5:8000/v1"
    api_key: "${VLLM_KEY:-}"
    timeouts: {connect: 2s, first_byte: 30s, idle: 30s, total: 5m}
  - name: demo
    simulated: {ttft: 20ms, inter_token: 5ms, tokens: 16}
models:
  - name: llama-3.1-8b
    upstream_model: meta-llama/Llama-3.1-8B-Instruct
    backends: [vllm-a]
    priority_scheduling: false
  - name: demo
    backends: [demo]
    tool_calling: true
store: {driver: sqlite, path: tollgate.db}
usage: {flush_interval: 1s}
limits:
  - {team: acme, rpm: 600, tpm: 100000, token_budget: 5000000, budget_window: month}
`

// minimalYAML is the smallest valid configuration: lines 1 to 9. Tests
// append to it, so errors in what they append are at line 10 and on.
const minimalYAML = `auth:
  keys:
    - {name: dev, key: sk-test-0001}
backends:
  - name: demo
    simulated: {}
models:
  - name: demo
    backends: [demo]
`

// env is a fixed environment for tests that need no process environment.
func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// noEnv is an environment with nothing set.
func noEnv(string) (string, bool) { return "", false }

// fieldErrors returns the FieldErrors in a joined error.
func fieldErrors(t *testing.T, err error) []*FieldError {
	t.Helper()
	var out []*FieldError
	for _, e := range splitJoined(err) {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("error %q is not a *FieldError", e)
		}
		out = append(out, fe)
	}
	return out
}

// requireFieldError fails unless err holds a FieldError at path whose
// problem contains msg.
func requireFieldError(t *testing.T, err error, path, msg string) *FieldError {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s: ...%s...", path, msg)
	}
	for _, fe := range fieldErrors(t, err) {
		if fe.Path == path && strings.Contains(fe.Err.Error(), msg) {
			return fe
		}
	}
	t.Fatalf("got error:\n%v\nwant one at path %q containing %q", err, path, msg)
	return nil
}

func TestLoadFullConfig(t *testing.T) {
	// Set but empty: ":-" falls back to the default, as in the shell.
	t.Setenv("TOLLGATE_DEV_KEY", "")
	t.Setenv("VLLM_KEY", "")
	dir := t.TempDir()
	path := filepath.Join(dir, "tollgate.yaml")
	if err := os.WriteFile(path, []byte(fullYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}

	want := &Config{
		Listen: "127.0.0.1:8080",
		Log:    Log{Level: "info", Format: "json"},
		Auth: Auth{Keys: []Key{{
			Name:        "dev",
			Key:         "sk-tollgate-demo",
			Teams:       []string{"*"},
			DefaultTeam: "acme",
			Admin:       true,
		}}},
		Server: Server{
			MaxBodyBytes:        4 << 20,
			MaxHeaderBytes:      16 << 10,
			MaxMessages:         2048,
			MaxJSONDepth:        64,
			ReadTimeout:         30 * time.Second,
			IdleTimeout:         120 * time.Second,
			WriteTimeout:        60 * time.Second,
			MaxConnections:      provisionedConns.proxy,
			AdminMaxConnections: provisionedConns.admin,
			MaxStreams:          10000,
			ShutdownTimeout:     30 * time.Second,
			MaxStopStrings:      64,
			MaxLogitBias:        300000,
			MaxResponseBytes:    64 << 20,
			MaxEventBytes:       1 << 20,
			BackgroundTeamShare: 25,
			MetricsAuth:         "key",
		},
		Backends: []Backend{
			{
				Name:     "vllm-a",
				URL:      "http://10.0.0.5:8000/v1",
				Weight:   1,
				MaxConns: 1024,
				Timeouts: BackendTimeouts{Connect: 2 * time.Second, FirstByte: 30 * time.Second, Idle: 30 * time.Second, Total: 5 * time.Minute},
				Health:   wantHealth,
				Metrics:  wantMetrics,
			},
			{
				Name:      "demo",
				Simulated: &Simulated{TimeToFirstToken: 20 * time.Millisecond, InterTokenDelay: 5 * time.Millisecond, Tokens: 16},
				Weight:    1,
				MaxConns:  1024,
				Timeouts:  BackendTimeouts{Connect: 5 * time.Second, FirstByte: 60 * time.Second, Idle: 60 * time.Second, Total: 10 * time.Minute},
				Health:    wantHealth,
				Metrics:   wantMetrics,
			},
		},
		Models: []Model{
			{Name: "llama-3.1-8b", UpstreamModel: "meta-llama/Llama-3.1-8B-Instruct", Backends: []string{"vllm-a"}, Queue: wantQueue, Routing: wantRouting},
			{Name: "demo", Backends: []string{"demo"}, ToolCalling: true, Queue: wantQueue, Routing: wantRouting},
		},
		Retries:       wantRetries,
		Reload:        Reload{Interval: 2 * time.Second},
		Store:         Store{Driver: "sqlite", Path: filepath.Join(dir, "tollgate.db")},
		Usage:         Usage{QueueSize: 65536, BatchSize: 512, FlushInterval: time.Second, DefaultProject: "inference", DefaultMaxTokens: 1024},
		LimitsBackend: LimitsBackend{Driver: "memory"},
		Limits: []Limit{
			{Team: "acme", RPM: 600, TPM: 100000, TokenBudget: 5000000, BudgetWindow: "month"},
		},
		Path: path,
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Load:\n got %+v\nwant %+v", cfg, want)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.HasPrefix(err.Error(), "read config: ") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load of a missing file: got %v, want read config: ... not exist", err)
	}
}

func TestParseLeavesPathEmpty(t *testing.T) {
	t.Setenv("TOLLGATE_DEV_KEY", "sk-from-the-environment")
	cfg, err := Parse([]byte(fullYAML), "inline")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if cfg.Path != "" {
		t.Errorf("Path = %q, want empty", cfg.Path)
	}
	if cfg.Store.Path != "tollgate.db" {
		t.Errorf("Store.Path = %q, want tollgate.db (relative to the working directory)", cfg.Store.Path)
	}
	if got := cfg.Auth.Keys[0].Key; got != "sk-from-the-environment" {
		t.Errorf("key = %q, want the value of TOLLGATE_DEV_KEY", got)
	}
}

func TestExpand(t *testing.T) {
	lookup := env(map[string]string{"SET": "value", "EMPTY": "", "DOLLAR": "a$b"})
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr string
	}{
		{name: "set", in: "${SET}", want: "value"},
		{name: "set with default", in: "${SET:-other}", want: "value"},
		{name: "unset with default", in: "${UNSET:-fallback}", want: "fallback"},
		{name: "unset with empty default", in: "${UNSET:-}", want: ""},
		{name: "empty with default", in: "${EMPTY:-fallback}", want: "fallback"},
		{name: "empty without default", in: "${EMPTY}", want: ""},
		{name: "embedded", in: "http://${SET}:8000/v1", want: "http://value:8000/v1"},
		{name: "several", in: "${SET}-${EMPTY}-${UNSET:-x}", want: "value--x"},
		{name: "escaped dollar", in: "$$", want: "$"},
		{name: "escaped reference", in: "$${SET}", want: "${SET}"},
		{name: "four dollars", in: "$$$$", want: "$$"},
		{name: "lone dollar", in: "pa$word", want: "pa$word"},
		{name: "trailing dollar", in: "cost$", want: "cost$"},
		{name: "shell form kept", in: "$SET", want: "$SET"},
		{name: "value not re-expanded", in: "${DOLLAR}", want: "a$b"},
		{name: "default is literal", in: "${UNSET:-a:-b}", want: "a:-b"},
		{name: "unset", in: "x${UNSET}", wantErr: "environment variable UNSET is not set"},
		{name: "unterminated", in: "${SET", wantErr: "unterminated"},
		{name: "empty name", in: "${}", wantErr: "unsupported reference"},
		{name: "bad name", in: "${1X}", wantErr: "unsupported reference \"${1X}\""},
		{name: "other operator", in: "${SET:=x}", wantErr: "unsupported reference"},
		{name: "dash without colon", in: "${SET-x}", wantErr: "unsupported reference"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := expand(tt.in, lookup)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("expand(%q) = %q, %v; want error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("expand(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParseExpandsEnvironment(t *testing.T) {
	const text = `auth:
  keys:
    - name: dev
      key: KEY_VALUE
backends:
  - name: demo
    simulated: {}
    api_key: API_KEY_VALUE
    weight: WEIGHT_VALUE
models:
  - name: demo
    backends: [demo]
`
	vars := map[string]string{
		"SET":     "sk-from-env",
		"EMPTY":   "",
		"NUMERIC": "12345678",
		"NULL":    "null",
		"TRUE":    "true",
		"TWO":     "2",
	}
	tests := []struct {
		name       string
		key        string
		apiKey     string
		weight     string
		wantKey    string
		wantAPIKey string
		wantWeight int
	}{
		{name: "set", key: "${SET}", wantKey: "sk-from-env"},
		{name: "unset with default", key: "${UNSET:-sk-default}", wantKey: "sk-default"},
		{name: "empty with default", key: "${EMPTY:-sk-default}", wantKey: "sk-default"},
		{name: "set but empty", key: "sk-literal", apiKey: "${EMPTY}", wantKey: "sk-literal", wantAPIKey: ""},
		{name: "escaped dollar", key: `"sk-$$x-$${SET}"`, wantKey: "sk-$x-${SET}"},
		{name: "lone dollar", key: "sk-pa$word", wantKey: "sk-pa$word"},
		{name: "quoted", key: `"${SET}"`, wantKey: "sk-from-env"},
		{name: "single quoted", key: `'${SET}'`, wantKey: "sk-from-env"},
		// An unquoted value is typed after expansion...
		{name: "integer from env", key: "sk-literal", weight: "${TWO}", wantKey: "sk-literal", wantWeight: 2},
		{name: "integer from default", key: "sk-literal", weight: "${UNSET:-3}", wantKey: "sk-literal", wantWeight: 3},
		{name: "empty integer is zero", key: "sk-literal", weight: "${EMPTY}", wantKey: "sk-literal", wantWeight: 0},
		// ...but a string field keeps the text, whatever it looks like.
		{name: "numeric string", key: "${NUMERIC}", wantKey: "12345678"},
		{name: "null string", key: "sk-literal", apiKey: "${NULL}", wantKey: "sk-literal", wantAPIKey: "null"},
		{name: "bool string", key: "sk-literal", apiKey: "${TRUE}", wantKey: "sk-literal", wantAPIKey: "true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			apiKey, weight := tt.apiKey, tt.weight
			if apiKey == "" {
				apiKey = "~"
			}
			if weight == "" {
				weight = "~"
			}
			text := strings.NewReplacer("API_KEY_VALUE", apiKey, "KEY_VALUE", tt.key, "WEIGHT_VALUE", weight).Replace(text)
			cfg, err := parse([]byte(text), "env.yaml", "", env(vars))
			if err != nil {
				t.Fatalf("parse:\n%s\nerror: %v", text, err)
			}
			b := cfg.Backends[0]
			if got := cfg.Auth.Keys[0].Key; got != tt.wantKey {
				t.Errorf("key = %q, want %q", got, tt.wantKey)
			}
			if b.APIKey != tt.wantAPIKey {
				t.Errorf("api_key = %q, want %q", b.APIKey, tt.wantAPIKey)
			}
			wantWeight := tt.wantWeight
			if wantWeight == 0 {
				wantWeight = defaultBackendWeight
			}
			if b.Weight != wantWeight {
				t.Errorf("weight = %d, want %d", b.Weight, wantWeight)
			}
		})
	}
}

func TestParseEnvironmentErrors(t *testing.T) {
	tests := []struct {
		name string
		add  string // appended to minimalYAML, from line 10
		want string
	}{
		{
			name: "unset without default",
			add:  "listen: \"${LISTEN_ADDR}\"\n",
			want: `env.yaml: line 10: listen: environment variable LISTEN_ADDR is not set`,
		},
		{
			name: "nested",
			add:  "store:\n  driver: postgres\n  dsn: ${PG_DSN}\n",
			want: `env.yaml: line 12: store.dsn: environment variable PG_DSN is not set`,
		},
		{
			name: "in a list",
			add:  "limits:\n  - team: ${TEAM}\n    rpm: 1\n",
			want: `env.yaml: line 11: limits[0].team: environment variable TEAM is not set`,
		},
		{
			name: "unterminated",
			add:  "listen: ${LISTEN_ADDR\n",
			want: `env.yaml: line 10: listen: unterminated "${LISTEN_ADDR"`,
		},
		{
			// Keys are never expanded, so this is an unknown key and not
			// an unset variable.
			name: "key not expanded",
			add:  "${LISTEN_KEY}: x\n",
			want: `env.yaml: line 10: unknown key "${LISTEN_KEY}"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse([]byte(minimalYAML+tt.add), "env.yaml", "", noEnv)
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("got error %v, want %q...", err, tt.want)
			}
		})
	}
}

func TestParseUsesProcessEnvironment(t *testing.T) {
	const name = "TOLLGATE_CONFIG_TEST_UNSET"
	// Setenv first so that the variable is restored after the test, then
	// unset it for the test.
	t.Setenv(name, "")
	if err := os.Unsetenv(name); err != nil {
		t.Fatal(err)
	}
	text := minimalYAML + "listen: ${" + name + "}\n"
	_, err := Parse([]byte(text), "proc.yaml")
	want := "proc.yaml: line 10: listen: environment variable " + name + " is not set"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("unset: got %v, want %q", err, want)
	}

	t.Setenv(name, "127.0.0.1:9999")
	cfg, err := Parse([]byte(text), "proc.yaml")
	if err != nil {
		t.Fatalf("set: %v", err)
	}
	if cfg.Listen != "127.0.0.1:9999" {
		t.Errorf("Listen = %q, want 127.0.0.1:9999", cfg.Listen)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		text string
		// want are substrings of the error message, each naming the
		// line, the path and the problem.
		want []string
	}{
		{
			name: "unknown top-level key",
			text: minimalYAML + "lisen: 127.0.0.1:8080\n",
			want: []string{`t.yaml: line 10: unknown key "lisen" (did you mean "listen"?)`},
		},
		{
			name: "unknown key in log",
			text: minimalYAML + "log:\n  level: info\n  colour: true\n",
			want: []string{`t.yaml: line 12: log: unknown key "colour"`},
		},
		{
			name: "unknown key in a model",
			text: minimalYAML + "  - name: other\n    bakends: [demo]\n",
			want: []string{`t.yaml: line 11: models[1]: unknown key "bakends" (did you mean "backends"?)`},
		},
		{
			name: "unknown key in backend timeouts",
			text: `auth:
  keys:
    - {name: dev, key: sk-test-0001}
backends:
  - name: demo
    simulated: {}
    timeouts:
      connect: 1s
      read: 5s
models:
  - {name: demo, backends: [demo]}
`,
			want: []string{`t.yaml: line 9: backends[0].timeouts: unknown key "read"`},
		},
		{
			name: "unknown key in a key",
			text: `auth:
  keys:
    - name: dev
      secret: sk-test-0001
backends:
  - {name: demo, simulated: {}}
models:
  - {name: demo, backends: [demo]}
`,
			want: []string{`t.yaml: line 4: auth.keys[0]: unknown key "secret"`},
		},
		{
			name: "unknown key in simulated",
			text: `auth: {keys: [{name: dev, key: sk-test-0001}]}
backends:
  - name: demo
    simulated: {delay: 1s}
models: [{name: demo, backends: [demo]}]
`,
			want: []string{`t.yaml: line 4: backends[0].simulated: unknown key "delay"`},
		},
		{
			name: "several problems are all reported",
			text: minimalYAML + "lisen: x\nlog: {levle: info}\n",
			want: []string{
				`t.yaml: line 10: unknown key "lisen"`,
				`t.yaml: line 11: log: unknown key "levle"`,
			},
		},
		{
			name: "duplicate key",
			text: minimalYAML + "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n",
			want: []string{`t.yaml: line 11: duplicate key "listen" (first at line 10)`},
		},
		{
			name: "integer",
			text: minimalYAML + "server:\n  max_messages: abc\n",
			want: []string{`t.yaml: line 11: server.max_messages: want an integer, got "abc"`},
		},
		{
			name: "fraction for an integer",
			text: minimalYAML + "server:\n  max_body_bytes: 1.5\n",
			want: []string{`t.yaml: line 11: server.max_body_bytes: want an integer, got "1.5"`},
		},
		{
			name: "float",
			text: minimalYAML + "    pricing: {prompt_per_mtok: cheap}\n",
			want: []string{`t.yaml: line 10: models[0].pricing.prompt_per_mtok: want a number, got "cheap"`},
		},
		{
			name: "bool",
			text: minimalYAML + "traces: {store_payloads: maybe}\n",
			want: []string{`t.yaml: line 10: traces.store_payloads: want true or false, got "maybe"`},
		},
		{
			name: "list where a mapping is wanted",
			text: minimalYAML + "log: [info]\n",
			want: []string{`t.yaml: line 10: log: want a mapping, got a list`},
		},
		{
			name: "scalar where a list is wanted",
			text: minimalYAML + "limits: none\n",
			want: []string{`t.yaml: line 10: limits: want a list, got "none"`},
		},
		{
			name: "mapping where a scalar is wanted",
			text: minimalYAML + "listen: {host: x}\n",
			want: []string{`t.yaml: line 10: listen: want a single value, got a mapping`},
		},
		{
			name: "syntax error",
			text: minimalYAML + "listen: [\n",
			want: []string{`t.yaml: yaml: line`},
		},
		{
			name: "two documents",
			text: minimalYAML + "---\nlisten: x\n",
			want: []string{`t.yaml: line 10: more than one YAML document`},
		},
		{
			name: "validation error gets the line of its field",
			text: minimalYAML + "  - name: other\n    backends: [demo, x]\n",
			want: []string{`t.yaml: line 11: models[1].backends[1]: no backend named "x"`},
		},
		{
			name: "validation error of an absent field gets its parent's line",
			text: minimalYAML + "store:\n  driver: postgres\n",
			want: []string{`t.yaml: line 10: store.dsn: required when driver is postgres`},
		},
		{
			name: "null simulated is no simulated",
			text: `auth: {keys: [{name: dev, key: sk-test-0001}]}
backends:
  - name: demo
    simulated:
models: [{name: demo, backends: [demo]}]
`,
			want: []string{`t.yaml: line 3: backends[0]: set one of url and simulated`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse([]byte(tt.text), "t.yaml", "", noEnv)
			if err == nil {
				t.Fatalf("parse:\n%s\ngot no error", tt.text)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error:\n%v\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

func TestParseEmpty(t *testing.T) {
	tests := []struct {
		name string
		text string
	}{
		{name: "empty", text: ""},
		{name: "blank lines", text: "\n\n  \n"},
		{name: "comments", text: "# tollgate\n# listen: 127.0.0.1:8080\n"},
		{name: "document start", text: "---\n# nothing\n"},
		{name: "null", text: "~\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse([]byte(tt.text), "empty.yaml", "", noEnv)
			if err == nil || err.Error() != "empty.yaml: empty configuration" {
				t.Fatalf("got %v, want empty.yaml: empty configuration", err)
			}
		})
	}
}

func TestParseDurations(t *testing.T) {
	tests := []struct {
		value   string
		want    time.Duration
		wantErr string
	}{
		{value: "5s", want: 5 * time.Second},
		{value: "250ms", want: 250 * time.Millisecond},
		{value: "1m30s", want: 90 * time.Second},
		{value: `"2h"`, want: 2 * time.Hour},
		{value: "5", wantErr: `d.yaml: line 10: usage.flush_interval: want a duration such as "5s" or "250ms", got "5"`},
		{value: "five", wantErr: `d.yaml: line 10: usage.flush_interval: want a duration such as "5s" or "250ms", got "five"`},
		{value: "1.5", wantErr: `got "1.5"`},
		{value: "-1s", wantErr: `d.yaml: line 10: usage.flush_interval: must be positive, got -1s`},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			text := minimalYAML + "usage: {flush_interval: " + tt.value + "}\n"
			cfg, err := parse([]byte(text), "d.yaml", "", noEnv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Usage.FlushInterval != tt.want {
				t.Errorf("flush_interval = %v, want %v", cfg.Usage.FlushInterval, tt.want)
			}
		})
	}
}

func TestParseSimulatedEmptyMapping(t *testing.T) {
	cfg, err := parse([]byte(minimalYAML), "m.yaml", "", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	sim := cfg.Backends[0].Simulated
	if sim == nil {
		t.Fatal("simulated: {} gave a nil *Simulated")
	}
	if !reflect.DeepEqual(*sim, Simulated{Tokens: defaultSimulatedTokens}) {
		t.Errorf("simulated = %+v, want only the default tokens", *sim)
	}
}

func TestParseSimulatedEngine(t *testing.T) {
	text := strings.Replace(minimalYAML, "simulated: {}", `simulated: {max_num_seqs: 8, prefill_per_token: 50us, kv_cache_blocks: 1536,
      block_size: 16, load_factor: 2, loras: [sql-lora], max_loras: 2, lora_load_time: 30ms}`, 1)
	cfg, err := parse([]byte(text), "m.yaml", "", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := Simulated{Tokens: defaultSimulatedTokens, MaxNumSeqs: 8, PrefillPerToken: 50 * time.Microsecond,
		KVCacheBlocks: 1536, BlockSize: 16, LoadFactor: 2, LoRAs: []string{"sql-lora"}, MaxLoRAs: 2,
		LoRALoadTime: 30 * time.Millisecond}
	if got := *cfg.Backends[0].Simulated; !reflect.DeepEqual(got, want) {
		t.Errorf("simulated = %+v, want %+v", got, want)
	}
}

func TestParseAnchorsAndMerge(t *testing.T) {
	text := `auth: {keys: [{name: dev, key: sk-test-0001}]}
backends:
  - name: a
    simulated: {}
    timeouts: &fast {connect: 1s, total: 1m}
  - name: b
    simulated: {}
    timeouts: *fast
  - name: c
    simulated: {}
    timeouts:
      <<: *fast
      total: 2m
models: [{name: demo, backends: [a, b, c]}]
`
	cfg, err := parse([]byte(text), "a.yaml", "", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []BackendTimeouts{
		{Connect: time.Second, FirstByte: defaultFirstByteTimeout, Idle: defaultIdleTimeout, Total: time.Minute},
		{Connect: time.Second, FirstByte: defaultFirstByteTimeout, Idle: defaultIdleTimeout, Total: time.Minute},
		{Connect: time.Second, FirstByte: defaultFirstByteTimeout, Idle: defaultIdleTimeout, Total: 2 * time.Minute},
	} {
		if got := cfg.Backends[i].Timeouts; got != want {
			t.Errorf("backends[%d].timeouts = %+v, want %+v", i, got, want)
		}
	}

	// A problem in an anchored mapping is reported once, where it is
	// defined, and not again at each alias or merge.
	bad := strings.Replace(text, "&fast {connect: 1s,", "&fast {conect: 1s,", 1)
	_, err = parse([]byte(bad), "a.yaml", "", noEnv)
	fe := requireFieldError(t, err, "backends[0].timeouts", `unknown key "conect"`)
	if fe.Line != 5 {
		t.Errorf("line = %d, want 5", fe.Line)
	}
	if n := len(fieldErrors(t, err)); n != 1 {
		t.Errorf("got %d errors, want 1:\n%v", n, err)
	}

	// Keys merged in are checked against the mapping they are merged into.
	bad = strings.Replace(text, "models: [{name: demo, backends: [a, b, c]}]", "models: [{name: demo, backends: [a], pricing: {<<: *fast}}]", 1)
	_, err = parse([]byte(bad), "a.yaml", "", noEnv)
	fe = requireFieldError(t, err, "models[0].pricing", `unknown key "connect"`)
	if fe.Line != 5 {
		t.Errorf("line = %d, want 5", fe.Line)
	}
}

func TestParseAliasBomb(t *testing.T) {
	// Each level doubles the work of a naive walk; the walk must check
	// each anchored node once.
	var b strings.Builder
	b.WriteString(minimalYAML)
	b.WriteString("limits:\n  - &l0 {team: a, rpm: 1}\n")
	b.WriteString("  - &l1 [*l0, *l0]\n")
	_, err := parse([]byte(b.String()), "bomb.yaml", "", noEnv)
	requireFieldError(t, err, "limits[1]", "want a mapping, got a list")
}

func TestProvisionDefaults(t *testing.T) {
	cfg := &Config{
		Auth:     Auth{Keys: []Key{{Name: "k", Key: "sk-test-0001"}}},
		Backends: []Backend{{Name: "u", URL: "http://u"}, {Name: "s", Simulated: &Simulated{}}},
		Models:   []Model{{Name: "m", Backends: []string{"u"}}},
		Limits:   []Limit{{RPM: 1}},
	}
	cfg.Provision()
	timeouts := BackendTimeouts{Connect: 5 * time.Second, FirstByte: 60 * time.Second, Idle: 60 * time.Second, Total: 10 * time.Minute}
	want := &Config{
		Listen: "127.0.0.1:8080",
		Log:    Log{Level: "info", Format: "json"},
		Auth:   Auth{Keys: []Key{{Name: "k", Key: "sk-test-0001", Teams: []string{"default"}, DefaultTeam: "default"}}},
		Server: Server{
			MaxBodyBytes:        4 << 20,
			MaxHeaderBytes:      16 << 10,
			MaxMessages:         2048,
			MaxJSONDepth:        64,
			ReadTimeout:         30 * time.Second,
			IdleTimeout:         120 * time.Second,
			WriteTimeout:        60 * time.Second,
			MaxConnections:      provisionedConns.proxy,
			AdminMaxConnections: provisionedConns.admin,
			MaxStreams:          10000,
			ShutdownTimeout:     30 * time.Second,
			MaxStopStrings:      64,
			MaxLogitBias:        300000,
			MaxResponseBytes:    64 << 20,
			MaxEventBytes:       1 << 20,
			BackgroundTeamShare: 25,
			MetricsAuth:         "key",
		},
		Backends: []Backend{
			{Name: "u", URL: "http://u", Weight: 1, MaxConns: 1024, Timeouts: timeouts, Health: wantHealth, Metrics: wantMetrics},
			{Name: "s", Simulated: &Simulated{Tokens: 16}, Weight: 1, MaxConns: 1024, Timeouts: timeouts, Health: wantHealth, Metrics: wantMetrics},
		},
		Models:        []Model{{Name: "m", Backends: []string{"u"}, Queue: wantQueue, Routing: wantRouting}},
		Retries:       wantRetries,
		Reload:        Reload{Interval: 2 * time.Second},
		Store:         Store{Driver: "sqlite", Path: "tollgate.db"},
		Usage:         Usage{QueueSize: 65536, BatchSize: 512, FlushInterval: time.Second, DefaultProject: "inference", DefaultMaxTokens: 1024},
		LimitsBackend: LimitsBackend{Driver: "memory"},
		Limits:        []Limit{{RPM: 1, BudgetWindow: "month"}},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Provision:\n got %+v\nwant %+v", cfg, want)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate after Provision: %v", err)
	}
}

func TestProvisionKeepsSetValues(t *testing.T) {
	cfg := &Config{
		Listen:   "0.0.0.0:9",
		Log:      Log{Level: "debug", Format: "console"},
		Auth:     Auth{Keys: []Key{{DefaultTeam: "acme"}, {Teams: []string{"x"}}}},
		Backends: []Backend{{Weight: 3, MaxConns: 7, Timeouts: BackendTimeouts{Connect: time.Second}, Simulated: &Simulated{Tokens: 2}}},
		Server:   Server{MaxStopStrings: 4, MaxLogitBias: 10},
		Store:    Store{Driver: "postgres"},
		Usage:    Usage{BatchSize: 9, DefaultProject: "p"},
		Limits:   []Limit{{BudgetWindow: "day"}},
	}
	cfg.Provision()
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", cfg.Listen, "0.0.0.0:9"},
		{"log", cfg.Log, Log{Level: "debug", Format: "console"}},
		{"key teams from default team", cfg.Auth.Keys[0].Teams, []string{"acme"}},
		{"key default team with teams", cfg.Auth.Keys[1].DefaultTeam, "default"},
		{"key teams kept", cfg.Auth.Keys[1].Teams, []string{"x"}},
		{"weight", cfg.Backends[0].Weight, 3},
		{"max conns", cfg.Backends[0].MaxConns, 7},
		{"connect", cfg.Backends[0].Timeouts.Connect, time.Second},
		{"tokens", cfg.Backends[0].Simulated.Tokens, 2},
		{"postgres has no path", cfg.Store, Store{Driver: "postgres"}},
		{"batch size", cfg.Usage.BatchSize, 9},
		{"project", cfg.Usage.DefaultProject, "p"},
		{"window", cfg.Limits[0].BudgetWindow, "day"},
		{"max stop strings", cfg.Server.MaxStopStrings, 4},
		{"max logit bias", cfg.Server.MaxLogitBias, 10},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Errorf("got %v, want %v", c.got, c.want)
			}
		})
	}
}

func TestProvisionStorePath(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		configPath string
		storePath  string
		want       string
	}{
		{name: "no config file", want: "tollgate.db"},
		{name: "no config file, relative", storePath: "data/x.db", want: "data/x.db"},
		{name: "default beside the file", configPath: "/etc/tollgate/tollgate.yaml", want: "/etc/tollgate/tollgate.db"},
		{name: "relative beside the file", configPath: "/etc/tollgate/tollgate.yaml", storePath: "data/x.db", want: "/etc/tollgate/data/x.db"},
		{name: "parent of the file", configPath: "/etc/tollgate/tollgate.yaml", storePath: "../x.db", want: "/etc/x.db"},
		{name: "absolute kept", configPath: "/etc/tollgate/tollgate.yaml", storePath: "/var/lib/x.db", want: "/var/lib/x.db"},
		{name: "in-memory kept", configPath: "/etc/tollgate/tollgate.yaml", storePath: ":memory:", want: ":memory:"},
		{name: "relative config file", configPath: "conf/tollgate.yaml", want: filepath.Join(wd, "conf", "tollgate.db")},
		{name: "bare config file name", configPath: "tollgate.yaml", storePath: "x.db", want: filepath.Join(wd, "x.db")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &Config{Path: tt.configPath, Store: Store{Path: tt.storePath}}
			cfg.Provision()
			if cfg.Store.Path != tt.want {
				t.Fatalf("store path = %q, want %q", cfg.Store.Path, tt.want)
			}
			// A second Provision must not resolve the path again.
			cfg.Provision()
			if cfg.Store.Path != tt.want {
				t.Fatalf("store path after a second Provision = %q, want %q", cfg.Store.Path, tt.want)
			}
		})
	}
}

func TestLoadResolvesStorePathBesideFile(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "etc")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(sub, "tollgate.yaml")
	text := minimalYAML + "store: {path: data/usage.db}\n"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(sub, "data", "usage.db"); cfg.Store.Path != want {
		t.Errorf("store path = %q, want %q", cfg.Store.Path, want)
	}
}

// validConfig returns a fresh, valid, provisioned Config that the
// validation tests break one rule at a time.
func validConfig(t *testing.T) *Config {
	t.Helper()
	cfg, err := parse([]byte(fullYAML), "valid.yaml", "", noEnv)
	if err != nil {
		t.Fatalf("parse valid config: %v", err)
	}
	cfg.Auth.Keys = append(cfg.Auth.Keys, Key{Name: "ci", KeySHA256: strings.Repeat("ab", 32), Teams: []string{"ci"}, DefaultTeam: "ci"})
	cfg.Provision()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	return cfg
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		path   string
		msg    string
	}{
		{"listen without port", func(c *Config) { c.Listen = "localhost" }, "listen", `want host:port`},
		{"listen with empty port", func(c *Config) { c.Listen = "localhost:" }, "listen", `want host:port`},
		{"admin listen", func(c *Config) { c.AdminListen = "9090" }, "admin_listen", `want host:port`},
		{"admin listen same as listen", func(c *Config) { c.AdminListen = c.Listen }, "admin_listen", "must differ from listen"},
		{"log level", func(c *Config) { c.Log.Level = "verbose" }, "log.level", `got "verbose"`},
		{"log format", func(c *Config) { c.Log.Format = "text" }, "log.format", `want one of "json", "console", got "text"`},

		{"no keys", func(c *Config) { c.Auth.Keys = nil }, "auth.keys", "at least one key is required"},
		{"key without name", func(c *Config) { c.Auth.Keys[1].Name = "" }, "auth.keys[1].name", "required"},
		{"duplicate key name", func(c *Config) { c.Auth.Keys[1].Name = "dev" }, "auth.keys[1].name", `duplicate name "dev" (also auth.keys[0])`},
		{"neither key nor digest", func(c *Config) { c.Auth.Keys[0].Key = "" }, "auth.keys[0]", "set one of key and key_sha256"},
		{"key and digest", func(c *Config) { c.Auth.Keys[1].Key = "sk-test-0002" }, "auth.keys[1]", "set only one of key and key_sha256"},
		{"short key", func(c *Config) { c.Auth.Keys[0].Key = "sk-1234" }, "auth.keys[0].key", "must be at least 8 characters"},
		{"digest not hex", func(c *Config) { c.Auth.Keys[1].KeySHA256 = strings.Repeat("zz", 32) }, "auth.keys[1].key_sha256", "want 64 hex characters"},
		{"digest too short", func(c *Config) { c.Auth.Keys[1].KeySHA256 = "abcd" }, "auth.keys[1].key_sha256", "want 64 hex characters"},
		{"same secret twice", func(c *Config) {
			// Key dev's secret, given again as a digest.
			sum := sha256.Sum256([]byte("sk-tollgate-demo"))
			c.Auth.Keys[1].KeySHA256 = hex.EncodeToString(sum[:])
		}, "auth.keys[1]", "same secret as auth.keys[0]"},
		{"invalid team", func(c *Config) { c.Auth.Keys[1].Teams = []string{"ci", "a b"} }, "auth.keys[1].teams[1]", `invalid name "a b"`},
		{"empty team", func(c *Config) { c.Auth.Keys[1].Teams = []string{""} }, "auth.keys[1].teams[0]", `invalid name ""`},
		{"invalid default team", func(c *Config) { c.Auth.Keys[0].DefaultTeam = "a/b" }, "auth.keys[0].default_team", `invalid name "a/b"`},
		{"default team not allowed", func(c *Config) { c.Auth.Keys[1].DefaultTeam = "other" }, "auth.keys[1].default_team", `team "other" is not in teams`},

		{"no backends", func(c *Config) { c.Backends = nil }, "backends", "at least one backend is required"},
		{"backend without name", func(c *Config) { c.Backends[1].Name = "" }, "backends[1].name", "required"},
		{"duplicate backend name", func(c *Config) { c.Backends[1].Name = "vllm-a" }, "backends[1].name", `duplicate name "vllm-a" (also backends[0])`},
		{"neither url nor simulated", func(c *Config) { c.Backends[1].Simulated = nil }, "backends[1]", "set one of url and simulated"},
		{"url and simulated", func(c *Config) { c.Backends[0].Simulated = &Simulated{Tokens: 1} }, "backends[0]", "set only one of url and simulated"},
		{"url scheme", func(c *Config) { c.Backends[0].URL = "ftp://h/v1" }, "backends[0].url", "want an http or https URL"},
		{"url without scheme", func(c *Config) { c.Backends[0].URL = "10.0.0.5:8000/v1" }, "backends[0].url", ""},
		{"url without host", func(c *Config) { c.Backends[0].URL = "http:///v1" }, "backends[0].url", "want a host"},
		{"url with query", func(c *Config) { c.Backends[0].URL = "http://h/v1?x=1" }, "backends[0].url", "must not have a query"},
		{"url with fragment", func(c *Config) { c.Backends[0].URL = "http://h/v1#x" }, "backends[0].url", "must not have a fragment"},
		{"url unparsable", func(c *Config) { c.Backends[0].URL = "http://h:port/v1" }, "backends[0].url", "invalid URL"},
		{"url password not shown", func(c *Config) { c.Backends[0].URL = "ftp://u:hunter2@h/v1" }, "backends[0].url", `"ftp://u:xxxxx@h/v1"`},
		{"negative weight", func(c *Config) { c.Backends[0].Weight = -1 }, "backends[0].weight", "must not be negative"},
		{"negative max concurrency", func(c *Config) { c.Backends[0].MaxConcurrency = -1 }, "backends[0].max_concurrency", "must not be negative"},
		{"negative max conns", func(c *Config) { c.Backends[0].MaxConns = -1 }, "backends[0].max_conns", "must be positive"},
		{"negative connect timeout", func(c *Config) { c.Backends[0].Timeouts.Connect = -time.Second }, "backends[0].timeouts.connect", "must be positive, got -1s"},
		{"negative first byte timeout", func(c *Config) { c.Backends[0].Timeouts.FirstByte = -1 }, "backends[0].timeouts.first_byte", "must be positive"},
		{"negative idle timeout", func(c *Config) { c.Backends[0].Timeouts.Idle = -1 }, "backends[0].timeouts.idle", "must be positive"},
		{"background share over 100", func(c *Config) { c.Server.BackgroundTeamShare = 101 }, "server.background_team_share", "must be a percentage from 1 to 100, got 101"},
		{"negative background share", func(c *Config) { c.Server.BackgroundTeamShare = -5 }, "server.background_team_share", "got -5"},
		{"negative total timeout", func(c *Config) { c.Backends[0].Timeouts.Total = -1 }, "backends[0].timeouts.total", "must be positive"},
		{"negative simulated delay", func(c *Config) { c.Backends[1].Simulated.InterTokenDelay = -1 }, "backends[1].simulated.inter_token", "must not be negative"},
		{"negative simulated tokens", func(c *Config) { c.Backends[1].Simulated.Tokens = -1 }, "backends[1].simulated.tokens", "must be positive"},
		{"negative simulated max_num_seqs", func(c *Config) { c.Backends[1].Simulated.MaxNumSeqs = -1 }, "backends[1].simulated.max_num_seqs", "must not be negative"},
		{"negative simulated prefill", func(c *Config) { c.Backends[1].Simulated.PrefillPerToken = -1 }, "backends[1].simulated.prefill_per_token", "must not be negative"},
		{"negative simulated kv blocks", func(c *Config) { c.Backends[1].Simulated.KVCacheBlocks = -1 }, "backends[1].simulated.kv_cache_blocks", "must not be negative"},
		{"simulated load factor below 1", func(c *Config) { c.Backends[1].Simulated.LoadFactor = 0.5 }, "backends[1].simulated.load_factor", "must be 0 or at least 1"},
		{"empty simulated adapter", func(c *Config) { c.Backends[1].Simulated.LoRAs = []string{"a", ""} }, "backends[1].simulated.loras[1]", "must not be empty"},
		{"negative simulated lora load", func(c *Config) { c.Backends[1].Simulated.LoRALoadTime = -1 }, "backends[1].simulated.lora_load_time", "must not be negative"},

		{"no models", func(c *Config) { c.Models = nil }, "models", "at least one model is required"},
		{"model without name", func(c *Config) { c.Models[1].Name = "" }, "models[1].name", "required"},
		{"duplicate model name", func(c *Config) { c.Models[1].Name = "llama-3.1-8b" }, "models[1].name", `duplicate name "llama-3.1-8b" (also models[0])`},
		{"model without backends", func(c *Config) { c.Models[1].Backends = nil }, "models[1].backends", "at least one backend is required"},
		{"unknown backend", func(c *Config) { c.Models[0].Backends = []string{"vllm-a", "x"} }, "models[0].backends[1]", `no backend named "x"`},
		{"backend listed twice", func(c *Config) { c.Models[0].Backends = []string{"vllm-a", "demo", "vllm-a"} }, "models[0].backends[2]", `backend "vllm-a" is listed twice (also models[0].backends[0])`},
		{"negative price", func(c *Config) { c.Models[0].Pricing.PromptPerMTok = -1 }, "models[0].pricing.prompt_per_mtok", "want a number >= 0"},
		{"NaN price", func(c *Config) { c.Models[0].Pricing.CompletionPerMTok = math.NaN() }, "models[0].pricing.completion_per_mtok", "want a number >= 0"},
		{"infinite price", func(c *Config) { c.Models[0].Pricing.CachedPromptPerMTok = math.Inf(1) }, "models[0].pricing.cached_prompt_per_mtok", "want a number >= 0"},

		{"store driver", func(c *Config) { c.Store.Driver = "mysql" }, "store.driver", `want "sqlite" or "postgres", got "mysql"`},
		{"postgres without dsn", func(c *Config) { c.Store = Store{Driver: "postgres"} }, "store.dsn", "required when driver is postgres"},
		{"sqlite without path", func(c *Config) { c.Store.Path = "" }, "store.path", "required"},

		{"queue size", func(c *Config) { c.Usage.QueueSize = -1 }, "usage.queue_size", "must be positive"},
		{"queue reserve", func(c *Config) { c.Models[0].Queue.Reserve = -2 }, "models[0].queue.reserve", "must be -1 (none), 0 (a quarter of the slots)"},
		{"batch size", func(c *Config) { c.Usage.BatchSize = 0 }, "usage.batch_size", "must be positive"},
		{"flush interval", func(c *Config) { c.Usage.FlushInterval = 0 }, "usage.flush_interval", "must be positive"},
		{"default max tokens", func(c *Config) { c.Usage.DefaultMaxTokens = -5 }, "usage.default_max_tokens", "must be positive"},
		{"default project", func(c *Config) { c.Usage.DefaultProject = "my project" }, "usage.default_project", `invalid name "my project"`},

		{"budget window", func(c *Config) { c.Limits[0].BudgetWindow = "week" }, "limits[0].budget_window", `want one of "day", "month", got "week"`},
		{"fallback unknown", func(c *Config) { c.Models[0].Fallbacks = []string{"nope"} }, "models[0].fallbacks[0]", `no model named "nope"`},
		{"fallback to itself", func(c *Config) { c.Models[0].Fallbacks = []string{c.Models[0].Name} }, "models[0].fallbacks[0]", "cannot fall back to itself"},
		{"affinity", func(c *Config) { c.Models[0].Affinity = "session" }, "models[0].affinity", `got "session"`},
		{"health path", func(c *Config) { c.Backends[0].Health.Path = "models" }, "backends[0].health.path", "starting with /"},
		{"max cooldown below cooldown", func(c *Config) { c.Backends[0].Health.MaxCooldown = time.Second }, "backends[0].health.max_cooldown", "must be at least cooldown"},
		{"retry budget ratio", func(c *Config) { c.Retries.BudgetRatio = 1.5 }, "retries.budget_ratio", "fraction"},
		{"limits backend driver", func(c *Config) { c.LimitsBackend.Driver = "etcd" }, "limits_backend.driver", `got "etcd"`},
		{"limits backend addr", func(c *Config) {
			c.LimitsBackend = LimitsBackend{Driver: "redis", Addr: "nohost", Timeout: time.Second}
		}, "limits_backend.addr", ""},
		{"negative rpm", func(c *Config) { c.Limits[0].RPM = -1 }, "limits[0].rpm", "must not be negative"},
		{"negative tpm", func(c *Config) { c.Limits[0].TPM = -1 }, "limits[0].tpm", "must not be negative"},
		{"negative budget", func(c *Config) { c.Limits[0].TokenBudget = -1 }, "limits[0].token_budget", "must not be negative"},
		{"nothing limited", func(c *Config) { c.Limits[0] = Limit{Team: "acme", BudgetWindow: "day"} }, "limits[0]", "set at least one of rpm, tpm and token_budget"},
		{"team selector", func(c *Config) { c.Limits[0].Team = "a b" }, "limits[0].team", `invalid name "a b"`},
		{"project selector", func(c *Config) { c.Limits[0].Project = "**" }, "limits[0].project", `invalid name "**"`},
		{"unknown key selector", func(c *Config) { c.Limits[0].Key = "nobody" }, "limits[0].key", `no key named "nobody"`},
		{"invalid key selector", func(c *Config) { c.Limits[0].Key = "no body" }, "limits[0].key", `invalid name "no body"`},

		{"max body bytes", func(c *Config) { c.Server.MaxBodyBytes = -1 }, "server.max_body_bytes", "must be positive"},
		{"max header bytes", func(c *Config) { c.Server.MaxHeaderBytes = 0 }, "server.max_header_bytes", "must be positive"},
		{"max messages", func(c *Config) { c.Server.MaxMessages = 0 }, "server.max_messages", "must be positive"},
		{"max json depth", func(c *Config) { c.Server.MaxJSONDepth = 0 }, "server.max_json_depth", "must be positive"},
		{"read timeout", func(c *Config) { c.Server.ReadTimeout = 0 }, "server.read_timeout", "must be positive"},
		{"idle timeout", func(c *Config) { c.Server.IdleTimeout = 0 }, "server.idle_timeout", "must be positive"},
		{"max connections", func(c *Config) { c.Server.MaxConnections = 0 }, "server.max_connections", "must be positive"},
		{"admin max connections", func(c *Config) { c.Server.AdminMaxConnections = -1 }, "server.admin_max_connections", "must be positive, got -1"},
		{"write timeout", func(c *Config) { c.Server.WriteTimeout = -time.Second }, "server.write_timeout", "must be positive, got -1s"},
		{"shutdown timeout", func(c *Config) { c.Server.ShutdownTimeout = -time.Second }, "server.shutdown_timeout", "must be positive, got -1s"},
		{"max stop strings", func(c *Config) { c.Server.MaxStopStrings = -1 }, "server.max_stop_strings", "must be positive, got -1"},
		{"max logit bias", func(c *Config) { c.Server.MaxLogitBias = 0 }, "server.max_logit_bias", "must be positive, got 0"},
		{"metrics auth", func(c *Config) { c.Server.MetricsAuth = "none" }, "server.metrics_auth", `want one of "key", "public", got "none"`},
		{"short metrics token", func(c *Config) { c.Server.MetricsToken = "short" }, "server.metrics_token", "must be at least 8 characters"},
		{"public metrics with a token", func(c *Config) {
			c.Server.MetricsAuth, c.Server.MetricsToken = "public", "metrics-token-1"
		}, "server.metrics_token", "takes no token"},
		{"public metrics requiring admin", func(c *Config) {
			c.Server.MetricsAuth, c.Server.MetricsRequireAdmin = "public", true
		}, "server.metrics_require_admin", "cannot require an admin key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig(t)
			tt.mutate(cfg)
			err := cfg.Validate()
			fe := requireFieldError(t, err, tt.path, tt.msg)
			if !strings.HasPrefix(fe.Error(), tt.path+": ") {
				t.Errorf("message %q does not start with its path %q", fe.Error(), tt.path)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
	}{
		{"admin listen", func(c *Config) { c.AdminListen = "127.0.0.1:9090" }},
		{"listen on all interfaces", func(c *Config) { c.Listen = ":8080" }},
		{"https url without path", func(c *Config) { c.Backends[0].URL = "https://api.example.com" }},
		{"upper-case digest", func(c *Config) { c.Auth.Keys[1].KeySHA256 = strings.Repeat("AB", 32) }},
		{"any team allows any default", func(c *Config) { c.Auth.Keys[0].DefaultTeam = "anything" }},
		{"star selectors", func(c *Config) { c.Limits[0] = Limit{Team: "*", Project: "*", Key: "*", TPM: 1, BudgetWindow: "day"} }},
		{"key selector", func(c *Config) { c.Limits[0].Key = "ci" }},
		{"key selector naming an unusual key", func(c *Config) {
			c.Auth.Keys[1].Name = "ci runner"
			c.Limits[0].Key = "ci runner"
		}},
		{"postgres", func(c *Config) { c.Store = Store{Driver: "postgres", DSN: "postgres://localhost/tollgate"} }},
		{"zero max concurrency", func(c *Config) { c.Backends[0].MaxConcurrency = 0 }},
		{"free model", func(c *Config) { c.Models[0].Pricing = Pricing{} }},
		{"public metrics", func(c *Config) { c.Server.MetricsAuth = "public" }},
		{"metrics token", func(c *Config) { c.Server.MetricsToken = "metrics-token-1" }},
		{"metrics_require_admin as before", func(c *Config) { c.Server.MetricsRequireAdmin = true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig(t)
			tt.change(cfg)
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	cfg := validConfig(t)
	cfg.Listen = "nope"
	cfg.Log.Level = "loud"
	cfg.Models[1].Backends = []string{"gone"}
	errs := fieldErrors(t, cfg.Validate())
	var paths []string
	for _, fe := range errs {
		paths = append(paths, fe.Path)
	}
	want := []string{"listen", "log.level", "models[1].backends[0]"}
	if !reflect.DeepEqual(paths, want) {
		t.Errorf("paths = %q, want %q", paths, want)
	}
}

func TestValidName(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"acme", true},
		{"Team_1.prod-eu", true},
		{"a", true},
		{strings.Repeat("x", 128), true},
		{"", false},
		{strings.Repeat("x", 129), false},
		{"a b", false},
		{"a/b", false},
		{"*", false},
		{"équipe", false},
		{"a\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := ValidName(tt.in); got != tt.want {
				t.Errorf("ValidName(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestFieldErrorString(t *testing.T) {
	problem := errors.New("bad")
	tests := []struct {
		name string
		err  *FieldError
		want string
	}{
		{"all", &FieldError{File: "t.yaml", Line: 3, Path: "log.level", Err: problem}, "t.yaml: line 3: log.level: bad"},
		{"no file", &FieldError{Line: 3, Path: "log.level", Err: problem}, "line 3: log.level: bad"},
		{"no line", &FieldError{File: "t.yaml", Path: "auth.keys", Err: problem}, "t.yaml: auth.keys: bad"},
		{"path only", &FieldError{Path: "auth.keys", Err: problem}, "auth.keys: bad"},
		{"no path", &FieldError{Line: 3, Err: problem}, "line 3: bad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
			if !errors.Is(tt.err, problem) {
				t.Error("FieldError does not unwrap to its problem")
			}
		})
	}
}

// The defaults Provision gives routing settings.
var (
	wantHealth = Health{Path: "/models", Interval: 10 * time.Second, Timeout: 3 * time.Second,
		FailuresToEject: 3, Cooldown: 5 * time.Second, MaxCooldown: 2 * time.Minute}
	wantQueue   = Queue{Depth: 128, Wait: 5 * time.Second}
	wantMetrics = BackendMetrics{Path: "/metrics", Interval: 250 * time.Millisecond, Timeout: time.Second, StaleAfter: time.Second}
	wantRouting = Routing{QueueCostTokens: 2048}
	wantRetries = Retries{Attempts: 3, Backoff: 25 * time.Millisecond, MaxBackoff: time.Second, BudgetRatio: 0.2, BudgetMin: 10}
)

// provisionedConns are the connection caps Provision gives this process,
// whose open-file limit depends on where the tests run.
var provisionedConns = func() (c struct{ proxy, admin int }) {
	c.proxy, c.admin = connectionDefaults(OpenFileLimit())
	return c
}()

// TestConnectionDefaults checks the caps derived from the open-file
// limit: with both listeners full, the reserve and upstream connections
// still have their descriptors.
func TestConnectionDefaults(t *testing.T) {
	tests := []struct {
		nofile       uint64
		proxy, admin int
	}{
		{0, 20000, 2500},       // unknown: the maxima
		{64, 21, 3},            // reserve 16, clients 24
		{128, 42, 6},           // reserve 32, clients 48
		{1024, 336, 48},        // reserve 256, clients 384
		{20000, 8638, 1234},    // reserve 256, clients 9872
		{1 << 20, 20000, 2500}, // capped
		{1<<63 - 1, 20000, 2500},
		{4, 1, 1},
	}
	for _, tt := range tests {
		t.Run(strconv.FormatUint(tt.nofile, 10), func(t *testing.T) {
			proxy, admin := connectionDefaults(tt.nofile)
			if proxy != tt.proxy || admin != tt.admin {
				t.Fatalf("connectionDefaults(%d) = %d, %d; want %d, %d", tt.nofile, proxy, admin, tt.proxy, tt.admin)
			}
			if tt.nofile > 8 && tt.nofile < 1<<20 && uint64(2*(proxy+admin)+min(256, int(tt.nofile/4))) > tt.nofile {
				t.Fatalf("nofile %d: caps %d + %d leave too little for upstream connections and the reserve", tt.nofile, proxy, admin)
			}
		})
	}
}
