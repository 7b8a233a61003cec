package backends

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/config"
)

// The vLLM metric families the scheduler reads (vllm/v1/metrics/loggers.py).
// Counters are exposed with a _total suffix by Python's Prometheus client;
// the gpu_ names are those of older vLLM releases.
const (
	metricRunning          = "vllm:num_requests_running"
	metricWaiting          = "vllm:num_requests_waiting"
	metricKVUsage          = "vllm:kv_cache_usage_perc"
	metricKVUsageOld       = "vllm:gpu_cache_usage_perc"
	metricPrefixQueries    = "vllm:prefix_cache_queries"
	metricPrefixHits       = "vllm:prefix_cache_hits"
	metricPrefixQueriesOld = "vllm:gpu_prefix_cache_queries"
	metricPrefixHitsOld    = "vllm:gpu_prefix_cache_hits"
	metricLoRA             = "vllm:lora_requests_info"
	metricCacheConfig      = "vllm:cache_config_info"
)

// wantedMetric reports whether a metric family name is one the scheduler
// reads; the others (histograms, mostly) are dropped before parsing.
func wantedMetric(name []byte) bool {
	switch string(bytes.TrimSuffix(name, []byte("_total"))) {
	case metricRunning, metricWaiting, metricKVUsage, metricKVUsageOld,
		metricPrefixQueries, metricPrefixHits, metricPrefixQueriesOld, metricPrefixHitsOld,
		metricLoRA, metricCacheConfig:
		return true
	}
	return false
}

// vllmReading is what one read of a backend's metrics says. Every series of
// a family (one per engine of a data-parallel server) is summed, but the
// KV cache use, which is their mean.
type vllmReading struct {
	running, waiting float64
	// kvUsage is the share of KV cache blocks in use, 0 to 1; -1 when the
	// server does not report it.
	kvUsage float64
	// prefixQueries and prefixHits are the prefix cache's counters, in
	// tokens; -1 when not reported.
	prefixQueries, prefixHits float64
	// kvTokens is the server's KV cache size in tokens (num_gpu_blocks ×
	// block_size of vllm:cache_config_info); zero when not reported.
	kvTokens int64
	// lora is the latest vllm:lora_requests_info; its zero value when the
	// server serves no adapters.
	lora loraInfo
}

// loraInfo is the LoRA adapters a server has loaded, by the FNV-1a hash of
// their names, and how many it may hold at once.
type loraInfo struct {
	running, waiting []uint64
	maxLoRA          int
}

// errNoVLLMMetrics is the error of a metrics page without vLLM's queue
// gauges: the backend is not vLLM, or not ready.
var errNoVLLMMetrics = errors.New("no vllm:num_requests_running or vllm:num_requests_waiting")

// metricsParser reads the families the scheduler needs from a Prometheus
// text exposition. Its zero value is ready to use; it keeps its buffers
// and expfmt's parser (whose buffers its documentation lets one reuse,
// one parse at a time) from one read to the next. Only the wanted
// families' TYPE and sample lines are handed to the parser (metricName): a
// vLLM page is mostly histogram buckets.
type metricsParser struct {
	wanted bytes.Buffer
	in     bytes.Reader
	text   expfmt.TextParser
	ready  bool
}

func (p *metricsParser) parse(text []byte) (vllmReading, error) {
	p.wanted.Reset()
	for len(text) > 0 {
		line := text
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i+1], text[i+1:]
		} else {
			text = nil
		}
		if wantedMetric(metricName(line)) {
			p.wanted.Write(line)
			if line[len(line)-1] != '\n' {
				p.wanted.WriteByte('\n')
			}
		}
	}
	if !p.ready {
		p.text, p.ready = expfmt.NewTextParser(model.LegacyValidation), true
	}
	p.in.Reset(p.wanted.Bytes())
	families, err := p.text.TextToMetricFamilies(&p.in)
	if err != nil {
		return vllmReading{}, fmt.Errorf("parse metrics: %w", err)
	}
	family := func(names ...string) *dto.MetricFamily {
		for _, n := range names {
			if f := families[n+"_total"]; f != nil {
				return f
			}
			if f := families[n]; f != nil {
				return f
			}
		}
		return nil
	}
	running, waiting := family(metricRunning), family(metricWaiting)
	if running == nil && waiting == nil {
		return vllmReading{}, errNoVLLMMetrics
	}
	r := vllmReading{running: sum(running), waiting: sum(waiting), kvUsage: -1, prefixQueries: -1, prefixHits: -1}
	if f := family(metricKVUsage, metricKVUsageOld); f != nil && len(f.GetMetric()) > 0 {
		r.kvUsage = sum(f) / float64(len(f.GetMetric()))
	}
	if q, h := family(metricPrefixQueries, metricPrefixQueriesOld), family(metricPrefixHits, metricPrefixHitsOld); q != nil && h != nil {
		r.prefixQueries, r.prefixHits = sum(q), sum(h)
	}
	if f := family(metricCacheConfig); f != nil {
		for _, m := range f.GetMetric() {
			blocks, _ := strconv.ParseInt(label(m, "num_gpu_blocks"), 10, 64)
			size, _ := strconv.ParseInt(label(m, "block_size"), 10, 64)
			if blocks > 0 && size > 0 {
				r.kvTokens += blocks * size
			}
		}
	}
	if f := family(metricLoRA); f != nil {
		r.lora = parseLoRAInfo(f)
	}
	return r, nil
}

// metricName is the family a text exposition line belongs to: the sample's
// name, or the name a # TYPE line describes; nil for another comment,
// HELP included, which the parser does not need.
func metricName(line []byte) []byte {
	if line[0] == '#' {
		rest, ok := bytes.CutPrefix(line, []byte("# TYPE "))
		if !ok {
			return nil
		}
		line = rest
	}
	end := bytes.IndexAny(line, "{ \t\n")
	if end < 0 {
		end = len(line)
	}
	return line[:end]
}

// parseLoRAInfo reads vllm:lora_requests_info. vLLM sets a new series, to
// the current time, each time the adapters change, and the old ones stay:
// the series with the highest value is the current one.
func parseLoRAInfo(f *dto.MetricFamily) loraInfo {
	var latest *dto.Metric
	for _, m := range f.GetMetric() {
		if latest == nil || m.GetGauge().GetValue() > latest.GetGauge().GetValue() {
			latest = m
		}
	}
	if latest == nil {
		return loraInfo{}
	}
	maxLoRA, _ := strconv.Atoi(label(latest, "max_lora"))
	return loraInfo{
		running: adapterHashes(label(latest, "running_lora_adapters")),
		waiting: adapterHashes(label(latest, "waiting_lora_adapters")),
		maxLoRA: maxLoRA,
	}
}

// adapterHashes hashes each name of a comma-separated list of adapters.
func adapterHashes(list string) []uint64 {
	var hs []uint64
	for name := range strings.SplitSeq(list, ",") {
		if name = strings.TrimSpace(name); name != "" {
			hs = append(hs, fnv1a([]byte(name)))
		}
	}
	return hs
}

// sum adds the values of every series of a gauge or counter family.
func sum(f *dto.MetricFamily) float64 {
	var s float64
	for _, m := range f.GetMetric() {
		switch {
		case m.GetGauge() != nil:
			s += m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			s += m.GetCounter().GetValue()
		case m.GetUntyped() != nil:
			s += m.GetUntyped().GetValue()
		}
	}
	return s
}

// label returns the value of a series' label, or "".
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// serverLoad is a backend's load as its last fresh metrics reading gave
// it. The poller builds a new one for each reading and publishes it with
// one atomic store; the request path only loads the pointer.
type serverLoad struct {
	running, waiting int64
	// inflightAtRead is the gateway's own in-flight count on the backend
	// when the reading arrived, so that the requests sent or finished
	// since can be added to the reading.
	inflightAtRead int64
	// maxRunning is the most sequences the server runs at once (its
	// max_num_seqs), learned as the largest running count seen while
	// requests were waiting; zero until the server has queued once.
	maxRunning int64
	// kvUsage is the share of the KV cache in use; -1 when unknown.
	kvUsage float64
	// prefixHitRate is the share of prompt tokens the prefix cache served
	// between the last two readings; -1 when unknown.
	prefixHitRate float64
	lora          loraInfo
}

// hasAdapter reports whether the server has adapter (an FNV-1a hash of its
// name) loaded: running, or waiting for a slot it was given.
func (s *serverLoad) hasAdapter(adapter uint64) bool {
	for _, h := range s.lora.running {
		if h == adapter {
			return true
		}
	}
	for _, h := range s.lora.waiting {
		if h == adapter {
			return true
		}
	}
	return false
}

// metricsPoller reads one backend's metrics at its interval and publishes
// each reading as the backend's serverLoad, or nil once the last good
// reading is older than stale_after.
type metricsPoller struct {
	b   *Backend
	url []byte
	cfg config.BackendMetrics
	// failures counts the failed reads; nil counts nothing.
	failures prometheus.Counter

	// The rest is the poller goroutine's own.
	lastGood              time.Time
	maxRunning            int64
	prevQueries, prevHits float64
	parser                metricsParser
}

// metricsURL is the metrics path at the origin of a backend's base URL.
func metricsURL(base, path string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	return u.Scheme + "://" + u.Host + path, nil
}

func newMetricsPoller(b *Backend, cfg config.BackendMetrics) (*metricsPoller, error) {
	u, err := metricsURL(b.base, cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("backend %s: metrics url: %w", b.Name, err)
	}
	return &metricsPoller{b: b, url: []byte(u), cfg: cfg, prevQueries: -1, prevHits: -1}, nil
}

// run polls until stop is closed.
func (p *metricsPoller) run(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		p.poll(time.Now())
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// poll reads the metrics once. A failed read leaves the last reading in
// force until it is stale_after old; then the backend is scored on the
// gateway's own counts until a read succeeds again.
func (p *metricsPoller) poll(now time.Time) {
	r, err := p.read()
	if err != nil {
		if p.failures != nil {
			p.failures.Inc()
		}
		if now.Sub(p.lastGood) >= p.cfg.StaleAfter {
			p.b.server.Store(nil)
		}
		return
	}
	p.lastGood = now
	p.b.server.Store(p.load(r))
}

// load turns a reading into the serverLoad published for the request path,
// and keeps what the poller learns across readings.
func (p *metricsPoller) load(r vllmReading) *serverLoad {
	running, waiting := int64(r.running), int64(r.waiting)
	if waiting > 0 && running > p.maxRunning {
		p.maxRunning = running
	}
	s := &serverLoad{
		running: running, waiting: waiting,
		inflightAtRead: p.b.InFlight(),
		maxRunning:     p.maxRunning,
		kvUsage:        r.kvUsage,
		prefixHitRate:  -1,
		lora:           r.lora,
	}
	if r.prefixQueries >= 0 && p.prevQueries >= 0 && r.prefixQueries > p.prevQueries && r.prefixHits >= p.prevHits {
		s.prefixHitRate = (r.prefixHits - p.prevHits) / (r.prefixQueries - p.prevQueries)
	}
	p.prevQueries, p.prevHits = r.prefixQueries, r.prefixHits
	if p.b.index != nil && r.kvTokens > 0 {
		p.b.index.kvTokens.Store(r.kvTokens)
	}
	return s
}

// read fetches and parses the metrics.
func (p *metricsPoller) read() (vllmReading, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURIBytes(p.url)
	req.Header.SetMethod(fasthttp.MethodGet)
	p.b.authorize(req)
	if err := p.b.client.DoTimeout(req, resp, p.cfg.Timeout); err != nil {
		return vllmReading{}, classify(err)
	}
	if code := resp.StatusCode(); code != fasthttp.StatusOK {
		return vllmReading{}, fmt.Errorf("metrics: status %d", code)
	}
	return p.parser.parse(resp.Body())
}
