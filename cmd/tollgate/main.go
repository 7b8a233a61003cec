// Command tollgate is the inference gateway.
//
//	tollgate [-config FILE] [-listen ADDR]   run the gateway
//	tollgate -check-config FILE              validate a config and exit
//	tollgate usage -config FILE [-since 24h] [-by project|model|key]
//
// Without -config (or TOLLGATE_CONFIG) it runs on the embedded
// config.example.yaml: a simulated backend and an SQLite file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	tollgate "github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/config"
)

func main() {
	// The gateway serves no profiles, so the runtime's sampling of heap
	// allocations (one every 512 KiB by default) only costs memory: its
	// 1.4 MB hash table of call stacks, touched a page per stack it
	// records, and the records, which stay resident after load. A build
	// that wants heap profiles sets the rate again after this.
	runtime.MemProfileRate = 0
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "tollgate:", err)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "usage" {
		return runUsage(args[1:], stdout)
	}
	fs := flag.NewFlagSet("tollgate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", os.Getenv("TOLLGATE_CONFIG"), "configuration `file` (default: the embedded config.example.yaml; env TOLLGATE_CONFIG)")
	listen := fs.String("listen", "", "listen `address`, overriding the config's listen")
	check := fs.String("check-config", "", "validate the configuration `file` and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (subcommands: usage)", fs.Arg(0))
	}
	if *check != "" {
		if _, err := config.Load(*check); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: configuration is valid\n", *check)
		return nil
	}
	cfg, err := loadConfig(*configPath)
	if err != nil {
		return err
	}
	// -listen replaces the address, not the configuration's listen: a
	// reload compares the file with the configuration, and the file did
	// not change.
	addr := cfg.Listen
	if *listen != "" {
		if _, _, err := net.SplitHostPort(*listen); err != nil {
			return fmt.Errorf("-listen %q: %w", *listen, err)
		}
		addr = *listen
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serve(ctx, cfg, addr, stderr)
}

// loadConfig loads path, or the embedded example when path is empty.
func loadConfig(path string) (*config.Config, error) {
	if path == "" {
		return config.Parse(tollgate.ExampleConfig(), "config.example.yaml (embedded)")
	}
	return config.Load(path)
}
