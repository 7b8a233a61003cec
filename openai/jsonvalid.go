package openai

import (
	"math/bits"
	"unicode/utf8"
)

// validJSON reports whether s is exactly one JSON value (RFC 8259) with
// optional whitespace around it, and is valid UTF-8. It accepts what
// encoding/json.Valid accepts when s is valid UTF-8, and nothing else
// (FuzzValidJSON checks both).
//
// It exists because checking the syntax of a chat body is most of the
// cost of validating it, and a body is mostly message text: a general
// validator (gjson.Valid) looks at every byte of a string on its own, and a
// separate UTF-8 check reads the whole body again. Here a string's plain
// ASCII bytes are skipped eight at a time, and UTF-8 is checked only where
// a byte is not ASCII, which outside a string is a syntax error anyway.
//
// It recurses once per nesting level; callers bound the depth first
// (tooDeep).
func validJSON(s string) bool {
	i, ok := validValue(s, skipSpace(s, 0))
	return ok && skipSpace(s, i) == len(s)
}

// validValue checks the value starting at s[i] and returns where it ends.
func validValue(s string, i int) (int, bool) {
	if i >= len(s) {
		return i, false
	}
	switch c := s[i]; {
	case c == '"':
		return validString(s, i+1)
	case c == '{':
		return validObject(s, i+1)
	case c == '[':
		return validArray(s, i+1)
	case c == 't':
		return validLiteral(s, i, "true")
	case c == 'f':
		return validLiteral(s, i, "false")
	case c == 'n':
		return validLiteral(s, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return validNumber(s, i)
	}
	return i, false
}

// validObject checks an object whose opening brace is just before s[i].
func validObject(s string, i int) (int, bool) {
	i = skipSpace(s, i)
	if i < len(s) && s[i] == '}' {
		return i + 1, true
	}
	for {
		if i >= len(s) || s[i] != '"' {
			return i, false
		}
		var ok bool
		if i, ok = validString(s, i+1); !ok {
			return i, false
		}
		i = skipSpace(s, i)
		if i >= len(s) || s[i] != ':' {
			return i, false
		}
		if i, ok = validValue(s, skipSpace(s, i+1)); !ok {
			return i, false
		}
		var closed bool
		if i, closed, ok = separator(s, i, '}'); closed || !ok {
			return i, ok
		}
		i = skipSpace(s, i)
	}
}

// validArray checks an array whose opening bracket is just before s[i].
func validArray(s string, i int) (int, bool) {
	i = skipSpace(s, i)
	if i < len(s) && s[i] == ']' {
		return i + 1, true
	}
	for {
		var ok, closed bool
		if i, ok = validValue(s, i); !ok {
			return i, false
		}
		if i, closed, ok = separator(s, i, ']'); closed || !ok {
			return i, ok
		}
		i = skipSpace(s, i)
	}
}

// separator checks what follows a member or an element at s[i]: a comma,
// after which the next one follows at next (after whitespace), or the
// closing bracket close, after which the object or array ends at next.
func separator(s string, i int, close byte) (next int, closed, ok bool) {
	i = skipSpace(s, i)
	if i < len(s) && (s[i] == ',' || s[i] == close) {
		return i + 1, s[i] == close, true
	}
	return i, false, false
}

func validLiteral(s string, i int, lit string) (int, bool) {
	if len(s)-i < len(lit) || s[i:i+len(lit)] != lit {
		return i, false
	}
	return i + len(lit), true
}

// validNumber checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
// starting at s[i].
func validNumber(s string, i int) (int, bool) {
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = skipDigits(s, i+1)
	default:
		return i, false
	}
	if i < len(s) && s[i] == '.' {
		j := skipDigits(s, i+1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := skipDigits(s, i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

func skipDigits(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// Masks of the word-at-a-time test in validString: one bit or byte value
// repeated in each of a word's eight bytes.
const (
	lowBits  = 0x0101010101010101
	highBits = 0x8080808080808080
)

// validString checks a string whose opening quote is just before s[i] and
// returns the index past its closing quote.
func validString(s string, i int) (int, bool) {
	for {
		// Skip eight bytes at a time while none of them needs a look: a
		// quote, a backslash, a control character or a non-ASCII byte.
		// The window of fixed length lets the compiler drop the bounds
		// checks and read the eight bytes as one little-endian word. The
		// tests mark the high bit of each matching byte; a borrow can also
		// mark bytes above a true match, never below one, so the lowest
		// mark is a true match and the scan jumps straight to it.
		for i+8 <= len(s) {
			t := s[i : i+8]
			w := uint64(t[0]) | uint64(t[1])<<8 | uint64(t[2])<<16 | uint64(t[3])<<24 |
				uint64(t[4])<<32 | uint64(t[5])<<40 | uint64(t[6])<<48 | uint64(t[7])<<56
			quote := w ^ (lowBits * '"')
			backslash := w ^ (lowBits * '\\')
			control := (w - lowBits*0x20) &^ w // a byte below 0x20
			if m := (control | (quote-lowBits)&^quote | (backslash-lowBits)&^backslash | w) & highBits; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(s) {
			return i, false
		}
		switch c := s[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			n := escapeLen(s, i)
			if n == 0 {
				return i, false
			}
			i += n
		case c < 0x20:
			return i, false
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				return i, false
			}
			i += size
		}
	}
}

// escapeLen returns the length of the escape sequence at s[i] (a
// backslash), or 0 when it is not one JSON allows.
func escapeLen(s string, i int) int {
	if i+1 >= len(s) {
		return 0
	}
	switch s[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if i+6 > len(s) {
			return 0
		}
		for _, h := range []byte(s[i+2 : i+6]) {
			if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
				return 0
			}
		}
		return 6
	}
	return 0
}
