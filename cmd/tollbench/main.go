// Command tollbench measures what the gateway costs on top of a backend.
//
//	go run ./cmd/tollbench [-quick] [-json FILE] [flags]
//
// It builds and starts the gateway (cmd/tollgate), mock backends
// (cmd/mockllm) and bare proxies (cmd/bareproxy: a fasthttp forwarder that
// does nothing else, the physical floor of the gateway's job) as separate
// processes, the gateway configured as a user runs it: usage accounting
// into SQLite, an API key, models routed to the mocks over TCP on
// 127.0.0.1. An in-process load generator built on the fasthttp client then
// alternates phases sent straight to a mock, through the bare proxy and
// through the gateway (direct, bare, gateway, direct, bare, gateway, ...),
// pooling the samples of each side, so that drift on a noisy machine hits
// every side alike. It reports what the gateway adds as a ratio to what the
// bare proxy adds, measured in the same run: latency at fixed open-loop
// rates, throughput and CPU time per request in a closed loop, streaming
// latency; and the gateway's memory after load and per open stream, each
// next to its goal. Every phase is bounded in time; the children are stopped with
// SIGTERM at the end, on error and on Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "tollbench:", err)
		}
		os.Exit(1)
	}
}

// options are the command-line settings.
type options struct {
	phase        time.Duration
	rounds       int
	warmup       time.Duration
	rates        []int
	openConns    int
	conns        int
	streamConc   int
	streamTokens int
	streamITL    time.Duration
	openStreams  []int
	slowITL      time.Duration
	jsonPath     string
	binDir       string
	keep         bool
	logLevel     string
	// bareStore has the bare proxy record each request in an SQLite file
	// as the gateway does (cmd/barestore), so that the bare column is the
	// floor of a proxy that accounts durably; false measures the plain
	// forwarder.
	bareStore bool
	// bareHandOver adds a floor stream phase that sets a plain bare proxy
	// beside one that hands its streams over as the gateway does
	// (bareproxy -handover); false runs none.
	bareHandOver bool

	// only names the one part to run: "soak" skips the measurements
	// against the bare proxy, "streams" runs only the stream phases and
	// "open" only the open loops; empty runs everything.
	only string
	// soak is the length of the soak load; 0 runs no soak.
	soak            time.Duration
	soakWarmup      time.Duration
	soakRate        int
	soakStreamShare float64
	soakAbandon     float64

	// fleet runs the fleet measurement of issue 35 (fleet.go) instead of everything else.
	fleet bool
	// fleetPhase is the length of each of its phases.
	fleetPhase time.Duration
	// fleetLog is where -fleet writes its scenarios' request log; empty writes none.
	fleetLog string
	// fleetReserve is the scenarios' model's queue.reserve; zero leaves the default.
	fleetReserve int
	// fleetApps is how many apps, each with its own system prompt, the workload's
	// conversations share; fleetNoSpread leaves the models' routing.spread off.
	fleetApps     int
	fleetNoSpread bool
	// fleetColdGateway measures tollgate's first conversation phase from a freshly started
	// gateway; false runs an unmeasured phase through it first.
	fleetColdGateway bool
	// seed makes its workload.
	seed int64

	// instructions, when more than 0, counts instructions per request
	// under valgrind instead of everything else (instructions.go): the
	// requests the second run of each side sends beyond the first's.
	instructions int
	// otel has the gateway export a span per request to a collector in
	// tollbench (otelsink.go); false leaves export off.
	otel bool
	// instrFleet has -instructions send the fleet's requests (a turn of
	// a conversation with a long system prompt) to a model of as many
	// backends as the example fleet's, in place of a short chat to one.
	instrFleet bool
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("tollbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.phase, "duration", 5*time.Second, "length of each measured phase; every measurement runs `rounds` phases on each side (direct, bare proxy, gateway)")
	fs.IntVar(&o.rounds, "rounds", 2, "direct/bare/gateway alternations per measurement; samples of each side are pooled")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load on each side before the first phase")
	rates := fs.String("rates", "1000,2000", "comma-separated open-loop `rates` in requests per second (non-streaming)")
	fs.IntVar(&o.openConns, "open-conns", 256, "most connections (and in-flight requests) of the open-loop generator")
	fs.IntVar(&o.conns, "conns", 64, "connections of the closed-loop throughput phase")
	fs.IntVar(&o.streamConc, "stream-conc", 16, "concurrent streams of the streaming latency phase")
	fs.IntVar(&o.streamTokens, "stream-tokens", 64, "tokens per stream in the streaming latency phase (mockllm -tokens, request max_tokens)")
	fs.DurationVar(&o.streamITL, "stream-itl", 5*time.Millisecond, "delay between stream events in the streaming latency phase (mockllm -itl)")
	streams := fs.String("streams", "1000,9000", "comma-separated `counts` of concurrent slow streams to measure memory per stream with")
	fs.DurationVar(&o.slowITL, "slow-itl", time.Second, "delay between events of the slow streams held open for the memory measurement")
	fs.StringVar(&o.jsonPath, "json", "", "also write the results as JSON to `file`")
	quick := fs.Bool("quick", false, "smoke run of about 30 s: 1 s phases, one round, 1,000 open streams (explicit flags still win)")
	fs.StringVar(&o.binDir, "bin-dir", "", "use the tollgate, mockllm and bareproxy (and, with -bare-store, barestore) binaries in `dir` instead of building them")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's directory (config, logs, SQLite file) and print where it is")
	fs.StringVar(&o.logLevel, "gateway-log-level", "info", "the gateway's log.level; info logs a line per request, as a default install does")
	fs.BoolVar(&o.bareStore, "bare-store", false, "measure against cmd/barestore, the bare proxy that also records every request in an SQLite file through "+
		"the gateway's usage writer: the bare column is then the floor of a proxy that accounts durably; floor phases "+
		"after the closed loop compare it with a plain bare proxy in one run: a closed loop (with the gateway too) and open loops at -rates")
	fs.BoolVar(&o.bareHandOver, "bare-handover", false, "after the stream phase, measure streams through a plain bare proxy and through one that "+
		"writes each stream from a goroutine of its own, as the gateway does to hold open streams in little memory (bareproxy -handover): "+
		"what that design costs the time to first event by itself")
	fs.StringVar(&o.only, "only", "", "run only this `part`: soak skips the direct/bare/gateway measurements (then -soak must be set); "+
		"streams measures only the streaming latency and, unless -streams is empty, the open streams; "+
		"open measures only the open loops at -rates; with -fleet, conversations runs the routings' phases alone, fairness or priority that scenario alone")
	fs.DurationVar(&o.soak, "soak", 0, "after the measurements, hold the gateway under a mixed open-loop load for `duration` and check "+
		"that its memory, goroutines, descriptors and in-flight gauges come back to where they were after the warm-up; 0 runs no soak")
	fs.DurationVar(&o.soakWarmup, "soak-warmup", time.Minute, "load of the soak's mix before its baseline is sampled")
	fs.IntVar(&o.soakRate, "soak-rate", 1000, "open-loop `rate` of the soak, in requests per second")
	fs.Float64Var(&o.soakStreamShare, "soak-stream-share", 0.25, "share of the soak's requests that are streams (-stream-tokens events at -stream-itl)")
	fs.Float64Var(&o.soakAbandon, "soak-abandon", 0.1, "share of the soak's streams the client closes after the first event")
	fs.BoolVar(&o.fleet, "fleet", false, "measure placement instead: config.example.yaml's fleet (model demo-fleet: its simulated vLLM servers, run in this process) behind the gateway, "+
		"a seeded multi-turn chat workload through tollgate's scheduler, round-robin and a pinned-conversation oracle in alternated "+
		"phases, then a fairness and a priority scenario; -rounds, -json, -keep, -bin-dir and -gateway-log-level apply")
	fs.DurationVar(&o.fleetPhase, "fleet-duration", 20*time.Second, "length of each -fleet phase (the first fifth is not measured)")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the -fleet workload")
	fs.BoolVar(&o.fleetColdGateway, "fleet-cold-gateway", false, "with -fleet, measure tollgate's first conversation phase from the freshly started gateway, "+
		"instead of running one unmeasured phase through it first, as a gateway in service has learned its servers' running limits and how long their tokens are")
	fs.IntVar(&o.fleetApps, "fleet-apps", fleetApps, "the -fleet workload's apps, each with a system prompt of its own; more than the servers' caches can each hold measures a fleet that should not spread them")
	fs.BoolVar(&o.fleetNoSpread, "fleet-no-spread", false, "leave routing.spread off on the -fleet models, its default, instead of on")
	fs.IntVar(&o.fleetReserve, "fleet-reserve", 0, "the queue.reserve of the -fleet scenarios' model, in slots; 0 leaves the default, -1 keeps none")
	fs.StringVar(&o.fleetLog, "fleet-log", "", "write a JSON line per -fleet request (each conversation's turn, each scenario's request) to `file`: its tenant or turn, time to first token, "+
		"the server it ran on, its time in the gateway and in the server's queue, the batch it joined, its cached tokens, and for a cold one "+
		"what every server held of its prompt then")
	fs.IntVar(&o.instructions, "instructions", 0, "count instead the user-space instructions the gateway and the bare proxy execute per request "+
		"under valgrind's cachegrind, which a busy host does not change: each side serves 1,000 requests, then 1,000 + `n` in a second run, "+
		"per round (-rounds); -bin-dir, -json and -keep apply; 0 runs the usual measurements")
	fs.BoolVar(&o.otel, "otel", false, "have the gateway export its OpenTelemetry spans (telemetry.endpoint, default batching) to an OTLP/HTTP collector in this process, "+
		"which decodes each export and counts its spans; with -instructions, each gateway run must export a span per request")
	fs.BoolVar(&o.instrFleet, "instructions-fleet", false, "with -instructions, send the -fleet workload's requests (turns of its conversations, "+
		"each with its app's long system prompt; -seed applies) to a model of as many backends on the mock as the example fleet has, as the scheduler places them")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["duration"] {
			o.phase = time.Second
		}
		if !set["rounds"] {
			o.rounds = 1
		}
		if !set["warmup"] {
			o.warmup = 300 * time.Millisecond
		}
		if !set["streams"] {
			*streams = "1000"
		}
	}
	var err error
	if o.rates, err = parseInts(*rates, "-rates"); err != nil {
		return o, err
	}
	if o.openStreams, err = parseInts(*streams, "-streams"); err != nil {
		return o, err
	}
	switch {
	case o.instructions < 0 || o.instructions > 1000000:
		return o, fmt.Errorf("-instructions %d: want 0 to 1000000", o.instructions)
	case o.instrFleet && o.instructions == 0:
		return o, errors.New("-instructions-fleet needs -instructions")
	case o.otel && o.fleet:
		return o, errors.New("-otel applies to the gateway's own measurements and -instructions, not to -fleet")
	case o.fleetApps < 1 || o.fleetApps > fleetConversations:
		return o, fmt.Errorf("-fleet-apps %d: want 1 to %d", o.fleetApps, fleetConversations)
	case o.fleetPhase < time.Second || o.fleetPhase > 10*time.Minute:
		return o, fmt.Errorf("-fleet-duration %s: want 1s to 10m", o.fleetPhase)
	case o.phase <= 0 || o.phase > 10*time.Minute:
		return o, fmt.Errorf("-duration %s: want more than 0 and at most 10m", o.phase)
	case o.rounds < 1 || o.rounds > 20:
		return o, fmt.Errorf("-rounds %d: want 1 to 20", o.rounds)
	case o.warmup < 0 || o.warmup > time.Minute:
		return o, fmt.Errorf("-warmup %s: want 0 to 1m", o.warmup)
	case o.openConns < 1 || o.conns < 1 || o.streamConc < 1:
		return o, errors.New("-open-conns, -conns and -stream-conc must be positive")
	case o.streamTokens < 1 || o.streamTokens > 4096:
		return o, fmt.Errorf("-stream-tokens %d: want 1 to 4096", o.streamTokens)
	case o.streamITL < 0 || o.slowITL <= 0 || o.slowITL > 10*time.Second:
		return o, errors.New("-stream-itl must not be negative, -slow-itl must be more than 0 and at most 10s")
	}
	switch {
	case o.fleet && o.only != "" && o.only != "conversations" && o.only != "fairness" && o.only != "priority":
		return o, fmt.Errorf("-only %q with -fleet: the parts that run alone are conversations, fairness and priority", o.only)
	case !o.fleet && o.only != "" && o.only != "soak" && o.only != "streams" && o.only != "open":
		return o, fmt.Errorf("-only %q: the parts that run alone are soak, streams and open", o.only)
	case o.only == "open" && len(o.rates) == 0:
		return o, errors.New("-only open needs -rates")
	case o.only == "soak" && o.soak == 0:
		return o, errors.New("-only soak needs -soak")
	case o.soak < 0 || o.soak > 24*time.Hour:
		return o, fmt.Errorf("-soak %s: want 0 to 24h", o.soak)
	case o.soakWarmup < 0 || o.soakWarmup > time.Hour:
		return o, fmt.Errorf("-soak-warmup %s: want 0 to 1h", o.soakWarmup)
	case o.soakRate < 1 || o.soakRate > 200000:
		return o, fmt.Errorf("-soak-rate %d: want 1 to 200000", o.soakRate)
	case !(o.soakStreamShare >= 0 && o.soakStreamShare <= 1) || !(o.soakAbandon >= 0 && o.soakAbandon <= 1):
		return o, errors.New("-soak-stream-share and -soak-abandon must be from 0 to 1")
	}
	for _, r := range o.rates {
		if r > 200000 {
			return o, fmt.Errorf("-rates %d: at most 200000", r)
		}
	}
	for _, n := range o.openStreams {
		if n > 100000 {
			return o, fmt.Errorf("-streams %d: at most 100000", n)
		}
	}
	return o, nil
}

// parseInts parses a comma-separated list of positive integers.
func parseInts(s, flagName string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: %q is not a positive integer", flagName, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(args []string, stdout, stderr io.Writer) (err error) {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, restore the default handling, so that a
	// second Ctrl-C ends a shutdown that takes too long; the children then
	// get SIGTERM from the kernel as their parent dies.
	context.AfterFunc(ctx, stop)
	if o.fleet {
		return runFleet(ctx, o, args, stdout, stderr)
	}
	if o.instructions > 0 {
		return runInstructions(ctx, o, args, stdout, stderr)
	}
	began := time.Now()

	// Each open stream costs the process it goes through two sockets, and
	// the benchmark and the slow mock one each. The bare proxy and the
	// gateway hold the streams in turn, each stopped before the next
	// starts, so no process needs more; the margin covers everything else.
	held := o.openStreams
	if o.only == "soak" || o.only == "open" {
		held = nil
	}
	want := uint64(2*slices.Max(append([]int{0}, held...)) + 4096)
	nofile, limitNote, err := raiseNoFile(want)
	if err != nil {
		return err
	}

	dir, removeDir, err := makeRunDir("tollbench-", o.keep, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, removeDir()) }()

	b := &bench{o: o, dir: dir, log: stderr, key: "sk-tollbench-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	b.rep = &report{
		Date:    time.Now().UTC().Format(time.RFC3339),
		Command: strings.Join(append([]string{"tollbench"}, args...), " "),
		Machine: describeMachine(nofile),
		Settings: settings{
			Phase: o.phase.String(), Rounds: o.rounds, Rates: o.rates, OpenLoopConns: o.openConns, Conns: o.conns,
			StreamConc: o.streamConc, StreamTokens: o.streamTokens, StreamITL: o.streamITL.String(),
			OpenStreams: o.openStreams, SlowITL: o.slowITL.String(), GatewayLog: o.logLevel, BareStore: o.bareStore, BareHandOver: o.bareHandOver, Otel: o.otel,
			Only: o.only, SoakRate: o.soakRate, SoakStreamShare: o.soakStreamShare, SoakAbandon: o.soakAbandon,
		},
	}
	if limitNote != "" {
		b.rep.note("%s", limitNote)
	}
	// The children are stopped before the directory holding their files
	// is removed: deferred calls run in reverse order.
	defer func() { err = errors.Join(err, b.stopAll()) }()

	if err := b.setup(ctx); err != nil {
		return interrupted(ctx, err)
	}
	if o.only != "soak" {
		if err := b.measure(ctx); err != nil {
			return interrupted(ctx, err)
		}
	}
	if o.soak > 0 {
		b.rep.Settings.Soak, b.rep.Settings.SoakWarmup = o.soak.String(), o.soakWarmup.String()
		if err := b.soak(ctx); err != nil {
			return interrupted(ctx, err)
		}
	}
	if w := b.foreign.wall; w > 0 {
		cores := b.foreign.others().Seconds() / w.Seconds()
		b.rep.OtherCores, b.rep.StealCores = cores, b.foreign.stealCores()
		if cores > 0.1 {
			b.rep.note("other programs used %.2f cores on average during the measured phases: the machine was not quiet, "+
				"and latency, throughput and CPU figures are inflated accordingly", cores)
		}
		if b.rep.StealCores > 0.1 {
			b.rep.note("the hypervisor took %.2f cores on average during the measured phases (steal): the host is "+
				"oversubscribed; latencies and the CPU time of every process are inflated accordingly", b.rep.StealCores)
		}
	}
	if b.sink != nil {
		// The gateway exports what it still holds as it stops.
		err := b.stopGateway()
		var sinkErr error
		b.rep.Settings.OtelSpans, b.rep.Settings.OtelExports, sinkErr = b.sink.take()
		if err := errors.Join(err, sinkErr); err != nil {
			return err
		}
	}
	b.rep.Elapsed = time.Since(began).Round(time.Second).String()
	if err := b.rep.writeTable(stdout); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	if o.jsonPath != "" {
		return b.rep.writeJSON(o.jsonPath)
	}
	return nil
}

// interrupted says so when err comes from a Ctrl-C or SIGTERM.
func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	return err
}

// Model names of the generated gateway config, one per mock process.
const (
	modelFast   = "bench"
	modelStream = "bench-stream"
	modelSlow   = "bench-slow"
)

// bench is one run: its settings, child processes and report.
type bench struct {
	o   options
	dir string
	log io.Writer
	key string
	rep *report

	bins        binaries
	configPath  string
	gatewayRuns int
	// bareRuns counts the fresh bare proxies of the open-streams
	// phases, each of which gets its own log.
	bareRuns int

	// The three mocks: fast non-streaming replies, streams of
	// -stream-tokens events at -stream-itl, and slow streams at -slow-itl.
	fast, streamMock, slow         *proc
	fastAddr, streamAddr, slowAddr string
	// The bare proxies in front of the fast and the stream mock.
	bareFast, bareStream         *proc
	bareFastAddr, bareStreamAddr string
	// plainFast is a plain bare proxy in front of mock-fast, started for
	// -bare-store's floor phase (floor.go); nil without -bare-store.
	plainFast     *proc
	plainFastAddr string
	// plainStream and handOverStream are a plain bare proxy and one that
	// hands its streams over, in front of mock-stream, started for
	// -bare-handover's floor phase (floorStreams); nil without it.
	plainStream, handOverStream         *proc
	plainStreamAddr, handOverStreamAddr string
	gateway                             *proc
	gatewayAddr                         string
	procs                               []*proc
	// sink is the collector the gateway exports its spans to (-otel);
	// nil without it.
	sink *otelSink

	// foreign adds up the CPU use of every measured phase, to report how
	// busy the rest of the machine was.
	foreign cpuDelta
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "tollbench: "+format+"\n", args...)
}

// setup builds the binaries, starts the mocks and the bare proxies, writes
// the gateway config and starts the gateway.
func (b *bench) setup(ctx context.Context) error {
	if b.o.binDir != "" {
		b.bins = binariesIn(b.o.binDir)
	} else {
		b.logf("building tollgate, mockllm and bareproxy")
		var err error
		if b.bins, err = buildBinaries(ctx, b.dir); err != nil {
			return err
		}
	}
	var err error
	// Non-streaming replies carry 16 tokens, as the requests ask.
	if b.fast, b.fastAddr, err = b.startMock(ctx, "mock-fast", mockFlags{tokens: 16}); err != nil {
		return err
	}
	if b.streamMock, b.streamAddr, err = b.startMock(ctx, "mock-stream", mockFlags{itl: b.o.streamITL, tokens: b.o.streamTokens}); err != nil {
		return err
	}
	if b.slow, b.slowAddr, err = b.startMock(ctx, "mock-slow", mockFlags{itl: b.o.slowITL, tokens: slowTokens}); err != nil {
		return err
	}
	if b.bareFast, b.bareFastAddr, err = b.startBare(ctx, "bare-fast", b.fastAddr); err != nil {
		return err
	}
	if b.bareStream, b.bareStreamAddr, err = b.startBare(ctx, "bare-stream", b.streamAddr); err != nil {
		return err
	}
	if b.o.bareStore {
		p, addr, err := startBare(ctx, b.bins, b.dir, "plain-fast", b.fastAddr, bareOptions{})
		if err != nil {
			return err
		}
		b.procs = append([]*proc{p}, b.procs...)
		b.plainFast, b.plainFastAddr = p, addr
	}
	if b.o.bareHandOver {
		for _, f := range []struct {
			name string
			o    bareOptions
			p    **proc
			addr *string
		}{
			{"plain-stream", bareOptions{}, &b.plainStream, &b.plainStreamAddr},
			{"handover-stream", bareOptions{handOver: true}, &b.handOverStream, &b.handOverStreamAddr},
		} {
			p, addr, err := startBare(ctx, b.bins, b.dir, f.name, b.streamAddr, f.o)
			if err != nil {
				return err
			}
			b.procs = append([]*proc{p}, b.procs...)
			*f.p, *f.addr = p, addr
		}
	}
	b.configPath = filepath.Join(b.dir, "tollgate.yaml")
	cfg := gatewayConfig{
		key: b.key, logLevel: b.o.logLevel, store: filepath.Join(b.dir, "tollgate.db"),
		fast: b.fastAddr, stream: b.streamAddr, slow: b.slowAddr,
	}
	if b.o.otel {
		if b.sink, err = startOtelSink(); err != nil {
			return err
		}
		cfg.otel = b.sink.endpoint()
	}
	if err := os.WriteFile(b.configPath, []byte(cfg.yaml()), 0o600); err != nil {
		return fmt.Errorf("write gateway config: %w", err)
	}
	return b.startGateway(ctx)
}

func (b *bench) startMock(ctx context.Context, name string, f mockFlags) (*proc, string, error) {
	p, addr, err := startMock(ctx, b.bins.mock, b.dir, name, f)
	if err != nil {
		return nil, "", err
	}
	b.procs = append(b.procs, p)
	return p, addr, nil
}

func (b *bench) startBare(ctx context.Context, name, upstream string) (*proc, string, error) {
	p, addr, err := startBare(ctx, b.bins, b.dir, name, upstream, bareOptions{store: b.o.bareStore})
	if err != nil {
		return nil, "", err
	}
	// Stopped before the mocks, as the gateway is.
	b.procs = append([]*proc{p}, b.procs...)
	return p, addr, nil
}

// startGateway starts a fresh gateway process; each gets its own log.
func (b *bench) startGateway(ctx context.Context) error {
	b.gatewayRuns++
	logPath := filepath.Join(b.dir, fmt.Sprintf("gateway-%d.log", b.gatewayRuns))
	p, addr, err := startGateway(ctx, b.bins.gateway, b.configPath, logPath)
	if err != nil {
		return err
	}
	b.gateway, b.gatewayAddr = p, addr
	return nil
}

// stopGateway stops the running gateway, if any.
func (b *bench) stopGateway() error {
	if b.gateway == nil {
		return nil
	}
	err := b.gateway.stop(stopGrace)
	b.gateway = nil
	return err
}

// stopAll stops the gateway first, so that it does not see its backends
// vanish under in-flight requests, then the mocks.
func (b *bench) stopAll() error {
	errs := []error{b.stopGateway()}
	for _, p := range b.procs {
		errs = append(errs, p.stop(stopGrace))
	}
	b.procs = nil
	if b.sink != nil {
		errs = append(errs, b.sink.stop())
		b.sink = nil
	}
	return errors.Join(errs...)
}

// slowTokens is the length of the slow streams: at -slow-itl of 1 s they
// would run for five minutes, far longer than they are held.
const slowTokens = 300

// gatewayConfig is what the generated gateway config depends on.
type gatewayConfig struct {
	key, logLevel, store string
	fast, stream, slow   string
	// otel is the OTLP endpoint the gateway exports to; empty for none.
	otel string
}

// yaml renders the config a user would write for this setup: one key,
// three models on three OpenAI-compatible backends, SQLite accounting.
// The connection limits are raised so that the open-streams phase is
// bounded by memory, not by a cap.
func (c gatewayConfig) yaml() string {
	backend := func(name, addr string) string {
		return fmt.Sprintf("  - name: %s\n    url: %q\n    max_conns: 100000\n", name, "http://"+addr+"/v1")
	}
	return fmt.Sprintf(`# Generated by tollbench.
listen: "127.0.0.1:8080"
log: {level: %s, format: json}
auth:
  keys:
    - name: bench
      key: %q
      teams: [bench]
      default_team: bench
server:
  max_connections: 100000
  shutdown_timeout: 10s
  metrics_auth: public # the soak reads /metrics without a key, on loopback
backends:
%s%s%smodels:
  - name: %s
    backends: [mock-fast]
  - name: %s
    backends: [mock-stream]
  - name: %s
    backends: [mock-slow]
store: {driver: sqlite, path: %q}
usage: {flush_interval: 1s}
%s`, c.logLevel, c.key, backend("mock-fast", c.fast), backend("mock-stream", c.stream), backend("mock-slow", c.slow),
		modelFast, modelStream, modelSlow, c.store, telemetryYAML(c.otel))
}

// chatBody is the chat completion request body the generator sends.
func chatBody(model string, maxTokens int, stream bool) []byte {
	s := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"You are a benchmark."},`+
		`{"role":"user","content":"Count from one to sixteen, one number per token."}],"max_tokens":%d`, model, maxTokens)
	if stream {
		// Usage is asked for, so both sides send the same events: the
		// gateway would otherwise add a usage chunk upstream and strip it.
		s += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return []byte(s + "}")
}
