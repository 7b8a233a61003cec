package simulated

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// chatJSON posts a chat completion and returns the parsed 200 reply.
func (h *harness) chatJSON(t *testing.T, body string) gjson.Result {
	t.Helper()
	r := h.do(t, "POST", "/v1/chat/completions", body)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	return mustJSON(t, string(r.body))
}

// events posts body to path and returns the data of every event of the streamed reply (the
// buffered client reads it whole), with the event names when the stream has them.
func (h *harness) events(t *testing.T, path, body string) (data, names []string) {
	t.Helper()
	r := h.do(t, "POST", path, body)
	if r.status != 200 || r.contentType != "text/event-stream" {
		t.Fatalf("status %d %q: %s", r.status, r.contentType, r.body)
	}
	for _, ev := range strings.Split(strings.TrimSuffix(string(r.body), "\n\n"), "\n\n") {
		for _, line := range strings.Split(ev, "\n") {
			if name, ok := strings.CutPrefix(line, "event: "); ok {
				names = append(names, name)
			} else if d, ok := strings.CutPrefix(line, "data: "); ok {
				data = append(data, d)
			} else {
				t.Fatalf("unexpected line %q", line)
			}
		}
	}
	return data, names
}

const hello = `"messages":[{"role":"user","content":"Say something long"}]`

func TestStop(t *testing.T) {
	h := start(t, Options{Tokens: 8}, false)
	tests := []struct {
		name       string
		extra      string
		text       string
		tokens     int
		finish     string
		stopReason string
	}{
		{"no stop", `"stop":[" nowhere"]`, content(8), 8, "stop", "null"},
		{"string hit inside a token", `"stop":"ok3"`, "tok0 tok1 tok2 t", 4, "stop", `"ok3"`},
		{"earliest of several", `"stop":["tok5","tok2 "]`, "tok0 tok1 ", 3, "stop", `"tok2 "`},
		{"include the stop string", `"stop":["tok2"],"include_stop_str_in_output":true`, "tok0 tok1 tok2", 3, "stop", `"tok2"`},
		{"across tokens", `"stop":["0 tok1"]`, "tok", 2, "stop", `"0 tok1"`},
		{"stop token id", `"stop_token_ids":[3]`, "tok0 tok1 tok2 ", 4, "stop", "3"},
		{"stop token id kept", `"stop_token_ids":[3],"include_stop_str_in_output":true`, "tok0 tok1 tok2 tok3 ", 4, "stop", "3"},
		{"stop token id not hit", `"stop_token_ids":[99]`, content(8), 8, "stop", "null"},
		{"length before the stop", `"stop":["tok6"],"max_tokens":3`, content(3), 3, "length", "null"},
		{"max_completion_tokens", `"max_completion_tokens":2`, content(2), 2, "length", "null"},
		{"min_tokens holds a stop back", `"stop":["tok1"],"min_tokens":3`, content(8), 8, "stop", "null"},
		{"min_tokens outlasts the natural end", `"min_tokens":10`, content(10), 10, "stop", "null"},
		{"stop token id at min_tokens", `"stop_token_ids":[1],"min_tokens":2`, "tok0 ", 2, "stop", "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := h.chatJSON(t, `{`+hello+`,`+tt.extra+`}`)
			c := v.Get("choices.0")
			if c.Get("message.content").Str != tt.text || c.Get("finish_reason").Str != tt.finish ||
				c.Get("stop_reason").Raw != tt.stopReason || v.Get("usage.completion_tokens").Int() != int64(tt.tokens) {
				t.Errorf("got %s, want text %q finish %s stop_reason %s, %d tokens", v.Raw, tt.text, tt.finish, tt.stopReason, tt.tokens)
			}
			// Streamed, the deltas join into the same text and the usage agrees.
			data, _ := h.events(t, "/v1/chat/completions", `{"stream":true,"stream_options":{"include_usage":true},`+hello+`,`+tt.extra+`}`)
			var text strings.Builder
			finish := ""
			for _, d := range data[:len(data)-1] {
				ev := gjson.Parse(d)
				text.WriteString(ev.Get("choices.0.delta.content").Str)
				if f := ev.Get("choices.0.finish_reason"); f.Type == gjson.String {
					finish = f.Str
				}
				if u := ev.Get("usage.completion_tokens"); u.Exists() && u.Int() != int64(tt.tokens) {
					t.Errorf("streamed usage %d, want %d", u.Int(), tt.tokens)
				}
			}
			if text.String() != tt.text || finish != tt.finish {
				t.Errorf("streamed %q %s, want %q %s", text.String(), finish, tt.text, tt.finish)
			}
		})
	}
}

func TestStopValidation(t *testing.T) {
	h := start(t, Options{}, false)
	for _, body := range []string{
		`{` + hello + `,"stop":""}`,
		`{` + hello + `,"stop":["a",""]}`,
		`{` + hello + `,"stop":[1]}`,
		`{` + hello + `,"stop_token_ids":["a"]}`,
		`{` + hello + `,"seed":1.5}`,
		`{` + hello + `,"top_logprobs":2}`,
		`{` + hello + `,"logprobs":true,"top_logprobs":21}`,
		`{` + hello + `,"response_format":{"type":"xml"}}`,
		`{` + hello + `,"response_format":{"type":"json_schema"}}`,
		`{` + hello + `,"structured_outputs":{"choice":["a"],"regex":"b"}}`,
		`{` + hello + `,"structured_outputs":{"choice":[]}}`,
	} {
		if r := h.do(t, "POST", "/v1/chat/completions", body); r.status != 400 || !gjson.GetBytes(r.body, "error.param").Exists() {
			t.Errorf("%s: status %d %s, want a 400 naming the field", body, r.status, r.body)
		}
	}
}

func TestSeed(t *testing.T) {
	h := start(t, Options{}, false)
	text := func(extra string) string {
		return h.chatJSON(t, `{`+hello+extra+`}`).Get("choices.0.message.content").Str
	}
	a, b, c := text(`,"seed":42`), text(`,"seed":42`), text(`,"seed":43`)
	if a != b {
		t.Errorf("same seed and body, different text: %q, %q", a, b)
	}
	if a == c {
		t.Errorf("another seed, the same text: %q", a)
	}
	if got := text(""); got != content(defaultTokens) {
		t.Errorf("without a seed %q, want the counting text", got)
	}
	if words := strings.Fields(a); len(words) != defaultTokens || strings.HasPrefix(a, "tok") {
		t.Errorf("seeded text %q, want %d words", a, defaultTokens)
	}
	// Changing only stop, n or max_tokens keeps the seeded text: the cut is a prefix of it.
	word := " " + strings.Fields(a)[5]
	cut := text(`,"seed":42,"stop":[` + fmt.Sprintf("%q", word) + `]`)
	if want := a[:strings.Index(a, word)]; cut != want {
		t.Errorf("stopped text %q, want %q", cut, want)
	}
	many := h.chatJSON(t, `{`+hello+`,"seed":42,"n":3}`)
	if many.Get("choices.0.message.content").Str != a {
		t.Errorf("choice 0 of n=3 differs from the n=1 text")
	}
	if many.Get("choices.1.message.content").Str == a || many.Get("usage.completion_tokens").Int() != 3*defaultTokens {
		t.Errorf("n=3 choices not independent samples, or usage wrong: %s", many.Raw)
	}
}

func TestLogprobs(t *testing.T) {
	h := start(t, Options{Tokens: 5}, false)
	tests := []struct {
		name  string
		extra string
		top   int
	}{
		{"logprobs only", `"logprobs":true`, 0},
		{"top 3", `"logprobs":true,"top_logprobs":3`, 3},
		{"seeded with a stop", `"logprobs":true,"top_logprobs":2,"seed":7,"stop":"zzz"`, 2},
	}
	check := func(t *testing.T, entry gjson.Result, top int) {
		t.Helper()
		tok := entry.Get("token").Str
		var bytes []byte
		for _, x := range entry.Get("bytes").Array() {
			bytes = append(bytes, byte(x.Int()))
		}
		if string(bytes) != tok || entry.Get("logprob").Num > 0 || entry.Get("logprob").Type != gjson.Number {
			t.Errorf("entry %s", entry.Raw)
		}
		alts := entry.Get("top_logprobs").Array()
		if len(alts) != top {
			t.Fatalf("%d top_logprobs, want %d: %s", len(alts), top, entry.Raw)
		}
		for i, a := range alts {
			if i > 0 && a.Get("logprob").Num > alts[i-1].Get("logprob").Num {
				t.Errorf("top_logprobs not sorted: %s", entry.Get("top_logprobs").Raw)
			}
			if !a.Get("token").Exists() || !a.Get("bytes").IsArray() {
				t.Errorf("alternative %s", a.Raw)
			}
		}
		if top > 0 && alts[0].Get("token").Str != tok {
			t.Errorf("the sampled token is not the most likely: %s", entry.Raw)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := h.chatJSON(t, `{`+hello+`,`+tt.extra+`}`)
			entries := v.Get("choices.0.logprobs.content").Array()
			var joined strings.Builder
			for _, e := range entries {
				check(t, e, tt.top)
				joined.WriteString(e.Get("token").Str)
			}
			if int64(len(entries)) != v.Get("usage.completion_tokens").Int() || joined.String() != v.Get("choices.0.message.content").Str {
				t.Errorf("%d entries joining to %q for %s", len(entries), joined.String(), v.Raw)
			}
			data, _ := h.events(t, "/v1/chat/completions", `{"stream":true,`+hello+`,`+tt.extra+`}`)
			streamed := 0
			for _, d := range data {
				for _, e := range gjson.Get(d, "choices.0.logprobs.content").Array() {
					check(t, e, tt.top)
					streamed++
				}
			}
			if streamed != len(entries) {
				t.Errorf("%d streamed entries, want %d", streamed, len(entries))
			}
		})
	}
	plain := h.chatJSON(t, `{`+hello+`}`)
	if plain.Get("choices.0.logprobs").Type != gjson.Null {
		t.Errorf("logprobs without asking: %s", plain.Raw)
	}
}

func TestStructuredOutputs(t *testing.T) {
	h := start(t, Options{}, false)
	for _, sc := range schemaCases {
		for _, form := range []string{
			`"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":%s}}`,
			`"structured_outputs":{"json":%s}`,
		} {
			field := fmt.Sprintf(form, sc.schema)
			t.Run(sc.name+"/"+field[:12], func(t *testing.T) {
				v := h.chatJSON(t, `{`+hello+`,"seed":5,`+field+`}`)
				text := v.Get("choices.0.message.content").Str
				if !gjson.Valid(text) || v.Get("choices.0.finish_reason").Str != "stop" {
					t.Fatalf("not a finished JSON document: %s", v.Raw)
				}
				schema := gjson.Parse(sc.schema)
				if err := validate(schema, schema, gjson.Parse(text), "$"); err != nil {
					t.Errorf("%v: %s", err, text)
				}
				if int(v.Get("usage.completion_tokens").Int()) != len(splitTokens(text)) {
					t.Errorf("usage %d for %d tokens", v.Get("usage.completion_tokens").Int(), len(splitTokens(text)))
				}
			})
		}
	}
	t.Run("json_object", func(t *testing.T) {
		text := h.chatJSON(t, `{`+hello+`,"response_format":{"type":"json_object"}}`).Get("choices.0.message.content").Str
		if !gjson.Parse(text).IsObject() {
			t.Errorf("not an object: %q", text)
		}
	})
	t.Run("choice", func(t *testing.T) {
		text := h.chatJSON(t, `{`+hello+`,"structured_outputs":{"choice":["positive","negative"]}}`).Get("choices.0.message.content").Str
		if text != "positive" && text != "negative" {
			t.Errorf("%q is not a choice", text)
		}
	})
	t.Run("regex", func(t *testing.T) {
		text := h.chatJSON(t, `{`+hello+`,"structured_outputs":{"regex":"[A-Z]{2}-\\d{3}"}}`).Get("choices.0.message.content").Str
		if len(text) != 6 || text[2] != '-' {
			t.Errorf("%q does not match", text)
		}
	})
	t.Run("max_tokens cuts the document", func(t *testing.T) {
		v := h.chatJSON(t, `{`+hello+`,"max_tokens":3,"response_format":{"type":"json_object"}}`)
		if v.Get("choices.0.finish_reason").Str != "length" || v.Get("usage.completion_tokens").Int() != 3 {
			t.Errorf("%s", v.Raw)
		}
	})
}

const weatherTool = `{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","unit"],"additionalProperties":false}}}`
const orderTool = `{"type":"function","function":{"name":"lookup_order","parameters":{"type":"object","properties":{"order_id":{"type":"string"},"items":{"type":"array","items":{"$ref":"#/$defs/item"},"minItems":1}},"required":["order_id","items"],"$defs":{"item":{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer","minimum":1}},"required":["sku","qty"]}}}}}`

func TestToolChoice(t *testing.T) {
	h := start(t, Options{}, false)
	tools := `"tools":[` + weatherTool + `,` + orderTool + `]`
	user := func(text string) string { return `"messages":[{"role":"user","content":"` + text + `"}]` }
	tests := []struct {
		name string
		body string
		call string // "" for a text answer
	}{
		{"none", tools + `,"tool_choice":"none",` + user("call get_weather"), ""},
		{"auto names a tool", tools + `,"tool_choice":"auto",` + user("Please call LOOKUP_ORDER now"), "lookup_order"},
		{"auto by default", tools + `,` + user("get_weather for Paris"), "get_weather"},
		{"auto names none", tools + `,"tool_choice":"auto",` + user("Tell me a story"), ""},
		{"auto after a tool result", tools + `,"messages":[{"role":"user","content":"get_weather please"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"3C"}]`, ""},
		{"auto looks at the last user message", tools + `,"messages":[{"role":"user","content":"get_weather"},{"role":"assistant","content":"ok"},{"role":"user","content":"thanks"}]`, ""},
		{"required calls the first", tools + `,"tool_choice":"required",` + user("anything"), "get_weather"},
		{"named", tools + `,"tool_choice":{"type":"function","function":{"name":"lookup_order"}},` + user("anything"), "lookup_order"},
		{"no tools", user("get_weather"), ""},
	}
	params := map[string]gjson.Result{
		"get_weather":  gjson.Get(weatherTool, "function.parameters"),
		"lookup_order": gjson.Get(orderTool, "function.parameters"),
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := h.chatJSON(t, `{`+tt.body+`}`)
			c := v.Get("choices.0")
			if tt.call == "" {
				if c.Get("finish_reason").Str != "stop" || c.Get("message.content").Str == "" || c.Get("message.tool_calls").Exists() {
					t.Errorf("want a text answer: %s", v.Raw)
				}
				return
			}
			call := c.Get("message.tool_calls.0")
			args := call.Get("function.arguments").Str
			if c.Get("finish_reason").Str != "tool_calls" || c.Get("message.content").Type != gjson.Null ||
				call.Get("function.name").Str != tt.call || call.Get("type").Str != "function" ||
				!strings.HasPrefix(call.Get("id").Str, "chatcmpl-tool-") || len(c.Get("message.tool_calls").Array()) != 1 {
				t.Fatalf("want a call of %s: %s", tt.call, v.Raw)
			}
			if !gjson.Valid(args) {
				t.Fatalf("arguments not JSON: %q", args)
			}
			p := params[tt.call]
			if err := validate(p, p, gjson.Parse(args), "$"); err != nil {
				t.Errorf("arguments %s: %v", args, err)
			}
			if got := v.Get("usage.completion_tokens").Int(); got != int64(len(splitTokens(args))) {
				t.Errorf("completion_tokens %d, want the %d tokens of the arguments", got, len(splitTokens(args)))
			}

			// Streamed: role, the call's head, argument fragments, finish, usage; the fragments
			// join into the same arguments.
			data, _ := h.events(t, "/v1/chat/completions", `{"stream":true,"stream_options":{"include_usage":true},`+tt.body+`}`)
			if data[len(data)-1] != "[DONE]" {
				t.Fatalf("no [DONE]: %q", data)
			}
			evs := data[:len(data)-1]
			if gjson.Get(evs[0], "choices.0.delta.role").Str != "assistant" {
				t.Errorf("first chunk %s", evs[0])
			}
			head := gjson.Get(evs[1], "choices.0.delta.tool_calls.0")
			if head.Get("index").Int() != 0 || !strings.HasPrefix(head.Get("id").Str, "chatcmpl-tool-") || head.Get("type").Str != "function" ||
				head.Get("function.name").Str != tt.call || head.Get("function.arguments").Raw != `""` {
				t.Errorf("call head %s", evs[1])
			}
			var joined strings.Builder
			fragments := 0
			for _, d := range evs[2 : len(evs)-2] {
				tc := gjson.Get(d, "choices.0.delta.tool_calls.0")
				if tc.Get("index").Int() != 0 || tc.Get("id").Exists() || tc.Get("function.name").Exists() {
					t.Errorf("fragment %s", d)
				}
				joined.WriteString(tc.Get("function.arguments").Str)
				fragments++
			}
			if joined.String() != args || fragments < 2 {
				t.Errorf("%d fragments join to %q, want %q", fragments, joined.String(), args)
			}
			if gjson.Get(evs[len(evs)-2], "choices.0.finish_reason").Str != "tool_calls" {
				t.Errorf("finish chunk %s", evs[len(evs)-2])
			}
			if u := gjson.Get(evs[len(evs)-1], "usage"); u.Get("completion_tokens").Int() != v.Get("usage.completion_tokens").Int() ||
				u.Get("prompt_tokens").Int() != v.Get("usage.prompt_tokens").Int() {
				t.Errorf("streamed usage %s, non-streamed %s", u.Raw, v.Get("usage").Raw)
			}
		})
	}
}

func TestToolChoiceValidation(t *testing.T) {
	h := start(t, Options{}, false)
	for _, body := range []string{
		`{` + hello + `,"tool_choice":"required"}`,
		`{` + hello + `,"tool_choice":{"type":"function","function":{"name":"x"}}}`,
		`{` + hello + `,"tools":[` + weatherTool + `],"tool_choice":{"type":"function","function":{"name":"other"}}}`,
		`{` + hello + `,"tools":[` + weatherTool + `],"tool_choice":"sometimes"}`,
		`{` + hello + `,"tools":[{"type":"function"}]}`,
	} {
		if r := h.do(t, "POST", "/v1/chat/completions", body); r.status != 400 {
			t.Errorf("%s: status %d %s, want 400", body, r.status, r.body)
		}
	}
}

func TestToolCallCutByMaxTokens(t *testing.T) {
	h := start(t, Options{}, false)
	v := h.chatJSON(t, `{`+hello+`,"max_tokens":2,"tools":[`+weatherTool+`],"tool_choice":"required"}`)
	c := v.Get("choices.0")
	if c.Get("finish_reason").Str != "length" || c.Get("message.tool_calls").Exists() || v.Get("usage.completion_tokens").Int() != 2 {
		t.Errorf("want the cut arguments as text with finish length: %s", v.Raw)
	}
}

func TestCompletions(t *testing.T) {
	h := start(t, Options{Tokens: 3}, false)
	tests := []struct {
		name    string
		body    string
		texts   []string
		prompt  int
		finish  string
		logprob bool
	}{
		{"string", `{"model":"m","prompt":"one two three"}`, []string{content(3)}, 3, "stop", false},
		{"strings and n", `{"prompt":["a","b c"],"n":2,"max_tokens":2}`, []string{content(2), content(2), content(2), content(2)}, 3, "length", false},
		{"token ids", `{"prompt":[5,6,7,8]}`, []string{content(3)}, 4, "stop", false},
		{"lists of token ids", `{"prompt":[[1],[2,3]]}`, []string{content(3), content(3)}, 3, "stop", false},
		{"echo", `{"prompt":"hi there","echo":true,"max_tokens":1}`, []string{"hi theretok0 "}, 2, "length", false},
		{"echo token ids", `{"prompt":[4,5],"echo":true,"max_tokens":1}`, []string{"tok4 tok5 tok0 "}, 2, "length", false},
		{"stop", `{"prompt":"x","stop":["tok2"]}`, []string{"tok0 tok1 "}, 1, "stop", false},
		{"null suffix", `{"prompt":"x","suffix":null,"best_of":2}`, []string{content(3)}, 1, "stop", false},
		{"logprobs", `{"prompt":"x","logprobs":2}`, []string{content(3)}, 1, "stop", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, "POST", "/v1/completions", tt.body)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			v := mustJSON(t, string(r.body))
			if v.Get("object").Str != "text_completion" || !strings.HasPrefix(v.Get("id").Str, "cmpl-") {
				t.Errorf("envelope %s", v.Raw)
			}
			choices := v.Get("choices").Array()
			if len(choices) != len(tt.texts) {
				t.Fatalf("%d choices, want %d: %s", len(choices), len(tt.texts), v.Raw)
			}
			completion := 0
			for i, c := range choices {
				if c.Get("index").Int() != int64(i) || c.Get("text").Str != tt.texts[i] || c.Get("finish_reason").Str != tt.finish {
					t.Errorf("choice %d: %s, want %q %s", i, c.Raw, tt.texts[i], tt.finish)
				}
				lp := c.Get("logprobs")
				if tt.logprob != lp.IsObject() {
					t.Errorf("logprobs %s", lp.Raw)
				}
				if tt.logprob {
					toks := lp.Get("tokens").Array()
					if len(toks) != 3 || len(lp.Get("token_logprobs").Array()) != 3 || len(lp.Get("text_offset").Array()) != 3 ||
						len(lp.Get("top_logprobs.0").Map()) != 2 || lp.Get("text_offset.1").Int() != 5 || lp.Get("token_logprobs.0").Num > 0 {
						t.Errorf("logprobs shape %s", lp.Raw)
					}
				}
				completion += len(strings.Fields(strings.TrimPrefix(c.Get("text").Str, "hi there")))
			}
			u := v.Get("usage")
			if u.Get("prompt_tokens").Int() != int64(tt.prompt) || u.Get("total_tokens").Int() != u.Get("prompt_tokens").Int()+u.Get("completion_tokens").Int() {
				t.Errorf("usage %s, want prompt %d", u.Raw, tt.prompt)
			}
		})
	}
	t.Run("stream", func(t *testing.T) {
		data, _ := h.events(t, "/completions", `{"prompt":["a","b"],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`)
		if data[len(data)-1] != "[DONE]" {
			t.Fatalf("no [DONE]")
		}
		texts := map[int64]string{}
		finishes := 0
		for _, d := range data[:len(data)-2] {
			c := gjson.Get(d, "choices.0")
			if gjson.Get(d, "object").Str != "text_completion" || !gjson.Get(d, "usage").Exists() {
				t.Errorf("chunk %s", d)
			}
			texts[c.Get("index").Int()] += c.Get("text").Str
			if c.Get("finish_reason").Str == "length" {
				finishes++
			}
		}
		if texts[0] != content(2) || texts[1] != content(2) || finishes != 2 {
			t.Errorf("texts %v, %d finishes", texts, finishes)
		}
		if u := gjson.Get(data[len(data)-2], "usage"); u.Get("completion_tokens").Int() != 4 || u.Get("prompt_tokens").Int() != 2 ||
			len(gjson.Get(data[len(data)-2], "choices").Array()) != 0 {
			t.Errorf("usage chunk %s", data[len(data)-2])
		}
	})
	for _, body := range []string{`{}`, `{"prompt":[]}`, `{"prompt":[1,"a"]}`, `{"prompt":"x","logprobs":true}`, `{"prompt":"x","stream_options":{}}`,
		`{"prompt":"x","suffix":"y"}`, `{"prompt":"x","n":3,"best_of":2}`} {
		if r := h.do(t, "POST", "/v1/completions", body); r.status != 400 {
			t.Errorf("%s: status %d, want 400", body, r.status)
		}
	}
}

func TestEmbeddings(t *testing.T) {
	h := start(t, Options{EmbeddingDimensions: 6}, false)
	get := func(body string) gjson.Result {
		t.Helper()
		r := h.do(t, "POST", "/v1/embeddings", body)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return mustJSON(t, string(r.body))
	}
	vector := func(e gjson.Result) []float64 {
		var v []float64
		for _, x := range e.Array() {
			v = append(v, x.Num)
		}
		return v
	}
	a := get(`{"model":"m","input":["hello world","other text"]}`)
	if a.Get("object").Str != "list" || a.Get("model").Str != "m" || a.Get("usage.prompt_tokens").Int() != 4 || a.Get("usage.total_tokens").Int() != 4 {
		t.Errorf("envelope %s", a.Raw)
	}
	v0, v1 := vector(a.Get("data.0.embedding")), vector(a.Get("data.1.embedding"))
	if len(v0) != 6 || a.Get("data.1.index").Int() != 1 || a.Get("data.0.object").Str != "embedding" {
		t.Fatalf("data %s", a.Get("data").Raw)
	}
	norm := 0.0
	for _, x := range v0 {
		norm += x * x
	}
	if math.Abs(norm-1) > 1e-5 {
		t.Errorf("norm² %v, want 1", norm)
	}
	if fmt.Sprint(v0) == fmt.Sprint(v1) {
		t.Errorf("different inputs, same vector")
	}
	if again := vector(get(`{"input":"hello world"}`).Get("data.0.embedding")); fmt.Sprint(again) != fmt.Sprint(v0) {
		t.Errorf("same input, different vector: %v, %v", again, v0)
	}
	small := get(`{"input":"hello world","dimensions":3}`)
	if n := len(small.Get("data.0.embedding").Array()); n != 3 {
		t.Errorf("dimensions 3 gave %d", n)
	}
	b64 := get(`{"input":"hello world","encoding_format":"base64"}`)
	raw, err := base64.StdEncoding.DecodeString(b64.Get("data.0.embedding").Str)
	if err != nil || len(raw) != 4*6 {
		t.Fatalf("base64 %q: %v", b64.Get("data.0.embedding").Str, err)
	}
	for j := range 6 {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:])); float64(got) != float64(float32(v0[j])) {
			t.Errorf("component %d: base64 %v, float %v", j, got, v0[j])
		}
	}
	if tok := get(`{"input":[[1,2,3],[4]]}`); tok.Get("usage.prompt_tokens").Int() != 4 || len(tok.Get("data").Array()) != 2 {
		t.Errorf("token inputs %s", tok.Raw)
	}
	for _, body := range []string{`{}`, `{"input":[]}`, `{"input":"x","encoding_format":"hex"}`, `{"input":"x","dimensions":0}`, `{"input":{"a":1}}`} {
		if r := h.do(t, "POST", "/v1/embeddings", body); r.status != 400 {
			t.Errorf("%s: status %d, want 400", body, r.status)
		}
	}
}

func TestResponses(t *testing.T) {
	h := start(t, Options{Tokens: 4}, false)
	create := func(body string) gjson.Result {
		t.Helper()
		r := h.do(t, "POST", "/v1/responses", body)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return mustJSON(t, string(r.body))
	}
	first := create(`{"model":"m","input":"hello there","instructions":"be brief"}`)
	id := first.Get("id").Str
	checks := map[string]string{
		"object": "response", "status": "completed", "model": "m", "instructions": "be brief",
		"output.0.type": "message", "output.0.role": "assistant", "output.0.content.0.type": "output_text",
		"output.0.content.0.text": content(4), "output.0.content.0.annotations": "[]",
		"usage.input_tokens": "12", "usage.output_tokens": "4", "usage.total_tokens": "16",
		"usage.input_tokens_details.cached_tokens": "0", "usage.output_tokens_details.reasoning_tokens": "0",
	}
	for path, want := range checks {
		if got := first.Get(path); got.String() != want {
			t.Errorf("%s = %s, want %s", path, got.Raw, want)
		}
	}
	if !strings.HasPrefix(id, "resp_") {
		t.Errorf("id %q", id)
	}

	t.Run("items and max_output_tokens", func(t *testing.T) {
		v := create(`{"input":[{"role":"user","content":[{"type":"input_text","text":"a b c"}]},{"type":"function_call_output","call_id":"x","output":"d e"}],"max_output_tokens":2}`)
		if v.Get("status").Str != "incomplete" || v.Get("incomplete_details.reason").Str != "max_output_tokens" ||
			v.Get("usage.input_tokens").Int() != 4+3+2 || v.Get("usage.output_tokens").Int() != 2 {
			t.Errorf("%s", v.Raw)
		}
	})
	t.Run("follow-up counts the conversation", func(t *testing.T) {
		v := create(`{"input":"more","previous_response_id":"` + id + `"}`)
		if v.Get("previous_response_id").Str != id || v.Get("usage.input_tokens").Int() != 12+4+5 {
			t.Errorf("%s", v.Raw)
		}
	})
	t.Run("unknown previous_response_id", func(t *testing.T) {
		r := h.do(t, "POST", "/v1/responses", `{"input":"x","previous_response_id":"resp_missing"}`)
		if r.status != 404 || gjson.GetBytes(r.body, "error.message").Str != "Response with id 'resp_missing' not found." {
			t.Errorf("status %d %s", r.status, r.body)
		}
	})
	t.Run("get, cancel, delete", func(t *testing.T) {
		if r := h.do(t, "GET", "/v1/responses/"+id, ""); r.status != 200 || gjson.GetBytes(r.body, "id").Str != id ||
			gjson.GetBytes(r.body, "output.0.content.0.text").Str != content(4) {
			t.Errorf("GET: %d %s", r.status, r.body)
		}
		if r := h.do(t, "POST", "/responses/"+id+"/cancel", ""); r.status != 400 || !strings.Contains(string(r.body), "synchronous") {
			t.Errorf("cancel: %d %s", r.status, r.body)
		}
		if r := h.do(t, "DELETE", "/v1/responses/"+id, ""); r.status != 200 || gjson.GetBytes(r.body, "deleted").Type != gjson.True {
			t.Errorf("DELETE: %d %s", r.status, r.body)
		}
		for _, m := range []string{"GET", "DELETE"} {
			if r := h.do(t, m, "/v1/responses/"+id, ""); r.status != 404 {
				t.Errorf("%s after delete: %d %s", m, r.status, r.body)
			}
		}
	})
	t.Run("store false", func(t *testing.T) {
		v := create(`{"input":"x","store":false}`)
		if r := h.do(t, "GET", "/v1/responses/"+v.Get("id").Str, ""); r.status != 404 {
			t.Errorf("an unstored response was kept: %d", r.status)
		}
	})
	t.Run("structured output", func(t *testing.T) {
		schema := schemaCases[2].schema
		v := create(`{"input":"x","text":{"format":{"type":"json_schema","name":"p","schema":` + schema + `}}}`)
		doc := v.Get("output.0.content.0.text").Str
		s := gjson.Parse(schema)
		if err := validate(s, s, gjson.Parse(doc), "$"); err != nil || !gjson.Valid(doc) {
			t.Errorf("%v: %s", err, doc)
		}
	})
	t.Run("stream", func(t *testing.T) {
		data, names := h.events(t, "/v1/responses", `{"input":"hello","stream":true,"max_output_tokens":3}`)
		want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
			"response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
			"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"}
		if fmt.Sprint(names) != fmt.Sprint(want) || len(data) != len(want) {
			t.Fatalf("events %v, want %v", names, want)
		}
		var text strings.Builder
		for i, d := range data {
			ev := gjson.Parse(d)
			if ev.Get("type").Str != names[i] || ev.Get("sequence_number").Int() != int64(i) {
				t.Errorf("event %d: %s", i, d)
			}
			text.WriteString(ev.Get("delta").Str)
		}
		done := gjson.Parse(data[len(data)-1]).Get("response")
		if text.String() != content(3) || gjson.Get(data[7], "text").Str != content(3) ||
			done.Get("output.0.content.0.text").Str != content(3) || done.Get("usage.output_tokens").Int() != 3 ||
			done.Get("usage.input_tokens").Int() != 5 || gjson.Get(data[0], "response.status").Str != "in_progress" {
			t.Errorf("text %q, completed %s", text.String(), done.Raw)
		}
		if r := h.do(t, "GET", "/v1/responses/"+done.Get("id").Str, ""); r.status != 200 {
			t.Errorf("the streamed response was not stored: %d", r.status)
		}
	})
	for _, body := range []string{`{}`, `{"input":5}`, `{"input":"x","max_output_tokens":0}`, `{"input":["x"]}`} {
		if r := h.do(t, "POST", "/v1/responses", body); r.status != 400 {
			t.Errorf("%s: status %d, want 400", body, r.status)
		}
	}
}

// TestNewEndpointsCountedAndInjected checks that the new endpoints share the chat path's stats
// and failure injection.
func TestNewEndpointsCountedAndInjected(t *testing.T) {
	h := start(t, Options{}, false)
	for _, p := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"x"}`},
		{"/v1/embeddings", `{"input":"x"}`},
		{"/v1/responses", `{"input":"x"}`},
	} {
		if r := h.do(t, "POST", p.path, p.body, "X-Mock-Status", "503"); r.status != 503 {
			t.Errorf("%s: status %d with X-Mock-Status 503", p.path, r.status)
		}
		if r := h.do(t, "POST", p.path, p.body); r.status != 200 {
			t.Errorf("%s: status %d", p.path, r.status)
		}
	}
	if s := h.srv.Stats(); s.Requests != 6 || s.Completed != 6 {
		t.Errorf("stats %+v, want 6 requests completed", s)
	}
	// A streamed completion fails in-band after the given number of token events.
	r := h.do(t, "POST", "/v1/completions", `{"prompt":"x","stream":true}`, "X-Mock-Fail-After", "2")
	body := string(r.body)
	if strings.Count(body, `"text":"tok`) != 2 || !strings.Contains(body, "simulated mid-stream failure") || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("fail-after body %s", body)
	}
}

func TestResponsesTools(t *testing.T) {
	h := start(t, Options{}, false)
	const tools = `"tools":[{"type":"web_search"},{"type":"function","name":"get_weather","parameters":` + `{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false}` + `}]`
	params := gjson.Parse(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false}`)
	tests := []struct {
		name string
		body string
		call bool
	}{
		{"auto names the tool", `{"input":"call get_weather please",` + tools + `}`, true},
		{"auto names none", `{"input":"tell me a story",` + tools + `}`, false},
		{"required", `{"input":"x","tool_choice":"required",` + tools + `}`, true},
		{"named", `{"input":"x","tool_choice":{"type":"function","name":"get_weather"},` + tools + `}`, true},
		{"none", `{"input":"get_weather","tool_choice":"none",` + tools + `}`, false},
		{"after the tool's output", `{"input":[{"role":"user","content":"get_weather"},{"type":"function_call","call_id":"c","name":"get_weather","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"3C"}],` + tools + `}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, "POST", "/v1/responses", tt.body)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			v := mustJSON(t, string(r.body))
			item := v.Get("output.0")
			if !tt.call {
				if item.Get("type").Str != "message" || item.Get("content.0.text").Str == "" {
					t.Errorf("want a message: %s", v.Raw)
				}
				return
			}
			args := item.Get("arguments").Str
			if item.Get("type").Str != "function_call" || item.Get("name").Str != "get_weather" || item.Get("status").Str != "completed" ||
				!strings.HasPrefix(item.Get("call_id").Str, "call_") || !strings.HasPrefix(item.Get("id").Str, "fc_") ||
				v.Get("usage.output_tokens").Int() != int64(len(splitTokens(args))) || v.Get("tools.#").Int() != 2 {
				t.Fatalf("want a call: %s", v.Raw)
			}
			if err := validate(params, params, gjson.Parse(args), "$"); err != nil {
				t.Errorf("arguments %s: %v", args, err)
			}

			data, names := h.events(t, "/v1/responses", strings.Replace(tt.body, `{`, `{"stream":true,`, 1))
			var joined strings.Builder
			deltas := 0
			for i, d := range data {
				if names[i] == "response.function_call_arguments.delta" {
					joined.WriteString(gjson.Get(d, "delta").Str)
					deltas++
				}
			}
			n := len(names)
			if names[2] != "response.output_item.added" || gjson.Get(data[2], "item.arguments").Str != "" ||
				names[n-3] != "response.function_call_arguments.done" || names[n-2] != "response.output_item.done" ||
				names[n-1] != "response.completed" || deltas < 2 || deltas != n-6 {
				t.Fatalf("events %v", names)
			}
			done := gjson.Get(data[n-1], "response")
			if joined.String() != gjson.Get(data[n-3], "arguments").Str || joined.String() != done.Get("output.0.arguments").Str ||
				done.Get("usage.output_tokens").Int() != int64(deltas) {
				t.Errorf("fragments %q, done %s", joined.String(), data[n-3])
			}
		})
	}
	if r := h.do(t, "POST", "/v1/responses", `{"input":"x","tool_choice":"required"}`); r.status != 400 {
		t.Errorf("required without tools: %d", r.status)
	}
}

func TestResponsesBackground(t *testing.T) {
	// A time to first token of an hour keeps a background response running for the whole test.
	slow := start(t, Options{TimeToFirstToken: time.Hour, Tokens: 2}, false)
	r := slow.do(t, "POST", "/v1/responses", `{"input":"x","background":true}`)
	v := mustJSON(t, string(r.body))
	id := v.Get("id").Str
	if r.status != 200 || v.Get("status").Str != "queued" || v.Get("background").Type != gjson.True || v.Get("output.#").Int() != 0 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if g := mustJSON(t, string(slow.do(t, "GET", "/v1/responses/"+id, "").body)); g.Get("status").Str != "in_progress" || g.Get("usage").Type != gjson.Null {
		t.Errorf("running: %s", g.Raw)
	}
	c := slow.do(t, "POST", "/v1/responses/"+id+"/cancel", "")
	if c.status != 200 || gjson.GetBytes(c.body, "status").Str != "cancelled" {
		t.Errorf("cancel: %d %s", c.status, c.body)
	}
	if g := slow.do(t, "GET", "/v1/responses/"+id, ""); gjson.GetBytes(g.body, "status").Str != "cancelled" {
		t.Errorf("after cancel: %s", g.body)
	}

	fast := start(t, Options{Tokens: 2}, false)
	id = gjson.GetBytes(fast.do(t, "POST", "/v1/responses", `{"input":"x","background":true}`).body, "id").Str
	g := mustJSON(t, string(fast.do(t, "GET", "/v1/responses/"+id, "").body))
	if g.Get("status").Str != "completed" || g.Get("output.0.content.0.text").Str != content(2) || g.Get("usage.output_tokens").Int() != 2 {
		t.Errorf("finished background response: %s", g.Raw)
	}
	if c := fast.do(t, "POST", "/v1/responses/"+id+"/cancel", ""); c.status != 200 || gjson.GetBytes(c.body, "status").Str != "completed" {
		t.Errorf("cancelling a finished response: %d %s", c.status, c.body)
	}
	if r := fast.do(t, "POST", "/v1/responses", `{"input":"x","background":true,"store":false}`); r.status != 400 {
		t.Errorf("background without store: %d", r.status)
	}
}

func TestVariedText(t *testing.T) {
	h := start(t, Options{VariedText: true}, false)
	text := func(path, body, field string) string {
		t.Helper()
		r := h.do(t, "POST", path, body)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return gjson.GetBytes(r.body, field).Str
	}
	for _, c := range []struct{ path, body, field string }{
		{"/v1/chat/completions", `{` + hello + `}`, "choices.0.message.content"},
		{"/v1/completions", `{"prompt":"x"}`, "choices.0.text"},
		{"/v1/responses", `{"input":"x"}`, "output.0.content.0.text"},
	} {
		a, b := text(c.path, c.body, c.field), text(c.path, c.body, c.field)
		if a == b || strings.HasPrefix(a, "tok") || len(strings.Fields(a)) != defaultTokens {
			t.Errorf("%s without a seed: %q then %q, want two different samples", c.path, a, b)
		}
	}
	seeded := `{"seed":9,` + hello + `}`
	if a, b := text("/v1/chat/completions", seeded, "choices.0.message.content"), text("/v1/chat/completions", seeded, "choices.0.message.content"); a != b {
		t.Errorf("the request's seed does not win: %q, %q", a, b)
	}
}
