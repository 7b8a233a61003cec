package main

import (
	"errors"
	"fmt"
	"slices"
	"time"

	tollgate "github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/config"
)

// exampleFleetModel is config.example.yaml's model served by a fleet of simulated vLLM
// servers: -fleet runs its servers with that fleet's size and physics, so that what the
// bench measures is what a newcomer can try.
const exampleFleetModel = "demo-fleet"

// fleetEngine is the physics of the simulated vLLM servers of -fleet.
type fleetEngine struct {
	servers                    int
	ttft, prefillPerToken, itl time.Duration
	loadFactor                 float64
	maxNumSeqs, kvBlocks       int
	blockSize                  int
	priorityPreemption         bool
}

// exampleFleet reads the fleet of exampleFleetModel from the embedded config.example.yaml.
func exampleFleet() (fleetEngine, error) {
	cfg, err := config.Parse(tollgate.ExampleConfig(), "config.example.yaml (embedded)")
	if err != nil {
		return fleetEngine{}, err
	}
	return fleetOf(cfg, exampleFleetModel)
}

// fleetOf is the fleet serving model in cfg: its backends must all be simulated with one
// engine that has a running limit (the scheduler's subject) and says its block size (which
// the report states).
func fleetOf(cfg *config.Config, model string) (fleetEngine, error) {
	i := slices.IndexFunc(cfg.Models, func(m config.Model) bool { return m.Name == model })
	if i < 0 {
		return fleetEngine{}, fmt.Errorf("model %s: not in the config", model)
	}
	var e fleetEngine
	for n, name := range cfg.Models[i].Backends {
		b := cfg.Backends[slices.IndexFunc(cfg.Backends, func(b config.Backend) bool { return b.Name == name })]
		if b.Simulated == nil {
			return fleetEngine{}, fmt.Errorf("model %s: backend %s is not simulated", model, name)
		}
		s := b.Simulated
		got := fleetEngine{ttft: s.TimeToFirstToken, prefillPerToken: s.PrefillPerToken, itl: s.InterTokenDelay,
			loadFactor: max(s.LoadFactor, 1), maxNumSeqs: s.MaxNumSeqs, kvBlocks: s.KVCacheBlocks,
			blockSize: s.BlockSize, priorityPreemption: s.PriorityPreemption}
		if n > 0 && got != e {
			return fleetEngine{}, fmt.Errorf("model %s: backend %s is simulated unlike %s", model, name, cfg.Models[i].Backends[0])
		}
		e = got
	}
	e.servers = len(cfg.Models[i].Backends)
	if e.servers < 2 || e.maxNumSeqs == 0 || e.blockSize == 0 {
		return fleetEngine{}, errors.New("model " + model + ": want two backends or more, simulated with max_num_seqs and block_size")
	}
	return e, nil
}
