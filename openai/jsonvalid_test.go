package openai

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/internal/jsonscan"
)

// validJSONCases are edge cases of the grammar, each with the answer RFC
// 8259 gives; the fuzz target below also starts from them.
var validJSONCases = []struct {
	in   string
	want bool
}{
	{`{}`, true},
	{` {"a" : [1, -0, 0.5, 1e3, 1E-3, -12.5e+7, true, false, null, "x"]} `, true},
	{`"plain ascii text longer than eight bytes"`, true},
	{`"caf\u00e9 \"quoted\" \\ \/ \b\f\n\r\t"`, true},
	{"\"multi-byte: caf\u00e9, \u4e16\u754c, \U0001F600 in the middle of a long string\"", true},
	{`[[[[]]]]`, true},
	{`123`, true},
	{``, false},
	{`   `, false},
	{`{`, false},
	{`{"a":1,}`, false},
	{`[1,]`, false},
	{`{"a" 1}`, false},
	{`{a:1}`, false},
	{`{"a":1}{}`, false},
	{`01`, false},
	{`-`, false},
	{`1.`, false},
	{`.5`, false},
	{`1e`, false},
	{`1e+`, false},
	{`+1`, false},
	{`NaN`, false},
	{`tru`, false},
	{`nul`, false},
	{`"unterminated`, false},
	{`"unterminated string that is longer than eight bytes`, false},
	{"\"a control\tcharacter in a long string\"", false},
	{"\"ends with a control character\x01\"", false},
	{`"\x"`, false},
	{`"\u12"`, false},
	{`"\u12g4"`, false},
	{`"\"`, false},
	{"\"invalid utf-8 \xff in a long string\"", false},
	{"\"truncated utf-8 \xe4\xb8\"", false},
	{"\"overlong encoding \xc0\xaf\"", false},
	{"\"surrogate half \xed\xa0\x80\"", false},
	{"\xef\xbb\xbf{}", false}, // a byte order mark is not JSON
	{"{\"a\":1}\x00", false},
}

func TestValidJSON(t *testing.T) {
	for _, tt := range validJSONCases {
		t.Run(tt.in, func(t *testing.T) {
			if got := validJSON(tt.in); got != tt.want {
				t.Errorf("validJSON(%q) = %v, want %v", tt.in, got, tt.want)
			}
			if ref := json.Valid([]byte(tt.in)) && utf8.ValidString(tt.in); ref != tt.want {
				t.Errorf("the case is wrong: encoding/json and utf8 say %v", ref)
			}
		})
	}
}

// TestValidJSONEveryByteInStrings puts each byte value at each position of
// an eight-byte word inside a string, where the word-at-a-time test must
// notice it, and compares with encoding/json.
func TestValidJSONEveryByteInStrings(t *testing.T) {
	for c := range 256 {
		for pos := range 8 {
			b := []byte(`"0123456789abcdef"`)
			b[1+pos] = byte(c)
			b[9+pos] = byte(c)
			want := json.Valid(b) && utf8.Valid(b)
			if got := validJSON(string(b)); got != want {
				t.Fatalf("validJSON(%q) = %v, want %v", b, got, want)
			}
		}
	}
}

// FuzzValidJSON checks validJSON against encoding/json.Valid and
// utf8.Valid on arbitrary input: they must agree on every input.
func FuzzValidJSON(f *testing.F) {
	for _, tt := range validJSONCases {
		f.Add([]byte(tt.in))
	}
	f.Add(typicalChatBody)
	f.Fuzz(func(t *testing.T, b []byte) {
		if jsonscan.TooDeep(string(b), maxDepth) {
			t.Skip("deeper than the validator is ever asked to check")
		}
		want := json.Valid(b) && utf8.Valid(b)
		if got := validJSON(string(b)); got != want {
			t.Fatalf("validJSON(%q) = %v; encoding/json and utf8 say %v", b, got, want)
		}
	})
}

func BenchmarkValidJSON(b *testing.B) {
	body := string(typicalChatBody)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if !validJSON(body) {
			b.Fatal("the benchmark body is not valid")
		}
	}
	if strings.Count(body, `"`) < 10 {
		b.Fatal("the benchmark body should be mostly strings")
	}
}

// BenchmarkValidJSONLongPrompt is a chat body whose system prompt is some
// ten thousand bytes, as an app's instructions are: plain words with a
// newline escape now and then, and the same with non-ASCII words.
func BenchmarkValidJSONLongPrompt(b *testing.B) {
	for _, tt := range []struct{ name, words string }{
		{"ascii", "you answer briefly and cite the manual section when asked about billing"},
		{"accented", "réponds brièvement et cite la section du manuel pour la facturation"},
	} {
		var prompt strings.Builder
		for i := 0; prompt.Len() < 10_000; i++ {
			prompt.WriteString(tt.words)
			if i%8 == 7 {
				prompt.WriteString(`\n`)
			} else {
				prompt.WriteByte(' ')
			}
		}
		body := `{"model":"m","messages":[{"role":"system","content":"` + prompt.String() +
			`"},{"role":"user","content":"How do I read my invoice?"}],"stream":true}`
		b.Run(tt.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if !validJSON(body) {
					b.Fatal("the benchmark body is not valid")
				}
			}
		})
	}
}
