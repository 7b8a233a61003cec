package backends

import (
	"hash/maphash"
	"math/bits"
	"sync/atomic"
)

// A prompt is cut into blocks at fixed offsets: fineBlocks blocks of
// fineBlockBytes first (about 16 tokens each, vLLM's own block), so that
// short prompts and the first messages of a conversation are told apart,
// then coarseBlocks blocks of PrefixBlockBytes (about 64 tokens), so that
// a long prompt needs few hashes, then longBlocks blocks each twice as
// long as the one before, from longBlockBytes, so that the turns of
// conversations behind a system prompt longer than the coarse blocks
// reach (an agent's, a coding assistant's) are still told apart, with a
// handful of hashes more, at the cost of matching at most half of such a
// prompt's tail.
const (
	fineBlockBytes   = 64
	fineBlocks       = 32
	PrefixBlockBytes = 256
	coarseBlocks     = 64
	longBlockBytes   = 2 << 10
	longBlocks       = 10
)

// MaxPrefixBlocks is how many leading blocks of a prompt the prefix signal
// looks at: 32 fine blocks, 64 coarse ones (the first 18 KiB) and 10 long
// ones (about 2 MiB more), while the chain fits in a small array on the
// request's stack.
const MaxPrefixBlocks = fineBlocks + coarseBlocks + longBlocks

// defaultBytesPerToken converts prompt bytes to tokens: in the score
// (heldTokens), and for the index's horizon until a backend's replies have
// said how its server counts them (prefixIndex.observe).
const defaultBytesPerToken = 4

// The learned bytes per token, in fixed point (bptScale units a byte), is
// an exponentially weighted average of the replies' ratios, each weighing
// 1/bptWeight, and each ratio is kept within [minBytesPerToken,
// maxBytesPerToken]: a reply counting tokens as no tokenizer does (a
// prompt of images, a server reporting nothing useful) cannot throw the
// index's horizon far off.
const (
	bptScale         = 1 << 10
	bptWeight        = 16
	minBytesPerToken = 1
	maxBytesPerToken = 16
)

// blockEnd is the offset in the prompt where block i ends (0 for i = -1).
func blockEnd(i int) int {
	const coarseStart = fineBlocks * fineBlockBytes
	const longStart = coarseStart + coarseBlocks*PrefixBlockBytes
	switch {
	case i < fineBlocks:
		return (i + 1) * fineBlockBytes
	case i < fineBlocks+coarseBlocks:
		return coarseStart + (i-fineBlocks+1)*PrefixBlockBytes
	}
	return longStart + longBlockBytes*(1<<(i-fineBlocks-coarseBlocks+1)-1)
}

// BlocksWithin is how many whole blocks the first n bytes of a prompt hold.
func BlocksWithin(n int) int {
	i := 0
	for i < MaxPrefixBlocks && blockEnd(i) <= n {
		i++
	}
	return i
}

// blockWeight is block i's length in blocks of PrefixBlockBytes, at least
// one: what it adds to the index's clock, which the server's KV cache is
// measured against.
func blockWeight(i int) uint64 {
	return uint64(max((blockEnd(i)-blockEnd(i-1))/PrefixBlockBytes, 1))
}

// AppendBlockChain appends to dst the hash chain of a request's prompt:
// the raw JSON of its "messages" array (or its "prompt" or "input"), after
// any parts a backend renders before it that the body keeps elsewhere (the
// Messages API's "system"), the parts taken as one run of bytes. It makes
// one hash per whole block, the hash of block i covering blocks 0 to i.
// Two prompts share their first k hashes exactly when they share their
// first k blocks, so a conversation's later turns match its earlier ones,
// and requests sharing a system prompt share its blocks. A partial last
// block is left out, as vLLM caches only whole blocks. It stops at
// cap(dst) and never grows dst, so a caller that passes an array of
// MaxPrefixBlocks does not allocate.
//
// Each block is hashed on its own, with hash/maphash under the process's
// chainSeed, and linked to the hash of the blocks before it: a block
// costs one pass over its bytes and a few instructions more, where a
// running digest also paid for a finalization of everything before it.
// A chain is thus the same in every backend's index of one process, and
// unknown outside it, so a client cannot make two prompts collide.
func AppendBlockChain(dst []uint64, parts ...[]byte) []uint64 {
	left := 0 // the bytes not yet hashed, in cur and parts
	for _, p := range parts {
		left += len(p)
	}
	var cur []byte // the rest of the part the next block starts in
	var h uint64
	for i := 0; len(dst) < cap(dst); {
		n := blockEnd(i) - blockEnd(i-1)
		if n > left {
			break
		}
		for len(cur) == 0 {
			cur, parts = parts[0], parts[1:]
		}
		if n > len(cur) {
			var block uint64
			block, cur, parts = hashAcross(n, cur, parts)
			h = linkBlock(h, block)
			dst = append(dst, h)
			left -= n
			i++
			continue
		}
		// The blocks of n bytes that lie in cur, up to the last of their
		// size, are hashed in a loop of their own, which keeps fewer
		// values live across each hash's call.
		k := min(len(cur)/n, sameSizeEnd(i)-i, cap(dst)-len(dst))
		h = hashBlockRun(dst[len(dst):len(dst)+k], h, cur[:k*n], n)
		dst = dst[:len(dst)+k]
		cur = cur[k*n:]
		left -= k * n
		i += k
	}
	return dst
}

// sameSizeEnd is the first block after block i whose size differs from
// i's, for the fine and the coarse blocks; i+1 for a long one.
func sameSizeEnd(i int) int {
	switch {
	case i < fineBlocks:
		return fineBlocks
	case i < fineBlocks+coarseBlocks:
		return fineBlocks + coarseBlocks
	}
	return i + 1
}

// hashBlockRun sets chain to the chain over run, blocks of n bytes each,
// one hash per block, after the chain's hash h, and returns the last.
func hashBlockRun(chain []uint64, h uint64, run []byte, n int) uint64 {
	for i := range chain {
		h = linkBlock(h, maphash.Bytes(chainSeed, run[i*n:(i+1)*n]))
		chain[i] = h
	}
	return h
}

// chainSeed seeds every block hash of the process; it is set once, at
// start, and only read after.
var chainSeed = maphash.MakeSeed()

// hashAcross hashes the next n bytes of cur and then parts, when they run
// past cur, and returns the hash and what is left of the two. maphash
// hashes a run of bytes written in pieces as it hashes them written at
// once, so such a block hashes as it would in one part.
func hashAcross(n int, cur []byte, parts [][]byte) (uint64, []byte, [][]byte) {
	var d maphash.Hash
	d.SetSeed(chainSeed)
	for n > 0 {
		for len(cur) == 0 {
			cur, parts = parts[0], parts[1:]
		}
		k := min(n, len(cur))
		_, _ = d.Write(cur[:k]) // never fails
		cur, n = cur[k:], n-k
	}
	return d.Sum64(), cur, parts
}

// linkBlock is the chain's hash after a block hashing to block, given the
// hash of the blocks before it (0 before the first): xxHash64's round,
// which is one to one in block for any chain, so a chain's hashes are as
// evenly spread as its blocks' are.
func linkBlock(chain, block uint64) uint64 {
	const prime1, prime2 = 11400714785074694791, 14029467366897019727
	return bits.RotateLeft64(chain+block*prime2, 31) * prime1
}

// The prefix index's shape: a set-associative table of indexEntries
// entries, indexWays per set. Each entry is one atomic word, a block hash's
// tag and the tick it was last sent at, so that lookups and inserts on the
// request path take no lock; two requests racing on one set may lose an
// insert, which only makes the index forget a block early.
const (
	indexEntries = 1 << 14
	indexWays    = 4
	indexSets    = indexEntries / indexWays
	tickBits     = 24
	tickMask     = 1<<tickBits - 1
	// indexBytes is the memory of one backend's index.
	indexBytes = indexEntries * 8
)

// prefixIndex remembers which prompt blocks a backend was sent recently,
// standing in for the server's prefix cache. It forgets a block when its
// set needs room for a newer one (least recently sent first), or once more
// blocks were sent after it than the server's KV cache holds: by then the
// server has evicted it too, approximately. The cache's size is known in
// tokens (from the server's metrics) and the blocks are cut in prompt
// bytes, so the index learns how many bytes of prompt the server counts
// as a token from the replies' usage (observe) to place that horizon.
type prefixIndex struct {
	// clock counts the new blocks inserted, by their weight in blocks of
	// PrefixBlockBytes (blockWeight): a block's age is how much was
	// inserted after it.
	clock atomic.Uint64
	// kvTokens is the server's KV cache in tokens, from its metrics; zero
	// when unknown, and then only the table's bound applies.
	kvTokens atomic.Int64
	// bytesPerToken is the learned prompt bytes per token the server
	// counts, in bptScale units; zero until a reply was observed, and then
	// defaultBytesPerToken stands for it.
	bytesPerToken atomic.Int64
	// reuse is how old, on the clock, the blocks a request found again
	// were at most, of late: a maximum that decays by 1/reuseDecay at each
	// insert. It is the reuse distance the server's cache must keep to
	// serve the prompts in use (see roomFor).
	reuse atomic.Uint64
	slots [indexEntries]atomic.Uint64
}

// reuseDecay sets how fast reuse forgets a long reuse distance: by a
// 1/reuseDecay share at each insert.
const reuseDecay = 64

// bpt is the prompt bytes per token, in bptScale units.
func (x *prefixIndex) bpt() int64 {
	if v := x.bytesPerToken.Load(); v > 0 {
		return v
	}
	return defaultBytesPerToken * bptScale
}

// observe learns from a reply to a prompt of promptBytes bytes (the raw
// JSON the blocks are cut from) that the server counted promptTokens
// tokens. Two replies racing may lose one's update, which only slows the
// learning.
func (x *prefixIndex) observe(promptBytes int, promptTokens int64) {
	if promptBytes <= 0 || promptTokens <= 0 {
		return
	}
	ratio := min(max(int64(promptBytes)*bptScale/promptTokens, minBytesPerToken*bptScale), maxBytesPerToken*bptScale)
	old := x.bytesPerToken.Load()
	if old <= 0 {
		x.bytesPerToken.Store(ratio)
		return
	}
	x.bytesPerToken.Store(old + (ratio-old)/bptWeight)
}

// heldTokens is how many prompt tokens the score and the queue rule count
// for the first k blocks: at defaultBytesPerToken, whatever the server
// counts. The score's weights and routing.queue_cost_tokens were set in
// this unit; counting the learned tokens instead makes the prefix term
// lighter wherever a token is longer than four bytes, and moved more
// conversations off the servers holding their turns (docs/scheduler.md).
func heldTokens(k int) int64 {
	if k == 0 {
		return 0
	}
	return int64(blockEnd(k-1) / defaultBytesPerToken)
}

// limit is how many blocks of PrefixBlockBytes the server's KV cache
// holds, or zero when its size is not known.
func (x *prefixIndex) limit() uint64 {
	kv := x.kvTokens.Load()
	if kv <= 0 {
		return 0
	}
	return uint64(max(kv*x.bpt()/(bptScale*PrefixBlockBytes), 1))
}

// indexSlot splits a block hash into its set's first slot and the tag the
// entry keeps (the hash's high bits; never zero, which marks an empty
// entry).
func indexSlot(h uint64) (base int, tag uint64) {
	return int(h%indexSets) * indexWays, h>>tickBits | 1
}

// has reports whether block h was sent to the backend and is not yet
// evicted, at clock now, when the server's cache holds limit blocks (see
// limit).
func (x *prefixIndex) has(h, now, limit uint64) bool {
	base, tag := indexSlot(h)
	for w := range indexWays {
		e := x.slots[base+w].Load()
		if e>>tickBits != tag {
			continue
		}
		return limit == 0 || (now-e)&tickMask < limit
	}
	return false
}

// held is how many leading blocks of chain the backend holds. A chain's
// blocks are sent together, and the earlier ones by more requests, so a
// backend holding block i almost always holds every block before it: a
// binary search finds the longest run in a few lookups. The lookups read
// the clock and the cache's size once, as one moment of the index.
func (x *prefixIndex) held(chain []uint64) int {
	lo, hi := 0, len(chain)
	if hi == 0 {
		return 0
	}
	now, limit := x.clock.Load(), x.limit()
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if x.has(chain[mid-1], now, limit) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// insert records that chain was sent to the backend: each block is
// refreshed where present, or takes the place of the least recently sent
// block of its set.
func (x *prefixIndex) insert(chain []uint64) {
	var reused uint64 // the oldest block found again
	for i, h := range chain {
		base, tag := indexSlot(h)
		now := x.clock.Load()
		oldest, oldestAge := base, uint64(0)
		found := false
		for w := range indexWays {
			e := x.slots[base+w].Load()
			if e>>tickBits == tag {
				x.slots[base+w].Store(tag<<tickBits | now&tickMask)
				reused = max(reused, (now-e)&tickMask)
				found = true
				break
			}
			age := uint64(tickMask + 1) // an empty entry is the first to go
			if e != 0 {
				age = (now - e) & tickMask
			}
			if age > oldestAge {
				oldest, oldestAge = base+w, age
			}
		}
		if !found {
			t := x.clock.Add(blockWeight(i))
			x.slots[oldest].Store(tag<<tickBits | t&tickMask)
		}
	}
	// Racing inserts may lose an update, which only blurs the maximum.
	r := x.reuse.Load()
	x.reuse.Store(max(r-r/reuseDecay, reused))
}

// roomFor reports whether the server's cache can take a prompt's first k
// blocks without evicting what the prompts in use read again: the reuse
// distance seen of late and those blocks fit in the cache. False when the
// cache's size is not known.
func (x *prefixIndex) roomFor(k int) bool {
	limit := x.limit()
	if limit == 0 {
		return false
	}
	var weight uint64 // what the blocks add to the clock, once inserted
	for i := range k {
		weight += blockWeight(i)
	}
	return x.reuse.Load()+weight < limit
}
