package simulated

import (
	"fmt"
	"testing"

	"github.com/tidwall/gjson"
)

// conversation builds a messages array whose first two messages are prefix p, followed by turn t.
func conversation(p, t int) string {
	return fmt.Sprintf(`[{"role":"system","content":"you are assistant %d"},{"role":"user","content":"question %d is here"},`+
		`{"role":"assistant","content":"ok"},{"role":"user","content":"follow up %d"}]`, p, p, t)
}

func TestPrefixCacheLRU(t *testing.T) {
	c := newPrefixCache(2)
	// The first two messages of conversation(p, ·) have four words each.
	const prefixTokens = (4 + 4) + (4 + 4)
	steps := []struct {
		prefix, turn int
		want         int
	}{
		{1, 0, 0},            // cold
		{1, 1, prefixTokens}, // same prefix, another turn: hit
		{2, 0, 0},            // a second prefix fits
		{1, 2, prefixTokens}, // 1 is now the most recently used
		{3, 0, 0},            // evicts 2, the least recently used
		{1, 3, prefixTokens}, // 1 survived
		{2, 1, 0},            // 2 was evicted, and now evicts 3
		{3, 1, 0},
	}
	for i, s := range steps {
		if got := c.lookup(gjson.Parse(conversation(s.prefix, s.turn))); got != s.want {
			t.Errorf("step %d (prefix %d): cached = %d, want %d", i, s.prefix, got, s.want)
		}
	}
}

func TestPrefixCacheKeys(t *testing.T) {
	tests := []struct {
		name   string
		first  string
		second string
		hit    bool
	}{
		{"later messages do not matter",
			`[{"role":"user","content":"a b"},{"role":"assistant","content":"c"},{"role":"user","content":"d"}]`,
			`[{"role":"user","content":"a b"},{"role":"assistant","content":"c"},{"role":"user","content":"e f"}]`, true},
		{"the second message matters",
			`[{"role":"user","content":"a b"},{"role":"assistant","content":"c"}]`,
			`[{"role":"user","content":"a b"},{"role":"assistant","content":"x"}]`, false},
		{"the role matters",
			`[{"role":"system","content":"a"},{"role":"user","content":"b"}]`,
			`[{"role":"user","content":"a"},{"role":"user","content":"b"}]`, false},
		{"text moved across the message boundary",
			`[{"role":"user","content":"ab"},{"role":"user","content":"c"}]`,
			`[{"role":"user","content":"a"},{"role":"user","content":"bc"}]`, false},
		{"a single message is its own prefix",
			`[{"role":"user","content":"only"}]`,
			`[{"role":"user","content":"only"}]`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newPrefixCache(4)
			c.lookup(gjson.Parse(tt.first))
			if got := c.lookup(gjson.Parse(tt.second)) > 0; got != tt.hit {
				t.Errorf("hit = %v, want %v", got, tt.hit)
			}
		})
	}
}

// TestPrefixCacheTokens checks that a hit reports exactly the prompt tokens of the first two
// messages, by the formula prompt_tokens uses.
func TestPrefixCacheTokens(t *testing.T) {
	first2 := `[{"role":"system","content":"  be\tbrief\n"},` +
		`{"role":"user","content":[{"type":"text","text":"one two"},{"type":"image_url","image_url":{"url":"x y z"}},{"type":"text","text":"three"}]}]`
	all := first2[:len(first2)-1] + `,{"role":"assistant","content":null},{"role":"user","content":"and more words"}]`
	want, ok := promptTokens(gjson.Parse(first2))
	if !ok {
		t.Fatal("promptTokens refused the prefix")
	}
	c := newPrefixCache(1)
	c.lookup(gjson.Parse(all))
	if got := c.lookup(gjson.Parse(all)); got != want {
		t.Errorf("cached = %d, want %d", got, want)
	}
	if got := (*prefixCache)(nil).lookup(gjson.Parse(all)); got != 0 {
		t.Errorf("a nil cache hit: %d", got)
	}
	if newPrefixCache(0) != nil || newPrefixCache(-1) != nil {
		t.Error("a non-positive capacity must mean no cache")
	}
}

// TestPrefixCacheInUsage checks the server reports cached tokens in non-streamed usage, in the
// final usage chunk and in continuous usage, and reports zero with the cache off.
func TestPrefixCacheInUsage(t *testing.T) {
	body := func(stream string) string {
		return `{"model":"m","max_tokens":2,"messages":[{"role":"system","content":"s1 s2"},{"role":"user","content":"u1"},` +
			`{"role":"user","content":"tail words"}]` + stream + `}`
	}
	const prefixTokens = (4 + 2) + (4 + 1)
	t.Run("non-stream", func(t *testing.T) {
		h := start(t, Options{PrefixCache: 4}, false)
		for i, want := range []int64{0, prefixTokens, prefixTokens} {
			r := h.do(t, "POST", "/v1/chat/completions", body(""))
			if got := mustJSON(t, string(r.body)).Get("usage.prompt_tokens_details.cached_tokens"); got.Int() != want || !got.Exists() {
				t.Errorf("request %d: cached_tokens = %s, want %d", i, got.Raw, want)
			}
		}
	})
	t.Run("stream", func(t *testing.T) {
		h := start(t, Options{PrefixCache: 4}, false)
		h.do(t, "POST", "/v1/chat/completions", body(""))
		s := h.openStream(t, body(`,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`))
		defer s.close()
		events, err := s.all()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events[:len(events)-1] {
			if got := mustJSON(t, ev).Get("usage.prompt_tokens_details.cached_tokens").Int(); got != prefixTokens {
				t.Errorf("cached_tokens = %d in %s, want %d", got, ev, prefixTokens)
			}
		}
	})
	t.Run("off", func(t *testing.T) {
		h := start(t, Options{}, false)
		for range 2 {
			r := h.do(t, "POST", "/v1/chat/completions", body(""))
			if got := mustJSON(t, string(r.body)).Get("usage.prompt_tokens_details.cached_tokens"); got.Int() != 0 || !got.Exists() {
				t.Errorf("cached_tokens = %s with the cache off", got.Raw)
			}
		}
	})
}
