package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/valyala/fasthttp"
)

// Targets, as stated for a 2-core machine running all three processes.
const (
	targetCPUPerRequest   = 25  // µs of gateway CPU per non-streaming request
	targetAddedP50        = 50  // µs added at the median, at 1k req/s
	targetAddedP99        = 500 // µs added at p99, at 1k req/s
	targetThroughputRatio = 0.6 // gateway throughput over direct, at 64 connections
	targetAddedTTFT       = 200 // µs added to the median time to first token
	targetAddedGapP99     = 100 // µs added to the p99 gap between events
	targetKiBPerStream    = 16  // KiB of gateway memory per open stream
	targetRateForLatency  = 1000
)

// Sides of every comparison, in the order phases alternate.
const (
	direct = iota
	gateway
)

var sideNames = [2]string{"direct", "gateway"}

// cpuDelta is the CPU time each process used during a phase, the busy
// time of the whole machine, and steal: the time the hypervisor gave to
// other guests.
type cpuDelta struct {
	gateway, backend, self, machine, steal time.Duration
	wall                                   time.Duration
}

func (c *cpuDelta) add(o cpuDelta) {
	c.gateway += o.gateway
	c.backend += o.backend
	c.self += o.self
	c.machine += o.machine
	c.steal += o.steal
	c.wall += o.wall
}

// stealCores is the hypervisor's steal during the phase, in cores.
func (c *cpuDelta) stealCores() float64 {
	if c.wall <= 0 {
		return 0
	}
	return c.steal.Seconds() / c.wall.Seconds()
}

// others is the CPU time the rest of the machine used meanwhile: other
// programs (builds, tests) competing for the same cores, which the
// numbers of a run on a shared machine must be read against.
func (c *cpuDelta) others() time.Duration {
	return max(c.machine-c.gateway-c.backend-c.self, 0)
}

// cpuNow reads the CPU time used so far by the gateway, backend and this
// process. It fails if the gateway has died, which would otherwise only
// show as a run of request errors.
func (b *bench) cpuNow(backend *proc) (cpuDelta, error) {
	if ok, err := b.gateway.exited(); ok {
		return cpuDelta{}, fmt.Errorf("the gateway exited during the run: %v\n%s", err, b.gateway.logTail(20))
	}
	var c cpuDelta
	var err error
	if c.gateway, err = readCPU(b.gateway.pid()); err != nil {
		return c, err
	}
	if c.backend, err = readCPU(backend.pid()); err != nil {
		return c, err
	}
	if c.self, err = readCPU(os.Getpid()); err != nil {
		return c, err
	}
	if c.machine, c.steal, err = readMachineBusy(); err != nil {
		return c, err
	}
	return c, nil
}

// cpuDuring runs fn and returns the CPU time each process used meanwhile.
func (b *bench) cpuDuring(backend *proc, fn func() error) (cpuDelta, error) {
	before, err := b.cpuNow(backend)
	if err != nil {
		return cpuDelta{}, err
	}
	start := time.Now()
	if err := fn(); err != nil {
		return cpuDelta{}, err
	}
	wall := time.Since(start)
	after, err := b.cpuNow(backend)
	if err != nil {
		return cpuDelta{}, err
	}
	d := cpuDelta{
		gateway: after.gateway - before.gateway,
		backend: after.backend - before.backend,
		self:    after.self - before.self,
		machine: after.machine - before.machine,
		steal:   after.steal - before.steal,
		wall:    wall,
	}
	b.foreign.add(d)
	return d, nil
}

// perRequest divides a CPU time by a count, in µs; 0 when nothing ran.
func perRequest(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return micros(d) / float64(n)
}

// measure runs every measurement in turn.
func (b *bench) measure(ctx context.Context) error {
	o := b.o
	conns := max(o.openConns, o.conns)
	eps := [2]*endpoint{
		newEndpoint("direct", b.fastAddr, b.key, conns),
		newEndpoint("gateway", b.gatewayAddr, b.key, conns),
	}
	defer eps[direct].client.CloseIdleConnections()
	defer eps[gateway].client.CloseIdleConnections()
	body := chatBody(modelFast, 16, false)

	b.logf("warm-up: %s per side", o.warmup)
	for _, e := range eps {
		r := runClosedLoop(ctx, e, body, 8, max(o.warmup, 100*time.Millisecond))
		if r.OK == 0 {
			return fmt.Errorf("warm-up: no request succeeded %s: %s", e.side, r.FirstError)
		}
	}
	for _, rate := range o.rates {
		if err := b.openLoop(ctx, eps, body, rate); err != nil {
			return err
		}
	}
	if err := b.closedLoop(ctx, eps, body); err != nil {
		return err
	}
	mem, err := readMem(b.gateway.pid())
	if err != nil {
		return err
	}
	b.rep.add(row{Section: "gateway memory", Metric: "peak RSS (VmHWM) after non-streaming load", Unit: unitMiB,
		Gateway: ptr(mib(mem.HWM)), Value: mib(mem.HWM)})

	if err := b.streamLatency(ctx); err != nil {
		return err
	}
	if mem, err = readMem(b.gateway.pid()); err != nil {
		return err
	}
	b.rep.add(row{Section: "gateway memory", Metric: "peak RSS (VmHWM) after streaming load", Unit: unitMiB,
		Gateway: ptr(mib(mem.HWM)), Value: mib(mem.HWM)})

	// Each open-streams measurement gets a fresh gateway, so that memory
	// the earlier load left in its heap neither inflates the baseline nor
	// gets reused by the streams and hides their cost.
	if err := b.stopGateway(); err != nil {
		return err
	}
	for _, n := range o.openStreams {
		if err := b.openStreams(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

func mib(bytes uint64) float64 { return float64(bytes) / (1 << 20) }

// openLoop measures latency at a fixed rate on both sides.
func (b *bench) openLoop(ctx context.Context, eps [2]*endpoint, body []byte, rate int) error {
	o := b.o
	b.logf("open loop at %d req/s: %d × (%s direct, %s gateway)", rate, o.rounds, o.phase, o.phase)
	var res [2]loadResult
	var cpu [2]cpuDelta
	for range o.rounds {
		for side, e := range eps {
			var r loadResult
			d, err := b.cpuDuring(b.fast, func() error {
				var err error
				r, err = runOpenLoop(ctx, e, body, rate, o.phase, o.openConns)
				return err
			})
			if err != nil {
				return fmt.Errorf("open loop %d/s %s: %w", rate, e.side, err)
			}
			res[side].merge(r)
			cpu[side].add(d)
		}
	}

	sec := fmt.Sprintf("open loop %d/s", rate)
	q := [2]quantiles{summarize(res[direct].Latencies), summarize(res[gateway].Latencies)}
	var t50, t99 *target
	if rate == targetRateForLatency {
		t50, t99 = atMost(targetAddedP50), atMost(targetAddedP99)
	}
	b.added(sec, "latency p50 (from scheduled send)", q[direct].P50, q[gateway].P50, t50, "")
	b.added(sec, "latency p90", q[direct].P90, q[gateway].P90, nil, "")
	b.added(sec, "latency p99", q[direct].P99, q[gateway].P99, t99, fmt.Sprintf("%d / %d samples", q[direct].N, q[gateway].N))
	lag := [2]quantiles{summarize(res[direct].Lags), summarize(res[gateway].Lags)}
	b.added(sec, "generator send lag p50", lag[direct].P50, lag[gateway].P50, nil, "how late requests left the generator; part of the latency")
	b.added(sec, "generator send lag p99", lag[direct].P99, lag[gateway].P99, nil, "")
	b.rateRows(sec, res)
	b.cpuRows(sec, [2]int{res[direct].OK, res[gateway].OK}, cpu)
	return nil
}

// closedLoop measures the most requests per second each side serves on
// o.conns connections.
func (b *bench) closedLoop(ctx context.Context, eps [2]*endpoint, body []byte) error {
	o := b.o
	b.logf("closed loop on %d connections: %d × (%s direct, %s gateway)", o.conns, o.rounds, o.phase, o.phase)
	var res [2]loadResult
	var cpu [2]cpuDelta
	for range o.rounds {
		for side, e := range eps {
			var r loadResult
			d, err := b.cpuDuring(b.fast, func() error {
				r = runClosedLoop(ctx, e, body, o.conns, o.phase)
				return ctx.Err()
			})
			if err != nil {
				return fmt.Errorf("closed loop %s: %w", e.side, err)
			}
			res[side].merge(r)
			cpu[side].add(d)
		}
	}
	sec := fmt.Sprintf("closed loop %d conns", o.conns)
	tput := [2]float64{}
	for side := range res {
		if res[side].Elapsed > 0 {
			tput[side] = float64(res[side].OK) / res[side].Elapsed.Seconds()
		}
	}
	ratio := 0.0
	if tput[direct] > 0 {
		ratio = tput[gateway] / tput[direct]
	}
	b.rep.add(row{Section: sec, Metric: "throughput (gateway / direct)", Unit: unitRatio, SideUnit: unitRate,
		Direct: ptr(tput[direct]), Gateway: ptr(tput[gateway]), Value: ratio, Target: atLeast(targetThroughputRatio)})
	q := [2]quantiles{summarize(res[direct].Latencies), summarize(res[gateway].Latencies)}
	b.added(sec, "latency p50", q[direct].P50, q[gateway].P50, nil, "")
	b.added(sec, "latency p99", q[direct].P99, q[gateway].P99, nil, "")
	b.errorRow(sec, res)
	b.cpuRows(sec, [2]int{res[direct].OK, res[gateway].OK}, cpu)
	return nil
}

// added adds a row comparing a latency on both sides; the result is the
// gateway's minus the direct one.
func (b *bench) added(section, metric string, d, g time.Duration, t *target, note string) {
	b.rep.add(row{Section: section, Metric: metric, Unit: unitMicros, Direct: ptr(micros(d)), Gateway: ptr(micros(g)),
		Value: micros(g - d), Signed: true, Target: t, Note: note})
}

func (b *bench) rateRows(sec string, res [2]loadResult) {
	var rate [2]float64
	for side := range res {
		if res[side].Elapsed > 0 {
			rate[side] = float64(res[side].OK) / res[side].Elapsed.Seconds()
		}
	}
	b.rep.add(row{Section: sec, Metric: "achieved rate", Unit: unitRate, Direct: ptr(rate[direct]), Gateway: ptr(rate[gateway]),
		Value: rate[gateway]})
	b.errorRow(sec, res)
}

// errorRow reports failed requests; any at all is a problem with the run,
// so it gets a target of zero.
func (b *bench) errorRow(sec string, res [2]loadResult) {
	note := ""
	for side := range res {
		if res[side].FirstError != "" && note == "" {
			note = sideNames[side] + ": " + res[side].FirstError
		}
	}
	b.rep.add(row{Section: sec, Metric: "failed requests", Unit: unitCount, Direct: ptr(float64(res[direct].Errors)),
		Gateway: ptr(float64(res[gateway].Errors)), Value: float64(res[direct].Errors + res[gateway].Errors),
		Target: atMost(0), Note: note})
}

// cpuRows reports CPU time per request: the gateway's against its target,
// and the backend's and the generator's on both sides, which tell where a
// 2-core machine's time goes when the throughput ratio is short.
func (b *bench) cpuRows(sec string, reqs [2]int, cpu [2]cpuDelta) {
	gw := perRequest(cpu[gateway].gateway, reqs[gateway])
	b.rep.add(row{Section: sec, Metric: "gateway CPU/request", Unit: unitMicros, Gateway: ptr(gw), Value: gw,
		Target: atMost(targetCPUPerRequest),
		Note:   fmt.Sprintf("%s over %d requests", cpu[gateway].gateway, reqs[gateway])})
	be := [2]float64{perRequest(cpu[direct].backend, reqs[direct]), perRequest(cpu[gateway].backend, reqs[gateway])}
	b.rep.add(row{Section: sec, Metric: "backend CPU/request", Unit: unitMicros, Direct: ptr(be[direct]), Gateway: ptr(be[gateway]),
		Value: be[gateway] - be[direct], Signed: true})
	gen := [2]float64{perRequest(cpu[direct].self, reqs[direct]), perRequest(cpu[gateway].self, reqs[gateway])}
	b.rep.add(row{Section: sec, Metric: "generator CPU/request", Unit: unitMicros, Direct: ptr(gen[direct]), Gateway: ptr(gen[gateway]),
		Value: gen[gateway] - gen[direct], Signed: true})
	b.othersRow(sec, cpu)
}

// othersRow reports how much CPU other programs on the machine used
// during the section's phases, in cores: on a 2-core machine a build
// running alongside moves every latency and throughput figure.
func (b *bench) othersRow(sec string, cpu [2]cpuDelta) {
	var cores [2]float64
	for side := range cpu {
		if cpu[side].wall > 0 {
			cores[side] = cpu[side].others().Seconds() / cpu[side].wall.Seconds()
		}
	}
	b.rep.add(row{Section: sec, Metric: "other programs' CPU (cores)", Unit: unitCores, Direct: ptr(cores[direct]),
		Gateway: ptr(cores[gateway]), Value: max(cores[direct], cores[gateway]),
		Note: "busy time of the machine less the three processes; should be near 0"})
	steal := [2]float64{cpu[direct].stealCores(), cpu[gateway].stealCores()}
	// Steal is part of the machine's busy time, and also of the CPU times
	// of the processes it interrupted (the scheduler charges a task for
	// the time its virtual CPU was taken away), so it inflates the rows
	// above as well as this section's latencies.
	b.rep.add(row{Section: sec, Metric: "hypervisor steal (cores)", Unit: unitCores, Direct: ptr(steal[direct]),
		Gateway: ptr(steal[gateway]), Value: max(steal[direct], steal[gateway]),
		Note: "CPU the host gave to other virtual machines; also inflates the CPU times above; should be near 0"})
}

// streamLatency measures what the gateway adds to the time to first token
// and to the gaps between events of a stream.
func (b *bench) streamLatency(ctx context.Context) error {
	o := b.o
	eps := [2]*endpoint{
		newEndpoint("direct", b.streamAddr, b.key, o.streamConc),
		newEndpoint("gateway", b.gatewayAddr, b.key, o.streamConc),
	}
	defer eps[direct].client.CloseIdleConnections()
	defer eps[gateway].client.CloseIdleConnections()
	body := chatBody(modelStream, o.streamTokens, true)
	b.logf("streams: %d concurrent, %d × (%s direct, %s gateway)", o.streamConc, o.rounds, o.phase, o.phase)
	// A stream is the role event, the tokens, the finish and usage events
	// and [DONE], spaced by the inter-token delay.
	stagger := time.Duration(o.streamTokens+4) * o.streamITL / time.Duration(o.streamConc)
	for _, e := range eps {
		if r := runStreamLatency(ctx, e, body, min(o.streamConc, 4), max(o.warmup, 100*time.Millisecond), 0); r.Streams == 0 {
			return fmt.Errorf("stream warm-up: no stream succeeded %s: %s", e.side, r.FirstError)
		}
	}
	var res [2]streamResult
	var cpu [2]cpuDelta
	for range o.rounds {
		for side, e := range eps {
			var r streamResult
			d, err := b.cpuDuring(b.streamMock, func() error {
				r = runStreamLatency(ctx, e, body, o.streamConc, o.phase, stagger)
				return ctx.Err()
			})
			if err != nil {
				return fmt.Errorf("streams %s: %w", e.side, err)
			}
			res[side].merge(r)
			cpu[side].add(d)
		}
	}
	sec := fmt.Sprintf("streams %d×%s", o.streamTokens, o.streamITL)
	ttft := [2]quantiles{summarize(res[direct].TTFT), summarize(res[gateway].TTFT)}
	gap := [2]quantiles{summarize(res[direct].Gaps), summarize(res[gateway].Gaps)}
	b.added(sec, "time to first event p50", ttft[direct].P50, ttft[gateway].P50, atMost(targetAddedTTFT),
		fmt.Sprintf("%d / %d streams", ttft[direct].N, ttft[gateway].N))
	b.added(sec, "time to first event p99", ttft[direct].P99, ttft[gateway].P99, nil, "")
	b.added(sec, "gap between events p50", gap[direct].P50, gap[gateway].P50, nil, "")
	b.added(sec, "gap between events p99", gap[direct].P99, gap[gateway].P99, atMost(targetAddedGapP99),
		fmt.Sprintf("%d / %d gaps", gap[direct].N, gap[gateway].N))
	var perStream [2]float64
	for side := range res {
		if res[side].Streams > 0 {
			perStream[side] = float64(res[side].Events) / float64(res[side].Streams)
		}
	}
	b.rep.add(row{Section: sec, Metric: "events per stream", Unit: unitCount, Direct: ptr(perStream[direct]),
		Gateway: ptr(perStream[gateway]), Value: perStream[gateway]})
	note := ""
	for side := range res {
		if res[side].FirstError != "" && note == "" {
			note = sideNames[side] + ": " + res[side].FirstError
		}
	}
	b.rep.add(row{Section: sec, Metric: "failed streams", Unit: unitCount, Direct: ptr(float64(res[direct].Errors)),
		Gateway: ptr(float64(res[gateway].Errors)), Value: float64(res[direct].Errors + res[gateway].Errors),
		Target: atMost(0), Note: note})
	gw := perRequest(cpu[gateway].gateway, res[gateway].Streams)
	b.rep.add(row{Section: sec, Metric: "gateway CPU/stream", Unit: unitMicros, Gateway: ptr(gw), Value: gw,
		Note: fmt.Sprintf("%.1fµs per event", perRequest(cpu[gateway].gateway, res[gateway].Events))})
	b.othersRow(sec, cpu)
	return nil
}

// openStreams measures the gateway's memory per open stream with n slow
// streams held at once, on a fresh gateway process.
func (b *bench) openStreams(ctx context.Context, n int) error {
	b.logf("open streams: %d at %s per event, on a fresh gateway", n, b.o.slowITL)
	if err := b.startGateway(ctx); err != nil {
		return err
	}
	if err := b.warmFresh(ctx); err != nil {
		return errors.Join(err, b.stopGateway())
	}
	pid := b.gateway.pid()
	baseline, err := readMem(pid)
	if err != nil {
		return errors.Join(err, b.stopGateway())
	}
	res, err := holdStreams(ctx, openStreamsOptions{
		addr: b.gatewayAddr, key: b.key, body: chatBody(modelSlow, slowTokens, true), n: n,
		openConc: 128, firstEventTimeout: 90 * time.Second, settle: b.o.slowITL + 500*time.Millisecond,
		measure: func() (memInfo, error) { return readMem(pid) },
	})
	if err != nil {
		return errors.Join(fmt.Errorf("open streams %d: %w", n, err), b.stopGateway())
	}
	res.Baseline = baseline
	if err := b.stopGateway(); err != nil {
		return err
	}

	sec := fmt.Sprintf("%d open streams", n)
	held := res.Open
	perStream := 0.0
	if held > 0 && res.Loaded.RSS > baseline.RSS {
		perStream = float64(res.Loaded.RSS-baseline.RSS) / float64(held) / 1024
	}
	note := fmt.Sprintf("RSS %.1f MiB idle → %.1f MiB with %d streams", mib(baseline.RSS), mib(res.Loaded.RSS), held)
	if held != n {
		note += fmt.Sprintf(" (divided by the %d held, not %d)", held, n)
	}
	b.rep.add(row{Section: sec, Metric: "gateway memory per stream", Unit: unitKiB, Gateway: ptr(perStream), Value: perStream,
		Target: atMost(targetKiBPerStream), Note: note})
	errNote := ""
	if len(res.ErrorSample) > 0 {
		errNote = res.ErrorSample[0]
	}
	b.rep.add(row{Section: sec, Metric: "streams failed", Unit: unitCount, Gateway: ptr(float64(res.Errors)),
		Value: float64(res.Errors), Target: atMost(0), Note: errNote})
	b.rep.add(row{Section: sec, Metric: "time until all had a first event", Unit: unitMicros, Gateway: ptr(micros(res.OpenTime)),
		Value: micros(res.OpenTime)})
	for _, e := range res.ErrorSample {
		b.rep.note("%d open streams: %s", n, e)
	}
	return nil
}

// warmFresh sends a few requests through a freshly started gateway, so
// that the idle baseline includes what any first request initialises
// (pools, prepared statements, log buffers) rather than charging it to the
// streams; then it lets the gateway settle for a second.
func (b *bench) warmFresh(ctx context.Context) error {
	e := newEndpoint("gateway", b.gatewayAddr, b.key, 4)
	defer e.client.CloseIdleConnections()
	body := chatBody(modelFast, 16, false)
	req := e.newRequest(body)
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	for range 50 {
		if err := e.do(req, resp); err != nil {
			return fmt.Errorf("warm fresh gateway: %w", err)
		}
	}
	se := newEndpoint("gateway", b.gatewayAddr, b.key, 2)
	defer se.client.CloseIdleConnections()
	sreq := se.newRequest(chatBody(modelStream, 8, true))
	defer fasthttp.ReleaseRequest(sreq)
	var sr streamResult
	buf := make([]byte, 16<<10)
	for range 2 {
		if err := readStream(se, sreq, buf, &sr); err != nil {
			return fmt.Errorf("warm fresh gateway: %w", err)
		}
	}
	return sleepCtx(ctx, time.Second)
}
