// Package usagecount reads the token counts of a backend's usage object,
// by the one rule every wire's usage obeys: a count is a plain
// non-negative integer no larger than Max.
package usagecount

import "github.com/tidwall/gjson"

// Max bounds every token count a backend may report. It is the most a
// usage record may carry (proxy checks that it is
// accounting.MaxRecordTokens), so that every count served is recorded as
// it is. A count above it is not a count but a broken or hostile backend.
const Max = 1 << 40

// Error says why a backend's usage block was refused.
type Error struct {
	Field   string // e.g. "usage.prompt_tokens"
	Problem string // e.g. "is negative"
}

func (e *Error) Error() string { return e.Field + " " + e.Problem }

// Read reads one count r, found at path in the usage object: absent or
// null is zero; anything but a plain non-negative integer literal up to
// Max is an error (a float, an exponent, a string, a negative or huge
// number).
func Read(r gjson.Result, path string) (int64, error) {
	if !r.Exists() || r.Type == gjson.Null {
		return 0, nil
	}
	if r.Type != gjson.Number {
		return 0, &Error{Field: "usage." + path, Problem: "is not a number"}
	}
	return readNumber(r.Raw, path)
}

// ReadText is Read for a count given as the text of a valid JSON value,
// "" when it is absent: a reader that walks the usage object's text needs
// no gjson.Result for it.
func ReadText(raw, path string) (int64, error) {
	if raw == "" {
		return 0, nil
	}
	switch raw[0] {
	case 'n':
		return 0, nil // null
	case '"', 't', 'f', '{', '[':
		return 0, &Error{Field: "usage." + path, Problem: "is not a number"}
	}
	return readNumber(raw, path)
}

// readNumber reads the text of a JSON number as a count.
func readNumber(raw, path string) (int64, error) {
	if raw != "" && raw[0] == '-' {
		return 0, &Error{Field: "usage." + path, Problem: "is negative"}
	}
	// The value is read in the same pass that checks its digits: 13
	// digits, as many as 2^40 has, cannot overflow an int64.
	var n int64
	for i := 0; i < len(raw); i++ {
		if raw[i] < '0' || raw[i] > '9' {
			return 0, &Error{Field: "usage." + path, Problem: "is not an integer"}
		}
		n = n*10 + int64(raw[i]-'0')
	}
	// 2^40 has 13 digits; a longer literal is out of range whatever it is.
	if len(raw) > 13 || n > Max {
		return 0, &Error{Field: "usage." + path, Problem: "exceeds 2^40"}
	}
	return n, nil
}
