package jsonstr

import (
	"encoding/json"
	"testing"
)

// hostileStrings are values a model, key name, backend or request id may
// hold that JSON must escape.
var hostileStrings = []string{
	"",
	"gpt-4o",
	`say "hi"`,
	`C:\models\m`,
	"a\x00b\x01c\x1f",
	"\b\f\n\r\t",
	"\x7f",
	"<script>&amp;</script>",
	"line\u2028para\u2029end",
	"\xff\xfe",
	"ok\xc3",           // truncated two-byte sequence
	"\xed\xa0\x80",     // an encoded surrogate
	"\xf4\x90\x80\x80", // beyond U+10FFFF
	"héllo wörld ☃ 🦫",
	"\ufffd",
	`\u0041`,
}

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range hostileStrings {
		t.Run(s, func(t *testing.T) {
			want, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			got := Append([]byte("prefix"), s)
			if string(got) != "prefix"+string(want) {
				t.Errorf("Append(%q) = %s, want prefix%s", s, got, want)
			}
		})
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range hostileStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := Append(nil, s); string(got) != string(want) {
			t.Errorf("Append(%q) = %s, want %s", s, got, want)
		}
	})
}

func TestAppendJSONStringAllocs(t *testing.T) {
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		buf = Append(buf[:0], "a <model> \"name\"\u2028\xff")
	}); n != 0 {
		t.Errorf("Append: %v allocations, want 0", n)
	}
}
