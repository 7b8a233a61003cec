// Package jsonstr appends Go strings as JSON strings without allocating,
// with the escaping of one of two encoders, byte for byte: encoding/json's
// (Append: stored rows, answers) and zap's (AppendZap: the log line). It
// imports nothing of ours, so that any package may use it.
package jsonstr

import "unicode/utf8"

// Append appends s as a JSON string, byte for byte as json.Marshal
// writes it: '<', '>' and '&' escaped as \u003c, \u003e and
// \u0026, the control characters as \b, \f, \n, \r, \t or \u00XX, U+2028
// and U+2029 escaped, and each byte of invalid UTF-8 replaced by \ufffd.
// JSON built with it is what encoding/json would have built, so that
// stored rows and answers do not change with the way they are built.
func Append(dst []byte, s string) []byte { return appendString(dst, s, &encodingJSON) }

// AppendZap appends s as a quoted JSON string, byte for byte as zap's
// JSON encoder escapes it: '"' and '\\' escaped, \n, \r and \t as such,
// the other control characters as \u00XX, each byte of invalid UTF-8 as
// \ufffd, everything else (DEL and valid non-ASCII included) as it is.
func AppendZap(dst []byte, s string) []byte { return appendString(dst, s, &zap) }

// escaping is one encoder's rules: what differs between encoding/json's
// and zap's. Both escape '"', '\\' and the control characters, and replace
// invalid UTF-8.
type escaping struct {
	// asIs holds the bytes copied unchanged; bytes from 0x80 are decoded
	// as UTF-8 first. One look-up a byte rather than a comparison per
	// escaped character.
	asIs [256]bool
	// short is the letter of a control character's two-byte escape
	// ('n' for \n); 0 means \u00XX.
	short [0x20]byte
	// html escapes '<', '>' and '&' (as \u00XX).
	html bool
	// lineSeparators escapes U+2028 and U+2029.
	lineSeparators bool
}

var (
	encodingJSON = newEscaping(true, "\b\f\n\r\t", "bfnrt")
	zap          = newEscaping(false, "\n\r\t", "nrt")
)

func newEscaping(html bool, controls, letters string) (e escaping) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		e.asIs[b] = b != '"' && b != '\\' && !(html && (b == '<' || b == '>' || b == '&'))
	}
	for i := range len(controls) {
		e.short[controls[i]] = letters[i]
	}
	e.html, e.lineSeparators = html, html
	return e
}

func appendString(dst []byte, s string, e *escaping) []byte {
	const hex = "0123456789abcdef"
	// The usual string, with nothing to escape, is checked eight bytes at
	// a time and copied whole.
	i := 0
	for i+8 <= len(s) && e.asIs8(word(s[i:])) {
		i += 8
	}
	for i < len(s) && e.asIs[s[i]] {
		i++
	}
	dst = append(dst, '"')
	if i == len(s) {
		dst = append(dst, s...)
		return append(dst, '"')
	}
	last := 0
	for i < len(s) {
		b := s[i]
		if e.asIs[b] {
			i++
			continue
		}
		if b >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				dst = append(dst, s[last:i]...)
				dst = append(dst, `\ufffd`...)
			case e.lineSeparators && (r == '\u2028' || r == '\u2029'):
				dst = append(dst, s[last:i]...)
				dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			default:
				i += size
				continue
			}
			i += size
			last = i
			continue
		}
		dst = append(dst, s[last:i]...)
		switch {
		case b == '"' || b == '\\':
			dst = append(dst, '\\', b)
		case b < 0x20 && e.short[b] != 0:
			dst = append(dst, '\\', e.short[b])
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
		}
		i++
		last = i
	}
	return append(append(dst, s[last:]...), '"')
}

const ones, tops = 0x0101010101010101, 0x8080808080808080

// asIs8 reports whether all eight bytes of the word x are asIs, eight at a
// time (the usual "has a byte less than n" and "has a zero byte" tests on
// a word): none has its top bit set, none is below 0x20, none is '"' or
// '\\', and with html none is '<', '>' or '&'.
func (e *escaping) asIs8(x uint64) bool {
	bad := x | (x-ones*0x20)&^x | has(x, '"') | has(x, '\\')
	if e.html {
		bad |= has(x, '<') | has(x, '>') | has(x, '&')
	}
	return bad&tops == 0
}

// has sets the top bit of a byte of the result where x may hold c (exact
// once x has no byte below 0x20 or from 0x80, which asIs8 also checks).
func has(x uint64, c byte) uint64 {
	q := x ^ (ones * uint64(c))
	return (q - ones) &^ q
}

// word is the first eight bytes of s, little-endian: one load.
func word(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
