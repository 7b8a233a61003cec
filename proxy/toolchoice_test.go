package proxy_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/backends/simulated"
)

// TestToolCallingPerModel checks models[].tool_calling end to end: a model without it
// refuses every tool_choice but "none" with a message that says what to configure, and
// nothing reaches its backend; a model with it forwards tool requests unchanged.
func TestToolCallingPerModel(t *testing.T) {
	h := newHarness(t, harnessOptions{models: `
  - name: plain
    backends: [sim]
  - name: agent
    backends: [sim]
    tool_calling: true
`})
	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","strict":true,` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}}}]`
	body := func(model, members string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"Weather in Paris?"}],"max_tokens":4,` + members + `}`
	}
	roundTrip := `"messages":[{"role":"user","content":"Weather in Paris?"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
		`{"role":"tool","tool_call_id":"call_1","content":"18 degrees"}]`

	refused := []struct {
		name, body, got string
	}{
		{"auto", body("plain", tools+`,"tool_choice":"auto"`), `got "auto"`},
		{"required", body("plain", tools+`,"tool_choice":"required"`), `got "required"`},
		{"named", body("plain", tools+`,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`), "got a named function (get_weather)"},
	}
	for _, tc := range refused {
		t.Run("off refuses "+tc.name, func(t *testing.T) {
			before := h.sim.Stats().Requests
			r := h.post(tc.body)
			if r.status != 400 {
				t.Fatalf("status %d, want 400: %s", r.status, r.body)
			}
			if r.json("error.param").String() != "tool_choice" || r.json("error.type").String() != "invalid_request_error" {
				t.Errorf("error = %s", r.body)
			}
			msg := r.json("error.message").String()
			for _, want := range []string{"Model plain is not configured for tool calling", tc.got, "set `tool_calling: true` for model plain", "--enable-auto-tool-choice"} {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q does not say %q", msg, want)
				}
			}
			if h.sim.Stats().Requests != before {
				t.Error("a refused request reached the backend")
			}
		})
	}

	accepted := []struct {
		name, body string
	}{
		{"off passes none", body("plain", tools+`,"tool_choice":"none"`)},
		{"off passes no tool_choice", body("plain", tools)},
		{"off passes null", body("plain", tools+`,"tool_choice":null`)},
		{"off passes a tool round trip", `{"model":"plain","max_tokens":4,` + tools + `,"tool_choice":"none",` + roundTrip + `}`},
		{"on passes auto", body("agent", tools+`,"tool_choice":"auto","parallel_tool_calls":false`)},
		{"on passes required", body("agent", tools+`,"tool_choice":"required"`)},
		{"on passes named", body("agent", tools+`,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`)},
		{"on passes a tool round trip", `{"model":"agent","max_tokens":4,` + tools + `,"tool_choice":"auto",` + roundTrip + `}`},
	}
	for _, tc := range accepted {
		t.Run(tc.name, func(t *testing.T) {
			r := h.post(tc.body)
			if r.status != 200 {
				t.Fatalf("status %d, want 200: %s", r.status, r.body)
			}
			up, _ := h.sim.LastRequest()
			if !bytes.Equal(up, []byte(tc.body)) {
				t.Errorf("the backend got\n%s\nwant the body as sent\n%s", up, tc.body)
			}
		})
	}

	// The model-independent rules apply to a model with tool calling too.
	t.Run("on refuses required without tools", func(t *testing.T) {
		before := h.sim.Stats().Requests
		r := h.post(body("agent", `"tool_choice":"required"`))
		if r.status != 400 || r.json("error.param").String() != "tool_choice" ||
			!strings.Contains(r.json("error.message").String(), "needs a non-empty tools array") {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if h.sim.Stats().Requests != before {
			t.Error("a refused request reached the backend")
		}
	})
	t.Run("on refuses an undeclared named tool", func(t *testing.T) {
		r := h.post(body("agent", tools+`,"tool_choice":{"type":"function","function":{"name":"get_news"}}`))
		if r.status != 400 || r.json("error.param").String() != "tool_choice.function.name" {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
	t.Run("a malformed tool call names the nested field", func(t *testing.T) {
		bad := strings.Replace(roundTrip, `"arguments":"{\"city\":\"Paris\"}"`, `"arguments":{"city":"Paris"}`, 1)
		r := h.post(`{"model":"agent",` + tools + `,` + bad + `}`)
		if r.status != 400 || r.json("error.param").String() != "messages[1].tool_calls[0].function.arguments" {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	})
}

// TestBodyLimitsConfigured checks that server.max_stop_strings and server.max_logit_bias
// reach the validator: above them a body is refused before any backend sees it.
func TestBodyLimitsConfigured(t *testing.T) {
	// The harness puts the models last in its YAML, so a top-level section can follow.
	h := newHarness(t, harnessOptions{models: `
  - name: demo
    backends: [sim]
server:
  max_stop_strings: 3
  max_logit_bias: 2
`})
	cases := []struct {
		name, members, param, msg string
	}{
		{"stop at the limit", `"stop":["a","b","c"]`, "", ""},
		{"stop past the limit", `"stop":["a","b","c","d"]`, "stop", "stop has more than 3 strings, the most the gateway accepts."},
		{"logit_bias at the limit", `"logit_bias":{"1":1,"2":-1}`, "", ""},
		{"logit_bias past the limit", `"logit_bias":{"1":1,"2":-1,"3":0}`, "logit_bias", "logit_bias has more than 2 entries, the most the gateway accepts."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := h.sim.Stats().Requests
			r := h.post(`{"model":"demo","messages":[{"role":"user","content":"x"}],"max_tokens":2,` + tc.members + `}`)
			if tc.msg == "" {
				if r.status != 200 {
					t.Fatalf("status %d, want 200: %s", r.status, r.body)
				}
				return
			}
			if r.status != 400 || r.json("error.param").String() != tc.param || r.json("error.message").String() != tc.msg {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if h.sim.Stats().Requests != before {
				t.Error("a refused request reached the backend")
			}
		})
	}
}

// TestToolChoiceSkipsFallbacksWithoutToolCalling checks that a request asking for tool
// calling is never sent to a fallback model that is not configured for it: with the
// model's own backend gone it goes on to the next fallback that is.
func TestToolChoiceSkipsFallbacksWithoutToolCalling(t *testing.T) {
	dead, plain, agent := newNode(t, "dead", simulated.Options{}), newNode(t, "plain", simulated.Options{}), newNode(t, "agent", simulated.Options{})
	c := newHarness(t, harnessOptions{healthChecks: true,
		backends: sameSpecs("", dead, plain, agent),
		models: `  - name: A
    backends: [dead]
    tool_calling: true
    fallbacks: [B, C]
  - name: B
    backends: [plain]
  - name: C
    backends: [agent]
    tool_calling: true
`,
		extra: "retries: {backoff: 1ms, max_backoff: 5ms}",
	})
	dead.kill()
	const tools = `"tools":[{"type":"function","function":{"name":"f"}}]`
	body := func(choice string) string {
		return `{"model":"A","messages":[{"role":"user","content":"x"}],"max_tokens":2,` + tools + `,"tool_choice":` + choice + `}`
	}

	r := c.postOK(body(`"auto"`))
	if got := r.header.Get("Compat-Served-Model"); got != "C" {
		t.Errorf("tool_choice auto served by %q, want C (B is not configured for tool calling)", got)
	}
	if plain.requests() != 0 || agent.requests() != 1 {
		t.Errorf("requests: plain %d, agent %d; want 0 and 1", plain.requests(), agent.requests())
	}

	// "none" needs no tool calling: the first fallback serves it.
	r = c.postOK(body(`"none"`))
	if got := r.header.Get("Compat-Served-Model"); got != "B" {
		t.Errorf("tool_choice none served by %q, want B", got)
	}
}
