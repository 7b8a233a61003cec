// Command mockllm runs the simulated OpenAI-compatible backend on its own (chat and text
// completions, embeddings, the Responses API, models), for manual testing and for load tests
// that want the backend in another process:
//
//	mockllm -listen 127.0.0.1:8000 -ttft 20ms -itl 5ms -tokens 16 -model mock
//
// It stops gracefully on SIGINT or SIGTERM, letting in-flight streams finish; a second signal
// kills it at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tollgate-dev/tollgate/backends/simulated"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mockllm:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("mockllm", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8000", "address to listen on (port 0 picks a free port)")
	ttft := fs.Duration("ttft", 0, "time to first token")
	itl := fs.Duration("itl", 0, "delay between streamed tokens")
	tokens := fs.Int("tokens", 16, "completion length when the request sets no max_tokens")
	models := fs.String("model", "", "comma-separated model ids to serve; empty accepts any model")
	failStatus := fs.Int("fail-status", 0, "answer every request with this status (0: never)")
	dims := fs.Int("embedding-dims", 8, "length of /v1/embeddings vectors when the request sets no dimensions")
	prefixCache := fs.Int("prefix-cache", 0, "prompt prefixes remembered for cached_tokens (0: no cache)")
	stored := fs.Int("stored-responses", 1024, "Responses API responses kept for GET, DELETE and previous_response_id")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}

	var ids []string
	for m := range strings.SplitSeq(*models, ",") {
		if m = strings.TrimSpace(m); m != "" {
			ids = append(ids, m)
		}
	}
	srv := simulated.New(simulated.Options{
		TimeToFirstToken:    *ttft,
		InterTokenDelay:     *itl,
		Tokens:              *tokens,
		Models:              ids,
		FailStatus:          *failStatus,
		EmbeddingDimensions: *dims,
		PrefixCache:         *prefixCache,
		StoredResponses:     *stored,
	})

	// Listening here rather than in ListenAndServe lets us print the real address when the port
	// is 0, which scripts starting mockllm need.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "mockllm: serving on http://%s (ttft=%s itl=%s tokens=%d models=%q)\n",
		ln.Addr(), *ttft, *itl, *tokens, ids)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case err := <-served:
		// Serve only returns on its own when accepting fails for good.
		return err
	case <-ctx.Done():
	}
	// Restore default signal handling so that a second signal ends a shutdown stuck on a
	// client that never finishes reading its stream.
	stop()
	fmt.Fprintln(os.Stderr, "mockllm: shutting down, waiting for in-flight requests")
	shutdownErr := srv.Shutdown()
	return errors.Join(<-served, shutdownErr)
}
