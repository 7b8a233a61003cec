// Package bare is the forwarder of the floors tollbench measures the
// gateway against (cmd/bareproxy, cmd/barestore), and that proxy's
// BenchmarkBareProxyTCP sets beside the gateway's: a reverse proxy that
// does nothing but forward, on the same fasthttp server and client as the
// gateway, with keep-alive upstream connections and response bodies
// streamed through as they arrive; and the main and flags the two
// commands share.
package bare

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

// Main runs a command built on the forwarder: run with the process's
// arguments and output and a context that ends on SIGINT or SIGTERM,
// exiting with status 1, its error printed after name, when it fails (a -h
// has printed the usage already).
func Main(name string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, name+":", err)
		}
		os.Exit(1)
	}
}

// Flags are the flags both commands take: where to listen and the
// upstream to forward to.
type Flags struct {
	Listen, Upstream *string
}

// AddFlags defines Flags on fs.
func AddFlags(fs *flag.FlagSet) Flags {
	return Flags{
		Listen:   fs.String("listen", "127.0.0.1:0", "listen `address`"),
		Upstream: fs.String("upstream", "", "the backend's `host:port`, reached over plain HTTP"),
	}
}

// ReplyFunc is told of every reply the upstream gave: its status and when
// the request came in.
type ReplyFunc func(started time.Time, status int)

// Proxy forwards every request to one upstream.
type Proxy struct {
	client *fasthttp.HostClient
	srv    *fasthttp.Server
	// onReply, when set, is called for every reply before it is written
	// back; nil calls nothing, and the forwarder reads no clock.
	onReply ReplyFunc
	// streams, when set (HandOverStreams), are the streams written by
	// goroutines of their own; nil leaves every stream to fasthttp's
	// worker.
	streams *streamConns
}

// New returns a Proxy forwarding to upstream (host:port, plain HTTP),
// calling onReply, when not nil, for every reply.
func New(upstream string, onReply ReplyFunc) *Proxy {
	p := &Proxy{onReply: onReply, client: &fasthttp.HostClient{
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

// Run listens on listen, prints "NAME: serving on http://ADDR upstream
// UPSTREAM" to stdout (tollbench waits for that line) and serves until ctx
// ends.
func (p *Proxy) Run(ctx context.Context, name, listen string, stdout io.Writer) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	fmt.Fprintf(stdout, "%s: serving on http://%s upstream %s\n", name, ln.Addr(), p.client.Addr)
	return p.Serve(ctx, ln)
}

// Serve serves on ln until ctx ends, then shuts down and closes the idle
// upstream connections.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	defer p.client.CloseIdleConnections()
	errc := make(chan error, 1)
	go func() { errc <- p.srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	if p.streams != nil {
		// fasthttp's Shutdown waits for connections served again after
		// a stream until they have idled for seconds.
		p.streams.closeAll()
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.srv.ShutdownWithContext(sctx)
	if p.streams != nil && err == nil {
		// Every handler has returned, so every stream is counted; each
		// ends at its upstream's next read.
		p.streams.running.Wait()
	}
	return errors.Join(err, <-errc)
}

// forward sends the request upstream as it came and copies the reply back.
// The upstream body is handed to the server as a stream; one of unknown
// length is written a read at a time, each read one chunk, flushed, so SSE
// events pass through as they arrive.
func (p *Proxy) forward(ctx *fasthttp.RequestCtx) {
	var started time.Time
	if p.onReply != nil {
		started = time.Now()
	}
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
	if p.onReply != nil {
		p.onReply(started, resp.StatusCode())
	}
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	if body := resp.BodyStream(); body != nil {
		if p.streams != nil && resp.Header.ContentLength() == -1 {
			p.handOver(ctx, resp, body)
			return
		}
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
