// Command bareproxy is the floor tollbench measures the gateway against: a
// reverse proxy that does nothing but forward (package bare), on the same
// fasthttp server and client as the gateway. It does no validation,
// routing, accounting or logging, so what the gateway costs beyond it is
// the price of those jobs.
//
//	bareproxy -upstream 127.0.0.1:9000 [-listen 127.0.0.1:0]
//
// It prints "bareproxy: serving on http://ADDR" once it listens, and stops
// on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tollgate-dev/tollgate/cmd/internal/bare"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bareproxy:", err)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bareproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "listen `address`")
	upstream := fs.String("upstream", "", "the backend's `host:port`, reached over plain HTTP")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *upstream == "" {
		return errors.New("-upstream is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return bare.New(*upstream, nil).Run(ctx, "bareproxy", *listen, stdout)
}
