package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tollgate-dev/tollgate/config"
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
// and the one model on the mock.
func TestInstrGatewayYAMLLoads(t *testing.T) {
	m := &instrMeter{dir: "/tmp/d", upstream: "127.0.0.1:1", key: "sk-tollbench-x"}
	y := m.gatewayYAML("gateway-1-1000")
	cfg, err := config.Parse([]byte(y), "instr.yaml")
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if len(cfg.Models) != 1 || cfg.Models[0].Name != modelFast || len(cfg.Backends) != 1 ||
		cfg.Backends[0].URL != "http://127.0.0.1:1/v1" || cfg.Store.Path != "/tmp/d/gateway-1-1000.db" {
		t.Errorf("config %+v\n%s", cfg, y)
	}
}
