package config

import (
	"reflect"
	"strconv"
	"strings"
)

// RestartOnlySettings are the settings that something built once at start
// holds: the listeners and fasthttp's server (sizes, timeouts, the
// connection cap, the shutdown timeout), the admin module (max_json_depth
// and max_file_bytes bound trace ingest, metrics_auth and metrics_token
// guard /metrics), the log, the store, the usage queue, the limiter's backend,
// the reload watcher and the span exporter (telemetry). A reload leaves them at the values the process
// started with, everywhere, until a restart. Each is a path as the YAML
// file writes it, "[]" standing for any entry of a list.
func RestartOnlySettings() []string {
	return []string{
		"listen", "admin_listen",
		"log.level", "log.format",
		"server.max_body_bytes", "server.max_header_bytes", "server.max_json_depth",
		"server.read_timeout", "server.idle_timeout", "server.write_timeout",
		"server.max_connections", "server.admin_max_connections",
		"server.metrics_auth", "server.metrics_token", "server.metrics_require_admin", "server.shutdown_timeout",
		"store.driver", "store.path", "store.dsn",
		"usage.queue_size", "usage.batch_size", "usage.flush_interval",
		"limits_backend.driver", "limits_backend.addr", "limits_backend.password",
		"limits_backend.db", "limits_backend.prefix", "limits_backend.timeout",
		"traces.max_file_bytes",
		"reload.watch", "reload.interval",
		"telemetry.endpoint", "telemetry.traces_endpoint", "telemetry.headers",
		"telemetry.service_name", "telemetry.sampler", "telemetry.sampler_arg",
		"telemetry.max_queue_size",
	}
}

// ReloadableSettings are the settings a reload applies: new requests read
// them from the configuration they started with, so a request in flight
// keeps the values it started on. The retry budget lives across reloads
// and takes the new budget_ratio and budget_min, keeping the tokens it
// holds (up to its new capacity).
func ReloadableSettings() []string {
	return []string{
		"auth.keys[].name", "auth.keys[].key", "auth.keys[].key_sha256",
		"auth.keys[].teams", "auth.keys[].default_team", "auth.keys[].admin",
		"server.max_messages", "server.max_streams", "server.max_stop_strings",
		"server.max_logit_bias", "server.max_response_bytes", "server.max_event_bytes", "server.background_team_share",
		"backends[].name", "backends[].url", "backends[].api_key",
		"backends[].simulated.ttft", "backends[].simulated.inter_token",
		"backends[].simulated.tokens", "backends[].simulated.embedding_dimensions",
		"backends[].simulated.varied_text", "backends[].simulated.max_num_seqs",
		"backends[].simulated.prefill_per_token", "backends[].simulated.kv_cache_blocks",
		"backends[].simulated.block_size", "backends[].simulated.load_factor",
		"backends[].simulated.loras", "backends[].simulated.max_loras", "backends[].simulated.lora_load_time",
		"backends[].simulated.priority_preemption",
		"backends[].weight", "backends[].max_concurrency", "backends[].max_conns",
		"backends[].continuous_usage", "backends[].messages",
		"backends[].timeouts.connect", "backends[].timeouts.first_byte",
		"backends[].timeouts.idle", "backends[].timeouts.total",
		"backends[].health.path", "backends[].health.interval", "backends[].health.timeout",
		"backends[].health.failures_to_eject", "backends[].health.cooldown", "backends[].health.max_cooldown",
		"backends[].metrics.path", "backends[].metrics.interval", "backends[].metrics.timeout",
		"backends[].metrics.stale_after",
		"models[].name", "models[].upstream_model", "models[].backends",
		"models[].priority_scheduling", "models[].tool_calling",
		"models[].pricing.prompt_per_mtok", "models[].pricing.completion_per_mtok",
		"models[].pricing.cached_prompt_per_mtok", "models[].pricing.cache_write_per_mtok",
		"models[].fallbacks", "models[].fallback_keeps_model", "models[].affinity",
		"models[].routing.prefix", "models[].routing.queue", "models[].routing.kv", "models[].routing.lora", "models[].routing.spread",
		"models[].routing.queue_cost_tokens",
		"models[].queue.depth", "models[].queue.wait", "models[].queue.reserve", "models[].endpoints",
		"models[].messages", "models[].max_output_tokens", "models[].reasoning",
		"usage.default_project", "usage.default_max_tokens",
		"limits[].team", "limits[].project", "limits[].key", "limits[].rpm", "limits[].tpm",
		"limits[].token_budget", "limits[].budget_window",
		"traces.store_payloads",
		"retries.attempts", "retries.backoff", "retries.max_backoff",
		"retries.budget_ratio", "retries.budget_min",
		"metrics.teams", "metrics.projects",
	}
}

// ReloadChanges is what reloading one configuration over another changes,
// by setting path as the YAML file writes it, list entries by index
// ("backends[1].weight"), a list whose length changed by its own name
// ("models").
type ReloadChanges struct {
	// Applied are the settings the reload applies to new requests.
	Applied []string
	// NeedsRestart are the settings that differ but keep their running
	// values until the process restarts.
	NeedsRestart []string
}

// DiffReload compares the running configuration with the one a reload
// read, and splits what differs into what the reload applies and what
// needs a restart.
func DiffReload(running, next *Config) ReloadChanges {
	var ch ReloadChanges
	restart := RestartOnlySettings()
	diffValue("", "", reflect.ValueOf(running).Elem(), reflect.ValueOf(next).Elem(), func(path, setting string) {
		if coversRestartOnly(restart, setting) {
			ch.NeedsRestart = append(ch.NeedsRestart, path)
		} else {
			ch.Applied = append(ch.Applied, path)
		}
	})
	return ch
}

// Reloaded returns the configuration a reload installs: next, with every
// restart-only setting at running's value, so that the whole process keeps
// using the values it started with until a restart (a 413 quotes the body
// limit fasthttp enforces, not one a reload read). next is not modified.
func Reloaded(running, next *Config) *Config {
	out := *next
	from, to := reflect.ValueOf(running).Elem(), reflect.ValueOf(&out).Elem()
	for _, setting := range RestartOnlySettings() {
		src, dst := from, to
		for _, name := range strings.Split(setting, ".") {
			src, dst = fieldByYAML(src, name), fieldByYAML(dst, name)
		}
		dst.Set(src)
	}
	return &out
}

// coversRestartOnly reports whether setting, or a setting under it, is
// restart-only: a list entry added or removed is only as reloadable as
// its least reloadable field.
func coversRestartOnly(restart []string, setting string) bool {
	for _, r := range restart {
		if r == setting || strings.HasPrefix(r, setting+".") || strings.HasPrefix(r, setting+"[]") {
			return true
		}
	}
	return false
}

// diffValue calls changed for each setting whose values differ in a and
// b: path names it with list indexes, setting as RestartOnlySettings do.
func diffValue(path, setting string, a, b reflect.Value, changed func(path, setting string)) {
	switch {
	case a.Kind() == reflect.Struct:
		t := a.Type()
		for i := range t.NumField() {
			name := yamlName(t.Field(i))
			if name == "" {
				continue
			}
			diffValue(join(path, name), join(setting, name), a.Field(i), b.Field(i), changed)
		}
	case a.Kind() == reflect.Pointer:
		switch {
		case a.IsNil() && b.IsNil():
		case a.IsNil() || b.IsNil():
			changed(path, setting)
		default:
			diffValue(path, setting, a.Elem(), b.Elem(), changed)
		}
	case a.Kind() == reflect.Slice && a.Type().Elem().Kind() == reflect.Struct:
		if a.Len() != b.Len() {
			changed(path, setting)
			return
		}
		for i := range a.Len() {
			diffValue(path+"["+strconv.Itoa(i)+"]", setting+"[]", a.Index(i), b.Index(i), changed)
		}
	default:
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			changed(path, setting)
		}
	}
}

// yamlName is the key a struct field is written under in YAML; "" for a
// field YAML does not read (Config.Path).
func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	return name
}

// fieldByYAML returns the field of struct v written as name in YAML. It
// panics on a name the struct does not have: the settings lists are the
// package's own, and TestReloadClassifiesEverySetting checks them.
func fieldByYAML(v reflect.Value, name string) reflect.Value {
	t := v.Type()
	for i := range t.NumField() {
		if yamlName(t.Field(i)) == name {
			return v.Field(i)
		}
	}
	panic("config: no setting " + name + " in " + t.Name())
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
