package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/openai"
)

// affinityMessages are a conversation's turns as the client sends them: the
// first turn is the system prompt and the first user message; each later turn
// repeats them, so all turns must share the first turn's prompt blocks.
var affinityMessages = []string{
	`[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."}]`,
	`[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."},` +
		`{"role":"assistant","content":"7"},{"role":"user","content":"Another."}]`,
	`[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."},` +
		`{"role":"assistant","content":"7"},{"role":"user","content":"Another."},` +
		`{"role":"assistant","content":"11"},{"role":"user","content":"And one more."}]`,
}

// affinityBodies places messages everywhere in a chat body: first, in the
// middle, last, after large fields (strings, and nested objects and arrays
// that themselves hold a "messages" key), and with loose whitespace.
func affinityBodies(messages string) map[string]string {
	big := strings.Repeat("x", 64<<10)
	return map[string]string{
		"first":  `{"messages":` + messages + `,"model":"m","max_tokens":5}`,
		"middle": `{"model":"m","messages":` + messages + `,"max_tokens":5}`,
		"last":   `{"model":"m","max_tokens":5,"stream":true,"messages":` + messages + `}`,
		"after large fields": `{"model":"m","metadata":{"blob":"` + big + `"},` +
			`"tools":[{"type":"function","function":{"name":"f","description":"` + big + `"}}],` +
			`"messages":` + messages + `}`,
		"after nested messages keys": `{"model":"m","extra":{"messages":[{"role":"user","content":"decoy"}]},` +
			`"note":"\"messages\":[1,2]","messages":` + messages + `}`,
		"loose whitespace": "{ \"model\" : \"m\" ,\n\t\"messages\" :  " + messages + " \n}",
	}
}

// TestPromptMessagesAnywhere checks that the prefix signal hashes the
// messages as written wherever they sit in the body, and that a
// conversation's later turns share every whole block of its first.
// promptPrefix, which an earlier gjson lookup replaced before validation
// took over, once added the array's offset twice: it hashed shifted bytes,
// and panicked when messages came late.
func TestPromptMessagesAnywhere(t *testing.T) {
	// The first turn's array without its closing bracket, which a later
	// turn replaces by a comma: the blocks every later turn must share.
	first := affinityMessages[0]
	shared := chainOf([]byte(first[:len(first)-1]))
	for turn, messages := range affinityMessages {
		for place, body := range affinityBodies(messages) {
			t.Run(fmt.Sprintf("turn %d/%s", turn+1, place), func(t *testing.T) {
				got, err := safePromptMessages([]byte(body))
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != messages {
					t.Fatalf("prompt = %.120q, want %.120q", got, messages)
				}
				if chain := chainOf(got); len(chain) < len(shared) || !slices.Equal(chain[:len(shared)], shared) {
					t.Errorf("chain %x does not start with the first turn's blocks %x", chain, shared)
				}
			})
		}
	}
	for _, body := range []string{`{"model":"m"}`, ``, `{`, `[]`} {
		t.Run("no prompt "+body, func(t *testing.T) {
			got, err := safePromptMessages([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if got != nil {
				t.Errorf("prompt = %q, want none", got)
			}
		})
	}
}

// TestPromptChainInstructions checks that forward counts the instructions
// of a request opening a conversation (its leading system and developer
// messages, or a system prompt kept apart, then one message) in whole
// blocks, wherever messages stand in the body, and none for a later turn.
func TestPromptChainInstructions(t *testing.T) {
	system := `{"role":"system","content":"` + strings.Repeat("Answer as the shop's assistant. ", 100) + `"}`
	developer := `{"role":"developer","content":"Use metric units."}`
	user := `{"role":"user","content":"Where is my order?"}`
	tests := []struct {
		name, messages, instructions string
	}{
		{"a system prompt", "[" + system + "," + user + "]", "[" + system},
		{"system and developer messages", "[" + system + "," + developer + "," + user + "]", "[" + system + "," + developer},
		{"a user message first", "[" + user + "," + system + "]", ""},
		{"a later turn", "[" + system + "," + user + `,{"role":"assistant","content":"Tomorrow."},` + user + "]", ""},
	}
	for _, tt := range tests {
		for place, body := range affinityBodies(tt.messages) {
			t.Run(tt.name+"/"+place, func(t *testing.T) {
				var req openai.Request
				if err := openai.ValidateChat([]byte(body), &req); err != nil {
					t.Fatal(err)
				}
				var arr [backends.MaxPrefixBlocks]uint64
				chain, opening, n := promptChain(arr[:0], &req, []byte(body))
				if n != len(tt.messages) || !slices.Equal(chain, chainOf([]byte(tt.messages))) {
					t.Fatalf("chain of %d bytes, want the messages' %d", n, len(tt.messages))
				}
				if want := backends.BlocksWithin(len(tt.instructions)); opening != want {
					t.Errorf("instructions: %d blocks, want %d", opening, want)
				}
			})
		}
	}
	t.Run("a system prompt kept apart", func(t *testing.T) {
		body := []byte(`{"system":"` + strings.Repeat("Be brief. ", 300) + `","messages":[` + user + `]}`)
		sysEnd := bytes.Index(body, []byte(`,"messages"`))
		req := openai.Request{Messages: 1, SystemStart: len(`{"system":`), SystemEnd: sysEnd, PromptStart: sysEnd + len(`,"messages":`), PromptEnd: len(body) - 1}
		var arr [backends.MaxPrefixBlocks]uint64
		_, opening, _ := promptChain(arr[:0], &req, body)
		if want := backends.BlocksWithin(req.SystemEnd - req.SystemStart); opening != want || want == 0 {
			t.Errorf("instructions: %d blocks, want %d", opening, want)
		}
	})
}

// chainOf is the block chain the scheduler keys a prompt on.
func chainOf(prompt []byte) []uint64 {
	var arr [backends.MaxPrefixBlocks]uint64
	return slices.Clone(backends.AppendBlockChain(arr[:0], prompt))
}

// safePromptMessages is the prompt forward cuts into blocks: the chat
// body's messages as its validation found them, nil for a body refused;
// a panic is reported as an error.
func safePromptMessages(body []byte) (prompt []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the prompt of a %d-byte body panicked: %v", len(body), r)
		}
	}()
	var req openai.Request
	if openai.ValidateChat(body, &req) != nil {
		return nil, nil
	}
	_, prompt = req.Prompt(body)
	return prompt, nil
}

// FuzzPromptMessages checks that finding the prompt never panics on any
// bytes, and that on a chat body whose messages sit anywhere among other
// fields, of any JSON value, the block chain depends only on the messages.
func FuzzPromptMessages(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), "sys", "user", "later", `{"messages":[1]}`, `"x"`, uint8(0))
	f.Add([]byte(`{"messages":[{},{}],"model":"m"}`), "", "", "", `[1,2,{"a":"messages"}]`, `null`, uint8(1))
	f.Add([]byte(`{"model":"`+strings.Repeat("m", 300)+`","messages":[`), "é\u2028\"\\", "\x00", "", "not json", `{"b":[[[]]]}`, uint8(2))
	f.Add([]byte(`[]`), "a", "b", "c", `12345`, `"\"messages\":[{}]"`, uint8(5))
	f.Add([]byte(`{}`), "a", "b", "", strings.Repeat("[", 1100)+strings.Repeat("]", 1100), "\xff", uint8(2))
	f.Fuzz(func(t *testing.T, raw []byte, system, user, later, before, after string, shape uint8) {
		if _, err := safePromptMessages(raw); err != nil {
			t.Fatal(err)
		}
		msgs := []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}}
		if shape&4 != 0 { // a later turn: more messages after the first two
			msgs = append(msgs, map[string]string{"role": "assistant", "content": later})
		}
		messages := mustJSON(t, msgs)
		fields := []string{`"a":` + jsonValue(t, before), `"messages":` + messages, `"b":` + jsonValue(t, after)}
		switch shape % 3 {
		case 0: // messages first
			fields[0], fields[1] = fields[1], fields[0]
		case 2: // messages last
			fields[1], fields[2] = fields[2], fields[1]
		}
		body := []byte("{" + strings.Join(fields, ",") + "}")
		got, err := safePromptMessages(body)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil && (refused(t, `{"a":`+jsonValue(t, before)+`,"messages":`+messages+`}`) ||
			refused(t, `{"messages":`+messages+`,"b":`+jsonValue(t, after)+`}`)) {
			return // validation refuses a field beside the messages (too deep, say): never placed
		}
		if !bytes.Equal(got, []byte(messages)) {
			t.Fatalf("prompt of %q = %q, want %q", body, got, messages)
		}
		if chain, alone := chainOf(got), chainOf([]byte(messages)); !slices.Equal(chain, alone) {
			t.Fatalf("chain %x differs from the chain %x of the messages alone", chain, alone)
		}
		if opening, alone := openingOf(t, string(body)), openingOf(t, `{"messages":`+messages+`}`); opening != alone {
			t.Fatalf("%d blocks of instructions, %d in the messages alone", opening, alone)
		}
	})
}

// openingOf is the instructions' blocks promptChain finds in a chat body
// that validation accepts.
func openingOf(t *testing.T, body string) int {
	t.Helper()
	var req openai.Request
	if err := openai.ValidateChat([]byte(body), &req); err != nil {
		t.Fatalf("validate: %v", err)
	}
	var arr [backends.MaxPrefixBlocks]uint64
	_, opening, _ := promptChain(arr[:0], &req, []byte(body))
	return opening
}

// refused reports whether validation refuses the chat body.
func refused(t *testing.T, body string) bool {
	t.Helper()
	var req openai.Request
	return openai.ValidateChat([]byte(body), &req) != nil
}

// jsonValue is s itself when it is a JSON value in valid UTF-8, else s as
// a JSON string (which json.Marshal makes valid UTF-8): a body with bytes
// that are not UTF-8 is refused by validation and never placed.
func jsonValue(t *testing.T, s string) string {
	if json.Valid([]byte(s)) && utf8.ValidString(s) {
		return s
	}
	return mustJSON(t, s)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
