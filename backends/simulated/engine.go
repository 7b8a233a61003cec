package simulated

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
)

// clock is the time the engine and the streams wait on. The server uses the wall clock; tests
// drive a fake one that records each wait and returns at once, so that the physics can be
// asserted on exactly, without timing anything.
type clock interface {
	Now() time.Time
	Sleep(d time.Duration)
}

type wallClock struct{}

func (wallClock) Now() time.Time        { return time.Now() }
func (wallClock) Sleep(d time.Duration) { time.Sleep(d) }

// engine is the scheduler of a simulated vLLM server (Options.Engine): it admits at most
// MaxNumSeqs sequences and queues the rest, holds the prefix cache's blocks, loads LoRA
// adapters, and says how long each sequence's prefill and tokens take at the current load.
type engine struct {
	cfg Engine

	mu      sync.Mutex
	running int
	// waiting is the queue, kept in admission order: by priority (lower first), then arrival.
	waiting []*waiter
	arrived uint64
	blocks  *blockCache // nil without KVCacheBlocks
	loras   loraSet
	// runs are the running sequences that may be preempted (PriorityPreemption only).
	runs []*seq
	// preemptions counts the sequences preempted, as vllm:num_preemptions_total.
	preemptions atomic.Int64

	// runningNow mirrors running for the lock-free reads of every token's delay.
	runningNow atomic.Int64
	// queried and hit are vLLM's prefix cache counters, in prompt tokens.
	queried, hit atomic.Int64
}

// waiter is a request in the queue; admitted is closed when it gets a slot.
type waiter struct {
	priority int64
	order    uint64
	adapter  string
	loads    bool // its adapter had to be loaded
	admitted chan struct{}
}

// seq is a running sequence, from admission to its finish.
type seq struct {
	e       *engine
	adapter string
	held    []uint64 // the blocks it holds in the cache
	// cached is the prompt tokens found in the cache; prefill the time to its first token.
	cached  int
	prefill time.Duration
	done    bool
	// priority and order are its place in the queue, should it be preempted (see
	// Engine.PriorityPreemption); generated counts the tokens it generated, which a
	// preemption makes it recompute; tail is its prompt's tokens after its last whole block,
	// which no cache holds.
	priority  int64
	order     uint64
	generated int
	tail      int
	// preempted is the waiter it waits as since it was preempted, until it runs again; nil
	// while it runs. Guarded by e.mu.
	preempted *waiter
}

func newEngine(cfg Engine) *engine {
	e := &engine{cfg: cfg, loras: loraSet{max: cfg.MaxLoRAs, running: map[string]int{}}}
	if cfg.KVCacheBlocks > 0 {
		e.blocks = newBlockCache(cfg.KVCacheBlocks)
	}
	return e
}

// startSequence admits a plain chat request to the engine and sets its cached tokens from the
// block cache; it waits while the request is queued. It returns nil without an engine.
func (s *Server) startSequence(body []byte, r *chatRequest) *seq {
	e := s.engine
	if e == nil {
		return nil
	}
	adapter := ""
	if e.serves(r.model) {
		adapter = r.model
	}
	blocks, _ := promptBlocks(nil, r.messages, e.cfg.BlockSize, adapter)
	arrived := s.clock.Now()
	q := e.start(blocks, r.prompt, adapter, gjson.GetBytes(body, "priority").Int())
	if e.blocks != nil {
		r.cached = q.cached
	}
	if s.opts.OnSequence != nil {
		s.opts.OnSequence(SequenceStat{
			Arrived: arrived, Admitted: s.clock.Now(), Running: int(e.runningNow.Load()),
			PromptTokens: r.prompt, CachedTokens: q.cached, Prefill: q.prefill, Body: body,
		})
	}
	return q
}

// CachedPrefix is how many tokens of the prompt of a chat request's body (its "messages") the
// server's prefix cache holds now, and how many sequences it runs and queues: a measurement's
// view of where else a request could have run warm. It changes nothing in the cache.
func (s *Server) CachedPrefix(body []byte) (cached, running, waiting int) {
	e := s.engine
	if e == nil {
		return 0, 0, 0
	}
	blocks, _ := promptBlocks(nil, gjson.GetBytes(body, "messages"), e.cfg.BlockSize, "")
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.blocks != nil {
		cached = e.blocks.leading(blocks) * e.cfg.BlockSize
	}
	return cached, e.running, len(e.waiting)
}

// decodeWhole waits out a reply that is not streamed, which a server sends once the whole
// generation of tokens tokens is done, and finishes its sequence.
func (s *Server) decodeWhole(q *seq, tokens int) {
	if q == nil {
		s.waitFirstToken()
		return
	}
	if !s.engine.cfg.PriorityPreemption {
		s.clock.Sleep(q.firstToken(s.opts.TimeToFirstToken) + time.Duration(max(tokens-1, 0))*q.interToken(s.opts.InterTokenDelay))
		q.finish()
		return
	}
	// Token by token, so that a preemption stops it at its next token.
	s.clock.Sleep(q.firstToken(s.opts.TimeToFirstToken))
	for range max(tokens-1, 0) {
		s.clock.Sleep(q.interToken(s.opts.InterTokenDelay))
	}
	q.finish()
}

// serves reports whether model names one of the engine's adapters.
func (e *engine) serves(model string) bool { return slices.Contains(e.cfg.LoRAs, model) }

// start admits a request for a prompt of tokens tokens whose full blocks hash to blocks, waiting
// in the queue while MaxNumSeqs sequences run (or its adapter cannot be loaded), then looks its
// blocks up in the cache. adapter is "" for the base model. The caller must call finish.
func (e *engine) start(blocks []uint64, tokens int, adapter string, priority int64) *seq {
	e.mu.Lock()
	w := &waiter{priority: priority, order: e.arrived, adapter: adapter}
	e.arrived++
	if e.admissible(adapter) {
		// Whoever waits cannot be admitted (admitWaiting runs on every release), so this
		// overtakes nobody who could run.
		w.loads = e.admit(adapter)
	} else if v := e.victim(priority, adapter); v != nil {
		// The victim's slot passes to this request: running stays as it was.
		e.preempt(v)
	} else {
		w.admitted = make(chan struct{})
		e.enqueue(w)
	}
	e.mu.Unlock()
	if w.admitted != nil {
		<-w.admitted
	}

	q := &seq{e: e, adapter: adapter, priority: priority, order: w.order, tail: max(tokens-len(blocks)*e.cfg.BlockSize, 0)}
	e.mu.Lock()
	if e.cfg.PriorityPreemption && adapter == "" {
		e.runs = append(e.runs, q)
	}
	hitBlocks := 0
	if e.blocks != nil {
		// vLLM recomputes at least the prompt's last token, so a prompt made of whole cached
		// blocks still prefills its last block.
		usable := blocks
		if len(blocks)*e.cfg.BlockSize >= tokens && len(blocks) > 0 {
			usable = blocks[:len(blocks)-1]
		}
		hitBlocks = e.blocks.leading(usable)
		q.held = e.blocks.acquire(blocks)
	}
	running := e.running
	e.mu.Unlock()
	q.cached = hitBlocks * e.cfg.BlockSize
	e.queried.Add(int64(tokens))
	e.hit.Add(int64(q.cached))
	q.prefill = e.scale(e.cfg.PrefillPerToken*time.Duration(tokens-q.cached), running)
	if w.loads {
		q.prefill += e.cfg.LoRALoadTime
	}
	return q
}

// firstToken is the wait before the first token: ttft, the fixed overhead, slowed by the load
// like the rest of prefill, plus the sequence's own prefill.
func (q *seq) firstToken(ttft time.Duration) time.Duration {
	return q.e.scale(ttft, int(q.e.runningNow.Load())) + q.prefill
}

// interToken is the delay before the next token at the current load. A sequence preempted
// since its last token first waits to run again, and then recomputes what it generated.
func (q *seq) interToken(itl time.Duration) time.Duration {
	d := q.e.scale(itl, int(q.e.runningNow.Load()))
	if q.e.cfg.PriorityPreemption {
		d += q.resume()
		q.generated++
	}
	return d
}

// victim is the running sequence a request of priority for adapter preempts, or nil: the one of
// the lowest priority (the highest value; the latest arrival among equals), if lower than the
// request's. e.mu is held.
func (e *engine) victim(priority int64, adapter string) *seq {
	if !e.cfg.PriorityPreemption || adapter != "" {
		return nil
	}
	var v *seq
	for _, q := range e.runs {
		if q.priority > priority && (v == nil || q.priority > v.priority || q.priority == v.priority && q.order > v.order) {
			v = q
		}
	}
	return v
}

// preempt takes v off the running sequences and queues it again at its priority and arrival;
// its slot is the caller's. e.mu is held.
func (e *engine) preempt(v *seq) {
	e.runs = slices.DeleteFunc(e.runs, func(q *seq) bool { return q == v })
	v.preempted = &waiter{priority: v.priority, order: v.order, admitted: make(chan struct{})}
	e.enqueue(v.preempted)
	e.preemptions.Add(1)
}

// enqueue inserts w in the queue, by priority then arrival. e.mu is held.
func (e *engine) enqueue(w *waiter) {
	i, _ := slices.BinarySearchFunc(e.waiting, w, func(a, b *waiter) int {
		if a.priority != b.priority {
			return cmpInt64(a.priority, b.priority)
		}
		return cmpInt64(int64(a.order), int64(b.order))
	})
	e.waiting = slices.Insert(e.waiting, i, w)
}

// resume waits, when q was preempted, until it is readmitted, and returns the time to recompute
// its state: the tokens it generated and its prompt's tail, at the load it runs again under.
func (q *seq) resume() time.Duration {
	e := q.e
	e.mu.Lock()
	w := q.preempted
	e.mu.Unlock()
	if w == nil {
		return 0
	}
	<-w.admitted
	e.mu.Lock()
	q.preempted = nil
	e.runs = append(e.runs, q)
	running := e.running
	e.mu.Unlock()
	return e.scale(e.cfg.PrefillPerToken*time.Duration(q.generated+q.tail), running)
}

// finish ends the sequence: its blocks become evictable and its slot goes to the next waiter
// that can run. Calling it again does nothing.
func (q *seq) finish() {
	if q == nil || q.done {
		return
	}
	q.done = true
	e := q.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.blocks != nil {
		e.blocks.release(q.held)
	}
	if w := q.preempted; w != nil {
		// Preempted after its last token: it holds a slot only if readmitted meanwhile.
		q.preempted = nil
		if i := slices.Index(e.waiting, w); i >= 0 {
			e.waiting = slices.Delete(e.waiting, i, i+1)
			return
		}
	} else if e.cfg.PriorityPreemption {
		e.runs = slices.DeleteFunc(e.runs, func(r *seq) bool { return r == q })
	}
	e.running--
	if q.adapter != "" {
		e.loras.running[q.adapter]--
	}
	e.admitWaiting()
	e.runningNow.Store(int64(e.running))
}

// admissible reports whether a sequence for adapter can run now; e.mu is held.
func (e *engine) admissible(adapter string) bool {
	if e.cfg.MaxNumSeqs > 0 && e.running >= e.cfg.MaxNumSeqs {
		return false
	}
	return adapter == "" || e.loras.canRun(adapter)
}

// admit takes a slot for a sequence of adapter, and reports whether the adapter had to be
// loaded; e.mu is held.
func (e *engine) admit(adapter string) (loads bool) {
	e.running++
	e.runningNow.Store(int64(e.running))
	if adapter != "" {
		loads = e.loras.use(adapter)
	}
	return loads
}

// admitWaiting admits, in queue order, every waiter that can run; e.mu is held. A waiter whose
// adapter cannot be loaded yet is passed over, as vLLM's scheduler skips it.
func (e *engine) admitWaiting() {
	kept := e.waiting[:0]
	for _, w := range e.waiting {
		if e.admissible(w.adapter) {
			w.loads = e.admit(w.adapter)
			close(w.admitted)
			continue
		}
		kept = append(kept, w)
	}
	clear(e.waiting[len(kept):])
	e.waiting = kept
}

// scale slows d by the load factor at running sequences: 1 with one running, LoadFactor with
// MaxNumSeqs, linear in between.
func (e *engine) scale(d time.Duration, running int) time.Duration {
	if e.cfg.LoadFactor <= 1 || e.cfg.MaxNumSeqs < 2 || d <= 0 {
		return d
	}
	r := min(max(running, 1), e.cfg.MaxNumSeqs)
	f := 1 + (e.cfg.LoadFactor-1)*float64(r-1)/float64(e.cfg.MaxNumSeqs-1)
	return time.Duration(float64(d) * f)
}

// resetPrefixCache forgets every cached block that no running sequence holds, as vLLM's
// POST /reset_prefix_cache does.
func (e *engine) resetPrefixCache() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.blocks != nil {
		e.blocks.dropFree()
	}
}

// engineState is what /metrics reports.
type engineState struct {
	running, waiting  int
	kvUsage           float64
	queried, hit      int64
	preemptions       int64
	runningAdapters   []string
	waitingAdapters   []string
	maxLoRAs, kvBlock int
	kvBlocks          int
}

func (e *engine) state() engineState {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := engineState{
		running: e.running, waiting: len(e.waiting),
		queried: e.queried.Load(), hit: e.hit.Load(), preemptions: e.preemptions.Load(),
		maxLoRAs: e.cfg.MaxLoRAs, kvBlock: e.cfg.BlockSize, kvBlocks: e.cfg.KVCacheBlocks,
	}
	if e.blocks != nil {
		st.kvUsage = float64(e.blocks.used) / float64(e.blocks.capacity)
	}
	for _, a := range e.cfg.LoRAs {
		if e.loras.running[a] > 0 {
			st.runningAdapters = append(st.runningAdapters, a)
		}
	}
	for _, w := range e.waiting {
		if w.adapter != "" && !slices.Contains(st.waitingAdapters, w.adapter) {
			st.waitingAdapters = append(st.waitingAdapters, w.adapter)
		}
	}
	return st
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// loraSet is the adapters a server has loaded, at most max, and the sequences running on each.
type loraSet struct {
	max     int
	loaded  []string // least recently used first
	running map[string]int
}

// canRun reports whether a sequence for adapter can start: it is loaded, there is room to load
// it, or a loaded adapter runs nothing and can be swapped out.
func (l *loraSet) canRun(adapter string) bool {
	if slices.Contains(l.loaded, adapter) || len(l.loaded) < l.max {
		return true
	}
	for _, a := range l.loaded {
		if l.running[a] == 0 {
			return true
		}
	}
	return false
}

// use starts a sequence on adapter, which canRun allowed, loading it (and unloading the least
// recently used idle adapter to make room) when it is not loaded; it reports whether it loaded.
func (l *loraSet) use(adapter string) (loaded bool) {
	l.running[adapter]++
	if i := slices.Index(l.loaded, adapter); i >= 0 {
		l.loaded = append(slices.Delete(l.loaded, i, i+1), adapter)
		return false
	}
	if len(l.loaded) >= l.max {
		for i, a := range l.loaded {
			if l.running[a] == 0 {
				l.loaded = slices.Delete(l.loaded, i, i+1)
				break
			}
		}
	}
	l.loaded = append(l.loaded, adapter)
	return true
}

// blockCache is the prefix cache: up to capacity blocks by hash. Blocks held by running
// sequences stay; the others are evictable, least recently released first.
type blockCache struct {
	capacity int
	used     int // blocks held by at least one running sequence
	entries  map[uint64]*block
	// free is the evictable blocks, a ring through a sentinel: free.next is the oldest.
	free block
}

type block struct {
	hash       uint64
	refs       int
	prev, next *block
}

func newBlockCache(capacity int) *blockCache {
	c := &blockCache{capacity: capacity, entries: make(map[uint64]*block, capacity)}
	c.free.prev, c.free.next = &c.free, &c.free
	return c
}

// leading counts the blocks at the start of hashes that the cache holds.
func (c *blockCache) leading(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := c.entries[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// acquire holds every block of hashes, storing those not cached while there is room (evicting
// free blocks, oldest first), and returns the hashes it holds, to release later. A block that
// finds no room is computed but not cached, as when vLLM's cache is full of running sequences.
func (c *blockCache) acquire(hashes []uint64) []uint64 {
	held := make([]uint64, 0, len(hashes))
	for _, h := range hashes {
		b, ok := c.entries[h]
		if !ok {
			if len(c.entries) >= c.capacity {
				oldest := c.free.next
				if oldest == &c.free {
					break
				}
				c.unlink(oldest)
				delete(c.entries, oldest.hash)
			}
			b = &block{hash: h}
			c.entries[h] = b
		} else if b.refs == 0 {
			c.unlink(b)
		}
		if b.refs == 0 {
			c.used++
		}
		b.refs++
		held = append(held, h)
	}
	return held
}

// release lets go of held. The last blocks of a prompt become evictable before its first ones,
// as in vLLM, so that eviction shortens a cached prefix from its end rather than orphaning it.
func (c *blockCache) release(held []uint64) {
	for i := len(held) - 1; i >= 0; i-- {
		b := c.entries[held[i]]
		if b == nil {
			continue
		}
		if b.refs--; b.refs == 0 {
			c.used--
			// Appended at the newest end: released last, evicted last.
			b.prev, b.next = c.free.prev, &c.free
			c.free.prev.next = b
			c.free.prev = b
		}
	}
}

func (c *blockCache) unlink(b *block) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
}

// dropFree forgets every evictable block.
func (c *blockCache) dropFree() {
	for b := c.free.next; b != &c.free; {
		next := b.next
		delete(c.entries, b.hash)
		b.prev, b.next = nil, nil
		b = next
	}
	c.free.prev, c.free.next = &c.free, &c.free
}

// fnvWord continues the FNV-1a hash h (see fnv64) over the eight bytes of w.
func fnvWord(h, w uint64) uint64 {
	for range 8 {
		h ^= w & 0xff
		h *= 1099511628211
		w >>= 8
	}
	return h
}

// promptBlocks appends to dst the hashes of the full blocks of blockSize tokens of a chat
// prompt, tokenized as promptTokens counts it: per message, tokensPerMessage tokens for its
// role, then one per word of its content. Each block's hash covers its tokens and the hash of
// the block before it, and the first covers adapter, so two prompts share their first k hashes
// exactly when they share their first k blocks under the same adapter. It returns the hashes
// and the prompt's length in tokens.
func promptBlocks(dst []uint64, messages gjson.Result, blockSize int, adapter string) ([]uint64, int) {
	chain := fnv64(fnvOffset, adapter)
	h, inBlock, tokens := chain, 0, 0
	token := func(t uint64) {
		h = fnvWord(h, t)
		tokens++
		if inBlock++; inBlock == blockSize {
			chain, inBlock = h, 0
			dst = append(dst, chain)
		}
	}
	words := func(s string) {
		for i := 0; i < len(s); {
			for i < len(s) && s[i] < 0x80 && asciiSpace[s[i]] {
				i++
			}
			j := i
			for j < len(s) && !(s[j] < 0x80 && asciiSpace[s[j]]) {
				j++
			}
			if j > i {
				token(fnv64(fnvOffset, s[i:j]))
			}
			i = j
		}
	}
	messages.ForEach(func(_, m gjson.Result) bool {
		role := fnv64(fnvOffset, m.Get("role").Str)
		for i := range tokensPerMessage {
			token(role + uint64(i))
		}
		c := m.Get("content")
		switch {
		case c.Type == gjson.String:
			words(c.Str)
		case c.IsArray():
			c.ForEach(func(_, part gjson.Result) bool {
				if part.Get("type").Str == "text" {
					words(part.Get("text").Str)
				}
				return true
			})
		}
		return true
	})
	return dst, tokens
}
