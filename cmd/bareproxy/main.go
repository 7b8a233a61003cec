// Command bareproxy is the floor tollbench measures the gateway against: a
// reverse proxy that does nothing but forward (package bare), on the same
// fasthttp server and client as the gateway. It does no validation,
// routing, accounting or logging, so what the gateway costs beyond it is
// the price of those jobs.
//
//	bareproxy -upstream 127.0.0.1:9000 [-listen 127.0.0.1:0] [-handover]
//
// With -handover it writes each stream from a goroutine of the stream's
// own, once fasthttp has handed the connection over, as the gateway does
// to hold an open stream in little memory (bare.Proxy.HandOverStreams):
// the floor of that design.
//
// It prints "bareproxy: serving on http://ADDR" once it listens, and stops
// on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"io"

	"github.com/tollgate-dev/tollgate/internal/bare"
)

func main() { bare.Main("bareproxy", run) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bareproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := bare.AddFlags(fs)
	handOver := fs.Bool("handover", false, "write each stream from a goroutine of its own, as the gateway does, instead of fasthttp's worker")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *f.Upstream == "" {
		return errors.New("-upstream is required")
	}
	p := bare.New(*f.Upstream, nil)
	if *handOver {
		p.HandOverStreams()
	}
	return p.Run(ctx, "bareproxy", *f.Listen, stdout)
}
