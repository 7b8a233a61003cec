package simulated

import (
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
)

// metrics serves GET /metrics: the gauges and counters of vLLM's Prometheus exposition that a
// router reads, under vLLM's names and labels (vllm/v1/metrics/loggers.py). Without an engine
// the running count is the generation requests in flight and nothing waits.
func (s *Server) metrics(ctx *fasthttp.RequestCtx) {
	if !getOnly(ctx) {
		return
	}
	var st engineState
	if s.engine != nil {
		st = s.engine.state()
	} else {
		st.running = int(s.requests.Load() - s.completed.Load() - s.cancelled.Load())
	}
	labels := `{engine="0",model_name=` + strconv.Quote(strings.Trim(s.defaultModelRaw, `"`)) + `}`
	b := replyBuffer(ctx)
	gauge := func(name, help string, v float64) {
		b = append(b, "# HELP "+name+" "+help+"\n# TYPE "+name+" gauge\n"+name+labels+" "...)
		b = strconv.AppendFloat(b, v, 'g', -1, 64)
		b = append(b, '\n')
	}
	counter := func(name, help string, v int64) {
		// Python's client names the family, like the sample, with the _total suffix.
		name += "_total"
		b = append(b, "# HELP "+name+" "+help+"\n# TYPE "+name+" counter\n"+name+labels+" "...)
		b = strconv.AppendFloat(b, float64(v), 'g', -1, 64)
		b = append(b, '\n')
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(st.running))
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(st.waiting))
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", st.kvUsage)
	counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", st.queried)
	counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", st.hit)
	counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", st.preemptions)
	if s.engine != nil && len(s.engine.cfg.LoRAs) > 0 {
		// vLLM adds a series each time the adapters change and leaves the old ones; a reader
		// takes the one with the latest value, so one series stamped now says the same.
		b = append(b, "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n"...)
		b = append(b, `vllm:lora_requests_info{max_lora="`...)
		b = strconv.AppendInt(b, int64(st.maxLoRAs), 10)
		b = append(b, `",running_lora_adapters="`...)
		b = append(b, strings.Join(st.runningAdapters, ",")...)
		b = append(b, `",waiting_lora_adapters="`...)
		b = append(b, strings.Join(st.waitingAdapters, ",")...)
		b = append(b, `"} `...)
		b = strconv.AppendFloat(b, float64(s.clock.Now().UnixNano())/1e9, 'f', 3, 64)
		b = append(b, '\n')
	}
	if st.kvBlocks > 0 {
		b = append(b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n"...)
		b = append(b, `vllm:cache_config_info{block_size="`...)
		b = strconv.AppendInt(b, int64(st.kvBlock), 10)
		b = append(b, `",enable_prefix_caching="True",engine="0",num_gpu_blocks="`...)
		b = strconv.AppendInt(b, int64(st.kvBlocks), 10)
		b = append(b, "\"} 1\n"...)
	}
	ctx.Response.SwapBody(b)
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
}

// resetPrefixCache serves POST /reset_prefix_cache, as vLLM does: the cached blocks that no
// running request holds are forgotten, so that a benchmark can start each phase cold.
func (s *Server) resetPrefixCache(ctx *fasthttp.RequestCtx) {
	if !postOnly(ctx) {
		return
	}
	if s.engine != nil {
		s.engine.resetPrefixCache()
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}
