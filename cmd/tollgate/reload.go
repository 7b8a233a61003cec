package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"reflect"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/proxy"
)

// generation is the part of a running gateway that a reload replaces:
// backends and their health checks, and the limiter built from the
// configured limits.
type generation struct {
	cfg      *config.Config
	registry *backends.Registry
	health   *backends.HealthChecker
	limiter  proxy.Limiter
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
	return &generation{cfg: cfg, registry: reg, health: reg.StartHealthChecks(), limiter: limiter}, nil
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
// flight finish on the old one. An invalid file changes nothing.
func (g *gateway) reload(ctx, stop context.Context) error {
	if g.cfgPath == "" {
		return errors.New("the embedded configuration has no file to reload")
	}
	cfg, err := config.Load(g.cfgPath)
	if err != nil {
		return err
	}
	g.mu.Lock()
	current := g.gen.cfg
	g.mu.Unlock()
	for _, what := range restartOnly(current, cfg) {
		g.log.Warn("configuration change needs a restart to take effect", zap.String("section", what))
	}
	gen, err := g.newGeneration(ctx, cfg)
	if err != nil {
		return err
	}
	if err := g.keys.Replace(cfg.Auth); err != nil {
		return errors.Join(err, gen.close())
	}
	_, drained := g.proxy.Swap(proxy.Generation{Config: cfg, Registry: gen.registry, Limiter: gen.limiter})
	// The metrics follow the new configuration: its backends' and models'
	// gauges, and the teams and projects it names.
	g.backendMetrics.Track(gen.registry)
	g.recorder.SetLabelPolicy(accounting.NewLabelPolicy(cfg))
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
	return nil
}

// restartOnly names the sections that changed between old and cfg but
// take effect only at start: listeners, the store, the usage queue, logging
// and server limits.
func restartOnly(old, cfg *config.Config) []string {
	var changed []string
	for _, s := range []struct {
		name     string
		old, new any
	}{
		{"listen", old.Listen, cfg.Listen},
		{"admin_listen", old.AdminListen, cfg.AdminListen},
		{"log", old.Log, cfg.Log},
		{"server", old.Server, cfg.Server},
		{"store", old.Store, cfg.Store},
		{"usage", old.Usage, cfg.Usage},
		{"limits_backend", old.LimitsBackend, cfg.LimitsBackend},
		{"retries", old.Retries, cfg.Retries},
		{"traces", old.Traces, cfg.Traces},
	} {
		if !reflect.DeepEqual(s.old, s.new) {
			changed = append(changed, s.name)
		}
	}
	return changed
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
	last := fileStamp(g.cfgPath)
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
		if err := g.reload(ctx, ctx); err != nil {
			g.log.Error("configuration reload refused; the previous configuration keeps serving", zap.Error(err))
			continue
		}
		g.log.Info("configuration reloaded", zap.String("path", g.cfgPath))
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
