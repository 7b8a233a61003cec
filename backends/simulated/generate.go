package simulated

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// Generated text. The default completion is "tok0 tok1 …" (token i is "tok<i> ", token id i), so
// that tests can assert exact text. A request with a seed instead draws its words from
// seededWords with a generator seeded by the seed, the prompt and the choice index: the same seed
// and prompt give the same text, another seed other text. Structured outputs and tool arguments
// are documents generated from a schema (schema.go), cut into tokens by splitTokens.

// Token ids of generated text. Token "tok<i> " is id i (below maxModelLen); word j of
// seededWords is wordTokenBase+j; any other piece of text (JSON punctuation, schema values) is
// pieceTokenBase plus a hash of its text.
const (
	wordTokenBase  = 200000
	pieceTokenBase = 300000
	pieceTokenSpan = 100000
)

// seededWords is the vocabulary of seeded text: plain words, none a prefix of another, so that
// a stop string cut at a word boundary behaves the same whatever the seed.
var seededWords = [...]string{
	"river", "lamp", "orbit", "garden", "copper", "falcon", "meadow", "signal", "harbor", "violet",
	"engine", "pebble", "summit", "canvas", "ember", "glacier", "lantern", "marble", "nectar", "quartz",
	"ribbon", "saddle", "thunder", "velvet", "willow", "yonder", "zephyr", "anchor", "beacon", "cobalt",
	"dune", "fable", "granite", "hollow", "island", "jungle", "kettle", "lagoon", "mosaic", "nimbus",
}

// rng is splitmix64: tiny, fast, and good enough to pick words and schema values.
type rng struct{ state uint64 }

func (r *rng) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a number in [0, n); n must be positive.
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

// fnv64 hashes s with FNV-1a, continuing from h (start with fnvOffset).
func fnv64(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

const fnvOffset = 14695981039346656037

// mix combines two hashes into one.
func mix(a, b uint64) uint64 {
	r := rng{state: a ^ (b * 0x9e3779b97f4a7c15)}
	return r.next()
}

// tokenSource produces the tokens of one choice before stops and limits are applied.
type tokenSource struct {
	kind   int // sourceCounting, sourceSeeded or sourceDocument
	seeded rng
	doc    []string // the tokens of a document, for sourceDocument
}

const (
	sourceCounting = iota // "tok<i> "
	sourceSeeded          // words of seededWords
	sourceDocument        // a fixed document, then the end of the text
)

// token returns the text and id of token i, and false when a document has no more tokens.
// Tokens must be asked for in order, from 0, because a seeded source draws as it goes.
func (ts *tokenSource) token(buf []byte, i int) ([]byte, int, bool) {
	switch ts.kind {
	case sourceSeeded:
		j := ts.seeded.intn(len(seededWords))
		buf = append(buf, seededWords[j]...)
		return append(buf, ' '), wordTokenBase + j, true
	case sourceDocument:
		if i >= len(ts.doc) {
			return buf, 0, false
		}
		return append(buf, ts.doc[i]...), pieceTokenID(ts.doc[i]), true
	}
	return appendToken(buf, i), i, true
}

// pieceTokenID is the token id of a piece of document text.
func pieceTokenID(s string) int {
	return pieceTokenBase + int(fnv64(fnvOffset, s)%pieceTokenSpan)
}

// tokenText returns the text of token id, the inverse of the ids above where it can be: "tok<i> "
// for i below maxModelLen, the word for a word id, and "<id> " for any other.
func tokenText(b []byte, id int64) []byte {
	switch {
	case id >= 0 && id < maxModelLen:
		return appendToken(b, int(id))
	case id >= wordTokenBase && id < wordTokenBase+int64(len(seededWords)):
		b = append(b, seededWords[id-wordTokenBase]...)
		return append(b, ' ')
	}
	b = append(b, '<')
	b = strconv.AppendInt(b, id, 10)
	return append(b, "> "...)
}

// splitTokens cuts text into tokens the way a BPE tokenizer roughly does: a run of letters and
// digits with at most one leading space is one token, so is a run of up to three punctuation
// characters, and so is every other character.
func splitTokens(text string) []string {
	var out []string
	for i := 0; i < len(text); {
		start := i
		if text[i] == ' ' && i+1 < len(text) && isWordByte(text[i+1]) {
			i++
		}
		switch {
		case isWordByte(text[i]):
			for i < len(text) && isWordByte(text[i]) {
				i++
			}
		case isPunct(text[i]):
			// Runs of punctuation merge, as `{"` and `":"` do in real vocabularies.
			for i < len(text) && i-start < 3 && isPunct(text[i]) {
				i++
			}
		default:
			_, size := utf8.DecodeRuneInString(text[i:])
			i += size
		}
		out = append(out, text[start:i])
	}
	return out
}

func isPunct(c byte) bool {
	return c > ' ' && c < utf8.RuneSelf && !isWordByte(c)
}

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

// stopRules are the request's stop conditions.
type stopRules struct {
	strings    []string
	tokenIDs   []int64
	includeStr bool // include_stop_str_in_output
	minTokens  int  // stops are not checked before this many tokens
}

func (sr *stopRules) empty() bool { return len(sr.strings) == 0 && len(sr.tokenIDs) == 0 }

// output is what one choice generated: the text a client sees, where each generated token ends
// in it, and why generation ended.
type output struct {
	text []byte
	// ends[k] is the end of token k's text in text. A stop string can cut the text inside a token
	// or before it, so a token's piece of text may be shorter than the token, or empty; every
	// generated token is counted all the same. int32 halves the memory of long completions;
	// no text comes near 2 GiB.
	ends   []int32
	finish string
	// stopReason is the JSON of vLLM's stop_reason: null, the stop string, or the stop token id.
	stopReason string
}

// tokens is the number of completion tokens the choice counts.
func (o *output) tokens() int { return len(o.ends) }

// piece returns the text of token k.
func (o *output) piece(k int) []byte {
	start := 0
	if k > 0 {
		start = int(o.ends[k-1])
	}
	return o.text[start:o.ends[k]]
}

// generate runs one choice: tokens from src until the limit, the end of a document, or a stop.
// limit is the most tokens to generate; limitFinish is the finish reason when it is reached.
func generate(src *tokenSource, limit int, limitFinish string, stops *stopRules) output {
	o := output{finish: limitFinish, stopReason: "null"}
	longest := 0
	for _, s := range stops.strings {
		longest = max(longest, len(s))
	}
	for k := 0; k < limit; k++ {
		before := len(o.text)
		text, id, ok := src.token(o.text, k)
		if !ok {
			o.finish = "stop"
			return o
		}
		o.text = text
		o.ends = append(o.ends, int32(len(o.text)))
		if k+1 < stops.minTokens {
			continue
		}
		if containsID(stops.tokenIDs, id) {
			if !stops.includeStr {
				o.cut(before)
			}
			o.finish, o.stopReason = "stop", strconv.Itoa(id)
			return o
		}
		if longest > 0 {
			// Only a match that ends in the new token is new; search from where it could start.
			// As in vLLM, a match that ended while min_tokens held the stops back stays unseen.
			from := max(0, before-longest+1)
			if at, s, ok := firstStop(o.text[from:], stops.strings); ok {
				end := from + at
				if stops.includeStr {
					end += len(s)
				}
				o.cut(end)
				o.finish, o.stopReason = "stop", string(appendJSONString(nil, s))
				return o
			}
		}
	}
	return o
}

// cut shortens the text to n bytes, clipping the token ends to it.
func (o *output) cut(n int) {
	o.text = o.text[:n]
	for k := range o.ends {
		o.ends[k] = min(o.ends[k], int32(n))
	}
}

// firstStop finds the stop string that occurs earliest in text (the first listed on a tie),
// returning where it starts.
func firstStop(text []byte, stops []string) (int, string, bool) {
	best, which := -1, ""
	s := bytesconv.String(text)
	for _, stop := range stops {
		if at := strings.Index(s, stop); at >= 0 && (best < 0 || at < best) {
			best, which = at, stop
		}
	}
	return best, which, best >= 0
}

func containsID(ids []int64, id int) bool {
	for _, x := range ids {
		if x == int64(id) {
			return true
		}
	}
	return false
}
