package simulated

import (
	"container/list"
	"sync"

	"github.com/tidwall/gjson"
)

// prefixMessages is how many leading messages make the prefix the cache model remembers: the
// system prompt and the first user turn, where the requests of one conversation agree.
const prefixMessages = 2

// prefixCache models an inference server's prefix (KV) cache, coarsely enough to measure how
// often a router sends a conversation back to the server that already holds its prefix. It
// remembers the hashes of the first two messages of its most recent distinct prefixes, least
// recently used first out, and a request whose prefix it holds reports the tokens of those
// messages as usage.prompt_tokens_details.cached_tokens.
type prefixCache struct {
	capacity int

	mu    sync.Mutex
	order *list.List // of uint64 hashes, most recently used at the front
	index map[uint64]*list.Element
}

// newPrefixCache returns a cache of capacity prefixes, or nil (no cache) when capacity is not
// positive.
func newPrefixCache(capacity int) *prefixCache {
	if capacity <= 0 {
		return nil
	}
	return &prefixCache{capacity: capacity, order: list.New(), index: make(map[uint64]*list.Element, capacity)}
}

// lookup returns the cached prompt tokens of a request with these messages: the tokens of its
// first two messages (by the prompt token formula) when its prefix was cached, else zero. Either
// way the prefix becomes the most recently used. A nil cache never hits.
func (c *prefixCache) lookup(messages gjson.Result) int {
	if c == nil {
		return 0
	}
	h, tokens, ok := prefixHash(messages)
	if !ok {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, hit := c.index[h]; hit {
		c.order.MoveToFront(e)
		return tokens
	}
	c.index[h] = c.order.PushFront(h)
	if c.order.Len() > c.capacity {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.index, oldest.Value.(uint64))
	}
	return 0
}

// prefixHash is the FNV-1a hash of the raw JSON of the first two messages, and their prompt
// tokens. It reports false when there is no message.
func prefixHash(messages gjson.Result) (h uint64, tokens int, ok bool) {
	h = 14695981039346656037
	n := 0
	messages.ForEach(func(_, m gjson.Result) bool {
		for i := 0; i < len(m.Raw); i++ {
			h ^= uint64(m.Raw[i])
			h *= 1099511628211
		}
		// A separator, so that moving text from one message to the next changes the hash.
		h ^= 0xff
		h *= 1099511628211
		tokens += tokensPerMessage + contentWords(m.Get("content"))
		n++
		return n < prefixMessages
	})
	return h, tokens, n > 0
}

// contentWords counts the words of a message's content as promptTokens does: a string, or the
// "text" parts of an array.
func contentWords(c gjson.Result) int {
	switch {
	case c.Type == gjson.String:
		return countWords(c.Str)
	case c.IsArray():
		n := 0
		c.ForEach(func(_, part gjson.Result) bool {
			if part.Get("type").Str == "text" {
				n += countWords(part.Get("text").Str)
			}
			return true
		})
		return n
	}
	return 0
}
