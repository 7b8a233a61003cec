package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/proxy"
)

// generation is the part of a running gateway that a reload replaces:
// backends and their health checks, the limiter built from the configured
// limits, and the models' prices the trace service costs calls with.
type generation struct {
	cfg      *config.Config
	registry *backends.Registry
	health   *backends.HealthChecker
	limiter  proxy.Limiter
	pricing  map[string]config.Pricing
}

// newGeneration builds backends and the limiter for cfg, with budgets
// restored from the store.
func (g *gateway) newGeneration(ctx context.Context, cfg *config.Config) (*generation, error) {
	limiter, err := g.newLimiter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	reg, err := backends.NewRegistryWith(cfg, backends.RegistryOptions{Metrics: g.backendMetrics})
	if err != nil {
		if c, ok := limiter.(interface{ Close() error }); ok {
			err = errors.Join(err, c.Close())
		}
		return nil, err
	}
	return &generation{cfg: cfg, registry: reg, health: reg.StartHealthChecks(), limiter: limiter, pricing: modelPricing(cfg)}, nil
}

// modelPricing is the configuration's price of each model.
func modelPricing(cfg *config.Config) map[string]config.Pricing {
	pricing := make(map[string]config.Pricing, len(cfg.Models))
	for _, m := range cfg.Models {
		pricing[m.Name] = m.Pricing
	}
	return pricing
}

// restorer is a limiter that loads the current windows' spend from the
// store, so budgets survive a restart.
type restorer interface {
	proxy.Limiter
	Restore(ctx context.Context, st accounting.LimitsStore) error
}

// newLimiter builds the limiter limits_backend selects: counters in this
// process, or in Redis shared by every replica (falling back to local
// counters while Redis fails).
func (g *gateway) newLimiter(ctx context.Context, cfg *config.Config) (proxy.Limiter, error) {
	var l restorer
	if cfg.LimitsBackend.Driver == "redis" {
		rl, err := accounting.NewRedisLimiter(cfg.Limits, cfg.LimitsBackend, time.Now, g.log, g.metrics)
		if err != nil {
			return nil, err
		}
		l = rl
	} else {
		l = accounting.NewLimiter(cfg.Limits, time.Now)
	}
	if err := l.Restore(ctx, g.store); err != nil {
		err = fmt.Errorf("restore budgets: %w", err)
		if c, ok := l.(interface{ Close() error }); ok {
			err = errors.Join(err, c.Close())
		}
		return nil, err
	}
	return l, nil
}

// close stops the generation's health checks and backends.
func (gen *generation) close() error {
	gen.health.Stop()
	var errs []error
	errs = append(errs, gen.registry.Close())
	if c, ok := gen.limiter.(interface{ Close() error }); ok {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// reload reads the configuration file again and, if it is valid, swaps in
// a new generation: new requests use the new configuration, requests in
// flight finish on the old one. Restart-only settings keep the values the
// process started with (config.Reloaded). It returns what the file changed,
// applied or needing a restart. An invalid file changes nothing.
func (g *gateway) reload(ctx, stop context.Context) (config.ReloadChanges, error) {
	if g.cfgPath == "" {
		return config.ReloadChanges{}, errors.New("the embedded configuration has no file to reload")
	}
	loaded, err := config.Load(g.cfgPath)
	if err != nil {
		return config.ReloadChanges{}, err
	}
	g.mu.Lock()
	current := g.gen.cfg
	g.mu.Unlock()
	// current holds the restart-only values the process started with, so
	// a change to one is reported at every reload until a restart.
	changes := config.DiffReload(current, loaded)
	cfg := config.Reloaded(current, loaded)
	gen, err := g.newGeneration(ctx, cfg)
	if err != nil {
		return config.ReloadChanges{}, err
	}
	// New prices apply from now on; past usage keeps the prices it had.
	if err := g.store.RecordPrices(ctx, gen.pricing, time.Now()); err != nil {
		return config.ReloadChanges{}, errors.Join(err, gen.close())
	}
	if err := g.keys.Replace(cfg.Auth); err != nil {
		return config.ReloadChanges{}, errors.Join(err, gen.close())
	}
	g.enforcer.SetPricing(gen.pricing)
	_, drained := g.proxy.Swap(proxy.Generation{Config: cfg, Registry: gen.registry, Limiter: gen.limiter})
	// The metrics follow the new configuration: the teams and projects it
	// names, and its backends' and models' gauges.
	g.recorder.SetLabelPolicy(accounting.NewLabelPolicy(cfg))
	g.spans.SetBackends(cfg.Backends)
	g.backendMetrics.Track(gen.registry)
	g.mu.Lock()
	prev := g.gen
	g.gen = gen
	g.mu.Unlock()
	// The previous generation is closed once no request uses it; until
	// then its requests, streams included, finish on it. Shutdown cuts the
	// wait short (stop), after the servers have drained.
	g.retiring.Add(1)
	go func() {
		defer g.retiring.Done()
		if err := drained(stop); err != nil {
			g.log.Warn("closing the previous configuration's backends with requests still using them", zap.Error(err))
		}
		if err := prev.close(); err != nil {
			g.log.Error("closing the previous configuration's backends", zap.Error(err))
		}
	}()
	return changes, nil
}

// watchReloads reloads on SIGHUP and, when reload.watch is on, when the
// configuration file changes, until ctx ends. It returns when done.
func (g *gateway) watchReloads(ctx context.Context, cfg *config.Config) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var tick <-chan time.Time
	if cfg.Reload.Watch && g.cfgPath != "" {
		t := time.NewTicker(cfg.Reload.Interval)
		defer t.Stop()
		tick = t.C
	}
	last := g.cfgStamp
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		case <-tick:
			stamp := fileStamp(g.cfgPath)
			if stamp == last {
				continue
			}
			last = stamp
		}
		changes, err := g.reload(ctx, ctx)
		if err != nil {
			g.log.Error("configuration reload refused; the previous configuration keeps serving", zap.Error(err))
			continue
		}
		logReload(g.log, g.cfgPath, changes)
	}
}

// stamp identifies a version of a file by its modification time and size.
type stamp struct {
	mod  time.Time
	size int64
}

func fileStamp(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}
	}
	return stamp{fi.ModTime(), fi.Size()}
}

// logReload logs one line per reload: the settings it applied, and those
// that changed in the file but keep their running values until a restart
// (a warning then, since the file and the process disagree).
func logReload(log *zap.Logger, path string, ch config.ReloadChanges) {
	fields := []zap.Field{zap.String("path", path), zap.Strings("applied", ch.Applied), zap.Strings("needs_restart", ch.NeedsRestart)}
	if len(ch.NeedsRestart) > 0 {
		log.Warn("configuration reloaded; some changes need a restart to take effect", fields...)
		return
	}
	log.Info("configuration reloaded", fields...)
}
