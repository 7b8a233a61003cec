package backends

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/tollgate-dev/tollgate/config"
)

// chatMessages renders a messages array as a client sends it: the system prompt, then the turns.
func chatMessages(system string, turns ...string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `[{"role":"system","content":%q}`, system)
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `,{"role":%q,"content":%q}`, role, t)
	}
	b.WriteString("]")
	return []byte(b.String())
}

func chain(prompt []byte) []uint64 {
	return AppendBlockChain(make([]uint64, 0, MaxPrefixBlocks), prompt)
}

// shared is how many leading hashes two chains have in common.
func shared(x, y []uint64) int {
	n := 0
	for n < len(x) && n < len(y) && x[n] == y[n] {
		n++
	}
	return n
}

func TestBlockChain(t *testing.T) {
	system := strings.Repeat("You are the support assistant of a shop; answer in two sentences. ", 40)
	otherSystem := strings.Repeat("You translate English into French and nothing else, ever. ", 40)
	turn1 := chatMessages(system, "Where is my order 1234?")
	turn2 := chatMessages(system, "Where is my order 1234?", "It ships tomorrow.", "Can it come sooner?")
	otherConversation := chatMessages(system, "How do I return a lamp?")
	otherApp := chatMessages(otherSystem, "Where is my order 1234?")
	// The bytes before the first message's content ends are the system prompt's.
	systemBytes := strings.Index(string(turn1), `"},{`)

	tests := []struct {
		name        string
		x, y        []byte
		wantAtLeast int
		wantAtMost  int
	}{
		{"turn 2 holds all of turn 1's whole blocks", turn1, turn2, len(chain(turn1)), len(chain(turn1))},
		{"two conversations of one app share the system prompt's blocks", turn1, otherConversation, BlocksWithin(systemBytes), BlocksWithin(systemBytes) + 1},
		{"different system prompts share nothing", turn1, otherApp, 0, 0},
		{"the same prompt is the same chain", turn2, turn2, len(chain(turn2)), len(chain(turn2))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cx, cy := chain(tt.x), chain(tt.y)
			if len(cx) == 0 || len(cy) == 0 {
				t.Fatalf("empty chains: %d and %d blocks", len(cx), len(cy))
			}
			if got := shared(cx, cy); got < tt.wantAtLeast || got > tt.wantAtMost {
				t.Errorf("shared blocks = %d, want %d to %d (chains of %d and %d)", got, tt.wantAtLeast, tt.wantAtMost, len(cx), len(cy))
			}
		})
	}

	t.Run("blocks are whole and the chain stops at cap", func(t *testing.T) {
		if got := AppendBlockChain(nil, make([]byte, 1<<20)); len(got) != 0 {
			t.Errorf("a nil dst grew to %d", len(got))
		}
		if got := chain(make([]byte, fineBlockBytes-1)); len(got) != 0 {
			t.Errorf("a prompt shorter than a block has %d blocks", len(got))
		}
		if got := chain(make([]byte, 4<<20)); len(got) != MaxPrefixBlocks {
			t.Errorf("a long prompt has %d blocks, want MaxPrefixBlocks %d", len(got), MaxPrefixBlocks)
		}
		if got := chain(make([]byte, blockEnd(fineBlocks))); len(got) != fineBlocks+1 {
			t.Errorf("the first coarse block ends at %d: got %d blocks, want %d", blockEnd(fineBlocks), len(got), fineBlocks+1)
		}
	})

	t.Run("a dst of less room stops the chain at its cap, after what it holds", func(t *testing.T) {
		long := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 600))
		want := chain(long)
		for _, room := range []int{1, 5, fineBlocks - 1, fineBlocks, fineBlocks + 1, 50, fineBlocks + coarseBlocks, fineBlocks + coarseBlocks + 1} {
			held := []uint64{7, 8, 9}
			got := AppendBlockChain(append(make([]uint64, 0, len(held)+room), held...), long[:1000], long[1000:])
			if !slices.Equal(got[:len(held)], held) || !slices.Equal(got[len(held):], want[:min(room, len(want))]) {
				t.Errorf("room for %d: got %d hashes, %d of them the chain's first, want %d", room, len(got)-len(held),
					shared(got[len(held):], want), min(room, len(want)))
			}
		}
	})

	t.Run("no allocation", func(t *testing.T) {
		var arr [MaxPrefixBlocks]uint64
		if n := testing.AllocsPerRun(100, func() { _ = AppendBlockChain(arr[:0], turn2) }); n != 0 {
			t.Errorf("AppendBlockChain allocates %v times", n)
		}
		system, messages := turn2[:700], turn2[700:]
		if n := testing.AllocsPerRun(100, func() { _ = AppendBlockChain(arr[:0], system, messages) }); n != 0 {
			t.Errorf("AppendBlockChain of two parts allocates %v times", n)
		}
	})
}

// TestBlockChainChangedByte checks that a byte changed anywhere in block k
// leaves the chain's first k hashes as they were and changes every one
// from k on: each hash covers all the bytes of its blocks and no others.
func TestBlockChainChangedByte(t *testing.T) {
	whole := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 600))
	want := chain(whole)
	for _, pos := range []int{0, fineBlockBytes - 1, fineBlockBytes, 1000, blockEnd(fineBlocks) - 1, blockEnd(fineBlocks), 5000, blockEnd(fineBlocks + coarseBlocks), len(whole) - 1} {
		t.Run(fmt.Sprint(pos), func(t *testing.T) {
			changed := slices.Clone(whole)
			changed[pos] ^= 1
			got := chain(changed)
			if len(got) != len(want) {
				t.Fatalf("%d hashes, want %d", len(got), len(want))
			}
			k := BlocksWithin(pos)
			if n := shared(got, want); n != min(k, len(want)) {
				t.Errorf("%d leading hashes unchanged, want %d", n, min(k, len(want)))
			}
			for i := k; i < len(want); i++ {
				if got[i] == want[i] {
					t.Errorf("hash %d unchanged", i)
				}
			}
		})
	}
}

// TestBlockChainParts checks that a prompt given in parts (a system prompt
// the body keeps apart, then the messages) has the chain of its parts run
// together, wherever they are cut, and that the parts' order counts.
func TestBlockChainParts(t *testing.T) {
	whole := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 600))
	want := chain(whole)
	for _, cuts := range [][]int{
		{0}, {len(whole)}, {1}, {fineBlockBytes}, {fineBlockBytes + 1}, {blockEnd(fineBlocks) - 3},
		{100, 100}, {5, 640, 3000}, {0, 0, 17}, {len(whole) - 1},
		{blockEnd(fineBlocks+coarseBlocks) - 5}, {blockEnd(fineBlocks+coarseBlocks) - 5, blockEnd(fineBlocks+coarseBlocks) + 300},
	} {
		t.Run(fmt.Sprint(cuts), func(t *testing.T) {
			var parts [][]byte
			prev := 0
			for _, c := range cuts {
				parts = append(parts, whole[prev:c])
				prev = c
			}
			parts = append(parts, whole[prev:])
			got := AppendBlockChain(make([]uint64, 0, MaxPrefixBlocks), parts...)
			if !slices.Equal(got, want) {
				t.Errorf("chain of the parts differs from the whole's in block %d of %d", shared(got, want), len(want))
			}
		})
	}
	t.Run("order", func(t *testing.T) {
		a, b := whole[:4000], []byte(strings.Repeat("x", 4000))
		ab := AppendBlockChain(make([]uint64, 0, MaxPrefixBlocks), a, b)
		ba := AppendBlockChain(make([]uint64, 0, MaxPrefixBlocks), b, a)
		if shared(ab, ba) != 0 {
			t.Errorf("swapped parts share %d blocks", shared(ab, ba))
		}
		if n := shared(ab, chain(a)); n != BlocksWithin(len(a)) {
			t.Errorf("the first part's own blocks: %d shared, want %d", n, BlocksWithin(len(a)))
		}
	})
	t.Run("none", func(t *testing.T) {
		if got := AppendBlockChain(make([]uint64, 0, MaxPrefixBlocks)); len(got) != 0 {
			t.Errorf("no parts: %d blocks", len(got))
		}
		if got := AppendBlockChain(make([]uint64, 0, MaxPrefixBlocks), nil, nil); len(got) != 0 {
			t.Errorf("empty parts: %d blocks", len(got))
		}
	})
}

// TestPrefixIndexBound checks that the index's memory is fixed whatever it is sent, that it
// keeps what it was sent last, and that it forgets blocks once the server's KV cache has had
// room for fewer blocks than were sent after them.
func TestPrefixIndexBound(t *testing.T) {
	if size := unsafe.Sizeof(prefixIndex{}); size > indexBytes+64 {
		t.Fatalf("prefixIndex is %d bytes, want about indexBytes %d", size, indexBytes)
	}
	tests := []struct {
		name      string
		capacity  int64 // the server's KV cache, in blocks; 0 unknown
		sent      int   // chains of 32 blocks sent after the first
		wantFirst bool  // the first chain still held
	}{
		{"within the table and the cache", 0, 10, true},
		{"far more than the table holds", 0, 20 * indexEntries / 32, false},
		{"more than the server's cache holds", 200, 10, false},
		{"less than the server's cache holds", 2000, 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := new(prefixIndex)
			x.kvTokens.Store(tt.capacity * PrefixBlockBytes / defaultBytesPerToken)
			// A conversation's chain of 32 blocks; the hashes stand in for
			// AppendBlockChain's, which TestBlockChain checks.
			conv := func(i int) []uint64 {
				c := make([]uint64, 32)
				for j := range c {
					c[j] = mix(uint64(i+1)<<8 | uint64(j))
				}
				return c
			}
			first := conv(-1)
			x.insert(first)
			for i := range tt.sent {
				x.insert(conv(i))
			}
			if got := x.held(first) == len(first); got != tt.wantFirst {
				t.Errorf("first chain held = %v (%d of %d blocks), want %v", got, x.held(first), len(first), tt.wantFirst)
			}
			last := conv(tt.sent - 1)
			if got := x.held(last); got != len(last) {
				t.Errorf("last chain held %d of %d blocks", got, len(last))
			}
			live := 0
			for i := range x.slots {
				if x.slots[i].Load() != 0 {
					live++
				}
			}
			if live > indexEntries {
				t.Errorf("%d live entries, more than the bound %d", live, indexEntries)
			}
		})
	}
}

// mix is splitmix64's finalizer: distinct inputs give well spread hashes.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// TestPrefixIndexLearnsBytesPerToken checks that the replies' usage teaches the index how many
// prompt bytes the server counts as a token, within bounds, and that its horizon in blocks
// follows it.
func TestPrefixIndexLearnsBytesPerToken(t *testing.T) {
	type reply struct {
		bytes  int
		tokens int64
	}
	repeat := func(n int, r reply) []reply { return slices.Repeat([]reply{r}, n) }
	tests := []struct {
		name    string
		replies []reply
		want    float64 // bytes per token learned
	}{
		{"nothing observed: the default", nil, defaultBytesPerToken},
		{"the first reply is taken whole", []reply{{6500, 1000}}, 6.5},
		{"no usage teaches nothing", []reply{{6500, 0}, {0, 100}}, defaultBytesPerToken},
		{"a steady ratio is learned", repeat(200, reply{6500, 1000}), 6.5},
		{"one odd reply moves it by a sixteenth", append(repeat(200, reply{6500, 1000}), reply{2500, 1000}), 6.25},
		{"the ratio is kept under the bound", []reply{{100000, 10}}, maxBytesPerToken},
		{"and over the bound below", []reply{{10, 100}}, minBytesPerToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestBackend("b", 1, 0)
			b.index = new(prefixIndex)
			for _, r := range tt.replies {
				b.ObservePrompt(r.bytes, r.tokens)
			}
			x := b.index
			if got := float64(x.bpt()) / bptScale; got < tt.want-0.01 || got > tt.want+0.01 {
				t.Fatalf("learned %.3f bytes a token, want %.3f", got, tt.want)
			}
			if x.limit() != 0 {
				t.Errorf("horizon %d blocks with the KV cache unknown, want 0 (none)", x.limit())
			}
			x.kvTokens.Store(100000)
			if got, want := x.limit(), 100000*tt.want/PrefixBlockBytes; float64(got) < want-1 || float64(got) > want+1 {
				t.Errorf("a KV cache of 100000 tokens holds %d blocks, want about %.0f", got, want)
			}
		})
	}
	t.Run("no index: nothing to learn", func(t *testing.T) {
		b := newTestBackend("b", 1, 0)
		b.ObservePrompt(6500, 1000)
		if b.index != nil {
			t.Fatal("observing made an index")
		}
	})
}

// TestLongBlocks checks the blocks past the coarse ones: each twice as
// long as the one before, weighing on the index's clock by its length,
// and long enough to tell apart conversations behind a system prompt
// longer than the fine and coarse blocks together: each turn goes to the
// backend holding its own conversation, not to either one at random.
func TestLongBlocks(t *testing.T) {
	first := fineBlocks + coarseBlocks
	if got := blockEnd(first) - blockEnd(first-1); got != longBlockBytes {
		t.Errorf("the first long block is %d bytes, want %d", got, longBlockBytes)
	}
	for i := first + 1; i < MaxPrefixBlocks; i++ {
		if a, b := blockEnd(i-1)-blockEnd(i-2), blockEnd(i)-blockEnd(i-1); b != 2*a {
			t.Errorf("block %d is %d bytes after one of %d, want twice", i, b, a)
		}
	}
	for _, tc := range []struct{ block, weight int }{{0, 1}, {fineBlocks, 1}, {first, longBlockBytes / PrefixBlockBytes}, {first + 3, 8 * longBlockBytes / PrefixBlockBytes}} {
		if got := blockWeight(tc.block); got != uint64(tc.weight) {
			t.Errorf("blockWeight(%d) = %d, want %d", tc.block, got, tc.weight)
		}
	}
	var x prefixIndex
	x.insert(chain(make([]byte, blockEnd(first+2))))
	if got, want := x.clock.Load(), uint64(first)+7*longBlockBytes/PrefixBlockBytes; got != want {
		t.Errorf("clock after a prompt of %d blocks = %d, want %d", first+3, got, want)
	}

	system := strings.Repeat("You are a careful coding assistant; read the files before editing them. ", 600)
	turn := func(conv, n int) []byte {
		var b strings.Builder
		b.WriteString(system)
		for k := range n {
			fmt.Fprintf(&b, "Conversation %d, turn %d: %s", conv, k, strings.Repeat("more context, ", 40))
		}
		return []byte(b.String())
	}
	if len(system) <= blockEnd(first-1) {
		t.Fatalf("the system prompt (%d bytes) fits in the coarse blocks (%d)", len(system), blockEnd(first-1))
	}
	a, b := newTestBackend("a", 1, 0), newTestBackend("b", 1, 0)
	r := newTestRoute(config.Queue{}, a, b)
	a.index, b.index = new(prefixIndex), new(prefixIndex)
	a.index.insert(chain(turn(1, 20)))
	b.index.insert(chain(turn(2, 20)))
	for conv, want := range map[int]string{1: "a", 2: "b"} {
		if got := pickCounts(r, 50, nil, chain(turn(conv, 21))); got[want] != 50 {
			t.Errorf("conversation %d's next turn: picks %v, want all on %s", conv, got, want)
		}
	}
}

// TestPrefixIndexReuse checks that the index learns how far back the
// prompts it is sent again reach (the reuse distance), that it forgets a
// long one as inserts go by, and that roomFor weighs it against the
// cache's size.
func TestPrefixIndexReuse(t *testing.T) {
	x := new(prefixIndex)
	if x.roomFor(1) {
		t.Error("roomFor with the cache's size unknown")
	}
	x.kvTokens.Store(1000 * PrefixBlockBytes / defaultBytesPerToken) // 1,000 blocks of PrefixBlockBytes
	prompt := make([]uint64, fineBlocks+10)
	for i := range prompt {
		prompt[i] = mix(uint64(900 + i))
	}
	x.insert(prompt)
	var others uint64
	for n := range 20 { // 20 other prompts of 10 coarse blocks each, after the first's fine ones
		other := make([]uint64, fineBlocks+10)
		for i := range other {
			other[i] = mix(uint64(5000 + 100*n + i))
		}
		before := x.clock.Load()
		x.insert(other)
		others += x.clock.Load() - before
	}
	x.insert(prompt)
	// The first block's age also counts the prompt's own later blocks, one unit each.
	if got, own := x.reuse.Load(), uint64(len(prompt)); got < others || got > others+own {
		t.Fatalf("reuse = %d after %d units inserted in between", got, others)
	}
	if !x.roomFor(fineBlocks + 10) {
		t.Errorf("no room for a prompt of %d blocks beside a reuse distance of %d in 1,000", fineBlocks+10, x.reuse.Load())
	}
	x.reuse.Store(990)
	if x.roomFor(fineBlocks + 10) {
		t.Error("room beside a reuse distance of 990 in 1,000")
	}
	for range 400 {
		x.insert(prompt) // found again at once: the long distance decays
	}
	if got := x.reuse.Load(); got > 990/10 {
		t.Errorf("reuse = %d after 400 immediate reuses, want it forgotten", got)
	}
}
