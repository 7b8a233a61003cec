package weave

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The digests below are Weave's (weave/shared/digest.py), byte for byte:
// refs carry them, and the SDKs compute some of them themselves, so a
// different algorithm would break deduplication and client-made refs.

// BytesDigest is the digest of a file's content: SHA-256 in URL-safe base64
// without padding, with '-' written 'X' and '_' written 'Y' so that the
// digest is a plain word inside a ref.
func BytesDigest(b []byte) string {
	sum := sha256.Sum256(b)
	s := base64.RawURLEncoding.EncodeToString(sum[:])
	return strings.NewReplacer("-", "X", "_", "Y").Replace(s)
}

// ValueDigest is the digest of a JSON value (an object's val, a table row):
// BytesDigest of its canonical text, which is what Python's
// json.dumps(val, sort_keys=True) prints (see AppendCanonical).
func ValueDigest(v any) (string, error) {
	b, err := AppendCanonical(nil, v)
	if err != nil {
		return "", err
	}
	return BytesDigest(b), nil
}

// TableDigest is the digest of a table: the hex SHA-256 of its row digests
// concatenated in order, so that the same rows in another order make
// another table.
func TableDigest(rowDigests []string) string {
	h := sha256.New()
	for _, d := range rowDigests {
		h.Write([]byte(d))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// AppendCanonical appends v as Python's json.dumps(v, sort_keys=True)
// prints it: keys sorted by code point, ", " and ": " as separators, and
// every non-ASCII character escaped as \uXXXX (ensure_ascii). v is a value
// decoded with UseNumber: nil, bool, string, json.Number, []any or
// map[string]any. Numbers are written as they were sent; Python would
// print a float read from "1e5" as 100000.0, a spelling the SDKs, which
// write numbers the way JavaScript's JSON.stringify and Python's json do,
// never send.
func AppendCanonical(dst []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		return strconv.AppendBool(dst, x), nil
	case json.Number:
		return append(dst, x...), nil
	case string:
		return appendPyString(dst, x)
	case []any:
		dst = append(dst, '[')
		for i, item := range x {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			var err error
			if dst, err = AppendCanonical(dst, item); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		// Python sorts str keys by code point; Go's bytewise order of
		// UTF-8 is the same order.
		sort.Strings(keys)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			var err error
			if dst, err = appendPyString(dst, k); err != nil {
				return nil, err
			}
			dst = append(dst, ": "...)
			if dst, err = AppendCanonical(dst, x[k]); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	}
	return nil, fmt.Errorf("canonical json: unsupported type %T", v)
}

const hexDigits = "0123456789abcdef"

// ErrNotUnicode is returned for a string that is not UTF-8: it would be
// digested as U+FFFD, the digest of another value.
var ErrNotUnicode = errors.New("canonical json: a string is not UTF-8")

// appendPyString writes s as Python's json with ensure_ascii does, or
// refuses s if it is not UTF-8.
func appendPyString(dst []byte, s string) ([]byte, error) {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch c {
			case '"':
				dst = append(dst, '\\', '"')
			case '\\':
				dst = append(dst, '\\', '\\')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				// Python escapes all but the printable ASCII range
				// (' ' to '~'), DEL included.
				if c < 0x20 || c == 0x7f {
					dst = appendU(dst, rune(c))
				} else {
					dst = append(dst, c)
				}
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return nil, ErrNotUnicode
		}
		i += size
		if r > 0xFFFF {
			r -= 0x10000
			dst = appendU(dst, 0xD800+(r>>10))
			dst = appendU(dst, 0xDC00+(r&0x3FF))
			continue
		}
		dst = appendU(dst, r)
	}
	return append(dst, '"'), nil
}

func appendU(dst []byte, r rune) []byte {
	return append(dst, '\\', 'u', hexDigits[r>>12&0xF], hexDigits[r>>8&0xF], hexDigits[r>>4&0xF], hexDigits[r&0xF])
}

// Compact returns v as compact JSON text, keys sorted (as Weave stores an
// object's val), HTML characters unescaped. It is how values are stored.
func Compact(v any) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return json.RawMessage("null")
	}
	return json.RawMessage(bytes.TrimRight(buf.Bytes(), "\n"))
}
