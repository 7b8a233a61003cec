// Command bareproxy is the floor tollbench measures the gateway against: a
// reverse proxy that does nothing but forward, on the same fasthttp server
// and client as the gateway, with keep-alive upstream connections and
// response bodies streamed through as they arrive. It does no validation,
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
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
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
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := newProxy(*upstream)
	fmt.Fprintf(stdout, "bareproxy: serving on http://%s upstream %s\n", ln.Addr(), *upstream)
	return p.serve(ctx, ln)
}

// proxy forwards every request to one upstream.
type proxy struct {
	client *fasthttp.HostClient
	srv    *fasthttp.Server
}

func newProxy(upstream string) *proxy {
	p := &proxy{client: &fasthttp.HostClient{
		Addr:                     upstream,
		MaxConns:                 100000,
		MaxIdleConnDuration:      time.Minute,
		StreamResponseBody:       true,
		ReadBufferSize:           16 << 10,
		NoDefaultUserAgentHeader: true,
	}}
	// The server's settings are the gateway's where they bear on cost.
	p.srv = &fasthttp.Server{
		Handler:               p.forward,
		Name:                  "bareproxy",
		NoDefaultServerHeader: true,
		ReduceMemoryUsage:     true,
		Concurrency:           100001,
		CloseOnShutdown:       true,
	}
	return p
}

// serve serves on ln until ctx ends, then shuts down.
func (p *proxy) serve(ctx context.Context, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- p.srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.srv.ShutdownWithContext(sctx)
	return errors.Join(err, <-errc)
}

// forward sends the request upstream as it came and copies the reply back.
// The upstream body is handed to the server as a stream; one of unknown
// length is written a read at a time, each read one chunk, flushed, so SSE
// events pass through as they arrive.
func (p *proxy) forward(ctx *fasthttp.RequestCtx) {
	req := fasthttp.AcquireRequest()
	ctx.Request.CopyTo(req)
	resp := fasthttp.AcquireResponse()
	err := p.client.Do(req, resp)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		ctx.Error("upstream: "+err.Error(), fasthttp.StatusBadGateway)
		return
	}
	ctx.SetStatusCode(resp.StatusCode())
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	if body := resp.BodyStream(); body != nil {
		// The server closes the stream once it is written; closing
		// releases the response and its upstream connection. A body of
		// unknown length (an SSE stream) goes out chunked.
		ctx.SetBodyStream(&releasingBody{Reader: body, resp: resp}, resp.Header.ContentLength())
		return
	}
	ctx.Response.SetBody(resp.Body())
	fasthttp.ReleaseResponse(resp)
}

// releasingBody is an upstream body stream that releases its response
// when the server is done with it.
type releasingBody struct {
	io.Reader
	resp *fasthttp.Response
}

func (b *releasingBody) Close() error {
	err := b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	return err
}
