// Package config loads, expands and validates tollgate's YAML configuration.
//
// It imports nothing of the rest of the project: every other package reads
// these plain types. Loading is three steps, in the style of Caddy's modules:
// parse strictly (unknown keys are errors), Provision (fill defaults), then
// Validate (refuse bad values, each error naming its path).
package config

import "time"

// Config is the whole gateway configuration, as written in one YAML file.
type Config struct {
	// Listen is the address of the client-facing listener. Zero means
	// "127.0.0.1:8080".
	Listen string `yaml:"listen"`
	// AdminListen, when set, serves the service API, the usage API and
	// /metrics on a separate address. Zero means they share Listen.
	AdminListen string `yaml:"admin_listen"`

	Log      Log       `yaml:"log"`
	Auth     Auth      `yaml:"auth"`
	Server   Server    `yaml:"server"`
	Backends []Backend `yaml:"backends"`
	Models   []Model   `yaml:"models"`
	Store    Store     `yaml:"store"`
	Usage    Usage     `yaml:"usage"`
	Limits   []Limit   `yaml:"limits"`
	// LimitsBackend says where limit and budget counters live.
	LimitsBackend LimitsBackend `yaml:"limits_backend"`
	Traces        Traces        `yaml:"traces"`
	// Retries govern trying another backend when one fails.
	Retries Retries `yaml:"retries"`
	// Reload governs picking up configuration changes without a restart.
	Reload Reload `yaml:"reload"`
	// Metrics bounds the label values of the Prometheus series.
	Metrics Metrics `yaml:"metrics"`
	// Telemetry exports an OpenTelemetry span for every request routed by
	// model.
	Telemetry Telemetry `yaml:"telemetry"`

	// Path is the file the configuration was loaded from; empty when it
	// came from the embedded default. It is not read from YAML.
	Path string `yaml:"-"`
}

// Log configures the zap logger.
type Log struct {
	// Level is debug, info, warn or error. Zero means info.
	Level string `yaml:"level"`
	// Format is json or console. Zero means json.
	Format string `yaml:"format"`
}

// Auth lists the API keys clients present as "Authorization: Bearer <key>".
type Auth struct {
	Keys []Key `yaml:"keys"`
}

// Key is one client API key. Exactly one of Key and KeySHA256 is set.
type Key struct {
	// Name identifies the key in logs and usage records; it is never secret.
	Name string `yaml:"name"`
	// Key is the secret itself, usually "${SOME_ENV_VAR}".
	Key string `yaml:"key"`
	// KeySHA256 is the hex SHA-256 of the secret (64 characters, as
	// sha256sum prints it; upper case is accepted too), so that the file
	// holds no secret at all.
	KeySHA256 string `yaml:"key_sha256"`
	// Teams the key may charge and read. "*" means any team. Zero means
	// only DefaultTeam.
	Teams []string `yaml:"teams"`
	// DefaultTeam is charged when a request names no team. Zero means
	// "default".
	DefaultTeam string `yaml:"default_team"`
	// Admin keys may use the service and usage APIs for every team.
	Admin bool `yaml:"admin"`
}

// Server holds the client-facing listener's limits and timeouts.
type Server struct {
	// MaxBodyBytes caps a request body. Zero means 4 MiB.
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// MaxHeaderBytes caps the request header block. Zero means 16 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxMessages caps the number of chat messages, and of Responses API
	// input items. Zero means 2048.
	MaxMessages int `yaml:"max_messages"`
	// MaxJSONDepth caps nesting depth of a request body. Zero means 64.
	MaxJSONDepth int `yaml:"max_json_depth"`
	// ReadTimeout bounds reading one request (headers and body), against
	// slow clients. Zero means 30s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// IdleTimeout closes keep-alive connections idle this long. Zero means 120s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// WriteTimeout bounds each write to a client: a whole reply, or one
	// write of a stream. A client that stops reading has its connection
	// closed once a write has waited this long. Zero means 60s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// MaxConnections caps concurrent client connections on listen. Zero
	// means a share of the open-file limit (RLIMIT_NOFILE) the process
	// starts with, at most 20000: a reserve of a quarter of the limit (at
	// most 256) is kept for the store, logs, trace files and the runtime;
	// half of the rest for upstream connections, one per request in
	// flight; and of the other half, seven eighths here and one eighth
	// for admin_listen. Connections beyond the cap are answered 503 and
	// closed.
	MaxConnections int `yaml:"max_connections"`
	// AdminMaxConnections caps concurrent connections on admin_listen.
	// Zero means the open-file limit's share described at
	// max_connections, at most 2500.
	AdminMaxConnections int `yaml:"admin_max_connections"`
	// MaxStreams caps concurrent streamed completions; past it a stream
	// request gets a 503 with Retry-After. Zero means 10000.
	MaxStreams int `yaml:"max_streams"`
	// MetricsAuth says who may read /metrics, whose series name every
	// team's token counts: "key" answers an admin key or MetricsToken,
	// anything else gets a 401 (no key) or 403 (another key); "public"
	// answers anyone who reaches the listener, for a private scrape network
	// or admin_listen on a private address. Zero means "key".
	MetricsAuth string `yaml:"metrics_auth"`
	// MetricsToken is a bearer token that reads /metrics and nothing else,
	// so that Prometheus needs no admin key (authorization.credentials_file
	// in its scrape config); usually "${TOLLGATE_METRICS_TOKEN}", at least 8
	// characters. Zero means only admin keys read /metrics.
	MetricsToken string `yaml:"metrics_token"`
	// MetricsRequireAdmin is what /metrics now does by default (see
	// MetricsAuth); it is kept so that files naming it still load, and may
	// not be true beside metrics_auth: public. Zero changes nothing.
	MetricsRequireAdmin bool `yaml:"metrics_require_admin"`
	// ShutdownTimeout is how long in-flight requests and streams may run
	// after SIGINT/SIGTERM. Zero means 30s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MaxStopStrings caps the strings in a request's "stop"; more get a
	// 400. OpenAI accepts 4 and vLLM sets no cap. Zero means 64, more than
	// any client sends.
	MaxStopStrings int `yaml:"max_stop_strings"`
	// MaxLogitBias caps the entries of a request's "logit_bias"; more get
	// a 400. Zero means 300000, above the largest vocabularies of current
	// models (about 262,000 tokens), so biasing every token still passes.
	MaxLogitBias int `yaml:"max_logit_bias"`
	// MaxResponseBytes caps a non-streamed upstream reply body: past it
	// the gateway stops reading, closes the upstream connection and
	// answers 502. Zero means 64 MiB: far above any chat completion, and
	// room for an embeddings batch of 2,048 inputs of 3,072 dimensions in
	// base64 (about 33 MiB).
	MaxResponseBytes int `yaml:"max_response_bytes"`
	// MaxEventBytes caps one upstream SSE event: past it the stream ends
	// with an in-band error and the upstream connection is closed. Zero
	// means 1 MiB; a streamed chunk is a few hundred bytes.
	MaxEventBytes int `yaml:"max_event_bytes"`
	// BackgroundTeamShare is the percentage of the gateway's background
	// response slots (responses made with "background": true whose usage
	// it still waits for) that one team may hold at once; past it the
	// team's next background request gets a 429 with Retry-After while
	// other teams still get slots. At least one slot is always allowed.
	// Zero means 25; 100 lets one team take every slot.
	BackgroundTeamShare int `yaml:"background_team_share"`
}

// The values of server.metrics_auth.
const (
	MetricsAuthKey    = "key"
	MetricsAuthPublic = "public"
)

// Backend is one OpenAI-compatible upstream, or the in-process simulator.
// Exactly one of URL and Simulated is set.
type Backend struct {
	// Name is how models refer to the backend.
	Name string `yaml:"name"`
	// URL is the OpenAI base URL, as users write it for OPENAI_BASE_URL,
	// e.g. "http://10.0.0.5:8000/v1". Chat completions go to URL + "/chat/completions".
	URL string `yaml:"url"`
	// APIKey is sent upstream as "Authorization: Bearer <APIKey>". Zero
	// means no Authorization header is sent upstream. Never logged.
	APIKey string `yaml:"api_key"`
	// Simulated, when set, runs an in-process simulated backend instead of
	// dialing URL.
	Simulated *Simulated `yaml:"simulated"`

	// Weight is this backend's share of traffic relative to the model's
	// other backends. Zero means 1.
	Weight int `yaml:"weight"`
	// MaxConcurrency caps in-flight requests to this backend. Zero means
	// no cap.
	MaxConcurrency int `yaml:"max_concurrency"`
	// MaxConns caps TCP connections to the backend. Zero means 1024.
	MaxConns int `yaml:"max_conns"`
	// ContinuousUsage says the backend honours vLLM's
	// stream_options.continuous_usage_stats. The gateway then asks for
	// cumulative usage on every chunk, so that a stream the client abandons
	// is counted exactly, and removes it from chunks the client did not ask
	// it on. Zero means false, except for simulated backends, which always
	// support it.
	ContinuousUsage bool `yaml:"continuous_usage"`
	// Messages is how the backend serves Anthropic's Messages API
	// (POST /v1/messages) for a model that does not choose: "native" (the
	// backend serves /messages itself, as vLLM's and llama.cpp's servers
	// do; the body goes upstream as is) or "translate" (the gateway
	// translates it to chat completions and back). Zero means "translate",
	// except for simulated backends, which serve it natively.
	Messages string `yaml:"messages"`

	Timeouts BackendTimeouts `yaml:"timeouts"`
	Health   Health          `yaml:"health"`
	// Metrics is how the gateway reads the backend's own Prometheus
	// metrics (vLLM's queues, KV cache and LoRA adapters), which the
	// scheduler scores backends on.
	Metrics BackendMetrics `yaml:"metrics"`
}

// BackendMetrics configures reading a backend's vLLM metrics. A backend
// whose reading fails, or is older than StaleAfter, is scored on the
// gateway's own counts of its requests in flight.
type BackendMetrics struct {
	// Path is read with GET at the origin of the backend's URL (its scheme
	// and host, without a path such as /v1, since vLLM serves its metrics
	// at the root). Zero means "/metrics"; "off" means the backend's
	// metrics are not read and it is always scored on the gateway's own
	// counts (for servers that are not vLLM).
	Path string `yaml:"path"`
	// Interval between two reads. Zero means 250ms: a few times a second
	// is what a queue that fills in a fraction of a second needs, while
	// each read is work vLLM's API server does instead of serving. Between
	// reads, the requests the gateway sent since are added to the reading.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one read. Zero means 1s.
	Timeout time.Duration `yaml:"timeout"`
	// StaleAfter is the age past which a reading no longer counts. Zero
	// means four intervals.
	StaleAfter time.Duration `yaml:"stale_after"`
}

// Health configures how a backend's health is judged: actively, by
// probing it, and passively, by ejecting it after consecutive failures.
type Health struct {
	// Path is probed with GET, relative to the backend URL. Zero means
	// "/models", which every OpenAI-compatible server answers.
	Path string `yaml:"path"`
	// Interval between probes. Zero means 10s.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one probe. Zero means 3s.
	Timeout time.Duration `yaml:"timeout"`
	// FailuresToEject is how many consecutive connection failures or 5xx
	// answers take the backend out of rotation. Zero means 3.
	FailuresToEject int `yaml:"failures_to_eject"`
	// Cooldown is how long an ejected backend stays out before it is tried
	// again; it doubles each time the backend fails again on return, up to
	// MaxCooldown. Zero means 5s.
	Cooldown time.Duration `yaml:"cooldown"`
	// MaxCooldown caps the cooldown. Zero means 2m.
	MaxCooldown time.Duration `yaml:"max_cooldown"`
}

// BackendTimeouts bound each phase of an upstream request.
type BackendTimeouts struct {
	// Connect bounds dialing. Zero means 5s.
	Connect time.Duration `yaml:"connect"`
	// FirstByte bounds the wait for the response headers after the request
	// is sent. Zero means 60s.
	FirstByte time.Duration `yaml:"first_byte"`
	// Idle bounds the gap between two reads of a streamed response, so that
	// a long generation lives as long as tokens keep coming. Zero means 60s.
	Idle time.Duration `yaml:"idle"`
	// Total bounds a whole non-streaming request or a whole stream. Zero
	// means 10m.
	Total time.Duration `yaml:"total"`
}

// Simulated configures the in-process simulated backend.
type Simulated struct {
	// TimeToFirstToken delays the first token. Zero means none.
	TimeToFirstToken time.Duration `yaml:"ttft"`
	// InterTokenDelay spaces streamed tokens. Zero means none.
	InterTokenDelay time.Duration `yaml:"inter_token"`
	// Tokens is the completion length when the request sets no max tokens.
	// Zero means 16.
	Tokens int `yaml:"tokens"`
	// EmbeddingDimensions is the length of the vectors /v1/embeddings
	// returns when the request asks for no dimensions. Zero means 8.
	EmbeddingDimensions int `yaml:"embedding_dimensions"`
	// VariedText makes requests without a seed sample different text each
	// time, as a real model does. Zero (false) means they get the same
	// counting text "tok0 tok1 …" every time.
	VariedText bool `yaml:"varied_text"`

	// The fields below give plain chat completions the physics of a vLLM
	// server (docs/scheduler.md); with all of them zero, every request
	// takes ttft and inter_token as they are.

	// MaxNumSeqs is how many sequences run at once (vLLM's
	// --max-num-seqs); more wait in a queue, by priority then arrival.
	// Zero means no limit and no queue.
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// PrefillPerToken is the prefill time of each prompt token not found
	// in the prefix cache, added to ttft. Zero means the first token comes
	// after ttft whatever the prompt.
	PrefillPerToken time.Duration `yaml:"prefill_per_token"`
	// KVCacheBlocks is the prefix cache's size in blocks of block_size
	// tokens; cached leading blocks of a prompt skip prefill. Zero means
	// no prefix cache.
	KVCacheBlocks int `yaml:"kv_cache_blocks"`
	// BlockSize is the tokens of a prefix cache block. Zero means 16.
	BlockSize int `yaml:"block_size"`
	// LoadFactor multiplies prefill and inter-token times when
	// max_num_seqs sequences run, from 1 with one running. Zero means 1:
	// no slowdown under load.
	LoadFactor float64 `yaml:"load_factor"`
	// LoRAs are LoRA adapters served besides the base model, by the model
	// id a request names them with. Zero means none.
	LoRAs []string `yaml:"loras"`
	// MaxLoRAs is how many adapters are loaded at once. Zero means 1.
	MaxLoRAs int `yaml:"max_loras"`
	// LoRALoadTime delays the first token of a request whose adapter had
	// to be loaded. Zero means loading is free.
	LoRALoadTime time.Duration `yaml:"lora_load_time"`
	// PriorityPreemption makes a request arriving while max_num_seqs
	// run preempt the running sequence of the lowest priority, if lower
	// than its own, as vLLM's priority scheduling policy does; the
	// preempted one waits again and recomputes what it generated. Zero
	// means false: a request waits for a slot whatever its priority.
	PriorityPreemption bool `yaml:"priority_preemption"`
}

// Model is a public model id and where it is served.
type Model struct {
	// Name is the id clients send and /v1/models lists.
	Name string `yaml:"name"`
	// UpstreamModel replaces Name in the body sent upstream, and is mapped
	// back to Name in replies. Zero means Name is sent as is.
	UpstreamModel string `yaml:"upstream_model"`
	// Backends serving the model, by name; at least one.
	Backends []string `yaml:"backends"`
	// PriorityScheduling says the backends schedule by the request's
	// "priority" (vLLM started with --scheduling-policy priority), so the
	// field is forwarded. Zero means false: a request with a non-zero
	// priority gets a 400. The gateway's own queue orders waiting
	// requests by priority either way.
	PriorityScheduling bool `yaml:"priority_scheduling"`
	// ToolCalling says the backends call tools (vLLM started with
	// --enable-auto-tool-choice and a --tool-call-parser), so requests may
	// send tool_choice "auto", "required" or a named function. Zero means
	// false: only tool_choice "none" (or none at all) is accepted, and any
	// other gets a 400 that says to set tool_calling.
	ToolCalling bool `yaml:"tool_calling"`
	// Pricing per million tokens, used by /trace/usage with include_costs.
	// Zero means the model's costs are 0.
	Pricing Pricing `yaml:"pricing"`
	// Fallbacks are models tried, in order, when every backend of this
	// model failed or is out. Zero means none.
	Fallbacks []string `yaml:"fallbacks"`
	// FallbackKeepsModel makes a reply served by a fallback still name this
	// model. Zero means the reply names the model that served it; the
	// Compat-Served-Model header always does.
	FallbackKeepsModel bool `yaml:"fallback_keeps_model"`
	// Affinity "prefix" is the older spelling of routing.prefix on, kept
	// so that existing configurations load: requests sharing a prompt
	// prefix go where its KV cache is warm. The prefix signal is now on by
	// default, so zero means the same unless routing.prefix is off (both
	// together are refused).
	Affinity string `yaml:"affinity"`
	// Routing turns the scheduler's signals on and off for a model with
	// several backends.
	Routing Routing `yaml:"routing"`
	// Queue bounds how requests wait when every backend is at its
	// max_concurrency.
	Queue Queue `yaml:"queue"`
	// Endpoints are the OpenAI endpoints the model serves, by name: chat,
	// completions, embeddings, responses (see ModelEndpoints). A request to
	// another endpoint gets a 400. Zero means all of them.
	Endpoints []string `yaml:"endpoints"`
	// Messages is how the model's backends serve Anthropic's Messages API:
	// "native" or "translate" (see Backend.Messages). Zero means each
	// backend's own setting.
	Messages string `yaml:"messages"`
	// MaxOutputTokens is the most tokens the model may generate in one
	// Messages API reply: a larger max_tokens gets a 400 naming the limit.
	// Zero means no limit of the gateway's (the backend's own applies).
	MaxOutputTokens int64 `yaml:"max_output_tokens"`
	// Reasoning is how a Messages API request's thinking reaches the
	// model's backends when the gateway translates it to chat completions
	// (a backend serving the API natively gets the request's thinking as
	// it is): "effort" sends vLLM's reasoning_effort (low, medium or high
	// from the thinking budget), which gpt-oss reads; "template" sends
	// chat_template_kwargs {"enable_thinking": true or false}, which the
	// chat templates of Qwen3 and its kind read. Either way the thinking
	// blocks of earlier assistant turns go back as reasoning_content.
	// "none" sends nothing and drops those blocks. Zero means none.
	Reasoning string `yaml:"reasoning"`
}

// The values of Model.Messages and Backend.Messages.
const (
	MessagesNative    = "native"
	MessagesTranslate = "translate"
)

// The values of Model.Reasoning.
const (
	ReasoningNone     = "none"
	ReasoningEffort   = "effort"
	ReasoningTemplate = "template"
)

// Signal turns one of the scheduler's signals on or off: "on", "off", or
// empty, which means on.
type Signal string

// The values of a Signal.
const (
	SignalOn  Signal = "on"
	SignalOff Signal = "off"
)

// On reports whether the signal is on; the zero value is.
func (s Signal) On() bool { return s != SignalOff }

// Routing is how the scheduler chooses among a model's backends: each
// signal scores them, and the best score wins (docs/scheduler.md).
type Routing struct {
	// Prefix scores a backend by how many leading blocks of the request's
	// prompt it was recently sent, so its prefix cache is likely to hold
	// them. Zero means on.
	Prefix Signal `yaml:"prefix"`
	// Queue scores a backend by the requests it runs and queues, read
	// from its metrics (vllm:num_requests_running and
	// vllm:num_requests_waiting) and brought up to date with the requests
	// sent since. Off, the gateway's own in-flight counts stand in. Zero
	// means on.
	Queue Signal `yaml:"queue"`
	// KV scores a backend by the share of its KV cache in use
	// (vllm:kv_cache_usage_perc), so a backend near preemption is
	// avoided. Zero means on.
	KV Signal `yaml:"kv"`
	// LoRA prefers, for a model whose upstream id is a LoRA adapter, the
	// backends that have it loaded (vllm:lora_requests_info), then those
	// with room to load it. Zero means on.
	LoRA Signal `yaml:"lora"`
	// Spread sends a request that opens a conversation (its leading
	// system or developer messages, then one message) to the least busy
	// backend without those instructions, when that backend is no busier
	// than the least busy one holding them by more than a request, its KV
	// cache is less than half in use, and its prefix cache has room for
	// them beside the prompts it serves: an app's instructions reach every
	// server early, at the price of one cold prefill per server, so that
	// its conversations can be balanced by load and a turn whose server is
	// full moves to one holding them. It suits a fleet whose servers can
	// each cache every app's instructions; with more apps than that, the
	// copies evict what other conversations read. Off, such a request goes
	// where the score says, which keeps each app's conversations on the
	// servers already holding its instructions. Needs the prefix signal.
	// Zero means off.
	Spread Signal `yaml:"spread"`
	// QueueCostTokens is how many prompt tokens of cached prefix, beyond
	// what the best backend with free capacity holds, pay for each request
	// waiting ahead on a queueing backend: a backend where the request
	// would queue is chosen over one with free capacity only when its
	// extra cached prefix exceeds this many tokens per request ahead.
	// Zero means 2048.
	QueueCostTokens int `yaml:"queue_cost_tokens"`
}

// PrefixSignal reports whether the model's scheduler uses the prefix
// signal: routing.prefix is not off. affinity: prefix, its older spelling,
// cannot turn it off (Validate refuses it beside routing.prefix: off).
func (m *Model) PrefixSignal() bool { return m.Routing.Prefix.On() || m.Affinity == "prefix" }

// ModelEndpoints returns the names models[].endpoints accepts, in the
// order of the OpenAI API reference.
func ModelEndpoints() []string {
	return []string{"chat", "completions", "embeddings", "responses", "messages"}
}

// Queue is the bounded wait for a backend slot.
type Queue struct {
	// Depth is how many requests may wait at once; more get a 503. Zero
	// means 128.
	Depth int `yaml:"depth"`
	// Wait is the longest a request waits for a slot before a 503 with
	// Retry-After. Zero means 5s.
	Wait time.Duration `yaml:"wait"`
	// Reserve is how many of the model's slots are kept free for tenants
	// under their equal share while a tenant over its share floods, more
	// of its requests waiting than it runs (docs/scheduler.md, "Priority
	// and fairness"); never more than the
	// under-share tenants leave unused of their shares. Zero means a
	// quarter of the model's slots, rounded up; -1 means none, every free
	// slot going to whoever is next in line.
	Reserve int `yaml:"reserve"`
}

// Pricing is a model's price per million tokens. Zero prices mean free,
// but for the cached prompt's and the cache writes', which zero makes the
// prompt's.
type Pricing struct {
	PromptPerMTok     float64 `yaml:"prompt_per_mtok"`
	CompletionPerMTok float64 `yaml:"completion_per_mtok"`
	// CachedPromptPerMTok prices the prompt tokens read from the prompt
	// cache. Zero means the prompt price.
	CachedPromptPerMTok float64 `yaml:"cached_prompt_per_mtok"`
	// CacheWritePerMTok prices the prompt tokens written to the prompt
	// cache (Anthropic's cache_creation_input_tokens). Zero means the
	// prompt price.
	CacheWritePerMTok float64 `yaml:"cache_write_per_mtok"`
}

// CachedPromptPrice is the price of a million prompt tokens read from the
// cache.
func (p Pricing) CachedPromptPrice() float64 {
	if p.CachedPromptPerMTok > 0 {
		return p.CachedPromptPerMTok
	}
	return p.PromptPerMTok
}

// CacheWritePrice is the price of a million prompt tokens written to the
// cache.
func (p Pricing) CacheWritePrice() float64 {
	if p.CacheWritePerMTok > 0 {
		return p.CacheWritePerMTok
	}
	return p.PromptPerMTok
}

// Store selects where usage records and traces are persisted.
type Store struct {
	// Driver is sqlite or postgres. Zero means sqlite.
	Driver string `yaml:"driver"`
	// Path is the SQLite file. Zero means "tollgate.db". A relative path
	// is resolved beside the config file (or in the working directory for
	// the embedded default); ":memory:" is kept as it is, and names a
	// database that lasts as long as the process (in a temporary file).
	Path string `yaml:"path"`
	// DSN is the PostgreSQL connection string (driver postgres only).
	DSN string `yaml:"dsn"`
}

// Usage configures how usage records are queued and written.
type Usage struct {
	// QueueSize bounds records waiting to be written; a full queue makes
	// recording wait (backpressure) rather than drop. Zero means 65536.
	QueueSize int `yaml:"queue_size"`
	// BatchSize is the most records written in one transaction. Zero means 512.
	BatchSize int `yaml:"batch_size"`
	// FlushInterval is the longest a record waits in the queue, and so the
	// most that a hard crash can lose. Zero means 1s.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// DefaultProject is charged when a request names no project. Zero
	// means "inference".
	DefaultProject string `yaml:"default_project"`
	// DefaultMaxTokens is the completion estimate reserved against budgets
	// when a request sets no max tokens. Zero means 1024.
	DefaultMaxTokens int64 `yaml:"default_max_tokens"`
}

// Limit applies rate limits and a token budget to the requests it selects.
type Limit struct {
	// Team, Project and Key (a key's name) select requests. A zero field
	// matches anything and counts all matches together; "*" matches
	// anything and counts each distinct value separately (team: "*" gives
	// every team its own budget).
	Team    string `yaml:"team"`
	Project string `yaml:"project"`
	Key     string `yaml:"key"`
	// RPM caps requests per minute. Zero means no cap.
	RPM int64 `yaml:"rpm"`
	// TPM caps tokens per minute. Zero means no cap.
	TPM int64 `yaml:"tpm"`
	// TokenBudget caps tokens per BudgetWindow. Zero means no budget.
	TokenBudget int64 `yaml:"token_budget"`
	// BudgetWindow is day or month, UTC calendar windows. Zero means month.
	BudgetWindow string `yaml:"budget_window"`
}

// LimitsBackend selects where rate-limit and budget counters are kept.
type LimitsBackend struct {
	// Driver is memory (counters in this process) or redis (counters
	// shared by every gateway replica). Zero means memory.
	Driver string `yaml:"driver"`
	// Addr is the Redis host:port (driver redis only).
	Addr string `yaml:"addr"`
	// Password authenticates to Redis. Zero means none.
	Password string `yaml:"password"`
	// DB is the Redis database number. Zero means 0.
	DB int `yaml:"db"`
	// Prefix starts every Redis key the gateway writes. Zero means "tollgate:".
	Prefix string `yaml:"prefix"`
	// Timeout bounds each Redis call on the request path; past it the
	// gateway falls back to its local counters. Zero means 50ms.
	Timeout time.Duration `yaml:"timeout"`
}

// Retries govern retrying a request on another backend after a failure
// that happened before any byte reached the client: a connection failure,
// a timeout before the first response byte, or a 429/502/503/504.
type Retries struct {
	// Attempts is the most backends one request is sent to, the first
	// included. Zero means 3.
	Attempts int `yaml:"attempts"`
	// Backoff is the base delay before a retry; each retry waits a random
	// time up to twice the previous one (full jitter), and never less than
	// a Retry-After the backend sent, capped at MaxBackoff. Zero means 25ms.
	Backoff time.Duration `yaml:"backoff"`
	// MaxBackoff caps the delay before one retry. Zero means 1s.
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// BudgetRatio caps retries at this fraction of requests (over a
	// ten-second window), so a meltdown does not multiply load. Zero means 0.2.
	BudgetRatio float64 `yaml:"budget_ratio"`
	// BudgetMin retries per second are always allowed, so light traffic
	// can retry. Zero means 10.
	BudgetMin int `yaml:"budget_min"`
}

// Reload governs configuration hot reload. SIGHUP always reloads.
type Reload struct {
	// Watch polls the configuration file and reloads when it changes.
	// Zero means false.
	Watch bool `yaml:"watch"`
	// Interval between polls. Zero means 2s.
	Interval time.Duration `yaml:"interval"`
}

// Traces configures how chat completions are recorded as trace calls.
type Traces struct {
	// StorePayloads stores prompts and outputs in the calls' inputs and
	// output. Zero means they are not stored.
	StorePayloads bool `yaml:"store_payloads"`
	// MaxFileBytes bounds a file the Weave SDKs store through /file/create
	// (an op's code, an image); a larger one is refused with 413. Zero
	// means 32 MiB. server.max_body_bytes bounds the whole request too.
	MaxFileBytes int64 `yaml:"max_file_bytes"`
}

// Metrics names the teams and projects that get a label value of their own
// in the Prometheus series, beside those the configuration names anyway: a
// key's teams and default_team, a limit's team and project, and
// usage.default_project. Every other team or project a request names (the
// Compat-Project header is the client's to write) is counted under the
// value "other", so that clients cannot grow the number of series.
type Metrics struct {
	// Teams get a team label of their own. Zero means only the teams keys
	// and limits name.
	Teams []string `yaml:"teams"`
	// Projects get a project label of their own. Zero means only the
	// projects limits name, and usage.default_project.
	Projects []string `yaml:"projects"`
}

// Telemetry configures the export of an OpenTelemetry span for every
// request routed by model, over OTLP/HTTP (protobuf). Each field left zero
// takes the standard OpenTelemetry environment variable it names, as every
// OpenTelemetry SDK reads it; export is off when neither an endpoint here
// nor OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
// set (and when OTEL_SDK_DISABLED is true or OTEL_TRACES_EXPORTER is
// none).
type Telemetry struct {
	// Endpoint is the collector's OTLP/HTTP base URL; spans are posted to
	// it with "/v1/traces" appended. Zero means OTEL_EXPORTER_OTLP_ENDPOINT.
	Endpoint string `yaml:"endpoint"`
	// TracesEndpoint is the full URL spans are posted to, taking
	// precedence over Endpoint. Zero means
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else Endpoint.
	TracesEndpoint string `yaml:"traces_endpoint"`
	// Headers are sent with every export (a collector's API key). Zero
	// means OTEL_EXPORTER_OTLP_TRACES_HEADERS, else
	// OTEL_EXPORTER_OTLP_HEADERS, else none.
	Headers map[string]string `yaml:"headers"`
	// ServiceName is the spans' service.name. Zero means
	// OTEL_SERVICE_NAME, else "tollgate".
	ServiceName string `yaml:"service_name"`
	// Sampler decides which requests get a span: always_on, always_off,
	// traceidratio, parentbased_always_on, parentbased_always_off or
	// parentbased_traceidratio (parentbased_ ones follow the sampled flag
	// of the client's traceparent). Zero means OTEL_TRACES_SAMPLER, else
	// parentbased_always_on.
	Sampler string `yaml:"sampler"`
	// SamplerArg is the ratio of requests the traceidratio samplers keep,
	// from "0" to "1". Zero means OTEL_TRACES_SAMPLER_ARG, else "1".
	SamplerArg string `yaml:"sampler_arg"`
	// MaxQueueSize bounds the spans waiting to be exported; past it a
	// span is dropped (and counted in tollgate_otel_spans_dropped_total)
	// rather than make a request wait. Zero means OTEL_BSP_MAX_QUEUE_SIZE,
	// else 2048.
	MaxQueueSize int `yaml:"max_queue_size"`
}
