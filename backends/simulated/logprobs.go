package simulated

import (
	"math"
	"strconv"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// Log probabilities. They are deterministic functions of the token's text and position: the
// sampled token's logprob is in (-2, 0], and the alternatives of top_logprobs follow it in
// descending order, so the sampled token is always the most likely (as in greedy decoding).

// maxTopLogprobs is vLLM's default --max-logprobs; more is refused as vLLM refuses it.
const maxTopLogprobs = 20

// tokenLogprob is the logprob of the token at position k with this text.
func tokenLogprob(piece []byte, k int) float64 {
	h := mix(fnv64(fnvOffset, bytesconv.String(piece)), uint64(k))
	return -float64(h%2000) / 1000
}

// altLogprob is the logprob of the j-th alternative, below the sampled token's and each other's.
func altLogprob(lp float64, j int) float64 {
	return math.Round((lp-float64(j)*0.75)*1000) / 1000
}

// alternative returns the text of the j-th alternative (j ≥ 1) to a sampled token.
func alternative(j int, k int) string {
	return seededWords[(j*7+k)%len(seededWords)]
}

// appendChatLogprob appends one entry of a chat logprobs "content" list.
func appendChatLogprob(b []byte, piece []byte, k, top int) []byte {
	lp := tokenLogprob(piece, k)
	b = append(b, `{"token":`...)
	b = appendJSONString(b, bytesconv.String(piece))
	b = append(b, `,"logprob":`...)
	b = appendFloat(b, lp)
	b = append(b, `,"bytes":`...)
	b = appendBytes(b, piece)
	b = append(b, `,"top_logprobs":[`...)
	for j := 0; j < top; j++ {
		if j > 0 {
			b = append(b, ',')
		}
		alt, altLP := piece, lp
		if j > 0 {
			s := alternative(j, k)
			alt, altLP = []byte(s), altLogprob(lp, j)
		}
		b = append(b, `{"token":`...)
		b = appendJSONString(b, bytesconv.String(alt))
		b = append(b, `,"logprob":`...)
		b = appendFloat(b, altLP)
		b = append(b, `,"bytes":`...)
		b = appendBytes(b, alt)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// appendChatLogprobs appends a choice's chat logprobs object for tokens [from, to) of o, or null
// when logprobs were not asked for; its refusal is null, there being no refusal to score, and is
// there because OpenAI's spec requires it. Tokens whose text a stop string cut away entirely are left out.
func appendChatLogprobs(b []byte, o *output, from, to int, want bool, top int) []byte {
	if !want {
		return append(b, "null"...)
	}
	b = append(b, `{"content":[`...)
	first := true
	for k := from; k < to; k++ {
		piece := o.piece(k)
		if len(piece) == 0 {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendChatLogprob(b, piece, k, top)
	}
	return append(b, `],"refusal":null}`...)
}

// appendCompletionLogprobs appends the legacy completions logprobs object for tokens [from, to)
// of o: parallel lists of tokens, their logprobs and text offsets, and for each token a map of
// its top alternatives. offset is where o's text starts in the choice's text (after an echo).
func appendCompletionLogprobs(b []byte, o *output, from, to int, top int, offset int) []byte {
	var tokens, lps, offsets, tops []byte
	tokens, lps, offsets, tops = append(tokens, '['), append(lps, '['), append(offsets, '['), append(tops, '[')
	first := true
	for k := from; k < to; k++ {
		piece := o.piece(k)
		if len(piece) == 0 {
			continue
		}
		if !first {
			tokens, lps, offsets, tops = append(tokens, ','), append(lps, ','), append(offsets, ','), append(tops, ',')
		}
		first = false
		start := 0
		if k > 0 {
			start = int(o.ends[k-1])
		}
		lp := tokenLogprob(piece, k)
		tokens = appendJSONString(tokens, bytesconv.String(piece))
		lps = appendFloat(lps, lp)
		offsets = strconv.AppendInt(offsets, int64(offset+start), 10)
		tops = append(tops, '{')
		for j := 0; j < top; j++ {
			if j > 0 {
				tops = append(tops, ',')
			}
			alt, altLP := bytesconv.String(piece), lp
			if j > 0 {
				alt, altLP = alternative(j, k), altLogprob(lp, j)
			}
			tops = appendJSONString(tops, alt)
			tops = append(tops, ':')
			tops = appendFloat(tops, altLP)
		}
		tops = append(tops, '}')
	}
	b = append(b, `{"text_offset":`...)
	b = append(b, offsets...)
	b = append(b, `],"token_logprobs":`...)
	b = append(b, lps...)
	b = append(b, `],"tokens":`...)
	b = append(b, tokens...)
	b = append(b, `],"top_logprobs":`...)
	b = append(b, tops...)
	return append(b, "]}"...)
}

// appendFloat appends f in JSON, with enough digits to round-trip and never in a form JSON lacks.
func appendFloat(b []byte, f float64) []byte {
	return strconv.AppendFloat(b, f, 'f', -1, 64)
}

// appendBytes appends the UTF-8 bytes of s as a JSON array of integers.
func appendBytes(b []byte, s []byte) []byte {
	b = append(b, '[')
	for i, c := range s {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(c), 10)
	}
	return append(b, ']')
}
