package jsonscan

import (
	"strings"
	"testing"
)

func TestTooDeep(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		limit int
		want  bool
	}{
		{"at the limit", `{"a":[{"b":1}]}`, 3, false},
		{"past the limit", `{"a":[{"b":[1]}]}`, 3, true},
		{"brackets in strings do not count", `{"a":"[[[[{{{{"}`, 2, false},
		{"an escaped quote does not end a string", `{"a":"\"[[[["}`, 2, false},
		{"an escaped backslash ends before the quote", `{"a":"\\"}[[[[`, 2, true},
		{"siblings do not add up", `[[1],[2],[3],[4]]`, 2, false},
		{"an unclosed string hides the rest", `{"a":"[[[[`, 2, false},
		{"any bytes", "\xff[[[\x00", 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := TooDeep(tt.doc, tt.limit); got != tt.want {
				t.Errorf("TooDeep = %v, want %v", got, tt.want)
			}
			if got := TooDeepBytes([]byte(tt.doc), tt.limit); got != tt.want {
				t.Errorf("TooDeepBytes = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestStringEnd(t *testing.T) {
	tests := []struct {
		doc          string
		closing, end int
	}{
		{`"abc"`, 4, 5},
		{`"a\"b"x`, 5, 6},
		{`"a\\"x`, 4, 5},
		{`"a\\\"b"`, 7, 8},
		{`"abc`, 4, 4},
		{`"a\"`, 4, 4},
		{`""`, 1, 2},
	}
	for _, tt := range tests {
		t.Run(tt.doc, func(t *testing.T) {
			if got := ClosingQuote(tt.doc, 0); got != tt.closing {
				t.Errorf("ClosingQuote = %d, want %d", got, tt.closing)
			}
			if got := ClosingQuoteBytes([]byte(tt.doc), 0); got != tt.closing {
				t.Errorf("ClosingQuoteBytes = %d, want %d", got, tt.closing)
			}
			if got := StringEnd(tt.doc, 0); got != tt.end {
				t.Errorf("StringEnd = %d, want %d", got, tt.end)
			}
		})
	}
}

func TestScansDoNotAllocate(t *testing.T) {
	doc := strings.Repeat(`{"a":"x\"y",`, 50)
	b := []byte(doc)
	if n := testing.AllocsPerRun(100, func() {
		_ = TooDeep(doc, 10)
		_ = TooDeepBytes(b, 10)
		_ = ClosingQuoteBytes(b, 5)
	}); n != 0 {
		t.Errorf("allocs = %v, want 0", n)
	}
}
