package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/backends"
)

// affinityMessages are a conversation's turns as the client sends them: the
// first turn is the system prompt and the first user message; each later turn
// repeats them, so all turns must share one affinity key.
var affinityMessages = []string{
	`[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."}]`,
	`[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."},` +
		`{"role":"assistant","content":"7"},{"role":"user","content":"Another."}]`,
	`[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."},` +
		`{"role":"assistant","content":"7"},{"role":"user","content":"Another."},` +
		`{"role":"assistant","content":"11"},{"role":"user","content":"And one more."}]`,
}

// affinityPrefix is what every turn of affinityMessages must key on.
const affinityPrefix = `{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."}`

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

// TestPromptPrefixMessagesAnywhere checks that prefix affinity keys on the
// first two messages wherever messages sits in the body, and that every turn
// of one conversation gets the same key. promptPrefix once added the array's
// offset twice: it hashed shifted bytes, and panicked when messages came late.
func TestPromptPrefixMessagesAnywhere(t *testing.T) {
	want := backends.AffinityKey([]byte(affinityPrefix))
	for turn, messages := range affinityMessages {
		for place, body := range affinityBodies(messages) {
			t.Run(fmt.Sprintf("turn %d/%s", turn+1, place), func(t *testing.T) {
				got, err := safePromptPrefix([]byte(body))
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != affinityPrefix {
					t.Fatalf("prefix = %.120q, want %q", got, affinityPrefix)
				}
				if key := backends.AffinityKey(got); key != want {
					t.Errorf("key = %#x, want %#x (the conversation's first turn in the first place)", key, want)
				}
			})
		}
	}
	t.Run("one message", func(t *testing.T) {
		body := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
		got, err := safePromptPrefix([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != `{"role":"user","content":"hi"}` {
			t.Errorf("prefix = %q, want the one message", got)
		}
	})
	for _, body := range []string{`{"model":"m"}`, `{"model":"m","messages":[]}`, `{"model":"m","messages":"x"}`, ``, `{`} {
		t.Run("no messages "+body, func(t *testing.T) {
			got, err := safePromptPrefix([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if got != nil {
				t.Errorf("prefix = %q, want none", got)
			}
		})
	}
}

// safePromptPrefix reports a panic in promptPrefix as an error.
func safePromptPrefix(body []byte) (prefix []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("promptPrefix panicked on a %d-byte body: %v", len(body), r)
		}
	}()
	return promptPrefix(body), nil
}

// FuzzPromptPrefix checks that promptPrefix never panics on any bytes, and
// that on a chat body whose messages sit anywhere among other fields, of any
// JSON value, the affinity key depends only on the first two messages.
func FuzzPromptPrefix(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), "sys", "user", "later", `{"messages":[1]}`, `"x"`, uint8(0))
	f.Add([]byte(`{"messages":[{},{}],"model":"m"}`), "", "", "", `[1,2,{"a":"messages"}]`, `null`, uint8(1))
	f.Add([]byte(`{"model":"`+strings.Repeat("m", 300)+`","messages":[`), "é\u2028\"\\", "\x00", "", "not json", `{"b":[[[]]]}`, uint8(2))
	f.Add([]byte(`[]`), "a", "b", "c", `12345`, `"\"messages\":[{}]"`, uint8(5))
	f.Fuzz(func(t *testing.T, raw []byte, system, user, later, before, after string, shape uint8) {
		if _, err := safePromptPrefix(raw); err != nil {
			t.Fatal(err)
		}
		msgs := []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}}
		want := mustJSON(t, msgs[0]) + "," + mustJSON(t, msgs[1])
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
		got, err := safePromptPrefix(body)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, []byte(want)) {
			t.Fatalf("prefix of %q = %q, want %q", body, got, want)
		}
		if key, alone := backends.AffinityKey(got), backends.AffinityKey(promptPrefix([]byte(`{"messages":`+messages+`}`))); key != alone {
			t.Fatalf("key %#x differs from the key %#x of the messages alone", key, alone)
		}
	})
}

// jsonValue is s itself when it is a JSON value, else s as a JSON string.
func jsonValue(t *testing.T, s string) string {
	if json.Valid([]byte(s)) {
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
