package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// minKeyLength is the shortest secret a key may have; shorter ones are
// guessable and most likely a mistake.
const minKeyLength = 8

// maxNameLength is the longest name ValidName accepts.
const maxNameLength = 128

// ValidName reports whether s is a valid team or project name: 1 to 128
// characters, each an ASCII letter, a digit, '.', '_' or '-'. Names are
// keys of usage records and labels of metrics, so they are kept to
// characters that need no quoting anywhere.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > maxNameLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Validate checks a provisioned Config and returns every problem it finds,
// joined with errors.Join, each a *FieldError whose message starts with the
// path of the field, such as
//
//	models[2].backends[0]: no backend named "vllm-b"
//
// It expects Provision to have run: zero values that Provision would
// replace by defaults are refused.
func (c *Config) Validate() error {
	v := &validator{}
	v.listen("listen", c.Listen)
	if c.AdminListen != "" {
		v.listen("admin_listen", c.AdminListen)
		if c.AdminListen == c.Listen {
			v.addf("admin_listen", "must differ from listen (leave it empty to share listen)")
		}
	}
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "json", "console")

	keyNames := v.keys(c.Auth.Keys)
	v.server(&c.Server)
	backendNames := v.backends(c.Backends)
	v.models(c.Models, backendNames)
	v.store(&c.Store)
	v.usage(&c.Usage)
	v.limits(c.Limits, keyNames)
	v.limitsBackend(&c.LimitsBackend)
	v.retries(&c.Retries)
	v.telemetry(&c.Telemetry)
	v.positiveDuration("reload.interval", c.Reload.Interval)
	for i, t := range c.Metrics.Teams {
		v.name(indexPath("metrics.teams", i), t, false)
	}
	for i, p := range c.Metrics.Projects {
		v.name(indexPath("metrics.projects", i), p, false)
	}
	return errors.Join(v.errs...)
}

// validator collects the problems Validate finds.
type validator struct {
	errs []error
}

func (v *validator) addf(path, format string, args ...any) {
	v.errs = append(v.errs, fieldErrorf(0, path, format, args...))
}

func (v *validator) listen(path, addr string) {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		v.addf(path, "want host:port such as \"127.0.0.1:8080\", got %q", addr)
	}
}

// oneOf checks that s is one of allowed.
func (v *validator) oneOf(path, s string, allowed ...string) {
	if slices.Contains(allowed, s) {
		return
	}
	quoted := make([]string, len(allowed))
	for i, a := range allowed {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	v.addf(path, "want one of %s, got %q", strings.Join(quoted, ", "), s)
}

// name checks a team or project name, or a limit's selector when star is
// set.
func (v *validator) name(path, s string, star bool) {
	if star && s == "*" || ValidName(s) {
		return
	}
	if star {
		v.addf(path, "invalid name %q: want \"*\" or 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'", s)
		return
	}
	v.addf(path, "invalid name %q: want 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'", s)
}

func (v *validator) nonNegative(path string, n int64) {
	if n < 0 {
		v.addf(path, "must not be negative, got %d", n)
	}
}

func (v *validator) positive(path string, n int64) {
	if n <= 0 {
		v.addf(path, "must be positive, got %d", n)
	}
}

func (v *validator) nonNegativeDuration(path string, d time.Duration) {
	if d < 0 {
		v.addf(path, "must not be negative, got %v", d)
	}
}

func (v *validator) positiveDuration(path string, d time.Duration) {
	if d <= 0 {
		v.addf(path, "must be positive, got %v", d)
	}
}

// uniqueName checks that a list item's name is set and not taken by an
// earlier item of list, and records it in seen.
func (v *validator) uniqueName(path, list, name string, i int, seen map[string]int) {
	switch first, dup := seen[name]; {
	case name == "":
		v.addf(path, "required")
	case dup:
		v.addf(path, "duplicate name %q (also %s)", name, indexPath(list, first))
	default:
		seen[name] = i
	}
}

// keys checks the API keys and returns their names.
func (v *validator) keys(keys []Key) map[string]int {
	names := make(map[string]int, len(keys))
	if len(keys) == 0 {
		v.addf("auth.keys", "at least one key is required")
	}
	// digests maps each secret's SHA-256 to its key, to refuse two keys
	// with one secret: a request could not tell which of them it used.
	digests := make(map[string]int, len(keys))
	for i, k := range keys {
		p := indexPath("auth.keys", i)
		v.uniqueName(p+".name", "auth.keys", k.Name, i, names)

		var digest string
		switch {
		case k.Key == "" && k.KeySHA256 == "":
			v.addf(p, "set one of key and key_sha256")
		case k.Key != "" && k.KeySHA256 != "":
			v.addf(p, "set only one of key and key_sha256")
		case k.Key != "":
			if utf8.RuneCountInString(k.Key) < minKeyLength {
				// The secret is not echoed: error messages end up in logs.
				v.addf(p+".key", "must be at least %d characters", minKeyLength)
				break
			}
			sum := sha256.Sum256([]byte(k.Key))
			digest = hex.EncodeToString(sum[:])
		default:
			if b, err := hex.DecodeString(k.KeySHA256); err != nil || len(b) != sha256.Size {
				v.addf(p+".key_sha256", "want 64 hex characters (a SHA-256), got %d characters", len(k.KeySHA256))
				break
			}
			digest = strings.ToLower(k.KeySHA256)
		}
		if digest != "" {
			if first, dup := digests[digest]; dup {
				v.addf(p, "same secret as %s", indexPath("auth.keys", first))
			} else {
				digests[digest] = i
			}
		}

		anyTeam := false
		for j, t := range k.Teams {
			v.name(indexPath(p+".teams", j), t, true)
			anyTeam = anyTeam || t == "*"
		}
		switch {
		case !ValidName(k.DefaultTeam):
			v.name(p+".default_team", k.DefaultTeam, false)
		case !anyTeam && !slices.Contains(k.Teams, k.DefaultTeam):
			v.addf(p+".default_team", "team %q is not in teams", k.DefaultTeam)
		}
	}
	return names
}

func (v *validator) server(s *Server) {
	v.positive("server.max_body_bytes", int64(s.MaxBodyBytes))
	v.positive("server.max_header_bytes", int64(s.MaxHeaderBytes))
	v.positive("server.max_messages", int64(s.MaxMessages))
	v.positive("server.max_json_depth", int64(s.MaxJSONDepth))
	v.positiveDuration("server.read_timeout", s.ReadTimeout)
	v.positiveDuration("server.idle_timeout", s.IdleTimeout)
	v.positiveDuration("server.write_timeout", s.WriteTimeout)
	v.positive("server.max_connections", int64(s.MaxConnections))
	v.positive("server.admin_max_connections", int64(s.AdminMaxConnections))
	v.positiveDuration("server.shutdown_timeout", s.ShutdownTimeout)
	v.positive("server.max_streams", int64(s.MaxStreams))
	v.positive("server.max_stop_strings", int64(s.MaxStopStrings))
	v.positive("server.max_logit_bias", int64(s.MaxLogitBias))
	v.positive("server.max_response_bytes", int64(s.MaxResponseBytes))
	v.positive("server.max_event_bytes", int64(s.MaxEventBytes))
	if s.BackgroundTeamShare < 1 || s.BackgroundTeamShare > 100 {
		v.addf("server.background_team_share", "must be a percentage from 1 to 100, got %d", s.BackgroundTeamShare)
	}
	v.oneOf("server.metrics_auth", s.MetricsAuth, MetricsAuthKey, MetricsAuthPublic)
	switch {
	case s.MetricsAuth == MetricsAuthPublic && s.MetricsRequireAdmin:
		v.addf("server.metrics_require_admin", "a public /metrics (metrics_auth: public) cannot require an admin key")
	case s.MetricsAuth == MetricsAuthPublic && s.MetricsToken != "":
		v.addf("server.metrics_token", "a public /metrics (metrics_auth: public) takes no token")
	case s.MetricsToken != "" && utf8.RuneCountInString(s.MetricsToken) < minKeyLength:
		// The secret is not echoed: error messages end up in logs.
		v.addf("server.metrics_token", "must be at least %d characters", minKeyLength)
	}
}

// backends checks the backends and returns their names.
func (v *validator) backends(backends []Backend) map[string]int {
	names := make(map[string]int, len(backends))
	if len(backends) == 0 {
		v.addf("backends", "at least one backend is required")
	}
	for i, b := range backends {
		p := indexPath("backends", i)
		v.uniqueName(p+".name", "backends", b.Name, i, names)
		switch {
		case b.URL == "" && b.Simulated == nil:
			v.addf(p, "set one of url and simulated")
		case b.URL != "" && b.Simulated != nil:
			v.addf(p, "set only one of url and simulated")
		case b.URL != "":
			v.backendURL(p+".url", b.URL)
		}
		v.nonNegative(p+".weight", int64(b.Weight))
		v.nonNegative(p+".max_concurrency", int64(b.MaxConcurrency))
		v.messagesMode(p+".messages", b.Messages)
		v.positive(p+".max_conns", int64(b.MaxConns))
		v.positiveDuration(p+".timeouts.connect", b.Timeouts.Connect)
		v.positiveDuration(p+".timeouts.first_byte", b.Timeouts.FirstByte)
		v.positiveDuration(p+".timeouts.idle", b.Timeouts.Idle)
		v.positiveDuration(p+".timeouts.total", b.Timeouts.Total)
		h := b.Health
		if !strings.HasPrefix(h.Path, "/") {
			v.addf(p+".health.path", "want a path starting with /, got %q", h.Path)
		}
		v.positiveDuration(p+".health.interval", h.Interval)
		v.positiveDuration(p+".health.timeout", h.Timeout)
		v.positive(p+".health.failures_to_eject", int64(h.FailuresToEject))
		v.positiveDuration(p+".health.cooldown", h.Cooldown)
		v.positiveDuration(p+".health.max_cooldown", h.MaxCooldown)
		if h.MaxCooldown < h.Cooldown {
			v.addf(p+".health.max_cooldown", "must be at least cooldown (%v), got %v", h.Cooldown, h.MaxCooldown)
		}
		if m := b.Metrics; m.Path != string(SignalOff) {
			if !strings.HasPrefix(m.Path, "/") {
				v.addf(p+".metrics.path", "want a path starting with /, or off, got %q", m.Path)
			}
			v.positiveDuration(p+".metrics.interval", m.Interval)
			v.positiveDuration(p+".metrics.timeout", m.Timeout)
			if m.StaleAfter < m.Interval {
				v.addf(p+".metrics.stale_after", "must be at least interval (%v), got %v", m.Interval, m.StaleAfter)
			}
		}
		if s := b.Simulated; s != nil {
			v.nonNegativeDuration(p+".simulated.ttft", s.TimeToFirstToken)
			v.nonNegativeDuration(p+".simulated.inter_token", s.InterTokenDelay)
			v.positive(p+".simulated.tokens", int64(s.Tokens))
			v.nonNegative(p+".simulated.embedding_dimensions", int64(s.EmbeddingDimensions))
			v.nonNegative(p+".simulated.max_num_seqs", int64(s.MaxNumSeqs))
			v.nonNegativeDuration(p+".simulated.prefill_per_token", s.PrefillPerToken)
			v.nonNegative(p+".simulated.kv_cache_blocks", int64(s.KVCacheBlocks))
			v.nonNegative(p+".simulated.block_size", int64(s.BlockSize))
			if s.LoadFactor != 0 && !(s.LoadFactor >= 1) {
				v.addf(p+".simulated.load_factor", "must be 0 or at least 1, got %v", s.LoadFactor)
			}
			for i, a := range s.LoRAs {
				if a == "" {
					v.addf(fmt.Sprintf("%s.simulated.loras[%d]", p, i), "must not be empty")
				}
			}
			v.nonNegative(p+".simulated.max_loras", int64(s.MaxLoRAs))
			v.nonNegativeDuration(p+".simulated.lora_load_time", s.LoRALoadTime)
		}
	}
	return names
}

// routing checks a model's scheduler settings.
func (v *validator) routing(path string, r Routing) {
	for _, s := range []struct {
		name string
		sig  Signal
	}{{"prefix", r.Prefix}, {"queue", r.Queue}, {"kv", r.KV}, {"lora", r.LoRA}, {"spread", r.Spread}} {
		if s.sig != "" && s.sig != SignalOn && s.sig != SignalOff {
			v.addf(path+"."+s.name, "want on or off, got %q", s.sig)
		}
	}
	v.positive(path+".queue_cost_tokens", int64(r.QueueCostTokens))
}

// backendURL checks an OpenAI base URL. Its path is kept, since servers
// mount the API at different places ("/v1", "/openai/v1"); a query or a
// fragment could not survive appending "/chat/completions".
func (v *validator) backendURL(path, raw string) {
	u, err := url.Parse(raw)
	if err != nil {
		// Unwrapped, the error leaves out the URL, which may hold a
		// password.
		v.addf(path, "invalid URL: %v", errors.Unwrap(err))
		return
	}
	switch shown := u.Redacted(); {
	case u.Scheme != "http" && u.Scheme != "https":
		v.addf(path, "want an http or https URL, got %q", shown)
	case u.Host == "":
		v.addf(path, "want a host in %q", shown)
	case u.RawQuery != "" || u.ForceQuery:
		v.addf(path, "must not have a query, got %q", shown)
	case u.Fragment != "":
		v.addf(path, "must not have a fragment, got %q", shown)
	}
}

func (v *validator) models(models []Model, backendNames map[string]int) {
	names := make(map[string]int, len(models))
	if len(models) == 0 {
		v.addf("models", "at least one model is required")
	}
	for i, m := range models {
		p := indexPath("models", i)
		v.uniqueName(p+".name", "models", m.Name, i, names)
		if len(m.Backends) == 0 {
			v.addf(p+".backends", "at least one backend is required")
		}
		listed := make(map[string]int, len(m.Backends))
		for j, b := range m.Backends {
			bp := indexPath(p+".backends", j)
			if _, ok := backendNames[b]; !ok {
				v.addf(bp, "no backend named %q", b)
			}
			if first, dup := listed[b]; dup {
				v.addf(bp, "backend %q is listed twice (also %s)", b, indexPath(p+".backends", first))
			} else {
				listed[b] = j
			}
		}
		v.price(p+".pricing.prompt_per_mtok", m.Pricing.PromptPerMTok)
		v.price(p+".pricing.completion_per_mtok", m.Pricing.CompletionPerMTok)
		v.price(p+".pricing.cached_prompt_per_mtok", m.Pricing.CachedPromptPerMTok)
		v.price(p+".pricing.cache_write_per_mtok", m.Pricing.CacheWritePerMTok)
		if m.Affinity != "" && m.Affinity != "prefix" {
			v.addf(p+".affinity", "want \"prefix\" or nothing, got %q", m.Affinity)
		}
		v.routing(p+".routing", m.Routing)
		if m.Affinity == "prefix" && !m.Routing.Prefix.On() {
			v.addf(p+".affinity", "affinity: prefix turns the prefix signal on, which routing.prefix: off turns off; keep one")
		}
		v.positive(p+".queue.depth", int64(m.Queue.Depth))
		v.positiveDuration(p+".queue.wait", m.Queue.Wait)
		if m.Queue.Reserve < -1 {
			v.addf(p+".queue.reserve", "must be -1 (none), 0 (a quarter of the slots) or a number of slots, got %d", m.Queue.Reserve)
		}
		v.endpoints(p+".endpoints", m.Endpoints)
		v.messagesMode(p+".messages", m.Messages)
		v.nonNegative(p+".max_output_tokens", m.MaxOutputTokens)
		if m.Reasoning != "" {
			v.oneOf(p+".reasoning", m.Reasoning, ReasoningNone, ReasoningEffort, ReasoningTemplate)
		}
	}
	// Fallbacks are checked once every model name is known, so that a
	// model may fall back to one listed after it.
	for i, m := range models {
		for j, f := range m.Fallbacks {
			fp := indexPath(indexPath("models", i)+".fallbacks", j)
			switch _, ok := names[f]; {
			case !ok:
				v.addf(fp, "no model named %q", f)
			case f == m.Name:
				v.addf(fp, "a model cannot fall back to itself")
			}
		}
	}
}

func (v *validator) price(path string, f float64) {
	// YAML can spell NaN and infinity (".nan", ".inf"); neither is a price.
	if !(f >= 0) || math.IsInf(f, 0) {
		v.addf(path, "want a number >= 0, got %v", f)
	}
}

func (v *validator) store(s *Store) {
	switch s.Driver {
	case driverSQLite:
		if s.Path == "" {
			v.addf("store.path", "required when driver is %s", driverSQLite)
		}
	case driverPostgres:
		if s.DSN == "" {
			v.addf("store.dsn", "required when driver is %s", driverPostgres)
		}
	default:
		v.addf("store.driver", "want %q or %q, got %q", driverSQLite, driverPostgres, s.Driver)
	}
}

func (v *validator) usage(u *Usage) {
	v.positive("usage.queue_size", int64(u.QueueSize))
	v.positive("usage.batch_size", int64(u.BatchSize))
	v.positiveDuration("usage.flush_interval", u.FlushInterval)
	v.positive("usage.default_max_tokens", u.DefaultMaxTokens)
	v.name("usage.default_project", u.DefaultProject, false)
}

func (v *validator) limits(limits []Limit, keyNames map[string]int) {
	for i, l := range limits {
		p := indexPath("limits", i)
		if l.Team != "" {
			v.name(p+".team", l.Team, true)
		}
		if l.Project != "" {
			v.name(p+".project", l.Project, true)
		}
		if l.Key != "" && l.Key != "*" {
			// Key names are not held to ValidName, so look the key up
			// first: a selector naming an existing key is always valid.
			if _, ok := keyNames[l.Key]; !ok {
				if ValidName(l.Key) {
					v.addf(p+".key", "no key named %q", l.Key)
				} else {
					v.name(p+".key", l.Key, true)
				}
			}
		}
		v.nonNegative(p+".rpm", l.RPM)
		v.nonNegative(p+".tpm", l.TPM)
		v.nonNegative(p+".token_budget", l.TokenBudget)
		if l.RPM <= 0 && l.TPM <= 0 && l.TokenBudget <= 0 {
			v.addf(p, "set at least one of rpm, tpm and token_budget")
		}
		v.oneOf(p+".budget_window", l.BudgetWindow, windowDay, windowMonth)
	}
}

func (v *validator) limitsBackend(lb *LimitsBackend) {
	switch lb.Driver {
	case limitsMemory:
	case limitsRedis:
		v.listen("limits_backend.addr", lb.Addr)
		v.nonNegative("limits_backend.db", int64(lb.DB))
		v.positiveDuration("limits_backend.timeout", lb.Timeout)
	default:
		v.addf("limits_backend.driver", "want %q or %q, got %q", limitsMemory, limitsRedis, lb.Driver)
	}
}

func (v *validator) retries(r *Retries) {
	v.positive("retries.attempts", int64(r.Attempts))
	v.positiveDuration("retries.backoff", r.Backoff)
	v.positiveDuration("retries.max_backoff", r.MaxBackoff)
	if !(r.BudgetRatio > 0 && r.BudgetRatio <= 1) {
		v.addf("retries.budget_ratio", "want a fraction in (0, 1], got %v", r.BudgetRatio)
	}
	v.nonNegative("retries.budget_min", int64(r.BudgetMin))
}

// telemetry checks the span export settings given in the file; those left
// to the environment are checked when the exporter is built.
func (v *validator) telemetry(t *Telemetry) {
	if t.Endpoint != "" {
		v.backendURL("telemetry.endpoint", t.Endpoint)
	}
	if t.TracesEndpoint != "" {
		v.backendURL("telemetry.traces_endpoint", t.TracesEndpoint)
	}
	if t.Sampler != "" {
		v.oneOf("telemetry.sampler", t.Sampler, TelemetrySamplers()...)
	}
	if t.SamplerArg != "" {
		if f, err := strconv.ParseFloat(t.SamplerArg, 64); err != nil || !(f >= 0 && f <= 1) {
			v.addf("telemetry.sampler_arg", "want a ratio from 0 to 1, got %q", t.SamplerArg)
		}
	}
	v.nonNegative("telemetry.max_queue_size", int64(t.MaxQueueSize))
}

// TelemetrySamplers are the sampler names telemetry.sampler and
// OTEL_TRACES_SAMPLER take, as the OpenTelemetry SDK configuration names
// them.
func TelemetrySamplers() []string {
	return []string{"always_on", "always_off", "traceidratio",
		"parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"}
}

// messagesMode checks how a model or backend serves the Messages API.
func (v *validator) messagesMode(path, mode string) {
	if mode != "" && mode != MessagesNative && mode != MessagesTranslate {
		v.addf(path, "want %q, %q or nothing, got %q", MessagesNative, MessagesTranslate, mode)
	}
}

// endpoints checks a model's endpoint names: known, and each listed once.
func (v *validator) endpoints(path string, names []string) {
	known := ModelEndpoints()
	for i, name := range names {
		if !slices.Contains(known, name) {
			v.addf(indexPath(path, i), "want one of %s, got %q", strings.Join(known, ", "), name)
		} else if first := slices.Index(names, name); first < i {
			v.addf(indexPath(path, i), "endpoint %q is listed twice (also %s)", name, indexPath(path, first))
		}
	}
}
