package openai

import (
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/jsonscan"
	"github.com/tollgate-dev/tollgate/internal/usagecount"
)

// MaxTokenCount bounds every token count a backend may report (see
// usagecount.Max).
const MaxTokenCount = usagecount.Max

// UsageError says why a backend's usage block was refused.
type UsageError = usagecount.Error

// usageFields names the counts of a usage object: chat and text
// completions and embeddings say prompt/completion, the Responses API
// input/output. cached is the path of the cached count, in the details
// object named details.
type usageFields struct{ input, output, total, details, cached string }

var (
	chatUsageFields      = usageFields{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details", "prompt_tokens_details.cached_tokens"}
	responsesUsageFields = usageFields{"input_tokens", "output_tokens", "total_tokens", "input_tokens_details", "input_tokens_details.cached_tokens"}
)

// cachedTokensField is the cached count's name in the details object.
const cachedTokensField = "cached_tokens"

// parseUsage reads a usage object named by f into u, all or nothing:
// every count must be a non-negative integer no larger than MaxTokenCount,
// total_tokens (when not zero) at least prompt plus completion, and cached
// tokens no more than the prompt. On error u is left as it was, so a
// record keeps only counts that were valid (none for a reply; for a stream,
// the last valid cumulative count). A null or absent usage is no report.
func (u *UsageCounts) parseUsage(v gjson.Result, f *usageFields) error {
	if !v.Exists() || v.Type == gjson.Null {
		return nil
	}
	if !v.IsObject() {
		return &UsageError{Field: "usage", Problem: "is not an object"}
	}
	// One pass over the object finds the four counts; as with a lookup by
	// name, the first of duplicate keys counts. Looking each count up on
	// its own would scan the object four times, for every reply and for
	// every streamed event that carries usage.
	var counts [4]string // input, output, total and cached; "" when absent
	v.ForEach(func(key, val gjson.Result) bool {
		var i int
		switch key.Str {
		case f.input:
			i = 0
		case f.output:
			i = 1
		case f.total:
			i = 2
		case f.details:
			// As a lookup by path does, the count is the first found in
			// a details object: a details key whose value holds none is
			// passed over.
			val = val.Get(cachedTokensField)
			i = 3
		default:
			return true
		}
		if counts[i] == "" {
			counts[i] = val.Raw
		}
		return true
	})
	return u.setCounts(&counts, f)
}

// SetResponses takes the counts from a Responses API usage object, with
// the checks of parseUsage.
func (u *UsageCounts) SetResponses(v gjson.Result) error {
	return u.parseUsage(v, &responsesUsageFields)
}

// SetChatReply takes the counts from the usage of a chat, text completion
// or embeddings reply, given as its text (ReplyMembers.Usage), with the
// checks of parseUsage.
func (u *UsageCounts) SetChatReply(raw string) error {
	return u.parseValidUsage(raw, &chatUsageFields)
}

// parseValidUsage is parseUsage for a usage value known to be valid JSON
// (a non-streamed reply's, which ScanReply checked, or a streamed chunk's
// that the flat scan checked), given as its text. Its counts are found by
// a walk of the object's bytes, without gjson's parse of every number in
// it into a float: the usage of every reply is read, and that parse cost
// as much as the rest of the reply's accounting. A value that is not an
// object, and an object with an escaped key (gjson unescapes keys before
// comparing them), are left to parseUsage. The counts are kept as their
// texts, not as gjson.Results, and the refusals are built apart: the usage
// chunk that ends a stream is processed on the stream's goroutine, whose
// stack must not outgrow what its other chunks take (TestUsageChunkStack).
func (u *UsageCounts) parseValidUsage(raw string, f *usageFields) error {
	if len(raw) == 0 || raw[0] != '{' {
		return u.parseUsageText(raw, f)
	}
	var counts [4]string // input, output, total and cached; "" when absent
	m := rawMembers{s: raw, i: 1}
	for key, val, ok := m.next(); ok; key, val, ok = m.next() {
		var i int
		switch key {
		case f.input:
			i = 0
		case f.output:
			i = 1
		case f.total:
			i = 2
		case f.details:
			// As parseUsage does, the count is the first found in a
			// details object.
			i = 3
			var read bool
			if val, read = cachedText(val); !read {
				return u.parseUsageText(raw, f)
			}
		default:
			continue
		}
		if counts[i] == "" {
			counts[i] = val
		}
	}
	if m.unread {
		return u.parseUsageText(raw, f)
	}
	return u.setCounts(&counts, f)
}

// cachedText is the text of the first cached count in val, a details
// value's text, "" when there is none; read is false when the object has
// an escaped key before it, which the walk does not read as gjson would.
func cachedText(val string) (text string, read bool) {
	if val[0] != '{' {
		return "", true
	}
	d := rawMembers{s: val, i: 1}
	for k, v, ok := d.next(); ok; k, v, ok = d.next() {
		if k == cachedTokensField {
			return v, true
		}
	}
	return "", !d.unread
}

// parseUsageText is parseUsage of a usage given as its text: kept out of
// parseValidUsage, so that its frame does not hold the gjson.Result.
//
//go:noinline
func (u *UsageCounts) parseUsageText(raw string, f *usageFields) error {
	return u.parseUsage(gjson.Parse(raw), f)
}

// rawMembers walks the members of a valid JSON object's text s, from i
// (just past the opening brace). The text being valid, the walk only
// finds where keys and values end (keyEnd, valueEnd), checking nothing.
type rawMembers struct {
	s string
	i int
	// unread is set when the walk stopped at a member it does not read
	// as gjson would: an escaped key.
	unread bool
}

// next returns the next member's key (as written) and value text; ok is
// false at the end of the object, or when the walk stops (unread).
func (m *rawMembers) next() (key, val string, ok bool) {
	s, i := m.s, skipSpace(m.s, m.i)
	if i < len(s) && s[i] == ',' {
		i = skipSpace(s, i+1)
	}
	if i >= len(s) || s[i] != '"' {
		return "", "", false
	}
	end, esc := keyEnd(s, i)
	if esc {
		m.unread = true
		return "", "", false
	}
	key = s[i+1 : end-1]
	i = skipSpace(s, end)
	if i >= len(s) || s[i] != ':' {
		return "", "", false
	}
	start := skipSpace(s, i+1)
	if start >= len(s) {
		return "", "", false
	}
	m.i = valueEnd(s, start)
	return key, s[start:m.i], true
}

// setCounts checks the counts found in a usage object named by f, given
// as their texts (see usagecount.ReadText): input, output, total and
// cached. When they are valid, it sets u to them (see parseUsage).
func (u *UsageCounts) setCounts(t *[4]string, f *usageFields) error {
	var (
		n   UsageCounts
		err error
	)
	if n.Input, err = usagecount.ReadText(t[0], f.input); err != nil {
		return err
	}
	if n.Output, err = usagecount.ReadText(t[1], f.output); err != nil {
		return err
	}
	if n.Total, err = usagecount.ReadText(t[2], f.total); err != nil {
		return err
	}
	if n.Cached, err = usagecount.ReadText(t[3], f.cached); err != nil {
		return err
	}
	return u.checkCounts(&n, f)
}

// checkCounts checks counts read one by one against each other and, when
// they agree, sets u to them.
func (u *UsageCounts) checkCounts(n *UsageCounts, f *usageFields) error {
	// Both are at most 2^40: the sum cannot overflow.
	sum := n.Input + n.Output
	switch {
	case n.Total == 0:
		// Some servers leave total_tokens out, or zero.
		n.Total = sum
	case n.Total < sum:
		return totalError(n.Total, sum, f)
	}
	if n.Cached > n.Input {
		return cachedError(n.Cached, n.Input, f)
	}
	n.Reported = true
	*u = *n
	return nil
}

// totalError and cachedError are checkCounts' refusals, apart so that the
// frame of the path that succeeds does not hold what they build.
//
//go:noinline
func totalError(total, sum int64, f *usageFields) error {
	return &UsageError{Field: "usage." + f.total, Problem: "(" + strconv.FormatInt(total, 10) + ") is less than " + f.input + " + " + f.output + " (" + strconv.FormatInt(sum, 10) + ")"}
}

//go:noinline
func cachedError(cached, input int64, f *usageFields) error {
	return &UsageError{Field: "usage." + f.cached, Problem: "(" + strconv.FormatInt(cached, 10) + ") exceeds " + f.input + " (" + strconv.FormatInt(input, 10) + ")"}
}

// validReply reports whether a non-streamed 200 body is one JSON object
// nested no deeper than maxDepth. The depth is checked first because the
// syntax check recurses once per level, and the body is the backend's.
func validReply(body []byte, maxDepth int) bool {
	s := bytesconv.String(body)
	return looksLikeJSONObject(body) && !jsonscan.TooDeep(s, maxDepth) && validJSON(s)
}
