package simulated

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/tidwall/gjson"
)

// fakeClock is a clock driven by the test: each Sleep records its duration and advances the
// time at once.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	slept []time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	c.now = c.now.Add(d)
}

// take returns the recorded sleeps and forgets them.
func (c *fakeClock) take() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slept
	c.slept = nil
	return s
}

// startDriven starts a server whose delays wait on a fake clock.
func startDriven(t *testing.T, opts Options) (*harness, *fakeClock) {
	t.Helper()
	h := start(t, opts, false)
	c := &fakeClock{now: time.Unix(1_750_000_000, 0)}
	// Set before the first request, which the in-memory pipe orders after this write.
	h.srv.clock = c
	return h, c
}

// words returns n distinct words starting at word first.
func words(first, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "w%d ", first+i)
	}
	return b.String()
}

func chatWith(messages string, extra string) string {
	return `{"model":"m","max_tokens":1,"messages":` + messages + extra + `}`
}

func TestEnginePrefillIsPerUncachedToken(t *testing.T) {
	const ttft, perToken = 10 * time.Millisecond, time.Millisecond
	h, clk := startDriven(t, Options{TimeToFirstToken: ttft, Engine: Engine{
		PrefillPerToken: perToken, KVCacheBlocks: 64, BlockSize: 4,
	}})
	// A system message of 4+24 tokens (7 blocks) and a user turn of 4+6: 38 tokens, 9 blocks.
	system := `{"role":"system","content":"` + words(0, 24) + `"}`
	first := `[` + system + `,{"role":"user","content":"` + words(100, 6) + `"}]`
	second := `[` + system + `,{"role":"user","content":"` + words(200, 10) + `"}]`
	tests := []struct {
		name     string
		messages string
		prompt   int
		cached   int
	}{
		{"cold: the whole prompt prefills", first, 38, 0},
		// The shared system message is 7 whole blocks, and the user message's role tokens an
		// 8th; the blocks holding the new words miss.
		{"another turn under the same system prompt", second, 42, 32},
		// Every whole block is cached; the 2 tokens after them are computed.
		{"the same prompt again", second, 42, 40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(t, "POST", "/v1/chat/completions", chatWith(tc.messages, ""))
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			usage := mustJSON(t, string(r.body)).Get("usage")
			if got := usage.Get("prompt_tokens").Int(); got != int64(tc.prompt) {
				t.Fatalf("prompt_tokens = %d, want %d", got, tc.prompt)
			}
			if got := usage.Get("prompt_tokens_details.cached_tokens").Int(); got != int64(tc.cached) {
				t.Errorf("cached_tokens = %d, want %d", got, tc.cached)
			}
			want := ttft + time.Duration(tc.prompt-tc.cached)*perToken
			if got := clk.take(); !slices.Equal(got, []time.Duration{want}) {
				t.Errorf("waits %v, want one of %s (overhead + %d uncached tokens)", got, want, tc.prompt-tc.cached)
			}
		})
	}
}

// TestEngineReportsSequences checks what Options.OnSequence hears of each admitted request, and
// what CachedPrefix says a server holds of a prompt, without touching its cache.
func TestEngineReportsSequences(t *testing.T) {
	var mu sync.Mutex
	var got []SequenceStat
	const perToken = time.Millisecond
	h, _ := startDriven(t, Options{TimeToFirstToken: time.Millisecond, Engine: Engine{
		PrefillPerToken: perToken, KVCacheBlocks: 64, BlockSize: 4, MaxNumSeqs: 2,
	}, OnSequence: func(st SequenceStat) {
		mu.Lock()
		defer mu.Unlock()
		st.Body = append([]byte(nil), st.Body...)
		got = append(got, st)
	}})
	system := `{"role":"system","content":"` + words(0, 24) + `"}`
	messages := `[` + system + `,{"role":"user","content":"` + words(100, 6) + `"}]`
	body := chatWith(messages, "")
	if c, running, waiting := h.srv.CachedPrefix([]byte(body)); c != 0 || running != 0 || waiting != 0 {
		t.Errorf("CachedPrefix before any request = %d, %d, %d, want 0, 0, 0", c, running, waiting)
	}
	for range 2 {
		if r := h.do(t, "POST", "/v1/chat/completions", body); r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	// 38 tokens, 9 whole blocks: cold, then every whole block cached and the 2 tokens after them
	// computed.
	want := []struct{ cached, running int }{{0, 1}, {36, 1}}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("%d sequences reported, want %d", len(got), len(want))
	}
	for i, w := range want {
		st := got[i]
		if st.PromptTokens != 38 || st.CachedTokens != w.cached || st.Running != w.running ||
			st.Prefill != time.Duration(38-w.cached)*perToken || string(st.Body) != body || st.Admitted.Before(st.Arrived) {
			t.Errorf("sequence %d: %d prompt tokens, %d cached, %d running, prefill %s, admitted %s after arriving, body %q; want 38, %d, %d, %s, not before, the request's",
				i, st.PromptTokens, st.CachedTokens, st.Running, st.Prefill, st.Admitted.Sub(st.Arrived), st.Body, w.cached, w.running, time.Duration(38-w.cached)*perToken)
		}
	}
	// Both finished: the 9 blocks stay cached, and nothing runs.
	if c, running, waiting := h.srv.CachedPrefix([]byte(body)); c != 36 || running != 0 || waiting != 0 {
		t.Errorf("CachedPrefix after = %d, %d, %d, want 36, 0, 0", c, running, waiting)
	}
}

func TestEngineStreamWaitsPrefillThenLoadedTokens(t *testing.T) {
	h, clk := startDriven(t, Options{TimeToFirstToken: 2 * time.Millisecond, InterTokenDelay: 5 * time.Millisecond,
		Engine: Engine{PrefillPerToken: time.Millisecond, MaxNumSeqs: 4, LoadFactor: 4}})
	s := h.openStream(t, `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"a b c d"}]}`)
	events, err := s.all()
	s.close()
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 6 { // role, 3 tokens, finish, [DONE]
		t.Fatalf("events %q", events)
	}
	// One sequence runs: no slowdown. The prompt is 4+4 tokens, none cached (no block cache).
	want := []time.Duration{2*time.Millisecond + 8*time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond}
	if got := clk.take(); !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	if st := h.srv.engine.state(); st.running != 0 {
		t.Errorf("running after the stream = %d, want 0", st.running)
	}
}

func TestEngineLoadFactor(t *testing.T) {
	e := newEngine(Engine{MaxNumSeqs: 5, LoadFactor: 3}.normalized())
	tests := []struct {
		running int
		want    time.Duration
	}{
		{0, 100 * time.Millisecond}, // counts as one
		{1, 100 * time.Millisecond},
		{3, 200 * time.Millisecond}, // halfway from 1 to 5: factor 2
		{5, 300 * time.Millisecond},
		{9, 300 * time.Millisecond}, // never beyond LoadFactor
	}
	for _, tc := range tests {
		if got := e.scale(100*time.Millisecond, tc.running); got != tc.want {
			t.Errorf("scale(100ms, %d running) = %s, want %s", tc.running, got, tc.want)
		}
	}
	if got := newEngine(Engine{MaxNumSeqs: 5}.normalized()).scale(time.Second, 5); got != time.Second {
		t.Errorf("without LoadFactor: %s, want 1s", got)
	}
}

// startAsync starts a sequence on its own goroutine and returns where it arrives once admitted.
func startAsync(e *engine, adapter string, priority int64) <-chan *seq {
	ch := make(chan *seq, 1)
	go func() { ch <- e.start(nil, 8, adapter, priority) }()
	return ch
}

// waitQueued waits until n requests are queued; the goroutines that queue them are running.
func waitQueued(t *testing.T, e *engine, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.state().waiting != n {
		if time.Now().After(deadline) {
			t.Fatalf("waiting = %d, want %d", e.state().waiting, n)
		}
		runtime.Gosched()
	}
}

func admitted(ch <-chan *seq) *seq {
	select {
	case q := <-ch:
		return q
	default:
		return nil
	}
}

func TestEngineQueuesBeyondMaxNumSeqs(t *testing.T) {
	e := newEngine(Engine{MaxNumSeqs: 2}.normalized())
	a, b := e.start(nil, 8, "", 0), e.start(nil, 8, "", 0)
	third := startAsync(e, "", 0)
	waitQueued(t, e, 1)
	fourth := startAsync(e, "", 0)
	waitQueued(t, e, 2)
	urgent := startAsync(e, "", -5) // lower priority value: served first
	waitQueued(t, e, 3)
	if st := e.state(); st.running != 2 {
		t.Fatalf("running = %d, want 2", st.running)
	}

	a.finish()
	a.finish() // a second finish frees nothing more
	u := <-urgent
	waitQueued(t, e, 2)
	if admitted(third) != nil || admitted(fourth) != nil {
		t.Fatal("a request overtook the urgent one")
	}
	b.finish()
	q3 := <-third
	if admitted(fourth) != nil {
		t.Fatal("the fourth request was admitted before the third (FIFO within a priority)")
	}
	u.finish()
	q4 := <-fourth
	if st := e.state(); st.running != 2 || st.waiting != 0 {
		t.Errorf("running %d, waiting %d; want 2, 0", st.running, st.waiting)
	}
	q3.finish()
	q4.finish()
	if st := e.state(); st.running != 0 {
		t.Errorf("running %d after every finish", st.running)
	}
}

func TestEngineLoRALoading(t *testing.T) {
	const load = 40 * time.Millisecond
	e := newEngine(Engine{LoRAs: []string{"sql", "chat"}, MaxLoRAs: 1, LoRALoadTime: load}.normalized())
	if !e.serves("sql") || e.serves("other") {
		t.Fatal("serves")
	}
	first := e.start(nil, 8, "sql", 0)
	if first.prefill != load {
		t.Errorf("first sql request: prefill %s, want the load time %s", first.prefill, load)
	}
	again := e.start(nil, 8, "sql", 0)
	if again.prefill != 0 {
		t.Errorf("sql already loaded: prefill %s, want 0", again.prefill)
	}
	base := e.start(nil, 8, "", 0)
	if base.prefill != 0 {
		t.Errorf("base model: prefill %s", base.prefill)
	}
	// One adapter at a time, and sql runs: chat waits until sql is idle.
	chat := startAsync(e, "chat", 0)
	waitQueued(t, e, 1)
	st := e.state()
	if !slices.Equal(st.runningAdapters, []string{"sql"}) || !slices.Equal(st.waitingAdapters, []string{"chat"}) {
		t.Errorf("adapters running %v waiting %v", st.runningAdapters, st.waitingAdapters)
	}
	first.finish()
	if admitted(chat) != nil {
		t.Fatal("chat admitted while sql still runs")
	}
	again.finish()
	c := <-chat
	if c.prefill != load {
		t.Errorf("chat swapped in: prefill %s, want %s", c.prefill, load)
	}
	c.finish()
	base.finish()
}

func TestLoRAAdapterIsAModel(t *testing.T) {
	h := start(t, Options{Models: []string{"base"}, Engine: Engine{LoRAs: []string{"sql-lora"}}}, false)
	for model, want := range map[string]int{"base": 200, "sql-lora": 200, "other": 404} {
		r := h.do(t, "POST", "/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"x"}]}`)
		if r.status != want {
			t.Errorf("model %s: status %d, want %d: %s", model, r.status, want, r.body)
		}
	}
	r := h.do(t, "GET", "/v1/models", "")
	if got := mustJSON(t, string(r.body)).Get("data.#.id").String(); got != `["base","sql-lora"]` {
		t.Errorf("models %s", got)
	}
}

func TestBlockCacheEvictsFreeBlocksFromTheirEnd(t *testing.T) {
	c := newBlockCache(4)
	held := c.acquire([]uint64{1, 2, 3})
	// Held blocks are never evicted: only one more fits.
	if got := c.acquire([]uint64{7, 8}); !slices.Equal(got, []uint64{7}) {
		t.Fatalf("acquired %v while 3 blocks are held, want [7]", got)
	}
	c.release([]uint64{7})
	c.release(held) // 3 then 2 then 1 become evictable: 7, 3, 2, 1 oldest first
	if c.used != 0 {
		t.Fatalf("used = %d after every release", c.used)
	}
	c.release(c.acquire([]uint64{10, 11}))
	for h, want := range map[uint64]bool{1: true, 2: true, 3: false, 7: false, 10: true, 11: true} {
		if _, ok := c.entries[h]; ok != want {
			t.Errorf("block %d cached = %v, want %v", h, ok, want)
		}
	}
	if n := c.leading([]uint64{1, 2, 3}); n != 2 {
		t.Errorf("leading = %d, want 2: the prefix lost its end, not its start", n)
	}
}

func TestPromptBlocksChain(t *testing.T) {
	blocks := func(messages, adapter string) []uint64 {
		b, _ := promptBlocks(nil, gjson.Parse(messages), 4, adapter)
		return b
	}
	base := blocks(`[{"role":"system","content":"a b c d e f g h"},{"role":"user","content":"x y"}]`, "")
	if len(base) != 4 { // 4+8 + 4+2 = 18 tokens: 4 whole blocks
		t.Fatalf("%d blocks, want 4", len(base))
	}
	later := blocks(`[{"role":"system","content":"a b c d e f g h"},{"role":"user","content":"x y"},{"role":"assistant","content":"z"}]`, "")
	if !slices.Equal(later[:4], base) {
		t.Error("a later turn does not extend the earlier turn's blocks")
	}
	changed := blocks(`[{"role":"system","content":"A b c d e f g h"},{"role":"user","content":"x y"}]`, "")
	// The first block is the system role's tokens; the changed word is in the second.
	if changed[0] != base[0] || changed[1] == base[1] || changed[3] == base[3] {
		t.Error("a changed second block does not change it and every later hash: not a chain")
	}
	if lora := blocks(`[{"role":"system","content":"a b c d e f g h"},{"role":"user","content":"x y"}]`, "sql"); lora[0] == base[0] {
		t.Error("an adapter's blocks equal the base model's")
	}
}

// scrape reads the server's /metrics with Prometheus's own parser.
func scrape(t *testing.T, h *harness) map[string]*dto.MetricFamily {
	t.Helper()
	r := h.do(t, "GET", "/metrics", "")
	if r.status != 200 || !strings.HasPrefix(r.contentType, "text/plain") {
		t.Fatalf("GET /metrics: %d %s", r.status, r.contentType)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, r.body)
	}
	return fams
}

func TestMetricsNamesAndValues(t *testing.T) {
	h, _ := startDriven(t, Options{Engine: Engine{KVCacheBlocks: 100, BlockSize: 4, MaxNumSeqs: 8,
		LoRAs: []string{"sql-lora"}, MaxLoRAs: 2}})
	msgs := `[{"role":"system","content":"` + words(0, 12) + `"},{"role":"user","content":"q"}]` // 21 tokens
	for range 2 {
		if r := h.do(t, "POST", "/v1/chat/completions", chatWith(msgs, "")); r.status != 200 {
			t.Fatalf("status %d", r.status)
		}
	}
	fams := scrape(t, h)
	value := func(name string) float64 {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 {
			t.Fatalf("family %s missing or not one series: %v", name, f)
		}
		m := f.GetMetric()[0]
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	// The second request found the first's 5 whole blocks (20 tokens) cached.
	for name, want := range map[string]float64{
		"vllm:num_requests_running":       0,
		"vllm:num_requests_waiting":       0,
		"vllm:kv_cache_usage_perc":        0,
		"vllm:prefix_cache_queries_total": 42,
		"vllm:prefix_cache_hits_total":    20,
		"vllm:cache_config_info":          1,
	} {
		if got := value(name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	labels := func(name string) map[string]string {
		out := map[string]string{}
		for _, l := range fams[name].GetMetric()[0].GetLabel() {
			out[l.GetName()] = l.GetValue()
		}
		return out
	}
	if l := labels("vllm:cache_config_info"); l["block_size"] != "4" || l["num_gpu_blocks"] != "100" {
		t.Errorf("cache_config_info labels %v", l)
	}
	if l := labels("vllm:lora_requests_info"); l["max_lora"] != "2" || l["running_lora_adapters"] != "" {
		t.Errorf("lora_requests_info labels %v", l)
	}

	// While a sequence runs, it shows as running and its blocks as KV use.
	q := h.srv.engine.start([]uint64{1, 2, 3, 4, 5}, 20, "sql-lora", 0)
	fams = scrape(t, h)
	if got := value("vllm:num_requests_running"); got != 1 {
		t.Errorf("running = %v with one sequence", got)
	}
	if got := value("vllm:kv_cache_usage_perc"); got != 0.05 {
		t.Errorf("kv_cache_usage_perc = %v, want 0.05 (5 of 100 blocks)", got)
	}
	if l := labels("vllm:lora_requests_info"); l["running_lora_adapters"] != "sql-lora" {
		t.Errorf("lora_requests_info labels %v", l)
	}
	q.finish()
}

func TestMetricsWithoutEngine(t *testing.T) {
	h := start(t, Options{}, false)
	fams := scrape(t, h)
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prefix_cache_hits_total"} {
		if fams[name] == nil {
			t.Errorf("%s missing", name)
		}
	}
	if fams["vllm:cache_config_info"] != nil || fams["vllm:lora_requests_info"] != nil {
		t.Error("cache or LoRA info without an engine")
	}
}

func TestResetPrefixCache(t *testing.T) {
	h, _ := startDriven(t, Options{Engine: Engine{KVCacheBlocks: 16, BlockSize: 4}})
	msgs := `[{"role":"user","content":"` + words(0, 12) + `"}]`
	h.do(t, "POST", "/v1/chat/completions", chatWith(msgs, ""))
	if r := h.do(t, "POST", "/reset_prefix_cache", ""); r.status != 200 {
		t.Fatalf("reset: %d", r.status)
	}
	r := h.do(t, "POST", "/v1/chat/completions", chatWith(msgs, ""))
	if got := mustJSON(t, string(r.body)).Get("usage.prompt_tokens_details.cached_tokens").Int(); got != 0 {
		t.Errorf("cached_tokens after a reset = %d, want 0", got)
	}
}

// TestEnginePriorityPreemption checks vLLM's priority policy: a request arriving at a full engine
// takes the slot of the running sequence of the lowest priority (the latest among equals) when
// that is lower than its own, and the preempted sequence waits at its next token, then
// recomputes the tokens it generated.
func TestEnginePriorityPreemption(t *testing.T) {
	const perToken = time.Millisecond
	tests := []struct {
		name       string
		preempt    bool
		running    []int64 // the priorities of the sequences running, in arrival order
		newcomer   int64
		wantVictim int // index in running of the sequence preempted; -1 none (the newcomer queues)
	}{
		{"the lowest priority is preempted", true, []int64{1, 3}, 2, 1},
		{"the latest of the lowest priority is preempted", true, []int64{1, 1}, 0, 1},
		{"the lowest even when it came first", true, []int64{3, 1}, 0, 0},
		{"an equal priority preempts nothing", true, []int64{0, 0}, 0, -1},
		{"a lower priority preempts nothing", true, []int64{0, 0}, 5, -1},
		{"off: the newcomer queues", false, []int64{1, 1}, 0, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(Engine{MaxNumSeqs: 2, PrefillPerToken: perToken, PriorityPreemption: tt.preempt}.normalized())
			var running []*seq
			for _, p := range tt.running {
				running = append(running, e.start(nil, 8, "", p))
			}
			// Each running sequence generated three tokens so far.
			for _, q := range running {
				for range 3 {
					q.interToken(0)
				}
			}
			newcomer := startAsync(e, "", tt.newcomer)
			if tt.wantVictim < 0 {
				waitQueued(t, e, 1)
				if admitted(newcomer) != nil {
					t.Fatal("the newcomer was admitted at a full engine")
				}
				if st := e.state(); st.running != 2 || st.preemptions != 0 {
					t.Errorf("running %d, preemptions %d; want 2, 0", st.running, st.preemptions)
				}
				running[0].finish()
				(<-newcomer).finish()
				running[1].finish()
				return
			}
			n := <-newcomer // admitted at once: it does not wait
			if st := e.state(); st.running != 2 || st.waiting != 1 || st.preemptions != 1 {
				t.Fatalf("running %d, waiting %d, preemptions %d; want 2, 1, 1", st.running, st.waiting, st.preemptions)
			}
			victim, other := running[tt.wantVictim], running[1-tt.wantVictim]
			resumed := make(chan time.Duration, 1)
			go func() { resumed <- victim.interToken(0) }()
			select {
			case <-resumed:
				t.Fatal("the preempted sequence went on while its slot was taken")
			case <-time.After(20 * time.Millisecond):
			}
			// The other running sequence is not preempted.
			if d := other.interToken(0); d != 0 {
				t.Errorf("the other sequence's next token waited %v, want 0", d)
			}
			n.finish()
			// Its three tokens generated are recomputed (the 8-token prompt has no whole block).
			if d := <-resumed; d != 11*perToken {
				t.Errorf("the preempted sequence resumed after %v, want %v", d, 11*perToken)
			}
			if st := e.state(); st.running != 2 || st.waiting != 0 {
				t.Errorf("running %d, waiting %d after it resumed; want 2, 0", st.running, st.waiting)
			}
			victim.finish()
			other.finish()
			if st := e.state(); st.running != 0 {
				t.Errorf("running %d after every finish", st.running)
			}
		})
	}
	t.Run("preempted after its last token", func(t *testing.T) {
		e := newEngine(Engine{MaxNumSeqs: 1, PriorityPreemption: true}.normalized())
		low := e.start(nil, 8, "", 1)
		high := e.start(nil, 8, "", 0)
		low.finish() // leaves the queue, frees nothing: its slot is high's
		if st := e.state(); st.running != 1 || st.waiting != 0 {
			t.Fatalf("running %d, waiting %d; want 1, 0", st.running, st.waiting)
		}
		high.finish()
		if st := e.state(); st.running != 0 {
			t.Errorf("running %d after every finish", st.running)
		}
	})
}
