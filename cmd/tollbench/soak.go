package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The soak holds the gateway under a steady mixed load for a long time and
// checks that it ends where it started: what a leak (a goroutine, a
// descriptor, an in-flight counter or a queue entry left behind by some
// rare path, such as a client closing a stream) would change.

// Bounds of the soak's checks.
const (
	soakRSSShare       = 0.10    // end RSS may exceed the baseline by this share...
	soakRSSFloor       = 4 << 20 // ...or by this many bytes, whichever is more
	soakGoroutineSlack = 10      // goroutines above the baseline after the load drained
	soakFDSlack        = 10      // open descriptors above the baseline after the load drained
)

const (
	// soakInterval is how often the gateway is sampled under load.
	soakInterval = 10 * time.Second
	// soakSettle is how long after the load stopped, and every in-flight
	// gauge read 0, the baseline and the end are sampled. A sample is also
	// taken soakEarly into it, as a record, but the verdicts use the late
	// one: the gateway's server keeps an idle worker goroutine per
	// connection it served for up to twice fasthttp's MaxIdleWorkerDuration
	// (10 s, cleaned every 10 s), and its upstream connections for up to
	// twice backends.maxIdleConnDuration (4 s), so a sample taken sooner
	// counts, beside any leak, as many goroutines and descriptors as the
	// last seconds of load happened to need.
	soakSettle = 25 * time.Second
	soakEarly  = 5 * time.Second
	// soakDrainTimeout bounds the wait for the in-flight gauges to drop
	// to 0 once the load stopped; a gauge still up then is a leak.
	soakDrainTimeout = 30 * time.Second
	// soakUsageTimeout bounds the wait for the usage records of every
	// request to reach the store.
	soakUsageTimeout = 30 * time.Second
	// scrapeTimeout bounds one read of the gateway's /metrics.
	scrapeTimeout = 5 * time.Second
)

// Metric families the soak samples from the gateway's /metrics. Series of
// one family (per backend, per model) are summed.
const metricGoroutines = "go_goroutines"

// The usage writer's queue and progress, which a phase waits on to count
// the writer's work in the gateway's CPU (bench.waitUsageWritten).
const (
	metricUsageQueue   = "tollgate_usage_queue_depth"
	metricUsageWritten = "tollgate_usage_records_written_total"
)

// soakGauges are the gateway's in-flight and queue gauges, which must all
// be back at 0 once the load drained.
var soakGauges = []string{
	"tollgate_streams_in_flight",          // proxy: streams open to clients
	"tollgate_backend_requests_in_flight", // backends: requests holding a backend slot
	"tollgate_queue_depth",                // backends: requests queued for a backend
	metricUsageQueue,                      // accounting: usage records not yet written
}

// soakScraped is every family read from /metrics.
var soakScraped = append([]string{metricGoroutines, "tollgate_stream_aborts_total", metricUsageWritten}, soakGauges...)

// Kinds of request of the soak's mix.
const (
	soakPlain   = iota // non-streamed
	soakStream         // streamed, read to its end
	soakAbandon        // streamed, closed by the client after the first event
	numSoakKinds
)

var soakKindNames = [numSoakKinds]string{"non-streamed", "streams", "abandoned"}

// soakMix says which kind request i of the schedule is. Shares are kept
// in parts per million and spread evenly (request i is a stream when
// ⌊(i+1)·s⌋ > ⌊i·s⌋), so that any stretch of the schedule carries the
// mix, and counts over a whole run are exact.
type soakMix struct {
	streamPPM, abandonPPM int64
}

func newSoakMix(streamShare, abandonShare float64) soakMix {
	return soakMix{streamPPM: int64(streamShare*1e6 + 0.5), abandonPPM: int64(abandonShare*1e6 + 0.5)}
}

// kind returns the kind of request i: every streamPPM-th millionth request
// is a stream, and of the streams every abandonPPM-th millionth one is
// abandoned.
func (m soakMix) kind(i int) int {
	n := int64(i)
	if (n+1)*m.streamPPM/1e6 == n*m.streamPPM/1e6 {
		return soakPlain
	}
	j := n * m.streamPPM / 1e6 // this stream's index among the streams
	if (j+1)*m.abandonPPM/1e6 > j*m.abandonPPM/1e6 {
		return soakAbandon
	}
	return soakStream
}

// soakCounts are the requests of each kind that were sent and that failed.
type soakCounts struct {
	sent, failed [numSoakKinds]atomic.Int64
	firstError   atomic.Pointer[string]
}

func (c *soakCounts) add(kind int, err error) {
	c.sent[kind].Add(1)
	if err != nil {
		c.failed[kind].Add(1)
		msg := soakKindNames[kind] + ": " + err.Error()
		c.firstError.CompareAndSwap(nil, &msg)
	}
}

// soakTally is a snapshot of soakCounts.
type soakTally struct {
	Sent       [numSoakKinds]int64 `json:"sent"`
	Failed     [numSoakKinds]int64 `json:"failed"`
	FirstError string              `json:"first_error,omitempty"`
}

func (c *soakCounts) tally() soakTally {
	var t soakTally
	for k := range numSoakKinds {
		t.Sent[k], t.Failed[k] = c.sent[k].Load(), c.failed[k].Load()
	}
	if p := c.firstError.Load(); p != nil {
		t.FirstError = *p
	}
	return t
}

func (t soakTally) failed() int64 {
	var n int64
	for _, f := range t.Failed {
		n += f
	}
	return n
}

func (t soakTally) total() int64 {
	var n int64
	for _, s := range t.Sent {
		n += s
	}
	return n
}

// soakLoad is the soak's generator: the open loop of runOpenLoopWith, each
// worker sending the kind of request the mix says.
type soakLoad struct {
	e                 *endpoint
	plain, streamBody []byte
	mix               soakMix
	counts            soakCounts
}

// sender is the newSender of the soak's open loop.
func (l *soakLoad) sender() (func(int) error, func()) {
	req, sreq := l.e.newRequest(l.plain), l.e.newRequest(l.streamBody)
	resp := fasthttp.AcquireResponse()
	buf := make([]byte, 16<<10)
	var sr streamResult
	send := func(i int) error {
		var err error
		switch kind := l.mix.kind(i); kind {
		case soakPlain:
			err = l.e.do(req, resp)
			l.counts.add(kind, err)
		case soakStream:
			err = readStream(l.e, sreq, buf, &sr)
			// Only whether the stream ended well matters here; the
			// timings readStream keeps would grow for the whole soak.
			sr.TTFT, sr.Gaps = sr.TTFT[:0], sr.Gaps[:0]
			l.counts.add(kind, err)
		case soakAbandon:
			err = abandonStream(l.e, sreq, buf)
			l.counts.add(kind, err)
		}
		return err
	}
	release := func() {
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseRequest(sreq)
		fasthttp.ReleaseResponse(resp)
	}
	return send, release
}

// run sends the mix at rate for d.
func (l *soakLoad) run(ctx context.Context, rate int, d time.Duration, workers int) (loadResult, error) {
	return runOpenLoopWith(ctx, rate, d, workers, l.sender)
}

// abandonStream sends a streaming request, reads until the first whole
// event and then closes the connection, as a client that gives up does.
func abandonStream(e *endpoint, req *fasthttp.Request, buf []byte) error {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	body, err := sendStream(e, req, resp)
	defer resp.CloseBodyStream() //nolint:errcheck // the connection is closed anyway
	if err != nil {
		return err
	}
	// With Connection: close the client closes the connection when the
	// body stream is closed, instead of reading the rest to reuse it.
	resp.SetConnectionClose()
	var counter eventCounter
	for {
		n, err := body.Read(buf)
		if n > 0 && counter.count(buf[:n]) > 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("stream ended before its first event: %w", err)
		}
	}
}

// soakSample is one reading of the gateway process.
type soakSample struct {
	// At is the time since the soak load started; the baseline samples,
	// taken before it, count from the end of the warm-up.
	At         time.Duration      `json:"at_ns"`
	Phase      string             `json:"phase"`
	RSS        uint64             `json:"rss_bytes"`
	FDs        int                `json:"open_fds"`
	Goroutines float64            `json:"goroutines"`
	Metrics    map[string]float64 `json:"metrics"`
	// Failed counts the requests of the load (warm-up or soak) that had
	// failed when the sample was taken.
	Failed int64 `json:"failed"`
	// ScrapeError says why /metrics could not be read; the figures from
	// /proc are there all the same.
	ScrapeError string `json:"scrape_error,omitempty"`
}

// parseMetrics sums, for each of names, the values of all its series in
// a Prometheus text exposition. Families absent from text are absent from
// the result, so that a caller can tell "0" from "not exposed".
func parseMetrics(text []byte, names []string) (map[string]float64, error) {
	out := make(map[string]float64, len(names))
	for line := range bytes.SplitSeq(text, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		end := bytes.IndexAny(line, "{ \t")
		if end < 0 {
			return nil, fmt.Errorf("parse metrics: no value in %q", line)
		}
		name := string(line[:end])
		if !slices.Contains(names, name) {
			continue
		}
		rest := line[end:]
		if rest[0] == '{' {
			// Label values may hold spaces; the value follows the last '}'.
			i := bytes.LastIndexByte(rest, '}')
			if i < 0 {
				return nil, fmt.Errorf("parse metrics: unterminated labels in %q", line)
			}
			rest = rest[i+1:]
		}
		f := bytes.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("parse metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(string(f[0]), 64)
		if err != nil {
			return nil, fmt.Errorf("parse metrics: %q: %w", line, err)
		}
		out[name] += v
	}
	return out, nil
}

// countFDs returns how many descriptors process pid has open.
func countFDs(pid int) (int, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return 0, fmt.Errorf("count open descriptors: %w", err)
	}
	return len(ents), nil
}

// gatewayProbe reads the gateway's memory, descriptors and metrics, for the
// soak's samples and for a phase waiting on the usage writer.
type gatewayProbe struct {
	pid     int
	client  *fasthttp.HostClient
	metrics string
}

func newGatewayProbe(pid int, addr string) *gatewayProbe {
	return &gatewayProbe{pid: pid, client: &fasthttp.HostClient{Addr: addr, NoDefaultUserAgentHeader: true},
		metrics: "http://" + addr + "/metrics"}
}

// scrape reads the families of soakScraped from /metrics.
func (p *gatewayProbe) scrape() (map[string]float64, error) {
	status, body, err := p.client.GetTimeout(nil, p.metrics, scrapeTimeout)
	if err != nil {
		return nil, fmt.Errorf("read /metrics: %w", err)
	}
	if status != fasthttp.StatusOK {
		return nil, fmt.Errorf("read /metrics: status %d: %.200s", status, body)
	}
	return parseMetrics(body, soakScraped)
}

// sample reads the gateway now. Reading /proc must work (the gateway is
// gone otherwise); a failed scrape under load is kept in the sample.
func (p *gatewayProbe) sample(at time.Duration, phase string) (soakSample, error) {
	s := soakSample{At: at, Phase: phase}
	m, err := readMem(p.pid)
	if err != nil {
		return s, err
	}
	s.RSS = m.RSS
	if s.FDs, err = countFDs(p.pid); err != nil {
		return s, err
	}
	if s.Metrics, err = p.scrape(); err != nil {
		s.ScrapeError = err.Error()
		return s, nil
	}
	g, ok := s.Metrics[metricGoroutines]
	if !ok {
		return s, fmt.Errorf("the gateway's /metrics has no %s: is the Go collector registered?", metricGoroutines)
	}
	s.Goroutines = g
	return s, nil
}

// inFlight returns the first in-flight gauge of s that is not 0.
func (s soakSample) inFlight() (string, float64, bool) {
	for _, g := range soakGauges {
		if v := s.Metrics[g]; v != 0 {
			return g, v, true
		}
	}
	return "", 0, false
}

// soakResult is everything the soak measured.
type soakResult struct {
	Duration time.Duration `json:"duration_ns"`
	Rate     int           `json:"rate"`
	// Baseline is the sample after the warm-up load drained, End the one
	// after the soak load drained; Samples are all of them in order.
	Baseline soakSample   `json:"baseline"`
	End      soakSample   `json:"end"`
	Samples  []soakSample `json:"samples"`
	// Warmup and Load count the requests of the two loads.
	Warmup soakTally `json:"warmup"`
	Load   soakTally `json:"load"`
	// Achieved is the soak load's rate of completed requests.
	Achieved float64 `json:"achieved_rate"`
	// UsageRecords counts the gateway's usage records by status, read
	// from its usage API after the soak; UsageError says why not.
	UsageRecords map[string]int64 `json:"usage_records"`
	UsageError   string           `json:"usage_error,omitempty"`
	// GatewayCPU is the CPU time the gateway used during the soak load.
	GatewayCPU time.Duration `json:"gateway_cpu_ns"`
}

// sent is every request of the warm-up and the soak.
func (r *soakResult) sent() int64 { return r.Warmup.total() + r.Load.total() }

func (r *soakResult) usageTotal() int64 {
	var n int64
	for _, c := range r.UsageRecords {
		n += c
	}
	return n
}

// peak is the sample with the largest value of f.
func peak(samples []soakSample, f func(soakSample) float64) soakSample {
	var best soakSample
	for i, s := range samples {
		if i == 0 || f(s) > f(best) {
			best = s
		}
	}
	return best
}

// rssAllowance is how far the end RSS may be above the baseline.
func rssAllowance(base uint64) uint64 {
	return max(uint64(float64(base)*soakRSSShare), soakRSSFloor)
}

// soakRows turns a soak's result into report rows, with the PASS/MISS
// rules of its goals.
func soakRows(r *soakResult) []row {
	sec := fmt.Sprintf("soak %s at %d/s", r.Duration, r.Rate)
	base, end := r.Baseline, r.End
	var rows []row
	at := func(s soakSample) string { return s.Phase + " " + s.At.Round(time.Second).String() }

	maxRSS := peak(r.Samples, func(s soakSample) float64 { return float64(s.RSS) })
	rows = append(rows, row{Section: sec, Metric: "RSS after the load drained", Unit: unitMiB, Value: mib(end.RSS),
		Target: atMost(mib(base.RSS + rssAllowance(base.RSS))),
		Note: fmt.Sprintf("baseline %.1f MiB after the warm-up (+max(10%%, 4 MiB) allowed); max %.1f MiB (%s)",
			mib(base.RSS), mib(maxRSS.RSS), at(maxRSS))})

	maxG := peak(r.Samples, func(s soakSample) float64 { return s.Goroutines })
	rows = append(rows, row{Section: sec, Metric: "goroutines after the load drained, over baseline", Unit: unitCount,
		Value: end.Goroutines - base.Goroutines, Signed: true, Target: atMost(soakGoroutineSlack),
		Note: fmt.Sprintf("baseline %.0f, end %.0f, max %.0f (%s)", base.Goroutines, end.Goroutines, maxG.Goroutines, at(maxG))})

	maxFD := peak(r.Samples, func(s soakSample) float64 { return float64(s.FDs) })
	rows = append(rows, row{Section: sec, Metric: "open descriptors after the load drained, over baseline", Unit: unitCount,
		Value: float64(end.FDs - base.FDs), Signed: true, Target: atMost(soakFDSlack),
		Note: fmt.Sprintf("baseline %d, end %d, max %d (%s)", base.FDs, end.FDs, maxFD.FDs, at(maxFD))})

	for _, g := range soakGauges {
		v, ok := end.Metrics[g]
		if !ok {
			rows = append(rows, row{Section: sec, Metric: g + " after the load drained", Unit: unitCount,
				Target: atMost(0), Value: 1, Note: "not exposed by the gateway's /metrics"})
			continue
		}
		mx := peak(r.Samples, func(s soakSample) float64 { return s.Metrics[g] })
		rows = append(rows, row{Section: sec, Metric: g + " after the load drained", Unit: unitCount, Value: v,
			Target: atMost(0), Note: fmt.Sprintf("baseline %g, max %g (%s)", base.Metrics[g], mx.Metrics[g], at(mx))})
	}

	rows = append(rows, row{Section: sec, Metric: "achieved rate", Unit: unitRate, Value: r.Achieved,
		Note: fmt.Sprintf("gateway CPU %.2f cores on average", r.GatewayCPU.Seconds()/max(r.Duration.Seconds(), 1e-9))})

	failed := r.Warmup.failed() + r.Load.failed()
	var byKind []string
	for k := range numSoakKinds {
		byKind = append(byKind, fmt.Sprintf("%s %d of %d", soakKindNames[k],
			r.Warmup.Failed[k]+r.Load.Failed[k], r.Warmup.Sent[k]+r.Load.Sent[k]))
	}
	note := "warm-up and soak: " + strings.Join(byKind, ", ")
	if e := cmpOr(r.Warmup.FirstError, r.Load.FirstError); e != "" {
		note += "; first: " + e
	}
	rows = append(rows, row{Section: sec, Metric: "failed requests (abandoning is no failure)", Unit: unitCount,
		Value: float64(failed), Target: atMost(0), Note: note})

	abandoned := r.Warmup.Sent[soakAbandon] - r.Warmup.Failed[soakAbandon] + r.Load.Sent[soakAbandon] - r.Load.Failed[soakAbandon]
	aborts := "no client abort count on /metrics"
	if v, ok := end.Metrics["tollgate_stream_aborts_total"]; ok {
		aborts = fmt.Sprintf("the gateway counted %.0f stream aborts (tollgate_stream_aborts_total)", v)
	}
	rows = append(rows, row{Section: sec, Metric: "streams abandoned after the first event", Unit: unitCount,
		Value: float64(abandoned), Note: aborts})

	usage := row{Section: sec, Metric: "usage records, off from requests sent", Unit: unitCount, Target: atMost(0)}
	if r.UsageError != "" {
		usage.Value, usage.Note = float64(r.sent()), "could not read the usage API: "+r.UsageError
	} else {
		got, want := r.usageTotal(), r.sent()
		usage.Value = float64(abs(got - want))
		statuses := make([]string, 0, len(r.UsageRecords))
		for s, n := range r.UsageRecords {
			statuses = append(statuses, fmt.Sprintf("%s: %d", s, n))
		}
		slices.Sort(statuses)
		usage.Note = fmt.Sprintf("%d records (%s) for %d requests sent, abandoned included", got, strings.Join(statuses, ", "), want)
	}
	rows = append(rows, usage)
	return rows
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// soak runs the soak against a fresh gateway with a store of its own, so
// that its usage records can be counted exactly: a warm-up of the mix, a
// sample once it drained, the soak load sampled every soakInterval, and a
// last sample once it drained.
func (b *bench) soak(ctx context.Context) error {
	o := b.o
	if err := b.stopGateway(); err != nil {
		return err
	}
	cfg := gatewayConfig{
		key: b.key, logLevel: o.logLevel, store: filepath.Join(b.dir, "soak.db"),
		fast: b.fastAddr, stream: b.streamAddr, slow: b.slowAddr,
	}
	b.configPath = filepath.Join(b.dir, "soak.yaml")
	if err := os.WriteFile(b.configPath, []byte(cfg.yaml()), 0o600); err != nil {
		return fmt.Errorf("write soak gateway config: %w", err)
	}
	if err := b.startGateway(ctx); err != nil {
		return err
	}
	began := time.Now()
	pid := b.gateway.pid()
	probe := newGatewayProbe(pid, b.gatewayAddr)
	defer probe.client.CloseIdleConnections()
	e := newEndpoint("gateway", b.gatewayAddr, b.key, o.openConns)
	defer e.client.CloseIdleConnections()

	res := &soakResult{Duration: o.soak, Rate: o.soakRate}
	mix := newSoakMix(o.soakStreamShare, o.soakAbandon)
	plain, streamBody := chatBody(modelFast, 16, false), chatBody(modelStream, o.streamTokens, true)

	b.logf("soak: warm-up %s at %d/s (%.0f%% streams, %.0f%% of them abandoned)", o.soakWarmup, o.soakRate,
		100*o.soakStreamShare, 100*o.soakAbandon)
	warm := &soakLoad{e: e, plain: plain, streamBody: streamBody, mix: mix}
	if _, err := warm.run(ctx, o.soakRate, o.soakWarmup, o.openConns); err != nil {
		return fmt.Errorf("soak warm-up: %w", err)
	}
	res.Warmup = warm.counts.tally()
	early, base, err := b.soakDrained(ctx, warm, probe, 0, "baseline")
	if err != nil {
		return err
	}
	res.Baseline = base
	res.Samples = append(res.Samples, early, base)

	cpu0, err := readCPU(pid)
	if err != nil {
		return err
	}
	b.logf("soak: %s at %d/s", o.soak, o.soakRate)
	load := &soakLoad{e: e, plain: plain, streamBody: streamBody, mix: mix}
	type loadDone struct {
		r   loadResult
		err error
	}
	done := make(chan loadDone, 1)
	start := time.Now()
	// The load ends by itself after o.soak, when ctx ends, or when a
	// sample fails (the gateway is gone); it is always waited for below.
	loadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		r, err := load.run(loadCtx, o.soakRate, o.soak, o.openConns)
		done <- loadDone{r, err}
	}()
	tick := time.NewTicker(soakInterval)
	defer tick.Stop()
	var ld loadDone
	var sampleErr error
wait:
	for {
		select {
		case ld = <-done:
			break wait
		case <-tick.C:
			if sampleErr != nil {
				continue
			}
			s, err := probe.sample(time.Since(start), "load")
			if err != nil {
				sampleErr = err
				cancel()
				continue
			}
			s.Failed = load.counts.tally().failed()
			res.Samples = append(res.Samples, s)
			b.logSample(s)
		}
	}
	if sampleErr != nil {
		return fmt.Errorf("soak: %w", sampleErr)
	}
	if ld.err != nil {
		return fmt.Errorf("soak: %w", ld.err)
	}
	cpu1, err := readCPU(pid)
	if err != nil {
		return err
	}
	res.GatewayCPU = cpu1 - cpu0
	res.Load = load.counts.tally()
	if ld.r.Elapsed > 0 {
		res.Achieved = float64(ld.r.OK) / ld.r.Elapsed.Seconds()
	}
	early, end, err := b.soakDrained(ctx, load, probe, time.Since(start), "end")
	if err != nil {
		return err
	}
	res.End = end
	res.Samples = append(res.Samples, early, end)

	res.UsageRecords, err = countUsage(ctx, b.gatewayAddr, b.key, began, res.sent())
	if err != nil {
		res.UsageError = err.Error()
	}
	for _, s := range res.Samples {
		if s.ScrapeError != "" {
			b.rep.note("soak sample at %s: %s", s.At.Round(time.Second), s.ScrapeError)
		}
	}
	for _, rw := range soakRows(res) {
		b.rep.add(rw)
	}
	b.rep.Soak = res
	return b.stopGateway()
}

// soakDrained waits, once a load stopped, for the client's connections to
// close and every in-flight gauge to read 0, then samples the gateway after
// soakEarly and after soakSettle, and returns both. A gauge that never
// drops to 0 is sampled as it is, to be reported.
func (b *bench) soakDrained(ctx context.Context, l *soakLoad, probe *gatewayProbe, at time.Duration, phase string) (early, settled soakSample, err error) {
	e := l.e
	e.client.CloseIdleConnections()
	deadline := time.Now().Add(soakDrainTimeout)
	for time.Now().Before(deadline) {
		s, err := probe.sample(at, phase)
		if err != nil {
			return s, s, err
		}
		if _, _, busy := s.inFlight(); !busy && s.ScrapeError == "" {
			break
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return s, s, err
		}
	}
	drained := time.Now()
	sample := func(after time.Duration, phase string) (soakSample, error) {
		if err := sleepCtx(ctx, time.Until(drained.Add(after))); err != nil {
			return soakSample{}, err
		}
		s, err := probe.sample(at+time.Since(drained), phase)
		s.Failed = l.counts.tally().failed()
		if err == nil && s.ScrapeError != "" {
			err = errors.New(s.ScrapeError)
		}
		b.logSample(s)
		return s, err
	}
	if early, err = sample(soakEarly, phase+" (drained "+soakEarly.String()+")"); err != nil {
		return early, early, err
	}
	settled, err = sample(soakSettle, phase)
	return early, settled, err
}

func (b *bench) logSample(s soakSample) {
	var g []string
	for _, name := range soakGauges {
		g = append(g, fmt.Sprintf("%s %g", strings.TrimPrefix(name, "tollgate_"), s.Metrics[name]))
	}
	b.logf("soak %s %s: RSS %.1f MiB, %d fds, %.0f goroutines, %s; %d requests failed", s.Phase, s.At.Round(time.Second),
		mib(s.RSS), s.FDs, s.Goroutines, strings.Join(g, ", "), s.Failed)
}

// countUsage reads the gateway's usage records since began by status from
// its usage API (with group_by=status, whose num_requests counts every
// record, refusals and errors included). It polls until they number want
// or soakUsageTimeout passes, since the recorder writes in batches.
func countUsage(ctx context.Context, addr, key string, began time.Time, want int64) (map[string]int64, error) {
	c := &fasthttp.HostClient{Addr: addr, NoDefaultUserAgentHeader: true}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(soakUsageTimeout)
	for {
		got, err := readUsage(c, addr, key, began)
		if err != nil {
			return nil, err
		}
		var n int64
		for _, v := range got {
			n += v
		}
		if n == want || !time.Now().Before(deadline) {
			return got, nil
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return got, err
		}
	}
}

// readUsage reads every page of daily usage buckets from a day before
// began, grouped by status.
func readUsage(c *fasthttp.HostClient, addr, key string, began time.Time) (map[string]int64, error) {
	q := url.Values{}
	q.Set("start_time", strconv.FormatInt(began.Add(-24*time.Hour).Unix(), 10))
	q.Set("bucket_width", "1d")
	q.Set("group_by", "status")
	got := map[string]int64{}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	for range 100 {
		req.SetRequestURI("http://" + addr + "/v1/organization/usage/completions?" + q.Encode())
		req.Header.SetMethod(fasthttp.MethodGet)
		req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+key)
		if err := c.DoTimeout(req, resp, scrapeTimeout); err != nil {
			return nil, fmt.Errorf("read usage: %w", err)
		}
		if resp.StatusCode() != fasthttp.StatusOK {
			return nil, fmt.Errorf("read usage: status %d: %.200s", resp.StatusCode(), resp.Body())
		}
		next, err := addUsagePage(got, resp.Body())
		if err != nil {
			return nil, err
		}
		if next == "" {
			return got, nil
		}
		q.Set("page", next)
	}
	return nil, errors.New("read usage: more than 100 pages")
}

// addUsagePage adds the num_requests of a usage page grouped by status to
// got, and returns the next page's token, if any.
func addUsagePage(got map[string]int64, body []byte) (string, error) {
	var page struct {
		Data []struct {
			Results []struct {
				Status      *string `json:"status"`
				NumRequests *int64  `json:"num_requests"`
			} `json:"results"`
		} `json:"data"`
		HasMore  bool   `json:"has_more"`
		NextPage string `json:"next_page"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return "", fmt.Errorf("read usage: %w", err)
	}
	for _, bk := range page.Data {
		for _, r := range bk.Results {
			if r.Status == nil || r.NumRequests == nil {
				return "", errors.New("read usage: a result without status or num_requests; was group_by=status ignored?")
			}
			got[*r.Status] += *r.NumRequests
		}
	}
	if page.HasMore {
		return page.NextPage, nil
	}
	return "", nil
}
