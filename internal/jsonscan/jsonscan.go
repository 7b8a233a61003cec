// Package jsonscan holds the byte-level JSON scans that the gateway's two
// wires share: how deep a document nests and where a string token ends.
// They read any bytes at all, valid JSON or not, and never allocate;
// syntax is the caller's decoder's job.
package jsonscan

import (
	"strings"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// TooDeep reports whether s nests arrays and objects deeper than limit,
// skipping strings. Depth cannot exceed the number of opening brackets, and
// counting those is a fast vectorised pass, so the exact scan only runs on
// documents with many brackets.
func TooDeep(s string, limit int) bool {
	if strings.Count(s, "[")+strings.Count(s, "{") <= limit {
		return false
	}
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			i = StringEnd(s, i) - 1
		case '[', '{':
			depth++
			if depth > limit {
				return true
			}
		case ']', '}':
			depth--
		}
	}
	return false
}

// TooDeepBytes is TooDeep over b, read in place.
func TooDeepBytes(b []byte, limit int) bool { return TooDeep(bytesconv.String(b), limit) }

// ClosingQuote returns the index of the quote closing the string token whose
// opening quote is at s[i], or len(s) when it is not closed. It jumps from
// quote to quote with IndexByte and counts the backslashes before each
// quote: an odd count means the quote is escaped.
func ClosingQuote(s string, i int) int {
	j := i + 1
	for {
		k := strings.IndexByte(s[j:], '"')
		if k < 0 {
			return len(s)
		}
		j += k
		n := 0
		for b := j - 1; b > i && s[b] == '\\'; b-- {
			n++
		}
		if n%2 == 0 {
			return j
		}
		j++
	}
}

// ClosingQuoteBytes is ClosingQuote over b, read in place.
func ClosingQuoteBytes(b []byte, i int) int { return ClosingQuote(bytesconv.String(b), i) }

// StringEnd returns the index just past the string token whose opening
// quote is at s[i], or len(s) when it is not closed.
func StringEnd(s string, i int) int {
	return min(ClosingQuote(s, i)+1, len(s))
}
