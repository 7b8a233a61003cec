package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/backends/simulated"
)

const (
	fleetConversations = 64
	fleetApps          = 8
	fleetPromptWords   = 1500
	fleetBusy          = 0.6
	// The scenarios' tenants: fairTenants well-behaved ones and a flooder at floodFactor times
	// their rate.
	fairTenants = 3
	floodFactor = 5
	// The models of the generated gateway config: the conversations' (the default scheduler,
	// no gateway queue), and the scenarios' (the same servers under max_concurrency, so that
	// the gateway queues, with priority scheduling).
	fleetModel     = "fleet"
	fleetFairModel = "fleet-fair"
)

// fleetBench is one -fleet run.
type fleetBench struct {
	o       options
	dir     string
	log     io.Writer
	key     string
	eng     fleetEngine
	work    *fleetWorkload
	servers []*simulated.Server
	addrs   []string
	served  []chan error
	direct  []*endpoint
	// inFlight counts, per server, the requests the client has sent straight to it and not
	// finished: the load the oracle pins conversations by.
	inFlight []atomic.Int64
	gateway  *proc
	gwAddr   string
	gw       *endpoint
	rep      *fleetReport
	// flog is the scenarios' request log (-fleet-log); nil writes none.
	flog *fleetLog
	// sessions counts the phases begun; each phase's prompts open with its number.
	sessions int
}

func (f *fleetBench) logf(format string, args ...any) {
	fmt.Fprintf(f.log, "tollbench: "+format+"\n", args...)
}

// runFleet is `tollbench -fleet`.
func runFleet(ctx context.Context, o options, args []string, stdout, stderr io.Writer) (err error) {
	began := time.Now()
	dir, removeDir, err := makeRunDir("tollbench-fleet-", o.keep, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, removeDir()) }()
	eng, err := exampleFleet()
	if err != nil {
		return err
	}
	f := &fleetBench{o: o, dir: dir, log: stderr, eng: eng,
		key: "sk-tollbench-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	service := (&fleetWorkload{minWords: 20, maxWords: 80, minReply: 16, maxReply: 48}).meanService(f.eng)
	think := thinkForBusy(fleetConversations, f.eng.servers*f.eng.maxNumSeqs, fleetBusy, service)
	f.work = newFleetWorkload(uint64(o.seed), fleetShape{apps: o.fleetApps, promptWords: fleetPromptWords, think: think})
	nofile, _, _ := raiseNoFile(8192)
	preemption := ""
	if f.eng.priorityPreemption {
		preemption = ", priority preemption"
	}
	f.rep = &fleetReport{
		Date: time.Now().UTC().Format(time.RFC3339), Command: strings.Join(append([]string{"tollbench"}, args...), " "),
		Machine: describeMachine(nofile),
		Setup: fmt.Sprintf("%d simulated vLLM servers (max_num_seqs %d, prefill %s + %s per uncached token, %s per token ×1 to ×%g with load, "+
			"prefix cache of %d blocks of %d tokens%s); %d conversations over %d apps with %d-word system prompts, think time %s (about %.0f %% of the slots busy), seed %d; "+
			"phases of %s (the first fifth unmeasured), %d round(s) of tollgate/round-robin/oracle%s",
			f.eng.servers, f.eng.maxNumSeqs, f.eng.ttft, f.eng.prefillPerToken, f.eng.itl, f.eng.loadFactor, f.eng.kvBlocks, f.eng.blockSize, preemption,
			fleetConversations, o.fleetApps, fleetPromptWords, think.Round(time.Millisecond), fleetBusy*100, o.seed, o.fleetPhase, o.rounds, gatewayWarmth(o.fleetColdGateway)),
		Settings: map[string]string{"phase": o.fleetPhase.String(), "rounds": strconv.Itoa(o.rounds), "seed": strconv.FormatInt(o.seed, 10),
			"cold_gateway": strconv.FormatBool(o.fleetColdGateway), "apps": strconv.Itoa(o.fleetApps), "spread": strconv.FormatBool(!o.fleetNoSpread)},
	}
	if o.fleetLog != "" {
		if f.flog, err = newFleetLog(o.fleetLog); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, f.flog.close()) }()
	}
	defer func() { err = errors.Join(err, f.stop()) }()
	if err := f.setup(ctx); err != nil {
		return interrupted(ctx, err)
	}
	if err := f.measure(ctx); err != nil {
		return interrupted(ctx, err)
	}
	f.rep.Elapsed = time.Since(began).Round(time.Second).String()
	if err := f.rep.writeTable(stdout); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	if o.jsonPath != "" {
		return f.rep.writeJSON(o.jsonPath)
	}
	return nil
}

// setup starts the simulated servers in this process, on loopback TCP, and the gateway in
// front of them as its own process.
func (f *fleetBench) setup(ctx context.Context) error {
	f.inFlight = make([]atomic.Int64, f.eng.servers)
	for i := range f.eng.servers {
		var observe func(simulated.SequenceStat)
		if f.flog != nil {
			observe = f.flog.observer(i, &f.servers)
		}
		srv := simulated.New(simulated.Options{
			OnSequence:       observe,
			TimeToFirstToken: f.eng.ttft, InterTokenDelay: f.eng.itl,
			Engine: simulated.Engine{
				MaxNumSeqs: f.eng.maxNumSeqs, PrefillPerToken: f.eng.prefillPerToken, KVCacheBlocks: f.eng.kvBlocks,
				BlockSize: f.eng.blockSize, LoadFactor: f.eng.loadFactor,
				// The scenarios' model has priority_scheduling on, as the example's: its
				// servers run vLLM's priority policy, which preempts. The conversations all
				// have priority 0, which preempts nothing.
				PriorityPreemption: f.eng.priorityPreemption,
			},
		})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("listen for server %d: %w", i, err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		f.servers, f.served = append(f.servers, srv), append(f.served, done)
		f.addrs = append(f.addrs, ln.Addr().String())
		f.direct = append(f.direct, newEndpoint("direct", ln.Addr().String(), f.key, 1024))
	}
	bin := filepath.Join(f.o.binDir, "tollgate")
	if f.o.binDir == "" {
		f.logf("building tollgate")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", f.dir+string(filepath.Separator), gatewayPkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build: %w\n%s", err, strings.TrimSpace(string(out)))
		}
		bin = filepath.Join(f.dir, "tollgate")
	}
	configPath := filepath.Join(f.dir, "tollgate.yaml")
	cfg := fleetConfig{key: f.key, logLevel: f.o.logLevel, store: filepath.Join(f.dir, "tollgate.db"), servers: f.addrs, maxNumSeqs: f.eng.maxNumSeqs,
		reserve: f.o.fleetReserve, spread: !f.o.fleetNoSpread}
	if err := os.WriteFile(configPath, []byte(cfg.yaml()), 0o600); err != nil {
		return fmt.Errorf("write gateway config: %w", err)
	}
	var err error
	if f.gateway, f.gwAddr, err = startGateway(ctx, bin, configPath, filepath.Join(f.dir, "gateway.log")); err != nil {
		return err
	}
	f.gw = newEndpoint("gateway", f.gwAddr, f.key, 4096)
	return nil
}

// stop stops the gateway, then the servers.
func (f *fleetBench) stop() error {
	var errs []error
	if f.gateway != nil {
		errs = append(errs, f.gateway.stop(stopGrace))
		f.gateway = nil
	}
	for _, e := range append(f.direct, f.gw) {
		if e != nil {
			e.client.CloseIdleConnections()
		}
	}
	for i, s := range f.servers {
		errs = append(errs, s.Shutdown(), <-f.served[i])
	}
	f.servers = nil
	return errors.Join(errs...)
}

// fleetConfig is what the generated gateway config depends on.
type fleetConfig struct {
	key, logLevel, store string
	servers              []string
	maxNumSeqs           int
	// reserve is the scenarios' model's queue.reserve (0: the default).
	reserve int
	// spread turns routing.spread on for both models.
	spread bool
}

// yaml renders the gateway's config: the servers twice, as the conversations' backends (no
// cap: the scheduler places, the servers queue) and as the scenarios' (capped at the servers'
// running limit, so that the gateway holds the queue, by priority and tenant). With spread,
// both spread their apps' instructions, as a fleet whose servers can each cache every app's.
func (c fleetConfig) yaml() string {
	var b, sims, fair strings.Builder
	for i, a := range c.servers {
		fmt.Fprintf(&b, "  - {name: sim-%d, url: %q, max_conns: 1024}\n", i, "http://"+a+"/v1")
		fmt.Fprintf(&b, "  - {name: fair-%d, url: %q, max_conns: 1024, max_concurrency: %d}\n", i, "http://"+a+"/v1", c.maxNumSeqs)
		if i > 0 {
			sims.WriteString(", ")
			fair.WriteString(", ")
		}
		fmt.Fprintf(&sims, "sim-%d", i)
		fmt.Fprintf(&fair, "fair-%d", i)
	}
	return fmt.Sprintf(`# Generated by tollbench -fleet.
listen: "127.0.0.1:8080"
log: {level: %s, format: json}
auth:
  keys:
    - {name: bench, key: %q, teams: [bench], default_team: bench}
server: {max_connections: 100000, shutdown_timeout: 10s, metrics_auth: public}
backends:
%smodels:
  - {name: %s, backends: [%s], routing: {spread: %s}}
  - name: %s
    backends: [%s]
    routing: {spread: %s}
    priority_scheduling: true
    queue: {depth: 4096, wait: 30s, reserve: %d}
store: {driver: sqlite, path: %q}
usage: {flush_interval: 1s}
`, c.logLevel, c.key, b.String(), fleetModel, sims.String(), onOff(c.spread), fleetFairModel, fair.String(), onOff(c.spread), c.reserve, c.store)
}

// onOff is a routing signal's setting.
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// measure runs the conversations through each routing in turn, round after round, and then
// the fairness and priority scenarios through the gateway.
// With -only conversations, fairness or priority, that part alone.
func (f *fleetBench) measure(ctx context.Context) error {
	if f.o.only == "" || f.o.only == "conversations" {
		var res [numRoutes]*routeResult
		for i := range res {
			res[i] = &routeResult{}
		}
		if !f.o.fleetColdGateway {
			f.logf("warm-up: conversations through %s for %s, not measured", routeNames[routeGateway], f.o.fleetPhase)
			if err := f.conversations(ctx, routeGateway, &routeResult{}, "warm-up through "); err != nil {
				return err
			}
		}
		before, err := f.placements(fleetModel)
		if err != nil {
			return err
		}
		for round := range f.o.rounds {
			for route := range numRoutes {
				f.logf("round %d: conversations through %s for %s", round+1, routeNames[route], f.o.fleetPhase)
				if err := f.conversations(ctx, route, res[route], "conversations through "); err != nil {
					return err
				}
			}
		}
		after, err := f.placements(fleetModel)
		if err != nil {
			return err
		}
		f.rep.Placements = placementsSince(before, after)
		f.rep.Notes = append(f.rep.Notes, placementsNote(f.rep.Placements))
		f.rep.Routes = res
		f.rep.Rows = append(f.rep.Rows, conversationRows(res)...)
	}
	if f.o.only == "" || f.o.only == "fairness" {
		unloaded, loaded, err := f.fairness(ctx)
		if err != nil {
			return err
		}
		f.rep.Rows = append(f.rep.Rows, fairnessRows(unloaded, loaded)...)
	}
	if f.o.only == "priority" || f.o.only == "" {
		return f.measurePriority(ctx)
	}
	return nil
}

// measurePriority runs the priority scenario and adds its row.
func (f *fleetBench) measurePriority(ctx context.Context) error {
	high0, high, flood, err := f.priority(ctx)
	if err != nil {
		return err
	}
	f.rep.Rows = append(f.rep.Rows, priorityRows(high0, high, flood)...)
	return nil
}

// resetCaches empties every server's prefix cache, so that each phase starts cold.
func (f *fleetBench) resetCaches() error {
	for i, e := range f.direct {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://" + f.addrs[i] + "/reset_prefix_cache")
		req.Header.SetMethod(fasthttp.MethodPost)
		err := e.client.DoTimeout(req, resp, 5*time.Second)
		if err == nil && resp.StatusCode() != fasthttp.StatusOK {
			err = fmt.Errorf("status %d", resp.StatusCode())
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if err != nil {
			return fmt.Errorf("reset the prefix cache of server %d: %w", i, err)
		}
	}
	return nil
}

// cacheCounters sums the servers' prefix cache counters, read from their /metrics.
func (f *fleetBench) cacheCounters() (queries, hits float64, err error) {
	names := []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"}
	for i, e := range f.direct {
		status, body, err := e.client.GetTimeout(nil, "http://"+f.addrs[i]+"/metrics", 5*time.Second)
		if err == nil && status != fasthttp.StatusOK {
			err = fmt.Errorf("status %d", status)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("read the metrics of server %d: %w", i, err)
		}
		m, err := parseMetrics(body, names)
		if err != nil {
			return 0, 0, err
		}
		queries += m[names[0]]
		hits += m[names[1]]
	}
	return queries, hits, nil
}

// phaseCounters are the growth of the servers' prefix cache counters over a phase's measured
// part.
type phaseCounters struct{ queries, hits float64 }

// phase runs load, which sends until end and returns once its requests have ended, on cold
// caches, and reads the cache counters at the end of the warm-up and after the load. load is
// given the phase's number, which its prompts open with (fleetConversation.session).
func (f *fleetBench) phase(ctx context.Context, load func(end, began time.Time, session int) error) (phaseCounters, error) {
	if err := f.resetCaches(); err != nil {
		return phaseCounters{}, err
	}
	f.sessions++
	session, began := f.sessions, time.Now()
	warm := f.o.fleetPhase / 5
	loadErr := make(chan error, 1)
	go func() { loadErr <- load(began.Add(f.o.fleetPhase), began, session) }()
	var q0, h0 float64
	var scrapeErr error
	if sleepCtx(ctx, warm) == nil {
		q0, h0, scrapeErr = f.cacheCounters()
	}
	if err := <-loadErr; err != nil {
		return phaseCounters{}, err
	}
	if scrapeErr != nil {
		return phaseCounters{}, scrapeErr
	}
	if err := ctx.Err(); err != nil {
		return phaseCounters{}, err
	}
	q1, h1, err := f.cacheCounters()
	return phaseCounters{queries: q1 - q0, hits: h1 - h0}, err
}

// conversations runs the scripted conversations through route for one phase and adds what
// they measured to res, logged (-fleet-log) as logAs and the routing's name:
// fleetConversations workers, worker w playing conversations w, w+fleetConversations, …,
// until the phase ends (turns in flight then run to their end).
func (f *fleetBench) conversations(ctx context.Context, route int, res *routeResult, logAs string) error {
	var mu sync.Mutex
	var rr atomic.Uint64
	warm := f.o.fleetPhase / 5
	if f.flog != nil {
		f.flog.start(logAs + routeNames[route])
		defer f.flog.start("")
	}
	c, err := f.phase(ctx, func(end, began time.Time, session int) error {
		var wg sync.WaitGroup
		for w := range fleetConversations {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 16<<10)
				// Workers start spread over a think time, not all at once.
				start := rand.New(rand.NewPCG(uint64(f.o.seed), uint64(w)+1<<40)).Float64()
				if sleepCtx(ctx, time.Duration(start*float64(f.work.think))) != nil {
					return
				}
				for n := w; ; n += fleetConversations {
					conv := f.work.conversation(n)
					conv.session = session
					server := -1
					for t, turn := range conv.turns {
						if sleepCtx(ctx, turn.think) != nil || time.Now().After(end) {
							return
						}
						e, s := f.gw, -1
						switch route {
						case routeRR:
							s = int(rr.Add(1) % uint64(f.eng.servers))
						case routeOracle:
							if server < 0 {
								server = f.leastLoaded()
							}
							s = server
						}
						model := fleetModel
						if s >= 0 {
							e, model = f.direct[s], "sim"
						}
						at, sent := time.Since(began), time.Now()
						sample := f.send(e, s, f.work.body(model, conv, t, 0), nil, buf)
						if f.flog != nil {
							f.flog.add(fmt.Sprintf("app-%d/conversation-%d/turn-%d", conv.app, n, t+1), turn.user, began, sent, time.Now(), 0, sample)
						}
						if at >= warm {
							mu.Lock()
							res.add(sample)
							mu.Unlock()
						}
						if sample.err != nil {
							// A failing turn ends its conversation, as a user would give up.
							break
						}
					}
				}
			}()
		}
		wg.Wait()
		return ctx.Err()
	})
	res.Queries += c.queries
	res.Hits += c.hits
	return err
}

// gatewayWarmth says in the report's setup whether tollgate's first phase was measured
// from a freshly started gateway.
func gatewayWarmth(cold bool) string {
	if cold {
		return ", tollgate's first from a freshly started gateway"
	}
	return ", after one unmeasured phase through tollgate"
}

// leastLoaded is the server with the fewest of the client's requests in flight, the lowest
// index among equals.
func (f *fleetBench) leastLoaded() int {
	best := 0
	for i := range f.inFlight {
		if f.inFlight[i].Load() < f.inFlight[best].Load() {
			best = i
		}
	}
	return best
}

// send streams one request to e (server s, or -1 for the gateway) and times its first event.
// header holds extra header pairs.
func (f *fleetBench) send(e *endpoint, s int, body []byte, header []string, buf []byte) fleetSample {
	req := e.newRequest(body)
	defer fasthttp.ReleaseRequest(req)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if s >= 0 {
		f.inFlight[s].Add(1)
		defer f.inFlight[s].Add(-1)
	}
	var r streamResult
	err := readStream(e, req, buf, &r)
	sample := fleetSample{err: err}
	if err == nil {
		sample.ttft = r.TTFT[0]
	}
	return sample
}

// openLoad is one stream of requests of a scenario: rate a second (Poisson arrivals), each a
// single turn of app's conversation, as tenant with priority.
type openLoad struct {
	tenant   int
	project  string
	priority int
	rate     float64
	app      int
}

// scenario sends loads through the gateway's scenario model for one phase, open loop, and
// returns what each load sent and got (requests sent during the warm-up are not counted).
func (f *fleetBench) scenario(ctx context.Context, name string, loads []openLoad) ([]*tenantLoad, error) {
	if f.flog != nil {
		f.flog.start(name)
		defer f.flog.start("")
	}
	out := make([]*tenantLoad, len(loads))
	for i, l := range loads {
		out[i] = &tenantLoad{Name: l.project}
	}
	var mu sync.Mutex
	warm := f.o.fleetPhase / 5
	tail := f.o.fleetPhase - f.work.saturatedService(f.eng)
	_, err := f.phase(ctx, func(end, began time.Time, session int) error {
		var wg sync.WaitGroup
		for i, l := range loads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(f.o.seed), uint64(l.tenant)+1<<48))
				var reqs sync.WaitGroup
				defer reqs.Wait()
				var inFlight atomic.Int64
				next := began
				for n := 0; ; n++ {
					next = next.Add(time.Duration(r.ExpFloat64() / l.rate * float64(time.Second)))
					if next.After(end) || sleepCtx(ctx, time.Until(next)) != nil {
						return
					}
					conv := f.work.conversation(l.tenant<<20 | n)
					conv.app, conv.session = l.app, session
					body := f.work.body(fleetFairModel, conv, 0, l.priority)
					at := time.Since(began)
					reqs.Add(1)
					go func() {
						defer reqs.Done()
						sent, held := time.Now(), inFlight.Add(1)
						s := f.send(f.gw, -1, body, []string{"Compat-Project", l.project}, make([]byte, 16<<10))
						inFlight.Add(-1)
						if f.flog != nil {
							f.flog.add(l.project, conv.turns[0].user, began, sent, time.Now(), int(held), s)
						}
						s.tokens, s.late, s.tail = conv.turns[0].maxTokens, time.Now().After(end), at >= tail
						if at >= warm {
							mu.Lock()
							out[i].add(s)
							mu.Unlock()
						}
					}()
				}
			}()
		}
		wg.Wait()
		return ctx.Err()
	})
	return out, err
}

// capacity estimates the requests a second the fleet serves with every slot busy, for a
// single turn under a cached system prompt: with every slot busy, every request runs at the
// load factor's top.
func (f *fleetBench) capacity() float64 {
	return float64(f.eng.servers*f.eng.maxNumSeqs) / f.work.saturatedService(f.eng).Seconds()
}

// fairness runs the well-behaved tenants alone, then with a tenant flooding at floodFactor
// times their rate, a third past the fleet's capacity in all.
func (f *fleetBench) fairness(ctx context.Context) (unloaded, loaded []*tenantLoad, err error) {
	rate := f.capacity() * 4 / 3 / float64(fairTenants+floodFactor)
	var loads []openLoad
	for t := range fairTenants {
		loads = append(loads, openLoad{tenant: t, project: "bench/tenant-" + strconv.Itoa(t), rate: rate, app: t})
	}
	f.logf("fairness: %d tenants at %.1f requests/s each, alone, for %s", fairTenants, rate, f.o.fleetPhase)
	if unloaded, err = f.scenario(ctx, "fairness alone", loads); err != nil {
		return nil, nil, err
	}
	loads = append(loads, openLoad{tenant: fairTenants, project: "bench/flooder", rate: floodFactor * rate, app: fairTenants})
	f.logf("fairness: with a flooder at %.1f requests/s, for %s", floodFactor*rate, f.o.fleetPhase)
	loaded, err = f.scenario(ctx, "fairness flood", loads)
	return unloaded, loaded, err
}

// priority runs a high-priority trickle alone, then under a low-priority flood past the
// fleet's capacity. Lower values are served first, as vLLM and the spec order them.
func (f *fleetBench) priority(ctx context.Context) (alone, high, flood *tenantLoad, err error) {
	c := f.capacity()
	trickle := openLoad{tenant: 10, project: "bench/high", priority: -1, rate: c / 10, app: 4}
	f.logf("priority: a high-priority trickle at %.1f requests/s, alone, for %s", trickle.rate, f.o.fleetPhase)
	a, err := f.scenario(ctx, "priority alone", []openLoad{trickle})
	if err != nil {
		return nil, nil, nil, err
	}
	low := openLoad{tenant: 11, project: "bench/low", priority: 1, rate: c * 1.2, app: 5}
	f.logf("priority: under a low-priority flood at %.1f requests/s, for %s", low.rate, f.o.fleetPhase)
	l, err := f.scenario(ctx, "priority flood", []openLoad{trickle, low})
	if err != nil {
		return nil, nil, nil, err
	}
	return a[0], l[0], l[1], nil
}
