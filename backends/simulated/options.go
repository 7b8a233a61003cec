package simulated

import "time"

// defaultTokens is the completion length used when neither the request nor Options say otherwise.
const defaultTokens = 16

// defaultEmbeddingDimensions is the embedding length when neither the request nor Options say.
const defaultEmbeddingDimensions = 8

// defaultStoredResponses is how many Responses API responses are kept when Options do not say.
const defaultStoredResponses = 1024

// defaultBlockSize is the tokens of a prefix cache block when Engine.BlockSize does not say.
const defaultBlockSize = 16

// defaultModel is the model id the server reports (in /v1/models, and in replies to requests that
// name no model) when Options.Models is empty.
const defaultModel = "sim"

// Options configure the simulated backend. Every field's comment says what its zero value means.
// Nonsensical values (negative durations or counts, a FailStatus outside 200-599) are treated as
// their zero value rather than refused, so that a flag typo in a benchmark cannot crash the backend.
type Options struct {
	// TimeToFirstToken is the delay before the first token (stream) or before the reply
	// (non-stream); zero means none.
	TimeToFirstToken time.Duration
	// InterTokenDelay is the delay between streamed tokens; zero means none (tokens are still
	// separate events and flushed one by one).
	InterTokenDelay time.Duration
	// Tokens is the completion length in tokens when the request sets no max_tokens or
	// max_completion_tokens; zero means 16.
	Tokens int
	// Models are the model ids the server answers to (404 for others, with vLLM's message
	// "The model `X` does not exist."); empty means it accepts any model and reports "sim".
	Models []string
	// FailStatus makes every request (every endpoint, /v1/models and /health) fail with this
	// status in the error shape chosen by the X-Mock-Error-Shape request header (nested by
	// default); zero means never. A per-request X-Mock-Status header takes precedence.
	FailStatus int
	// PrefixCache is the number of prompt prefixes (the first two messages) the server remembers,
	// least recently used first out, to model an inference server's prefix cache: a request whose
	// prefix is remembered reports the tokens of those messages as
	// usage.prompt_tokens_details.cached_tokens. Zero means no cache, and cached_tokens is 0.
	PrefixCache int
	// EmbeddingDimensions is the length of the vectors /v1/embeddings returns when the request
	// asks for no dimensions; zero means 8.
	EmbeddingDimensions int
	// VariedText makes a request without a seed sample its text like a seeded one, from a seed
	// of its own, so that repeated requests differ as sampled text does; false (zero) gives
	// such requests the counting text "tok0 tok1 …", the same every time, which tests assert.
	// A request's own seed always wins.
	VariedText bool
	// StoredResponses is how many Responses API responses the server keeps for GET, DELETE,
	// cancel and previous_response_id, oldest first out; zero means 1024.
	StoredResponses int
	// Engine gives plain chat completions the physics of a vLLM server: a running-sequence
	// limit with a queue, per-token prefill over a block prefix cache, load-dependent latency,
	// LoRA adapters (engine.go). Its zero value keeps the fixed TimeToFirstToken and
	// InterTokenDelay of every request.
	Engine Engine
	// OnSequence, when set, is called with what the engine did with each plain chat request it
	// admitted, once admitted: a measurement's request log (tollbench -fleet-log). Nil means
	// nothing is reported.
	OnSequence func(SequenceStat)
}

// SequenceStat is what Options.OnSequence hears of a request the engine admitted.
type SequenceStat struct {
	// Arrived is when the request reached the engine, Admitted when it got a sequence slot:
	// the difference is its wait in the server's queue.
	Arrived, Admitted time.Time
	// Running is the sequences running once it was admitted, itself included, the load its
	// prefill is slowed by.
	Running int
	// PromptTokens is its prompt's length, CachedTokens the part found in the prefix cache.
	PromptTokens, CachedTokens int
	// Prefill is its prefill time beyond the fixed TimeToFirstToken.
	Prefill time.Duration
	// Body is the request's body, valid during the call only.
	Body []byte
}

// Engine is the scheduler and KV cache model of the simulated server, after the latency and KV
// cache model of llm-d-inference-sim: prefill takes TimeToFirstToken (the fixed overhead) plus
// PrefillPerToken for each prompt token not found in the prefix cache, decoding takes
// InterTokenDelay per token, and both are slowed by LoadFactor as the running sequences approach
// MaxNumSeqs. Every field's zero value turns its part off.
type Engine struct {
	// MaxNumSeqs is how many sequences run at once (vLLM's --max-num-seqs); later requests wait
	// in a queue, in order of their "priority" (lower first) and then of arrival. Zero means no
	// limit and no queue.
	MaxNumSeqs int
	// PrefillPerToken is the prefill time of each prompt token not found in the prefix cache,
	// added to TimeToFirstToken. Zero means the first token comes after TimeToFirstToken
	// whatever the prompt.
	PrefillPerToken time.Duration
	// KVCacheBlocks is the size of the prefix cache in blocks of BlockSize tokens (vLLM's
	// num_gpu_blocks). The prompt is cut into blocks, each identified by a hash of its tokens
	// and of every block before it; leading blocks found in the cache are hits and skip
	// prefill; blocks of running sequences stay, the others leave least recently used first.
	// Zero means no block cache (PrefixCache, when set, still reports cached_tokens).
	KVCacheBlocks int
	// BlockSize is the number of tokens in a block. Zero means 16, vLLM's default.
	BlockSize int
	// LoadFactor multiplies the prefill and inter-token times when MaxNumSeqs sequences run,
	// growing linearly from 1 with one running (llm-d-inference-sim's time-factor-under-load).
	// Zero (or anything up to 1, or MaxNumSeqs below 2) means no slowdown.
	LoadFactor float64
	// LoRAs are LoRA adapters served besides the base model; a request whose model names one
	// runs with it. Empty means none.
	LoRAs []string
	// MaxLoRAs is how many adapters are loaded at once (vLLM's --max-loras); a request for
	// another waits until a loaded adapter has no running request and can be swapped out. Zero
	// means 1, vLLM's default.
	MaxLoRAs int
	// LoRALoadTime is added to the first token of a request whose adapter had to be loaded.
	// Zero means loading is free.
	LoRALoadTime time.Duration
	// PriorityPreemption makes the engine preempt as vLLM's priority scheduling policy
	// (--scheduling-policy priority) does: a request arriving while MaxNumSeqs sequences run
	// takes the slot of the running sequence of the lowest priority (the highest value, the
	// latest arrival among equals) when that priority is lower than its own. The preempted
	// sequence stops at its next token, waits in the queue at its priority and arrival, and
	// when readmitted recomputes the tokens it had generated (vLLM's recompute preemption; its
	// prompt's blocks stay cached). Sequences of LoRA adapters are neither preempted nor
	// preempt. False means a request waits for a slot whatever its priority.
	PriorityPreemption bool
}

// enabled reports whether any part of the engine is configured.
func (e Engine) enabled() bool {
	return e.MaxNumSeqs > 0 || e.PrefillPerToken > 0 || e.KVCacheBlocks > 0 || e.LoadFactor > 1 || len(e.LoRAs) > 0
}

// normalized returns e with out-of-range values replaced by their defaults, and its own copy of
// LoRAs.
func (e Engine) normalized() Engine {
	e.MaxNumSeqs = max(e.MaxNumSeqs, 0)
	e.PrefillPerToken = max(e.PrefillPerToken, 0)
	e.KVCacheBlocks = max(e.KVCacheBlocks, 0)
	if e.BlockSize <= 0 {
		e.BlockSize = defaultBlockSize
	}
	if !(e.LoadFactor > 1) {
		e.LoadFactor = 1
	}
	if e.MaxLoRAs <= 0 {
		e.MaxLoRAs = 1
	}
	e.LoRALoadTime = max(e.LoRALoadTime, 0)
	e.LoRAs = append([]string(nil), e.LoRAs...)
	return e
}

// normalized returns a copy of o with zero and out-of-range values replaced by their defaults.
// The Models slice is copied so that a caller mutating its own slice later cannot race with the
// server reading it.
func (o Options) normalized() Options {
	if o.TimeToFirstToken < 0 {
		o.TimeToFirstToken = 0
	}
	if o.InterTokenDelay < 0 {
		o.InterTokenDelay = 0
	}
	if o.Tokens <= 0 {
		o.Tokens = defaultTokens
	}
	if o.Tokens > maxModelLen {
		o.Tokens = maxModelLen
	}
	if o.EmbeddingDimensions <= 0 {
		o.EmbeddingDimensions = defaultEmbeddingDimensions
	}
	o.EmbeddingDimensions = min(o.EmbeddingDimensions, maxEmbeddingDimensions)
	if o.StoredResponses <= 0 {
		o.StoredResponses = defaultStoredResponses
	}
	if o.PrefixCache < 0 {
		o.PrefixCache = 0
	}
	if !validStatus(o.FailStatus) {
		o.FailStatus = 0
	}
	o.Models = append([]string(nil), o.Models...)
	o.Engine = o.Engine.normalized()
	return o
}

// validStatus reports whether code can be injected as a failure status. Statuses below 200 and
// 204/304 cannot carry the error body the shapes need, so they are not accepted.
func validStatus(code int) bool {
	return code >= 200 && code <= 599 && code != 204 && code != 304
}
