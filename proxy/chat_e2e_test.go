package proxy_test

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/backends/simulated"
)

const helloBody = `{"model":"demo","messages":[{"role":"user","content":"say hello to me"}],"max_tokens":5}`

// The simulated backend counts prompt tokens as the words of all contents
// plus 4 per message: "say hello to me" is 4 + 4.
const helloPromptTokens = 8

func TestNonStreaming(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	r := h.post(helloBody, "Compat-Project: acme/chatbot", "X-Request-Id: req-123")
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := r.json("model").String(); got != "demo" {
		t.Errorf("model = %q, want demo", got)
	}
	if got := r.json("choices.0.message.content").String(); got != "tok0 tok1 tok2 tok3 tok4 " {
		t.Errorf("content = %q", got)
	}
	if got := r.header.Get("X-Request-Id"); got != "req-123" {
		t.Errorf("X-Request-Id = %q, want the client's", got)
	}
	if r.header.Get("Compat-Call-Id") == "" {
		t.Error("no Compat-Call-Id header")
	}
	rec := h.recorder.wait(t, 1)
	if rec.Team != "acme" || rec.Project != "chatbot" || rec.KeyName != "acme-key" || rec.Model != "demo" || rec.Backend != "sim" {
		t.Errorf("record attribution wrong: %+v", rec)
	}
	if rec.PromptTokens != helloPromptTokens || rec.CompletionTokens != 5 || rec.TotalTokens != helloPromptTokens+5 {
		t.Errorf("record tokens = %d/%d/%d, want %d/5/%d", rec.PromptTokens, rec.CompletionTokens, rec.TotalTokens,
			helloPromptTokens, helloPromptTokens+5)
	}
	if rec.RequestID != "req-123" || rec.Status != 200 || rec.Error != "" || rec.Stream {
		t.Errorf("record = %+v", rec)
	}

	// What the backend saw: the gateway's key, not the client's; the
	// request id; no Compat-* headers.
	_, hdr := h.sim.LastRequest()
	if hdr["Authorization"] != "Bearer sk-upstream-secret" {
		t.Errorf("upstream Authorization = %q", hdr["Authorization"])
	}
	if hdr["X-Request-Id"] != "req-123" {
		t.Errorf("upstream X-Request-Id = %q", hdr["X-Request-Id"])
	}
	for k := range hdr {
		if strings.HasPrefix(k, "Compat-") {
			t.Errorf("upstream got gateway header %s", k)
		}
	}
}

func TestModelRewrite(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	body := strings.Replace(helloBody, `"demo"`, `"llama"`, 1)
	r := h.post(body)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	up, _ := h.sim.LastRequest()
	if got := gjson.GetBytes(up, "model").String(); got != "meta-llama/Llama-3.1-8B-Instruct" {
		t.Errorf("upstream model = %q", got)
	}
	if got := r.json("model").String(); got != "llama" {
		t.Errorf("reply model = %q, want the public id", got)
	}

	// Streams: every chunk names the public id.
	resp, err := http.DefaultClient.Do(h.request(strings.Replace(body, `"max_tokens":5`, `"max_tokens":3,"stream":true`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := readEvents(t, bufio.NewReader(resp.Body))
	if len(events) < 3 {
		t.Fatalf("events = %v", events)
	}
	for _, ev := range events[:len(events)-1] {
		if m := gjson.Get(ev, "model").String(); m != "llama" {
			t.Errorf("chunk model = %q in %s", m, ev)
		}
	}
}

func TestAuth(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	tests := []struct {
		name   string
		header string
	}{
		{"missing", "Authorization:"},
		{"wrong key", "Authorization: Bearer sk-not-a-key"},
		{"wrong scheme", "Authorization: Token " + testKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.sim.Stats().Requests
			r := h.post(helloBody, tt.header)
			if r.status != 401 {
				t.Fatalf("status = %d, want 401: %s", r.status, r.body)
			}
			if r.json("error.code").String() != "invalid_api_key" || r.json("error.type").String() != "invalid_request_error" {
				t.Errorf("error body = %s", r.body)
			}
			if h.sim.Stats().Requests != before {
				t.Error("an unauthenticated request reached the backend")
			}
		})
	}
}

func TestRefusedBeforeBackend(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	tests := []struct {
		name    string
		body    string
		headers []string
		status  int
		param   string
		code    string
	}{
		{"invalid temperature", `{"model":"demo","messages":[{"role":"user","content":"x"}],"temperature":3}`, nil, 400, "temperature", ""},
		{"no messages", `{"model":"demo","messages":[]}`, nil, 400, "messages", ""},
		{"bad role type", `{"model":"demo","messages":[{"role":1,"content":"x"}]}`, nil, 400, "messages[0].role", ""},
		{"unknown model", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, nil, 404, "model", "model_not_found"},
		{"priority without scheduling", `{"model":"demo","messages":[{"role":"user","content":"x"}],"priority":3}`, nil, 400, "priority", ""},
		{"malformed project header", helloBody, []string{"Compat-Project: acme/a/b"}, 400, "", "invalid_project"},
		{"foreign team", helloBody, []string{"Compat-Project: globex/app"}, 403, "", "permission_denied"},
		{"bad traceparent", helloBody, []string{"traceparent: 00-xyz"}, 400, "", "invalid_trace_context"},
		{"wrong content type", helloBody, []string{"Content-Type: text/plain"}, 415, "", ""},
		{"not json", `{"model":`, nil, 400, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.sim.Stats().Requests
			r := h.post(tt.body, tt.headers...)
			if r.status != tt.status {
				t.Fatalf("status = %d, want %d: %s", r.status, tt.status, r.body)
			}
			if got := r.json("error.param").String(); got != tt.param {
				t.Errorf("param = %q, want %q (%s)", got, tt.param, r.body)
			}
			if got := r.json("error.code").String(); got != tt.code {
				t.Errorf("code = %q, want %q (%s)", got, tt.code, r.body)
			}
			if r.json("error.message").String() == "" {
				t.Errorf("no message: %s", r.body)
			}
			if h.sim.Stats().Requests != before {
				t.Error("a refused request reached the backend")
			}
		})
	}
	// Priority is accepted for a model served with priority scheduling.
	if r := h.post(`{"model":"prio","messages":[{"role":"user","content":"x"}],"priority":3,"max_tokens":1}`); r.status != 200 {
		t.Errorf("priority on a priority model: status %d: %s", r.status, r.body)
	}
}

func TestStreaming(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{InterTokenDelay: 40 * time.Millisecond}})
	tests := []struct {
		name         string
		streamOpts   string
		wantUsageEvt bool
	}{
		{"without include_usage", ``, false},
		{"with include_usage", `,"stream_options":{"include_usage":true}`, true},
		{"include_usage false", `,"stream_options":{"include_usage":false}`, false},
		{"continuous usage", `,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"demo","messages":[{"role":"user","content":"say hello to me"}],"max_tokens":6,"stream":true` + tt.streamOpts + `}`
			resp, err := http.DefaultClient.Do(h.request(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("content type %q", ct)
			}
			br := bufio.NewReader(resp.Body)
			// The first event must arrive while the backend is still
			// generating: six tokens 40 ms apart take 200 ms more.
			first, err := readEvent(br)
			if err != nil {
				t.Fatal(err)
			}
			if done := h.sim.Stats().Completed; done != int64(i) {
				t.Errorf("backend finished %d streams before the first event arrived; events are being held back", done-int64(i))
			}
			events := append([]string{first}, readEvents(t, br)...)
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("stream did not end with [DONE]: %v", events)
			}
			var content strings.Builder
			usageEvents := 0
			for _, ev := range events[:len(events)-1] {
				content.WriteString(gjson.Get(ev, "choices.0.delta.content").String())
				if gjson.Get(ev, "choices.#").Int() == 0 && gjson.Get(ev, "usage").IsObject() {
					usageEvents++
				}
			}
			if content.String() != "tok0 tok1 tok2 tok3 tok4 tok5 " {
				t.Errorf("content = %q", content.String())
			}
			if want := map[bool]int{true: 1, false: 0}[tt.wantUsageEvt]; usageEvents != want {
				t.Errorf("usage-only events = %d, want %d", usageEvents, want)
			}
			rec := h.recorder.wait(t, i+1)
			if rec.PromptTokens != helloPromptTokens || rec.CompletionTokens != 6 || rec.TotalTokens != helloPromptTokens+6 {
				t.Errorf("record tokens %d/%d/%d, want %d/6/%d", rec.PromptTokens, rec.CompletionTokens, rec.TotalTokens,
					helloPromptTokens, helloPromptTokens+6)
			}
			if !rec.Stream || rec.Incomplete || rec.Error != "" {
				t.Errorf("record = %+v", rec)
			}
		})
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{InterTokenDelay: 30 * time.Millisecond}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"demo","messages":[{"role":"user","content":"say hello to me"}],"max_tokens":1000,"stream":true}`
	req := h.request(body)
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	sr := bufio.NewReader(resp.Body)
	for range 3 {
		if _, err := readEvent(sr); err != nil {
			t.Fatal(err)
		}
	}
	closed := time.Now()
	conn.Close()

	// The gateway notices at its next write (a token comes every 30 ms) and
	// closes the upstream connection; the bound is wide for a loaded CI
	// machine, and without the cancellation the stream would run 30 s.
	deadline := closed.Add(5 * time.Second)
	for h.sim.Stats().Cancelled == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("backend still generating 5s after the client left (stats %+v)", h.sim.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec := h.recorder.wait(t, 1)
	if !rec.Incomplete || rec.Error == "" {
		t.Errorf("abandoned stream record = %+v, want incomplete with an error", rec)
	}
	if rec.CompletionTokens < 3 || rec.CompletionTokens >= 1000 {
		t.Errorf("completion tokens = %d, want the tokens streamed before the client left", rec.CompletionTokens)
	}
	if rec.PromptTokens == 0 {
		t.Error("an abandoned stream must still charge its prompt")
	}
}

func TestUpstreamErrorNormalisation(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	tests := []struct {
		name        string
		status      string
		shape       string
		wantStatus  int
		wantType    string
		wantMessage string
		// wantDetail is the backend's own text: the client sees it only
		// for errors about its request (400, 422); otherwise it is kept
		// for the log and the record.
		wantDetail string
	}{
		{"vllm nested 400", "400", "nested", 400, "invalid_request_error", "simulated failure", "simulated failure"},
		{"vllm flat 400", "400", "flat", 400, "invalid_request_error", "simulated failure", "simulated failure"},
		{"bare string 401", "401", "bare", 502, "api_error", "Backend sim refused the gateway's credentials", "Unauthorized"},
		{"plain text 500", "500", "plain", 502, "api_error", "Backend sim answered 500 with an error", "simulated failure"},
		{"nested 503", "503", "nested", 503, "api_error", "Backend sim answered 503", "simulated failure"},
		{"nested 429", "429", "nested", 429, "rate_limit_exceeded", "Backend sim is at its rate limit", "simulated failure"},
		{"nested 404", "404", "nested", 502, "api_error", "Backend sim does not serve the configured model", "simulated failure"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.post(helloBody, "X-Mock-Status: "+tt.status, "X-Mock-Error-Shape: "+tt.shape)
			if r.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d: %s", r.status, tt.wantStatus, r.body)
			}
			if got := r.json("error.type").String(); got != tt.wantType {
				t.Errorf("type = %q, want %q", got, tt.wantType)
			}
			if got := r.json("error.message").String(); !strings.Contains(got, tt.wantMessage) {
				t.Errorf("message = %q, want it to contain %q", got, tt.wantMessage)
			}
			if !r.json("error.code").Exists() || !r.json("error.param").Exists() {
				t.Errorf("error body lacks code or param: %s", r.body)
			}
			if tt.wantStatus != 400 && strings.Contains(string(r.body), tt.wantDetail) {
				t.Errorf("the client got the backend's own message: %s", r.body)
			}
			rec := h.recorder.wait(t, i+1)
			if rec.Error == "" || rec.Status != tt.wantStatus || rec.TotalTokens != 0 {
				t.Errorf("record = %+v", rec)
			}
			if !strings.Contains(rec.Error, tt.wantDetail) {
				t.Errorf("record error %q lacks the backend's detail %q", rec.Error, tt.wantDetail)
			}
		})
	}
}

func TestUpstreamUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	h := newHarness(t, harnessOptions{
		extraBackends: "  - name: dead\n    url: \"http://" + dead + "/v1\"\n",
		models:        "  - name: demo\n    backends: [dead]\n",
	})
	r := h.post(helloBody)
	if r.status != 502 || r.json("error.code").String() != "upstream_unavailable" {
		t.Fatalf("status %d body %s, want 502 upstream_unavailable", r.status, r.body)
	}
}

func TestUpstreamTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{backendExtra: "timeouts: {first_byte: 200ms}"})
	r := h.post(helloBody, "X-Mock-Delay: 1s")
	if r.status != 504 || r.json("error.code").String() != "upstream_timeout" {
		t.Fatalf("status %d body %s, want 504 upstream_timeout", r.status, r.body)
	}
}

func TestStreamErrorsInBand(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	tests := []struct {
		name           string
		header         string
		wantIncomplete bool
	}{
		{"in-band error from the backend", "X-Mock-Fail-After: 2", false},
		{"backend breaks the connection", "X-Mock-Break-After: 2", true},
		{"backend sends garbage", "X-Mock-Garbage: 1", true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"stream":true}`
			resp, err := http.DefaultClient.Do(h.request(body, tt.header))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			events := readEvents(t, bufio.NewReader(resp.Body))
			if len(events) < 2 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("stream must end with an error event and [DONE]: %v", events)
			}
			errEvent := events[len(events)-2]
			if !gjson.Get(errEvent, "error.message").Exists() {
				t.Errorf("last event before [DONE] is not an error: %s", errEvent)
			}
			rec := h.recorder.wait(t, i+1)
			if rec.Error == "" || rec.Incomplete != tt.wantIncomplete {
				t.Errorf("record = %+v", rec)
			}
		})
	}
}

func TestModelsAndHealth(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	req, _ := http.NewRequest(http.MethodGet, h.base+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&buf)
	resp.Body.Close()
	if resp.StatusCode != 200 || gjson.Get(buf.String(), "object").String() != "list" ||
		gjson.Get(buf.String(), "data.#(id==llama).object").String() != "model" {
		t.Fatalf("models: %d %s", resp.StatusCode, buf.String())
	}
	resp, err = http.Get(h.base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
}
