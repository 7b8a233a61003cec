package accounting

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate-dev/tollgate/config"
)

// labelConfig names teams acme (a key's teams), ops (a key's default
// team), billing (a limit) and research (metrics.teams); projects chatbot
// (a limit), batch (metrics.projects) and inference (the default project).
func labelConfig() *config.Config {
	return &config.Config{
		Auth: config.Auth{Keys: []config.Key{
			{Name: "a", Teams: []string{"acme", "*"}, DefaultTeam: "ops"},
		}},
		Limits: []config.Limit{
			{Team: "billing", Project: "chatbot", RPM: 1},
			{Team: "*", Project: "*", TPM: 1},
		},
		Metrics: config.Metrics{Teams: []string{"research"}, Projects: []string{"batch"}},
		Usage:   config.Usage{DefaultProject: "inference"},
		Models:  []config.Model{{Name: "m"}},
	}
}

func TestLabelPolicy(t *testing.T) {
	p := NewLabelPolicy(labelConfig())
	for _, tt := range []struct {
		what, got, want string
	}{
		{"key's team", p.Team("acme"), "acme"},
		{"key's default team", p.Team("ops"), "ops"},
		{"limit's team", p.Team("billing"), "billing"},
		{"metrics.teams", p.Team("research"), "research"},
		{"unnamed team", p.Team("mallory"), OtherLabel},
		{"star is no team", p.Team("*"), OtherLabel},
		{"limit's project", p.Project("chatbot"), "chatbot"},
		{"metrics.projects", p.Project("batch"), "batch"},
		{"default project", p.Project("inference"), "inference"},
		{"unnamed project", p.Project("x1"), OtherLabel},
		{"team names no project", p.Project("acme"), OtherLabel},
		{"configured model", p.Model("m"), "m"},
		{"unconfigured model", p.Model("gpt-9"), OtherLabel},
	} {
		t.Run(tt.what, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
	var none *LabelPolicy
	if got := none.Team("acme"); got != OtherLabel {
		t.Errorf("nil policy: Team(acme) = %q, want %q", got, OtherLabel)
	}
}

// tokenSeries returns the label sets of a token counter as
// "team/project/model=value", sorted.
func tokenSeries(t *testing.T, reg *prometheus.Registry, name string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out = append(out, fmt.Sprintf("%s/%s/%s=%g", l["team"], l["project"], l["model"], m.GetCounter().GetValue()))
		}
	}
	sort.Strings(out)
	return out
}

func TestRecorderLabelsBoundedByConfig(t *testing.T) {
	st := &memStore{}
	reg := prometheus.NewRegistry()
	cfg := labelConfig()
	r := newRecorder(st, RecorderOptions{FlushInterval: time.Millisecond, Labels: NewLabelPolicy(cfg)}, nil, reg, testBackoff)
	record := func(team, project, model string) {
		r.Record(Record{CallID: team + "/" + project, Team: team, Project: project, Model: model,
			PromptTokens: 2, CompletionTokens: 1, TotalTokens: 3, Ended: time.Now()})
	}
	// A thousand projects no configuration names, as any client can send.
	for i := range 1000 {
		record("acme", fmt.Sprintf("p%d", i), "m")
	}
	for i := range 100 {
		record(fmt.Sprintf("team%d", i), "chatbot", "gpt-"+fmt.Sprint(i))
	}
	record("research", "batch", "m")

	// A reload names team7: its records from now on get their own series.
	cfg.Metrics.Teams = append(cfg.Metrics.Teams, "team7")
	flushed := func(n int) func() bool {
		return func() bool {
			st.mu.Lock()
			defer st.mu.Unlock()
			return len(st.recs) == n
		}
	}
	eventually(flushed(1101))
	r.SetLabelPolicy(NewLabelPolicy(cfg))
	record("team7", "inference", "m")
	eventually(flushed(1102))

	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"acme/other/m=2000",
		"other/chatbot/other=200",
		"research/batch/m=2",
		"team7/inference/m=2",
	}
	if got := tokenSeries(t, reg, "tollgate_prompt_tokens_total"); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("prompt token series:\n got %v\nwant %v", got, want)
	}
	if got := tokenSeries(t, reg, "tollgate_completion_tokens_total"); len(got) != len(want) {
		t.Errorf("completion token series: %v, want %d", got, len(want))
	}
}

func TestRecorderWriteLag(t *testing.T) {
	st := &memStore{}
	reg := prometheus.NewRegistry()
	r := newRecorder(st, RecorderOptions{BatchSize: 2, FlushInterval: time.Hour}, nil, reg, testBackoff)
	old := time.Now().Add(-time.Hour)
	r.Record(Record{CallID: "a", Ended: old})
	r.Record(Record{CallID: "b", Ended: time.Now()})
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var h *dto.Histogram
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tollgate_usage_write_lag_seconds" {
			h = mf.GetMetric()[0].GetHistogram()
		}
	}
	if h == nil {
		t.Fatal("no tollgate_usage_write_lag_seconds")
	}
	// One batch of two: one observation, the older record's age.
	if h.GetSampleCount() != 1 || h.GetSampleSum() < 3600 {
		t.Errorf("write lag: %d samples summing %gs, want 1 of at least 3600s", h.GetSampleCount(), h.GetSampleSum())
	}
}
