package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Goals. Speed is judged against the bare proxy measured in the same run,
// as ratios that a noisy host inflates on both sides alike; memory has
// absolute bounds.
const (
	targetCPURatio        = 1.5  // gateway CPU per request over the bare proxy's, closed loop
	targetAddedP50Ratio   = 1.2  // median latency the gateway adds over what the bare proxy adds
	targetAddedP99Ratio   = 2.0  // p99 latency added, over the bare proxy's, at targetRateForP99
	targetThroughputRatio = 0.70 // closed-loop throughput, gateway over bare proxy
	targetStreamRatio     = 1.2  // added time to first event (p50) and added gap (p99), over the bare proxy's
	targetRSSMiB          = 30   // gateway RSS after the non-streaming and streaming load
	targetKiBPerStream    = 16   // gateway memory per open stream
	targetRateForP99      = 2000
)

// Sides of every comparison, in the order phases alternate.
const (
	direct = iota
	bare
	gateway
	numSides
)

var sideNames = [numSides]string{"direct", "bare", "gateway"}

// cpuDelta is the CPU time each process used during a phase — front is
// the process in front of the backend, the gateway or the bare proxy (none
// on the direct side) — the busy time of the whole machine, and steal: the
// time the hypervisor gave to other guests.
type cpuDelta struct {
	front, backend, self, machine, steal time.Duration
	wall                                 time.Duration
}

func (c *cpuDelta) add(o cpuDelta) {
	c.front += o.front
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
	return max(c.machine-c.front-c.backend-c.self, 0)
}

// cpuNow reads the CPU time used so far by front (nil for none), backend
// and this process. It fails if front has died, which would otherwise only
// show as a run of request errors.
func cpuNow(front, backend *proc) (cpuDelta, error) {
	var c cpuDelta
	var err error
	if front != nil {
		if ok, err := front.exited(); ok {
			return cpuDelta{}, fmt.Errorf("the %s exited during the run: %v\n%s", front.name, err, front.logTail(20))
		}
		if c.front, err = readCPU(front.pid()); err != nil {
			return c, err
		}
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
func (b *bench) cpuDuring(front, backend *proc, fn func() error) (cpuDelta, error) {
	before, err := cpuNow(front, backend)
	if err != nil {
		return cpuDelta{}, err
	}
	start := time.Now()
	if err := fn(); err != nil {
		return cpuDelta{}, err
	}
	wall := time.Since(start)
	if front != nil && front == b.gateway {
		// The usage writer works behind the requests: a phase's records
		// are written up to a flush interval after its last request, more
		// if the writer fell behind. That work is the phase's too.
		if err := b.waitUsageWritten(); err != nil {
			return cpuDelta{}, err
		}
	}
	after, err := cpuNow(front, backend)
	if err != nil {
		return cpuDelta{}, err
	}
	d := cpuDelta{
		front:   after.front - before.front,
		backend: after.backend - before.backend,
		self:    after.self - before.self,
		machine: after.machine - before.machine,
		steal:   after.steal - before.steal,
		wall:    wall,
	}
	b.foreign.add(d)
	return d, nil
}

// usageDrainTimeout bounds the wait for the usage writer after a phase:
// far above the flush interval of the gateway tollbench configures.
const usageDrainTimeout = 30 * time.Second

// waitUsageWritten waits until the gateway's usage queue is empty and its
// writer has written nothing for two scrapes in a row, so that the records
// of the phase just run are in the store.
func (b *bench) waitUsageWritten() error {
	probe := newGatewayProbe(b.gateway.pid(), b.gatewayAddr)
	deadline := time.Now().Add(usageDrainTimeout)
	last, stable := -1.0, 0
	for {
		m, err := probe.scrape()
		if err != nil {
			return fmt.Errorf("wait for the usage writer: %w", err)
		}
		written := m[metricUsageWritten]
		if m[metricUsageQueue] == 0 && written == last {
			if stable++; stable == 2 {
				return nil
			}
		} else {
			stable = 0
		}
		last = written
		if time.Now().After(deadline) {
			return fmt.Errorf("wait for the usage writer: %v records still queued after %v", m[metricUsageQueue], usageDrainTimeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// perRequest divides a CPU time by a count, in µs; 0 when nothing ran.
func perRequest(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return micros(d) / float64(n)
}

// sides are the three endpoints a measurement alternates between and the
// process in front of the backend on each (none when direct).
type sides struct {
	eps    [numSides]*endpoint
	fronts [numSides]*proc
}

// sides returns the endpoints of a measurement against the backend at
// backendAddr: directly, through the bare proxy bareProxy at bareAddr,
// and through the gateway.
func (b *bench) sides(backendAddr string, bareProxy *proc, bareAddr string, conns int) sides {
	return sides{
		eps: [numSides]*endpoint{
			newEndpoint("direct", backendAddr, b.key, conns),
			newEndpoint("bare", bareAddr, b.key, conns),
			newEndpoint("gateway", b.gatewayAddr, b.key, conns),
		},
		fronts: [numSides]*proc{nil, bareProxy, b.gateway},
	}
}

func (s sides) close() {
	for _, e := range s.eps {
		e.client.CloseIdleConnections()
	}
}

// measure runs every measurement in turn.
func (b *bench) measure(ctx context.Context) error {
	o := b.o
	if o.only == "open" {
		return b.measureOpenLoops(ctx)
	}
	if o.only != "streams" {
		if err := b.measureRequests(ctx); err != nil {
			return err
		}
	}
	if err := b.streamLatency(ctx); err != nil {
		return err
	}
	if err := b.memoryRow("after streaming load"); err != nil {
		return err
	}
	if b.handOverStream != nil {
		if err := b.floorStreams(ctx); err != nil {
			return err
		}
	}

	// Each open-streams measurement gets a fresh gateway and a fresh bare
	// proxy, so that memory the earlier load left in a heap neither
	// inflates the baseline nor gets reused by the streams and hides
	// their cost.
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

// measureRequests measures the non-streaming requests: the open loops,
// the closed loop, the memory they leave and, with -bare-store, the floor.
func (b *bench) measureRequests(ctx context.Context) error {
	o := b.o
	sd := b.sides(b.fastAddr, b.bareFast, b.bareFastAddr, max(o.openConns, o.conns))
	defer sd.close()
	body := chatBody(modelFast, 16, false)
	if err := b.openLoops(ctx, sd, body); err != nil {
		return err
	}
	if err := b.closedLoop(ctx, sd, body); err != nil {
		return err
	}
	if err := b.memoryRow("after non-streaming load"); err != nil {
		return err
	}
	if b.plainFast != nil {
		if err := b.floorLoop(ctx, body); err != nil {
			return err
		}
		return b.floorOpenLoops(ctx, body)
	}
	return nil
}

// measureOpenLoops measures the open loops alone (-only open), for quick
// comparisons of the latency at a fixed rate.
func (b *bench) measureOpenLoops(ctx context.Context) error {
	sd := b.sides(b.fastAddr, b.bareFast, b.bareFastAddr, b.o.openConns)
	defer sd.close()
	return b.openLoops(ctx, sd, chatBody(modelFast, 16, false))
}

// openLoops warms every side up and runs the open loop at each rate.
func (b *bench) openLoops(ctx context.Context, sd sides, body []byte) error {
	b.logf("warm-up: %s per side", b.o.warmup)
	for _, e := range sd.eps {
		r := runClosedLoop(ctx, e, body, 8, max(b.o.warmup, 100*time.Millisecond))
		if r.OK == 0 {
			return fmt.Errorf("warm-up: no request succeeded %s: %s", e.side, r.FirstError)
		}
	}
	for _, rate := range b.o.rates {
		if err := b.openLoop(ctx, sd, body, rate, loopReport{section: fmt.Sprintf("open loop %d/s", rate), goals: true}); err != nil {
			return err
		}
	}
	return nil
}

// loopReport is how an open loop's rows read: the section they go in,
// whether the goals apply to them (the gateway's loops) or not
// (the floor's, whose GATEWAY column is not the gateway), and a note for
// each latency row, which says what the columns are when they are not
// the usual ones.
type loopReport struct {
	section string
	goals   bool
	note    string
}

// memoryRow reports the gateway's resident memory now against its goal,
// beside the bare proxy's.
func (b *bench) memoryRow(when string) error {
	gw, err := readMem(b.gateway.pid())
	if err != nil {
		return err
	}
	bp, err := readMem(b.bareFast.pid())
	if err != nil {
		return err
	}
	b.rep.add(memoryRowOf(when, bp, gw))
	return nil
}

// memoryRowOf is the row of memoryRow, with the peaks and the split into
// anonymous memory (what the process allocated) and file-backed pages
// (mostly its executable) in the note.
func memoryRowOf(when string, bp, gw memInfo) row {
	return row{Section: "memory", Metric: "RSS " + when, Unit: unitMiB,
		Bare: ptr(mib(bp.RSS)), Gateway: ptr(mib(gw.RSS)), Value: mib(gw.RSS), Target: atMost(targetRSSMiB),
		Note: fmt.Sprintf("anon %.1f / file %.1f MiB; bare proxy anon %.1f / file %.1f MiB; peak (VmHWM): gateway %.1f MiB, bare proxy %.1f MiB",
			mib(gw.Anon), mib(gw.File), mib(bp.Anon), mib(bp.File), mib(gw.HWM), mib(bp.HWM))}
}

func mib(bytes uint64) float64 { return float64(bytes) / (1 << 20) }

// rewarm is how long each side serves its phase's load, unmeasured, right
// before each of its measured phases. The gateway closes an upstream
// connection left idle for 4 s (below uvicorn's keep-alive timeout), and
// between two of its phases the other sides run theirs: without a rewarm
// each of its phases would begin by dialing its backend again, which the
// bare proxy, keeping idle connections for a minute, would not, and a
// sustained load does not.
const rewarm = 300 * time.Millisecond

// alternate runs phase on each side in turn, o.rounds times, measuring the
// CPU time of the processes involved; backend is the mock behind them.
// warm, unmeasured, runs right before each phase (see rewarm).
func (b *bench) alternate(sd sides, backend *proc, warm func(e *endpoint), phase func(e *endpoint, side int) error) ([numSides]cpuDelta, error) {
	var cpu [numSides]cpuDelta
	for range b.o.rounds {
		for side, e := range sd.eps {
			warm(e)
			d, err := b.cpuDuring(sd.fronts[side], backend, func() error { return phase(e, side) })
			if err != nil {
				return cpu, fmt.Errorf("%s: %w", e.side, err)
			}
			cpu[side].add(d)
		}
	}
	return cpu, nil
}

// openLoop measures latency at a fixed rate on every side, and reports it
// as rep says.
func (b *bench) openLoop(ctx context.Context, sd sides, body []byte, rate int, rep loopReport) error {
	o := b.o
	b.logf("%s: %d × (%s %s, %s %s, %s %s)", rep.section, o.rounds,
		o.phase, sd.eps[direct].side, o.phase, sd.eps[bare].side, o.phase, sd.eps[gateway].side)
	var res [numSides]loadResult
	// The open loop's requests rarely overlap; a few connections carry it.
	warm := func(e *endpoint) { runClosedLoop(ctx, e, body, 8, rewarm) }
	cpu, err := b.alternate(sd, b.fast, warm, func(e *endpoint, side int) error {
		r, err := runOpenLoop(ctx, e, body, rate, o.phase, o.openConns)
		res[side].merge(r)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", rep.section, err)
	}
	b.openLoopRows(rep, rate, res, cpu)
	return nil
}

// openLoopRows reports an open loop at rate: latency, the generator's lag,
// the rate achieved and CPU, with the goals where rep says they
// apply.
func (b *bench) openLoopRows(rep loopReport, rate int, res [numSides]loadResult, cpu [numSides]cpuDelta) {
	sec := rep.section
	var q, lag [numSides]quantiles
	for side := range res {
		q[side], lag[side] = summarize(res[side].Latencies), summarize(res[side].Lags)
	}
	var t50, t99, tCPU *target
	if rep.goals {
		t50, tCPU = atMost(targetAddedP50Ratio), atMost(targetCPURatio)
		if rate == targetRateForP99 {
			t99 = atMost(targetAddedP99Ratio)
		}
	}
	b.compare(sec, "latency p50 (from scheduled send)", pick(q, p50), t50, rep.note)
	b.compare(sec, "latency p90", pick(q, p90), nil, rep.note)
	b.compare(sec, "latency p99", pick(q, p99), t99,
		joinNotes(fmt.Sprintf("%d / %d / %d samples", q[direct].N, q[bare].N, q[gateway].N), rep.note))
	b.sideRow(sec, "generator send lag p99", unitMicros, pick(lag, p99),
		"how late requests left the generator; part of every side's latency")
	b.rateRows(sec, res)
	b.cpuRows(sec, okCounts(res), cpu, tCPU, rep.note)
}

// joinNotes joins the notes that are not empty with "; ".
func joinNotes(notes ...string) string {
	return strings.Join(slices.DeleteFunc(notes, func(n string) bool { return n == "" }), "; ")
}

// closedLoops runs a closed loop on o.conns connections on each of sd's
// sides in turn, o.rounds times, and returns each side's pooled results
// and CPU use.
func (b *bench) closedLoops(ctx context.Context, sd sides, body []byte) ([numSides]loadResult, [numSides]cpuDelta, error) {
	var res [numSides]loadResult
	warm := func(e *endpoint) { runClosedLoop(ctx, e, body, b.o.conns, rewarm) }
	cpu, err := b.alternate(sd, b.fast, warm, func(e *endpoint, side int) error {
		res[side].merge(runClosedLoop(ctx, e, body, b.o.conns, b.o.phase))
		return ctx.Err()
	})
	return res, cpu, err
}

// throughputs is each side's successful requests per second.
func throughputs(res [numSides]loadResult) [numSides]float64 {
	var tput [numSides]float64
	for side := range res {
		if res[side].Elapsed > 0 {
			tput[side] = float64(res[side].OK) / res[side].Elapsed.Seconds()
		}
	}
	return tput
}

// closedLoop measures the most requests per second each side serves on
// o.conns connections.
func (b *bench) closedLoop(ctx context.Context, sd sides, body []byte) error {
	o := b.o
	b.logf("closed loop on %d connections: %d × (%s direct, %s bare, %s gateway)", o.conns, o.rounds, o.phase, o.phase, o.phase)
	res, cpu, err := b.closedLoops(ctx, sd, body)
	if err != nil {
		return fmt.Errorf("closed loop: %w", err)
	}
	sec := fmt.Sprintf("closed loop %d conns", o.conns)
	tput := throughputs(res)
	b.rep.add(row{Section: sec, Metric: "throughput, gateway / bare proxy", Unit: unitRatio, SideUnit: unitRate,
		Direct: ptr(tput[direct]), Bare: ptr(tput[bare]), Gateway: ptr(tput[gateway]),
		Value: safeRatio(tput[gateway], tput[bare]), Target: atLeast(targetThroughputRatio),
		Note: fmt.Sprintf("of direct: bare proxy %.1f%%, gateway %.1f%%",
			100*safeRatio(tput[bare], tput[direct]), 100*safeRatio(tput[gateway], tput[direct]))})
	var q [numSides]quantiles
	for side := range res {
		q[side] = summarize(res[side].Latencies)
	}
	b.compare(sec, "latency p50", pick(q, p50), nil, "")
	b.compare(sec, "latency p99", pick(q, p99), nil, "")
	b.errorRow(sec, res)
	b.cpuRows(sec, okCounts(res), cpu, atMost(targetCPURatio), "")
	return nil
}

// Percentiles pick chooses from quantiles.
const (
	p50 = iota
	p90
	p99
)

func pick(q [numSides]quantiles, p int) [numSides]time.Duration {
	var d [numSides]time.Duration
	for side := range q {
		d[side] = [3]time.Duration{q[side].P50, q[side].P90, q[side].P99}[p]
	}
	return d
}

func okCounts(res [numSides]loadResult) [numSides]int {
	var n [numSides]int
	for side := range res {
		n[side] = res[side].OK
	}
	return n
}

// safeRatio is a / b, or 0 when b is not positive.
func safeRatio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// compare adds a row comparing a latency on the three sides. Its result is
// the latency the gateway adds over direct divided by the latency the bare
// proxy adds: 1.0 means the gateway costs no more than forwarding does.
func (b *bench) compare(section, metric string, d [numSides]time.Duration, t *target, note string) {
	addedBare, addedGateway := d[bare]-d[direct], d[gateway]-d[direct]
	ratio := safeRatio(float64(addedGateway), float64(addedBare))
	added := fmt.Sprintf("added: bare proxy %s, gateway %s", formatValue(micros(addedBare), unitMicros, true),
		formatValue(micros(addedGateway), unitMicros, true))
	if addedBare <= 0 {
		added += "; the bare proxy added nothing measurable, so there is no ratio"
		t = nil
	}
	if note != "" {
		added += "; " + note
	}
	b.rep.add(row{Section: section, Metric: metric + ", added over bare", Unit: unitTimes, SideUnit: unitMicros,
		Direct: ptr(micros(d[direct])), Bare: ptr(micros(d[bare])), Gateway: ptr(micros(d[gateway])),
		Value: ratio, Target: t, Note: added})
}

// sideRow adds a row of one figure per side, with no result of its own.
func (b *bench) sideRow(section, metric, unit string, d [numSides]time.Duration, note string) {
	b.rep.add(row{Section: section, Metric: metric, Unit: unit, Direct: ptr(micros(d[direct])), Bare: ptr(micros(d[bare])),
		Gateway: ptr(micros(d[gateway])), Value: micros(d[gateway]), Note: note})
}

func (b *bench) rateRows(sec string, res [numSides]loadResult) {
	var rate [numSides]float64
	for side := range res {
		if res[side].Elapsed > 0 {
			rate[side] = float64(res[side].OK) / res[side].Elapsed.Seconds()
		}
	}
	b.rep.add(row{Section: sec, Metric: "achieved rate", Unit: unitRate, Direct: ptr(rate[direct]), Bare: ptr(rate[bare]),
		Gateway: ptr(rate[gateway]), Value: rate[gateway]})
	b.errorRow(sec, res)
}

// errorRow reports failed requests; any at all is a problem with the run,
// so it gets a target of zero.
func (b *bench) errorRow(sec string, res [numSides]loadResult) {
	note := ""
	var errs [numSides]float64
	total := 0.0
	for side := range res {
		errs[side] = float64(res[side].Errors)
		total += errs[side]
		if res[side].FirstError != "" && note == "" {
			note = sideNames[side] + ": " + res[side].FirstError
		}
	}
	b.rep.add(row{Section: sec, Metric: "failed requests", Unit: unitCount, Direct: ptr(errs[direct]), Bare: ptr(errs[bare]),
		Gateway: ptr(errs[gateway]), Value: total, Target: atMost(0), Note: note})
}

// cpuRows reports CPU time per request of the gateway against the bare
// proxy's, and the backend's and the generator's on every side, which tell
// where a 2-core machine's time goes when the throughput ratio is short.
func (b *bench) cpuRows(sec string, reqs [numSides]int, cpu [numSides]cpuDelta, t *target, note string) {
	gw, bp := perRequest(cpu[gateway].front, reqs[gateway]), perRequest(cpu[bare].front, reqs[bare])
	b.rep.add(row{Section: sec, Metric: "CPU/request, gateway / bare proxy", Unit: unitTimes, SideUnit: unitMicros,
		Bare: ptr(bp), Gateway: ptr(gw), Value: safeRatio(gw, bp), Target: t,
		Note: joinNotes(fmt.Sprintf("%s over %d requests, bare proxy %s over %d", cpu[gateway].front, reqs[gateway], cpu[bare].front, reqs[bare]), note)})
	var be, gen [numSides]float64
	for side := range cpu {
		be[side], gen[side] = perRequest(cpu[side].backend, reqs[side]), perRequest(cpu[side].self, reqs[side])
	}
	b.rep.add(row{Section: sec, Metric: "backend CPU/request", Unit: unitMicros, Direct: ptr(be[direct]), Bare: ptr(be[bare]),
		Gateway: ptr(be[gateway]), Value: be[gateway] - be[direct], Signed: true})
	b.rep.add(row{Section: sec, Metric: "generator CPU/request", Unit: unitMicros, Direct: ptr(gen[direct]), Bare: ptr(gen[bare]),
		Gateway: ptr(gen[gateway]), Value: gen[gateway] - gen[direct], Signed: true})
	b.othersRow(sec, cpu)
}

// othersRow reports how much CPU other programs on the machine used
// during the section's phases, in cores: on a 2-core machine a build
// running alongside moves every latency and throughput figure.
func (b *bench) othersRow(sec string, cpu [numSides]cpuDelta) {
	var cores, steal [numSides]float64
	for side := range cpu {
		if cpu[side].wall > 0 {
			cores[side] = cpu[side].others().Seconds() / cpu[side].wall.Seconds()
		}
		steal[side] = cpu[side].stealCores()
	}
	b.rep.add(row{Section: sec, Metric: "other programs' CPU (cores)", Unit: unitCores, Direct: ptr(cores[direct]),
		Bare: ptr(cores[bare]), Gateway: ptr(cores[gateway]), Value: max(cores[direct], cores[bare], cores[gateway]),
		Note: "busy time of the machine less the processes measured; should be near 0"})
	// Steal is part of the machine's busy time, and also of the CPU times
	// of the processes it interrupted (the scheduler charges a task for
	// the time its virtual CPU was taken away), so it inflates the rows
	// above as well as this section's latencies.
	b.rep.add(row{Section: sec, Metric: "hypervisor steal (cores)", Unit: unitCores, Direct: ptr(steal[direct]),
		Bare: ptr(steal[bare]), Gateway: ptr(steal[gateway]), Value: max(steal[direct], steal[bare], steal[gateway]),
		Note: "CPU the host gave to other virtual machines; also inflates the CPU times above; should be near 0"})
}

// streamLatency measures what the gateway adds to the time to first event
// and to the gaps between events of a stream, against the bare proxy.
func (b *bench) streamLatency(ctx context.Context) error {
	o := b.o
	sd := b.sides(b.streamAddr, b.bareStream, b.bareStreamAddr, o.streamConc)
	defer sd.close()
	return b.streamRows(ctx, sd, loopReport{section: fmt.Sprintf("streams %d×%s", o.streamTokens, o.streamITL), goals: true})
}

// streamRows runs streams on sd's sides in turn, o.rounds times, and
// reports their time to first event and gaps between events under rep.
func (b *bench) streamRows(ctx context.Context, sd sides, rep loopReport) error {
	o := b.o
	b.logf("%s: %d concurrent, %d × (%s %s, %s %s, %s %s)", rep.section, o.streamConc, o.rounds,
		o.phase, sd.eps[direct].side, o.phase, sd.eps[bare].side, o.phase, sd.eps[gateway].side)
	body := chatBody(modelStream, o.streamTokens, true)
	// A stream is the role event, the tokens, the finish and usage events
	// and [DONE], spaced by the inter-token delay.
	stagger := time.Duration(o.streamTokens+4) * o.streamITL / time.Duration(o.streamConc)
	for _, e := range sd.eps {
		if r := runStreamLatency(ctx, e, body, min(o.streamConc, 4), max(o.warmup, 100*time.Millisecond), 0); r.Streams == 0 {
			return fmt.Errorf("stream warm-up: no stream succeeded %s: %s", e.side, r.FirstError)
		}
	}
	var res [numSides]streamResult
	// Each worker starts one stream at once, and the rewarm ends with it.
	warm := func(e *endpoint) { runStreamLatency(ctx, e, body, o.streamConc, rewarm, 0) }
	cpu, err := b.alternate(sd, b.streamMock, warm, func(e *endpoint, side int) error {
		res[side].merge(runStreamLatency(ctx, e, body, o.streamConc, o.phase, stagger))
		return ctx.Err()
	})
	if err != nil {
		return fmt.Errorf("%s: %w", rep.section, err)
	}
	sec := rep.section
	var ttft, gap [numSides]quantiles
	for side := range res {
		ttft[side], gap[side] = summarize(res[side].TTFT), summarize(res[side].Gaps)
	}
	var goal *target
	if rep.goals {
		goal = atMost(targetStreamRatio)
	}
	b.compare(sec, "time to first event p50", pick(ttft, p50), goal,
		joinNotes(fmt.Sprintf("%d / %d / %d streams", ttft[direct].N, ttft[bare].N, ttft[gateway].N), rep.note))
	b.compare(sec, "time to first event p99", pick(ttft, p99), nil, rep.note)
	b.compare(sec, "gap between events p50", pick(gap, p50), nil, rep.note)
	b.compare(sec, "gap between events p99", pick(gap, p99), goal,
		joinNotes(fmt.Sprintf("%d / %d / %d gaps", gap[direct].N, gap[bare].N, gap[gateway].N), rep.note))
	var perStream, errs [numSides]float64
	note := ""
	for side := range res {
		if res[side].Streams > 0 {
			perStream[side] = float64(res[side].Events) / float64(res[side].Streams)
		}
		errs[side] = float64(res[side].Errors)
		if res[side].FirstError != "" && note == "" {
			note = sideNames[side] + ": " + res[side].FirstError
		}
	}
	b.rep.add(row{Section: sec, Metric: "events per stream", Unit: unitCount, Direct: ptr(perStream[direct]),
		Bare: ptr(perStream[bare]), Gateway: ptr(perStream[gateway]), Value: perStream[gateway]})
	b.rep.add(row{Section: sec, Metric: "failed streams", Unit: unitCount, Direct: ptr(errs[direct]), Bare: ptr(errs[bare]),
		Gateway: ptr(errs[gateway]), Value: errs[direct] + errs[bare] + errs[gateway], Target: atMost(0), Note: note})
	gw, bp := perRequest(cpu[gateway].front, res[gateway].Streams), perRequest(cpu[bare].front, res[bare].Streams)
	b.rep.add(row{Section: sec, Metric: "CPU/stream, gateway / bare proxy", Unit: unitTimes, SideUnit: unitMicros,
		Bare: ptr(bp), Gateway: ptr(gw), Value: safeRatio(gw, bp),
		Note: joinNotes(fmt.Sprintf("gateway %.1fµs per event", perRequest(cpu[gateway].front, res[gateway].Events)), rep.note)})
	b.othersRow(sec, cpu)
	return nil
}

// openStreams measures the memory per open stream of the bare proxy and
// of the gateway with n slow streams held at once through each, in turn,
// on fresh processes; the bare proxy goes first, so that both see the
// slow mock and the machine in the same state.
func (b *bench) openStreams(ctx context.Context, n int) error {
	b.logf("open streams: %d at %s per event, on a fresh bare proxy, then on a fresh gateway", n, b.o.slowITL)
	// Both forward the same request to the same slow mock: the gateway
	// routes modelSlow to it, the bare proxy forwards everything there.
	hold := openStreamsOptions{
		key: b.key, body: chatBody(modelSlow, slowTokens, true), n: n,
		openConc: 128, firstEventTimeout: 90 * time.Second, settle: b.o.slowITL + 500*time.Millisecond,
	}
	var res [numSides]openStreamsResult
	var err error
	if res[bare], err = b.holdOnFreshBare(ctx, hold); err != nil {
		return fmt.Errorf("open streams %d, bare proxy: %w", n, err)
	}
	if res[gateway], err = b.holdOnFreshGateway(ctx, hold); err != nil {
		return fmt.Errorf("open streams %d, gateway: %w", n, err)
	}
	for _, rw := range openStreamsRows(n, res[bare], res[gateway]) {
		b.rep.add(rw)
	}
	for side, r := range res {
		for _, e := range r.ErrorSample {
			b.rep.note("%d open streams, %s: %s", n, sideNames[side], e)
		}
	}
	return nil
}

// holdOnFreshBare starts a bare proxy in front of the slow mock, warms it,
// reads its idle memory and holds the streams of o through it; it stops
// the proxy before it returns.
func (b *bench) holdOnFreshBare(ctx context.Context, o openStreamsOptions) (res openStreamsResult, err error) {
	b.bareRuns++
	p, addr, err := startBare(ctx, b.bins, b.dir, fmt.Sprintf("bare-slow-%d", b.bareRuns), b.slowAddr, bareOptions{store: b.o.bareStore})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, p.stop(stopGrace)) }()
	// The bare proxy reaches only the slow mock, which answers plain
	// requests at once but waits -slow-itl between a stream's tokens:
	// its warm-up streams have one token, so that they end at once.
	if err := warmFresh(ctx, "bare proxy", addr, b.key, chatBody(modelSlow, 16, false), chatBody(modelSlow, 1, true)); err != nil {
		return res, err
	}
	return holdAndMeasure(ctx, o, addr, p.pid())
}

// holdOnFreshGateway starts a gateway, warms it, reads its idle memory and
// holds the streams of o through it; it stops the gateway before it
// returns.
func (b *bench) holdOnFreshGateway(ctx context.Context, o openStreamsOptions) (res openStreamsResult, err error) {
	if err := b.startGateway(ctx); err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, b.stopGateway()) }()
	if err := warmFresh(ctx, "gateway", b.gatewayAddr, b.key, chatBody(modelFast, 16, false), chatBody(modelStream, 8, true)); err != nil {
		return res, err
	}
	return holdAndMeasure(ctx, o, b.gatewayAddr, b.gateway.pid())
}

// holdAndMeasure reads the idle memory of process pid, then holds the
// streams of o through it at addr.
func holdAndMeasure(ctx context.Context, o openStreamsOptions, addr string, pid int) (openStreamsResult, error) {
	baseline, err := readMem(pid)
	if err != nil {
		return openStreamsResult{}, err
	}
	o.addr = addr
	o.measure = func() (memInfo, error) { return readMem(pid) }
	res, err := holdStreams(ctx, o)
	res.Baseline = baseline
	return res, err
}

// kibPerStream is the growth from before to after spread over held
// streams, in KiB; 0 when nothing was held or nothing grew.
func kibPerStream(before, after uint64, held int) float64 {
	if held <= 0 || after <= before {
		return 0
	}
	return float64(after-before) / float64(held) / 1024
}

// mibDelta is after - before in MiB, signed.
func mibDelta(before, after uint64) float64 {
	return mib(after) - mib(before)
}

// openStreamsRows reports the memory per open stream of the bare proxy and
// the gateway side by side. The target is on the gateway's own figure;
// the note gives the difference, the anonymous memory alone per stream
// (what streams allocate: buffers, goroutine stacks, connection state),
// and how far the file-backed pages moved, which they should not.
func openStreamsRows(n int, bp, gw openStreamsResult) []row {
	sec := fmt.Sprintf("%d open streams", n)
	res := [numSides]openStreamsResult{bare: bp, gateway: gw}
	var rss, anon [numSides]float64
	var idle []string
	for _, side := range []int{bare, gateway} {
		r := res[side]
		rss[side] = kibPerStream(r.Baseline.RSS, r.Loaded.RSS, r.Open)
		anon[side] = kibPerStream(r.Baseline.Anon, r.Loaded.Anon, r.Open)
		s := fmt.Sprintf("%s %.1f → %.1f MiB", sideNames[side], mib(r.Baseline.RSS), mib(r.Loaded.RSS))
		if r.Open != n {
			s += fmt.Sprintf(" (divided by the %d held, not %d)", r.Open, n)
		}
		idle = append(idle, s)
	}
	note := fmt.Sprintf("gateway − bare %s; anon only: bare %.1f, gateway %.1f KiB/stream; RSS idle → held: %s; "+
		"file-backed moved: bare %+.1f, gateway %+.1f MiB",
		formatValue(rss[gateway]-rss[bare], unitKiB, true), anon[bare], anon[gateway], strings.Join(idle, ", "),
		mibDelta(bp.Baseline.File, bp.Loaded.File), mibDelta(gw.Baseline.File, gw.Loaded.File))

	errNote := ""
	for _, side := range []int{bare, gateway} {
		if len(res[side].ErrorSample) > 0 && errNote == "" {
			errNote = sideNames[side] + ": " + res[side].ErrorSample[0]
		}
	}
	return []row{
		{Section: sec, Metric: "memory per stream", Unit: unitKiB, Bare: ptr(rss[bare]), Gateway: ptr(rss[gateway]),
			Value: rss[gateway], Target: atMost(targetKiBPerStream), Note: note},
		{Section: sec, Metric: "streams failed", Unit: unitCount, Bare: ptr(float64(bp.Errors)), Gateway: ptr(float64(gw.Errors)),
			Value: float64(bp.Errors + gw.Errors), Target: atMost(0), Note: errNote},
		{Section: sec, Metric: "time until all had a first event", Unit: unitMicros, Bare: ptr(micros(bp.OpenTime)),
			Gateway: ptr(micros(gw.OpenTime)), Value: micros(gw.OpenTime)},
	}
}

// warmFresh sends a few plain requests and two streams through a freshly
// started gateway or bare proxy at addr, so that the idle baseline
// includes what any first request initialises (pools, prepared statements,
// log buffers) rather than charging it to the streams; then it lets the
// process settle for a second.
func warmFresh(ctx context.Context, name, addr, key string, plain, stream []byte) error {
	e := newEndpoint(name, addr, key, 4)
	defer e.client.CloseIdleConnections()
	req := e.newRequest(plain)
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	for range 50 {
		if err := e.do(req, resp); err != nil {
			return fmt.Errorf("warm fresh %s: %w", name, err)
		}
	}
	se := newEndpoint(name, addr, key, 2)
	defer se.client.CloseIdleConnections()
	sreq := se.newRequest(stream)
	defer fasthttp.ReleaseRequest(sreq)
	var sr streamResult
	buf := make([]byte, 16<<10)
	for range 2 {
		if err := readStream(se, sreq, buf, &sr); err != nil {
			return fmt.Errorf("warm fresh %s: %w", name, err)
		}
	}
	return sleepCtx(ctx, time.Second)
}
