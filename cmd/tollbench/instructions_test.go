package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/openai"
)

func TestCachegrindTotal(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       uint64
		wantErr    bool
	}{
		{"summary", "desc: --cache-sim=no\ncmd: tollgate\nevents: Ir\nfl=x.go\nfn=main\n1 5\nsummary: 799323809\n", 799323809, false},
		{"no summary", "desc: --cache-sim=no\nevents: Ir\n", 0, true},
		{"not a count", "events: Ir\nsummary: 12 34\n", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cg.out")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := cachegrindTotal(path)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("cachegrindTotal = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// The gateway's configuration of -instructions loads, with the bench key
// and the one model on the mock, behind one backend or, for
// -instructions-fleet, four.
func TestInstrGatewayYAMLLoads(t *testing.T) {
	for _, backends := range []int{0, 4} {
		t.Run(fmt.Sprint(backends, " backends"), func(t *testing.T) {
			m := &instrMeter{dir: "/tmp/d", upstream: "127.0.0.1:1", key: "sk-tollbench-x", backends: backends}
			y := m.gatewayYAML("gateway-1-1000")
			cfg, err := config.Parse([]byte(y), "instr.yaml")
			if err != nil {
				t.Fatalf("%v\n%s", err, y)
			}
			want := max(1, backends)
			if len(cfg.Models) != 1 || cfg.Models[0].Name != modelFast || len(cfg.Backends) != want ||
				len(cfg.Models[0].Backends) != want || cfg.Store.Path != "/tmp/d/gateway-1-1000.db" {
				t.Fatalf("config %+v\n%s", cfg, y)
			}
			for i, b := range cfg.Backends {
				if b.URL != "http://127.0.0.1:1/v1" || cfg.Models[0].Backends[i] != b.Name {
					t.Errorf("backend %d: %+v, model's %q\n%s", i, b, cfg.Models[0].Backends[i], y)
				}
			}
		})
	}
}

// The requests of -instructions-fleet are every turn of the workload's
// conversations, each a valid chat request that starts with its app's
// system prompt, in an order that mixes conversations.
func TestInstrFleetBodies(t *testing.T) {
	bodies := instrFleetBodies(1)
	w := newFleetWorkload(1, fleetShape{apps: fleetApps, promptWords: fleetPromptWords})
	turns := 0
	for i := range fleetConversations {
		turns += len(w.conversation(i).turns)
	}
	if len(bodies) != turns {
		t.Fatalf("%d bodies, want one per turn: %d", len(bodies), turns)
	}
	if slices.Equal(bodies[0], w.body(modelFast, w.conversation(0), 0, 0)) && slices.Equal(bodies[1], w.body(modelFast, w.conversation(0), 1, 0)) {
		t.Error("bodies are in the script's order, not mixed")
	}
	for i, b := range bodies {
		var req openai.Request
		if err := openai.ValidateChat(b, &req); err != nil {
			t.Fatalf("body %d: %v", i, err)
		}
		if string(req.Model) != modelFast || !req.Stream || req.Messages < 2 {
			t.Fatalf("body %d: model %q, stream %v, %d messages", i, req.Model, req.Stream, req.Messages)
		}
		if _, p := req.Prompt(b); !bytes.Contains(p, []byte(`{"role":"system","content":"You are the assistant of app `)) {
			t.Fatalf("body %d has no app's system prompt first", i)
		}
	}
	if !slices.EqualFunc(bodies, instrFleetBodies(1), bytes.Equal) {
		t.Error("the same seed gave other bodies")
	}
}

// TestUndecodable checks that a side valgrind killed for RDTSCP is told
// apart from one killed for another instruction, and from one that failed
// for any other reason.
func TestUndecodable(t *testing.T) {
	const unrecognised = "==21680== valgrind: Unrecognised instruction at address 0x48a2a9.\n"
	tests := []struct {
		name, log, want string
	}{
		{"RDTSCP", "vex amd64->IR: " + rdtscpBytes + " 0x48 0xC1\n" + unrecognised, "cannot decode RDTSCP"},
		{"another instruction", "vex amd64->IR: unhandled instruction bytes: 0x62 0xF1 0xFE\n" + unrecognised, "an instruction it cannot decode"},
		{"no valgrind verdict", "panic: listen tcp: address already in use\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "side.log")
			if err := os.WriteFile(path, []byte(tt.log), 0o600); err != nil {
				t.Fatal(err)
			}
			err := undecodable(path)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("undecodable = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("undecodable = %v, want it to say %q", err, tt.want)
			}
		})
	}
	if err := undecodable(filepath.Join(t.TempDir(), "missing.log")); err != nil {
		t.Errorf("a missing log: %v", err)
	}
}
