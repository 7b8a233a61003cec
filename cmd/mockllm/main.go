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
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tollgate-dev/tollgate/backends/simulated"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Restoring default signal handling once the first signal arrives lets a second signal end
	// a shutdown stuck on a client that never finishes reading its stream.
	context.AfterFunc(ctx, stop)
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mockllm:", err)
		os.Exit(1)
	}
}

// config is what the command line asks for.
type config struct {
	listen string
	opts   simulated.Options
}

// parseFlags reads the command line; flag.ErrHelp means -h was asked for.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("mockllm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8000", "address to listen on (port 0 picks a free port)")
	ttft := fs.Duration("ttft", 0, "time to first token")
	itl := fs.Duration("itl", 0, "delay between streamed tokens")
	tokens := fs.Int("tokens", 16, "completion length when the request sets no max_tokens")
	models := fs.String("model", "", "comma-separated model ids to serve; empty accepts any model")
	failStatus := fs.Int("fail-status", 0, "answer every request with this status (0: never)")
	dims := fs.Int("embedding-dims", 8, "length of /v1/embeddings vectors when the request sets no dimensions")
	prefixCache := fs.Int("prefix-cache", 0, "prompt prefixes remembered for cached_tokens (0: no cache)")
	varied := fs.Bool("varied", false, "requests without a seed sample different text each time (default: the same tok0 tok1 … text)")
	stored := fs.Int("stored-responses", 1024, "Responses API responses kept for GET, DELETE and previous_response_id")
	var e simulated.Engine
	fs.IntVar(&e.MaxNumSeqs, "max-num-seqs", 0, "sequences running at once; more wait in a queue (0: no limit, no queue)")
	fs.DurationVar(&e.PrefillPerToken, "prefill-per-token", 0, "prefill time of each prompt token not in the prefix cache, added to -ttft (0: -ttft whatever the prompt)")
	fs.IntVar(&e.KVCacheBlocks, "kv-cache-blocks", 0, "prefix cache size in blocks; cached leading blocks skip prefill (0: no block cache)")
	fs.IntVar(&e.BlockSize, "block-size", 16, "tokens of a prefix cache block")
	fs.Float64Var(&e.LoadFactor, "load-factor", 0, "prefill and token delays multiply by this with -max-num-seqs running, from 1 with one (0: no slowdown)")
	loras := fs.String("loras", "", "comma-separated LoRA adapters served besides the base model (empty: none)")
	fs.IntVar(&e.MaxLoRAs, "max-loras", 1, "adapters loaded at once")
	fs.DurationVar(&e.LoRALoadTime, "lora-load-time", 0, "added to the first token of a request whose adapter had to be loaded")
	fs.BoolVar(&e.PriorityPreemption, "priority-preemption", false, "a request arriving while -max-num-seqs run preempts the running sequence of the lowest priority, if lower than its own (vLLM's priority policy)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	ids := splitList(*models)
	e.LoRAs = splitList(*loras)
	return config{listen: *listen, opts: simulated.Options{
		TimeToFirstToken:    *ttft,
		InterTokenDelay:     *itl,
		Tokens:              *tokens,
		Models:              ids,
		FailStatus:          *failStatus,
		EmbeddingDimensions: *dims,
		PrefixCache:         *prefixCache,
		StoredResponses:     *stored,
		VariedText:          *varied,
		Engine:              e,
	}}, nil
}

// splitList splits a comma-separated flag, dropping empty items.
func splitList(s string) []string {
	var out []string
	for m := range strings.SplitSeq(s, ",") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}

// run serves until ctx is done, then shuts down gracefully.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	srv := simulated.New(cfg.opts)

	// Listening here rather than in ListenAndServe lets us print the real address when the port
	// is 0, which scripts starting mockllm need.
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	o := cfg.opts
	fmt.Fprintf(stderr, "mockllm: serving on http://%s (ttft=%s itl=%s tokens=%d models=%q)\n",
		ln.Addr(), o.TimeToFirstToken, o.InterTokenDelay, o.Tokens, o.Models)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		// Serve only returns on its own when accepting fails for good.
		return err
	case <-ctx.Done():
	}
	fmt.Fprintln(stderr, "mockllm: shutting down, waiting for in-flight requests")
	shutdownErr := srv.Shutdown()
	return errors.Join(<-served, shutdownErr)
}
