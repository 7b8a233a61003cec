package jsonstr

import (
	"encoding/json"
	"math/rand/v2"
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

// asIs8 agrees with asIs on every byte at every place in the word, and on
// random words of bytes near the edges it tests, for both escapings.
func TestAsIs8(t *testing.T) {
	for name, e := range map[string]*escaping{"encoding/json": &encodingJSON, "zap": &zap} {
		t.Run(name, func(t *testing.T) { testAsIs8(t, e) })
	}
}

func testAsIs8(t *testing.T, e *escaping) {
	check := func(w []byte) {
		want := true
		for _, b := range w {
			want = want && e.asIs[b]
		}
		if got := e.asIs8(word(string(w))); got != want {
			t.Fatalf("asIs8(%q) = %t, want %t", w, got, want)
		}
	}
	for p := range 8 {
		for b := range 256 {
			w := []byte("aaaaaaaa")
			w[p] = byte(b)
			check(w)
		}
	}
	edges := []byte{0x00, 0x01, 0x1f, 0x20, 0x21, '"', 0x23, 0x5b, '\\', 0x5d, 0x7e, 0x7f, '<', '>', '&', 0x25, 0x27, 0x3b, 0x3d, 0x3f, 0x80, 0x81, 0xa2, 0xdc, 0xff}
	r := rand.New(rand.NewPCG(9, 10))
	w := make([]byte, 8)
	for range 200000 {
		for i := range w {
			if r.IntN(4) == 0 {
				w[i] = edges[r.IntN(len(edges))]
			} else {
				w[i] = byte(0x20 + r.IntN(0x5f))
			}
		}
		check(w)
	}
}
