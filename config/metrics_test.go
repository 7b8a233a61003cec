package config

import (
	"strings"
	"testing"
)

func TestMetricsLabelLists(t *testing.T) {
	base := `auth:
  keys:
    - {name: k, key: sk-test-0001}
backends:
  - {name: a, simulated: {}}
models:
  - {name: m, backends: [a]}
`
	for _, tt := range []struct {
		name, yaml, wantErr string
	}{
		{"absent", "", ""},
		{"named", "metrics: {teams: [research, ops-2], projects: [chat.bot]}\n", ""},
		{"bad team", "metrics: {teams: [ok, \"a b\"]}\n", `metrics.teams[1]: invalid name "a b"`},
		{"star is no project", "metrics: {projects: [\"*\"]}\n", `metrics.projects[0]: invalid name "*"`},
		{"unknown field", "metrics: {models: [m]}\n", "models"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(base+tt.yaml), "m.yaml")
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tt.name == "named" && (strings.Join(cfg.Metrics.Teams, ",") != "research,ops-2" || strings.Join(cfg.Metrics.Projects, ",") != "chat.bot") {
					t.Errorf("metrics = %+v", cfg.Metrics)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}
