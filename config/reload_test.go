package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// settingLeaves lists every setting of Config as RestartOnlySettings
// writes them: walked from the types, so a field added later is in it.
func settingLeaves(path string, t reflect.Type, leaves *[]string) {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Struct:
		for i := range t.NumField() {
			if name := yamlName(t.Field(i)); name != "" {
				settingLeaves(join(path, name), t.Field(i).Type, leaves)
			}
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		settingLeaves(path+"[]", t.Elem(), leaves)
	default:
		*leaves = append(*leaves, path)
	}
}

// TestReloadClassifiesEverySetting fails when a setting is in neither
// list (a new field: decide whether a reload applies it), in both, or
// when a list names a setting Config does not have.
func TestReloadClassifiesEverySetting(t *testing.T) {
	var leaves []string
	settingLeaves("", reflect.TypeOf(Config{}), &leaves)
	if len(leaves) < 90 {
		t.Fatalf("walked only %d settings: %v", len(leaves), leaves)
	}
	restart, reload := RestartOnlySettings(), ReloadableSettings()
	for _, leaf := range leaves {
		inRestart, inReload := slices.Contains(restart, leaf), slices.Contains(reload, leaf)
		switch {
		case !inRestart && !inReload:
			t.Errorf("%s is neither in RestartOnlySettings nor in ReloadableSettings: decide whether a reload applies it (and say so in the README's hot reload list)", leaf)
		case inRestart && inReload:
			t.Errorf("%s is in both RestartOnlySettings and ReloadableSettings", leaf)
		}
	}
	for _, s := range append(slices.Clone(restart), reload...) {
		if !slices.Contains(leaves, s) {
			t.Errorf("%s is listed but is not a setting of Config", s)
		}
	}
	for _, s := range restart {
		// Reloaded pins restart-only settings by walking struct fields;
		// a setting inside a list cannot be pinned that way.
		if strings.Contains(s, "[]") {
			t.Errorf("restart-only %s is inside a list", s)
		}
	}
	if n := len(restart) + len(reload); n != len(leaves) {
		t.Errorf("the lists name %d settings, Config has %d", n, len(leaves))
	}
}

func TestDiffReload(t *testing.T) {
	tests := []struct {
		name         string
		mutate       func(c *Config)
		applied      []string
		needsRestart []string
	}{
		{name: "nothing changed", mutate: func(*Config) {}},
		{
			name:    "request limits reload",
			mutate:  func(c *Config) { c.Server.MaxMessages = 3; c.Server.MaxStreams = 7 },
			applied: []string{"server.max_messages", "server.max_streams"},
		},
		{
			name:         "fasthttp's limits need a restart",
			mutate:       func(c *Config) { c.Server.MaxBodyBytes = 1 << 10; c.Server.ReadTimeout = time.Second },
			needsRestart: []string{"server.max_body_bytes", "server.read_timeout"},
		},
		{
			name: "both at once, each in its list",
			mutate: func(c *Config) {
				c.Retries.BudgetRatio = 0.5
				c.Traces.StorePayloads = !c.Traces.StorePayloads
				c.Traces.MaxFileBytes = 5
				c.Listen = "127.0.0.1:1"
				c.LimitsBackend.Driver = "redis"
			},
			applied:      []string{"traces.store_payloads", "retries.budget_ratio"},
			needsRestart: []string{"listen", "limits_backend.driver", "traces.max_file_bytes"},
		},
		{
			name:    "a list entry's field by index",
			mutate:  func(c *Config) { c.Backends[1].Weight = 9; c.Backends[0].Health.Interval = time.Minute },
			applied: []string{"backends[0].health.interval", "backends[1].weight"},
		},
		{
			name:    "a list that grew, by its name",
			mutate:  func(c *Config) { c.Models = append(c.Models, Model{Name: "extra", Backends: []string{"vllm-a"}}) },
			applied: []string{"models"},
		},
		{
			name:    "a simulated backend replaced by a URL",
			mutate:  func(c *Config) { c.Backends[0].Simulated = &Simulated{Tokens: 3} },
			applied: []string{"backends[0].simulated"},
		},
		{
			name:    "a key's secret is named, never shown",
			mutate:  func(c *Config) { c.Auth.Keys[0].Key = "sk-changed-secret" },
			applied: []string{"auth.keys[0].key"},
		},
		{
			name:   "the file's path is not a setting",
			mutate: func(c *Config) { c.Path = "elsewhere.yaml" },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			running, next := validConfig(t), validConfig(t)
			tt.mutate(next)
			got := DiffReload(running, next)
			if !slices.Equal(got.Applied, tt.applied) {
				t.Errorf("applied = %q, want %q", got.Applied, tt.applied)
			}
			if !slices.Equal(got.NeedsRestart, tt.needsRestart) {
				t.Errorf("needs restart = %q, want %q", got.NeedsRestart, tt.needsRestart)
			}
		})
	}
}

func TestReloadedKeepsRestartOnlySettings(t *testing.T) {
	running, next := validConfig(t), validConfig(t)
	next.Server.MaxBodyBytes = running.Server.MaxBodyBytes * 2
	next.Server.MaxJSONDepth = 3
	next.Store.Path = "/elsewhere.db"
	next.LimitsBackend.Driver = "redis"
	next.Reload.Watch = !running.Reload.Watch
	next.Server.MaxMessages = 5
	next.Retries.Attempts = 1
	next.Backends[0].Weight = 42

	got := Reloaded(running, next)
	if got == next {
		t.Fatal("Reloaded returned next itself")
	}
	if got.Server.MaxBodyBytes != running.Server.MaxBodyBytes || got.Server.MaxJSONDepth != running.Server.MaxJSONDepth ||
		got.Store.Path != running.Store.Path || got.LimitsBackend.Driver != running.LimitsBackend.Driver ||
		got.Reload.Watch != running.Reload.Watch {
		t.Errorf("a restart-only setting took the reloaded value: server %+v store %+v limits_backend %+v reload %+v",
			got.Server, got.Store, got.LimitsBackend, got.Reload)
	}
	if got.Server.MaxMessages != 5 || got.Retries.Attempts != 1 || got.Backends[0].Weight != 42 {
		t.Errorf("a reloadable setting kept its running value: max_messages %d attempts %d weight %d",
			got.Server.MaxMessages, got.Retries.Attempts, got.Backends[0].Weight)
	}
	if next.Server.MaxBodyBytes != running.Server.MaxBodyBytes*2 || next.Store.Path != "/elsewhere.db" {
		t.Error("Reloaded modified the configuration it was given")
	}
	// What was pinned still needs a restart, at every later reload too.
	ch := DiffReload(got, next)
	want := []string{"server.max_body_bytes", "server.max_json_depth", "store.path", "limits_backend.driver", "reload.watch"}
	if len(ch.Applied) != 0 || !slices.Equal(ch.NeedsRestart, want) {
		t.Errorf("diff of the installed configuration and the file = %+v, want only %q needing a restart", ch, want)
	}
}
