package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// -instructions counts what the gateway and the bare proxy execute per
// request, in user-space instructions, under valgrind's cachegrind: a
// count that other programs on the host do not change, where CPU time on
// a shared host moves by more than the differences worth finding. Each
// side runs twice per round, once for instrRequestsBase requests and once
// for that many more; the difference between the two runs' counts, over
// the difference in requests, is the cost of a request without the
// process's start and shutdown. Kernel time is not counted: it follows
// the system calls, which a change to the gateway's own code rarely adds.

// instrRequestsBase is the smaller run's requests; it also warms the
// pools and buffers both runs then reuse.
const instrRequestsBase = 1000

// instrConns is the load's concurrency: a few connections, as a closed
// loop on a small host keeps busy, without the scheduler's idle spinning
// of many.
const instrConns = 4

// instrResidentRequests is how many requests each side serves natively,
// after the counted runs, before its resident memory is read.
const instrResidentRequests = 20000

// instrSide is one side's runs: its requests per run and the instructions
// per request of each round.
type instrSide struct {
	Side     string    `json:"side"`
	PerRound []float64 `json:"instructions_per_request"`
	Mean     float64   `json:"mean"`
	// AnonMiB and FileMiB are the side's resident memory, anonymous and
	// file-backed, after instrResidentRequests requests run natively.
	AnonMiB float64 `json:"rss_anon_mib"`
	FileMiB float64 `json:"rss_file_mib"`
}

// instrReport is what -instructions prints, and writes with -json.
type instrReport struct {
	Date     string      `json:"date"`
	Command  string      `json:"command"`
	Requests [2]int      `json:"requests"`
	Sides    []instrSide `json:"sides"`
	// Ratio is the gateway's mean over the bare proxy's.
	Ratio float64 `json:"gateway_over_bare"`
}

// runInstructions is tollbench -instructions.
func runInstructions(ctx context.Context, o options, args []string, stdout, stderr io.Writer) (err error) {
	valgrind, err := exec.LookPath("valgrind")
	if err != nil {
		return errors.New("-instructions needs valgrind on PATH (Debian: apt-get install valgrind)")
	}
	dir, removeDir, err := makeRunDir("tollbench-instr-", o.keep, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, removeDir()) }()
	bins := binariesIn(o.binDir)
	if o.binDir == "" {
		fmt.Fprintln(stderr, "tollbench: building tollgate, mockllm and bareproxy")
		if bins, err = buildBinaries(ctx, dir); err != nil {
			return err
		}
	}
	mock, mockAddr, err := startMock(ctx, bins.mock, dir, "mock-fast", mockFlags{tokens: 16})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, mock.stop(stopGrace)) }()
	key := "sk-tollbench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	m := &instrMeter{valgrind: valgrind, bins: bins, dir: dir, upstream: mockAddr, key: key, bodies: [][]byte{chatBody(modelFast, 16, false)}}
	workload := "chat completion of 16 tokens"
	if o.otel {
		if m.sink, err = startOtelSink(); err != nil {
			return err
		}
		m.otel = m.sink.endpoint()
		defer func() { err = errors.Join(err, m.sink.stop()) }()
		workload += ", the gateway exporting a span per request"
	}
	if o.instrFleet {
		fleet, err := exampleFleet()
		if err != nil {
			return err
		}
		m.backends = fleet.servers
		m.bodies = instrFleetBodies(uint64(o.seed)) //nolint:gosec // a seed
		workload = fmt.Sprintf("the -fleet workload's turns (seed %d) to %d backends", o.seed, fleet.servers)
	}
	rep := instrReport{
		Date:     time.Now().UTC().Format(time.RFC3339),
		Command:  strings.Join(append([]string{"tollbench"}, args...), " "),
		Requests: [2]int{instrRequestsBase, instrRequestsBase + o.instructions},
		Sides:    []instrSide{{Side: "bare proxy"}, {Side: "gateway"}},
	}
	for round := range o.rounds {
		for i := range rep.Sides {
			per, err := m.perRequest(ctx, i == 1, round, rep.Requests)
			if err != nil {
				return interrupted(ctx, err)
			}
			fmt.Fprintf(stderr, "tollbench: round %d, %s: %.0f instructions per request\n", round+1, rep.Sides[i].Side, per)
			rep.Sides[i].PerRound = append(rep.Sides[i].PerRound, per)
		}
	}
	for i := range rep.Sides {
		s := &rep.Sides[i]
		for _, v := range s.PerRound {
			s.Mean += v / float64(len(s.PerRound))
		}
		mem, err := m.resident(ctx, sideName(i == 1)+"-resident", i == 1, instrResidentRequests)
		if err != nil {
			return interrupted(ctx, err)
		}
		s.AnonMiB, s.FileMiB = float64(mem.Anon)/(1<<20), float64(mem.File)/(1<<20)
	}
	rep.Ratio = safeRatio(rep.Sides[1].Mean, rep.Sides[0].Mean)
	fmt.Fprintf(stdout, "tollbench %s (%s)\nuser-space instructions per request (valgrind cachegrind), %d-request difference, %d connections, %s:\n",
		rep.Date, rep.Command, o.instructions, instrConns, workload)
	for _, s := range rep.Sides {
		fmt.Fprintf(stdout, "  %-10s  mean %9.0f  rounds %s\n", s.Side, s.Mean, joinFloats(s.PerRound))
	}
	fmt.Fprintf(stdout, "  gateway / bare proxy: %.3f×\nresident memory after %d requests run natively, anonymous + file-backed:\n", rep.Ratio, instrResidentRequests)
	for _, s := range rep.Sides {
		fmt.Fprintf(stdout, "  %-10s  %.1f + %.1f MiB\n", s.Side, s.AnonMiB, s.FileMiB)
	}
	if o.jsonPath == "" {
		return nil
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(o.jsonPath, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

func joinFloats(vs []float64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strings.Join(parts, ", ")
}

// instrMeter runs one side under cachegrind.
type instrMeter struct {
	valgrind string
	bins     binaries
	dir      string
	upstream string
	key      string
	// backends is how many backends the gateway's model has, each a name
	// for the one mock; 0 means one.
	backends int
	// bodies are the requests each connection sends in turn.
	bodies [][]byte
	// sink, when not nil, is the collector the gateway exports its spans
	// to, at otel; each gateway run must export a span per request.
	sink *otelSink
	otel string
}

// perRequest runs the side once for each of requests and returns the
// instructions per request of the difference.
func (m *instrMeter) perRequest(ctx context.Context, gateway bool, round int, requests [2]int) (float64, error) {
	var counts [2]uint64
	for i, n := range requests {
		name := fmt.Sprintf("%s-%d-%d", sideName(gateway), round+1, n)
		c, err := m.count(ctx, name, gateway, n)
		if err != nil {
			return 0, err
		}
		counts[i] = c
	}
	if counts[1] <= counts[0] {
		return 0, fmt.Errorf("the run of %d requests counted %d instructions, no more than the run of %d (%d)",
			requests[1], counts[1], requests[0], counts[0])
	}
	return float64(counts[1]-counts[0]) / float64(requests[1]-requests[0]), nil
}

// count starts the side under cachegrind, sends it n requests, stops it
// and returns the instructions it executed in all.
func (m *instrMeter) count(ctx context.Context, name string, gateway bool, n int) (uint64, error) {
	out := filepath.Join(m.dir, name+".cachegrind")
	// Asynchronous preemption is off on both sides: under valgrind every
	// goroutine runs slowly enough for the runtime's preemption signals
	// to land at moments no native run sees. RDTSCP is off too: valgrind's
	// emulated CPUID reports it even where the host lacks it, and then
	// cannot decode it when the runtime reads the clock with it.
	p, addr, err := m.start(name, gateway, "GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off", m.valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file="+out)
	if err != nil {
		return 0, err
	}
	if err := errors.Join(m.load(ctx, p, addr, n), p.stop(stopGrace)); err != nil {
		return 0, errors.Join(err, undecodable(p.logPath))
	}
	if err := m.exported(gateway, n); err != nil {
		return 0, err
	}
	return cachegrindTotal(out)
}

// exported checks that a gateway run that served n requests exported a
// span for each of them to the sink, when there is one.
func (m *instrMeter) exported(gateway bool, n int) error {
	if m.sink == nil || !gateway {
		return nil
	}
	spans, exports, err := m.sink.take()
	if err == nil && spans < int64(n) {
		err = fmt.Errorf("the gateway exported %d spans in %d exports for %d requests", spans, exports, n)
	}
	return err
}

// rdtscpBytes is how valgrind names RDTSCP when it cannot decode it.
const rdtscpBytes = "unhandled instruction bytes: 0xF 0x1 0xF9"

// undecodable explains a side that valgrind killed for an instruction it
// does not decode, from the side's log; nil otherwise. The case met so far
// is RDTSCP on a virtual machine that hides it, which count's
// GODEBUG=cpu.rdtscp=off prevents for programs built with Go's runtime.
func undecodable(logPath string) error {
	log, err := os.ReadFile(logPath)
	switch {
	case err != nil || !bytes.Contains(log, []byte("valgrind: Unrecognised instruction")):
		return nil
	case bytes.Contains(log, []byte(rdtscpBytes)):
		return errors.New("valgrind cannot decode RDTSCP on this host (its CPUID does not report it, valgrind's emulated CPUID does), " +
			"and the side ran it although GODEBUG=cpu.rdtscp=off tells Go's runtime not to")
	}
	return fmt.Errorf("valgrind met an instruction it cannot decode (%s)", logPath)
}

// resident starts the side natively, sends it n requests and returns its
// resident memory once they are answered.
func (m *instrMeter) resident(ctx context.Context, name string, gateway bool, n int) (memInfo, error) {
	p, addr, err := m.start(name, gateway)
	if err != nil {
		return memInfo{}, err
	}
	var mem memInfo
	loadErr := m.load(ctx, p, addr, n)
	if loadErr == nil {
		mem, loadErr = readMem(p.pid())
	}
	if err := errors.Join(loadErr, p.stop(stopGrace)); err != nil {
		return memInfo{}, err
	}
	return mem, m.exported(gateway, n)
}

// load waits for the side p to serve at addr, then sends it n requests.
func (m *instrMeter) load(ctx context.Context, p *proc, addr string, n int) error {
	if err := waitServing(ctx, p, addr); err != nil {
		return err
	}
	return closedLoopN(addr, m.key, m.bodies, n)
}

// sideName names a side's files in the run directory.
func sideName(gateway bool) string {
	if gateway {
		return "gateway"
	}
	return "bare"
}

// start starts the side, run by env with the arguments before its own
// (none to run it as it is), on a free port, which it returns.
func (m *instrMeter) start(name string, gateway bool, wrap ...string) (*proc, string, error) {
	addr, err := freePort()
	if err != nil {
		return nil, "", err
	}
	args := wrap
	if gateway {
		cfg := filepath.Join(m.dir, name+".yaml")
		if err := os.WriteFile(cfg, []byte(m.gatewayYAML(name)), 0o600); err != nil {
			return nil, "", fmt.Errorf("write gateway config: %w", err)
		}
		args = append(args, m.bins.gateway, "-config", cfg, "-listen", addr)
	} else {
		args = append(args, m.bins.bare, "-listen", addr, "-upstream", m.upstream)
	}
	p, err := startProc(name, "env", args, filepath.Join(m.dir, name+".log"))
	return p, addr, err
}

// gatewayYAML is the gateway's configuration: the settings every version
// since the gateway of commit ef60e68 reads, so that -bin-dir can count
// older builds with this tollbench.
func (m *instrMeter) gatewayYAML(name string) string {
	names := []string{"mock-fast"}
	if m.backends > 0 {
		names = names[:0]
		for i := range m.backends {
			names = append(names, fmt.Sprintf("mock-%d", i+1))
		}
	}
	backends := ""
	for _, b := range names {
		backends += fmt.Sprintf("  - name: %s\n    url: \"http://%s/v1\"\n", b, m.upstream)
	}
	return fmt.Sprintf(`# Generated by tollbench -instructions.
log: {level: info, format: json}
auth:
  keys:
    - name: bench
      key: %q
      teams: [bench]
      default_team: bench
backends:
%smodels:
  - name: %s
    backends: [%s]
store: {driver: sqlite, path: %q}
usage: {flush_interval: 1s}
%s`, m.key, backends, modelFast, strings.Join(names, ", "), filepath.Join(m.dir, name+".db"), telemetryYAML(m.otel))
}

// waitServing waits until addr answers a TCP request with any status: a
// process under valgrind takes seconds to start.
func waitServing(ctx context.Context, p *proc, addr string) error {
	c := &fasthttp.HostClient{Addr: addr}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if _, _, err := c.GetTimeout(nil, "http://"+addr+"/readyz", time.Second); err == nil {
			return nil
		}
		if ok, err := p.exited(); ok {
			return fmt.Errorf("%s exited before serving: %v\n%s", p.name, err, p.logTail(20))
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s did not answer within 2m\n%s", p.name, p.logTail(20))
}

// closedLoopN sends n chat completions to addr over instrConns
// connections, each waiting for its reply before the next and sending
// bodies in turn, and fails on the first that does not answer 200.
func closedLoopN(addr, key string, bodies [][]byte, n int) error {
	e := newEndpoint("instr", addr, key, instrConns)
	defer e.client.CloseIdleConnections()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for w := range instrConns {
		share := n / instrConns
		if w < n%instrConns {
			share++
		}
		wg.Go(func() {
			req, resp := e.newRequest(bodies[0]), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for i := range share {
				// Each connection starts at a body of its own, so that
				// the connections do not send the same turn at once.
				req.SetBody(bodies[(w+i)%len(bodies)])
				if err := e.do(req, resp); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// cachegrindTotal reads the instruction count of a cachegrind output
// file's "summary:" line.
func cachegrindTotal(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read cachegrind output: %w", err)
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("summary:")); ok {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(rest)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cachegrind output %s: summary %q", path, rest)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("cachegrind output %s has no summary line", path)
}

// instrFleetBodies are the requests of every turn of the -fleet
// workload's conversations, streamed as its clients send them, in a
// seeded order.
func instrFleetBodies(seed uint64) [][]byte {
	w := newFleetWorkload(seed, fleetShape{apps: fleetApps, promptWords: fleetPromptWords})
	var bodies [][]byte
	for i := range fleetConversations {
		c := w.conversation(i)
		for t := range c.turns {
			bodies = append(bodies, w.body(modelFast, c, t, 0))
		}
	}
	r := rand.New(rand.NewPCG(seed, 0))
	r.Shuffle(len(bodies), func(i, j int) { bodies[i], bodies[j] = bodies[j], bodies[i] })
	return bodies
}
