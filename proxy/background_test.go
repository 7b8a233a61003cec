package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/proxy"
)

// send makes a request with the test key to path and reads the reply.
func (h *harness) send(method, path, body string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.base+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	body2, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: body2}
}

// TestBackgroundResponseIsCharged makes a background response, answered
// "queued" with no usage, and checks that the gateway's poller records its
// usage once it finished, exactly once: a GET through the gateway later
// records nothing more. (A GET or cancel that sees it finished first
// settles it: TestBackgroundResponseHoldsBudget.)
func TestBackgroundResponseIsCharged(t *testing.T) {
	h := newHarness(t, harnessOptions{sim: simulated.Options{Tokens: 5}})
	queued := h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"Say hi","background":true}`)
	if queued.status != http.StatusOK || queued.json("status").Str != "queued" || queued.json("usage").Value() != nil {
		t.Fatalf("create: %d %s", queued.status, queued.body)
	}
	id := queued.json("id").Str

	// The poller finds the response completed and records its usage,
	// with no client asking.
	rec := h.recorder.wait(t, 1)
	final := h.send(http.MethodGet, "/v1/responses/"+id, "")
	if final.json("status").Str != "completed" {
		t.Fatalf("GET: %d %s", final.status, final.body)
	}
	in, out := final.json("usage.input_tokens").Int(), final.json("usage.output_tokens").Int()
	if out != 5 || in == 0 {
		t.Fatalf("usage of the finished response: %s", final.json("usage").Raw)
	}
	if rec.PromptTokens != in || rec.CompletionTokens != out || rec.TotalTokens != in+out || rec.Status != http.StatusOK ||
		rec.Error != "" || rec.Team != "acme" || rec.Model != "demo" || rec.Backend != "sim" || rec.CompletionID != id {
		t.Fatalf("record = %+v, want %d + %d tokens of %s", rec, in, out, id)
	}
	// Reading it again through the gateway records nothing more.
	h.send(http.MethodGet, "/v1/responses/"+id, "")
	// A later request's record comes next: none was made in between.
	h.postOK(`{"model":"demo","messages":[{"role":"user","content":"x"}]}`)
	if r := h.recorder.wait(t, 2); r.Endpoint != "chat.completions" {
		t.Fatalf("second record = %+v, want the chat completion's", r)
	}
	if n := h.recorder.count(); n != 2 {
		t.Fatalf("%d records, want 2", n)
	}
}

// TestBackgroundResponseHoldsBudget checks that a background response
// still running keeps its reservation: the budget counts it until the
// response ends, here by a cancel through the gateway, which also records
// the request once.
func TestBackgroundResponseHoldsBudget(t *testing.T) {
	h := newHarness(t, harnessOptions{
		// A time to first token of an hour keeps the response running.
		sim:    simulated.Options{TimeToFirstToken: time.Hour, Tokens: 2},
		limits: []config.Limit{{Team: "acme", TokenBudget: 1000, BudgetWindow: "day"}},
	})
	queued := h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"x","background":true,"max_output_tokens":600}`)
	if queued.status != http.StatusOK || queued.json("status").Str != "queued" {
		t.Fatalf("create: %d %s", queued.status, queued.body)
	}
	id := queued.json("id").Str
	refused := h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"x","max_output_tokens":600,"background":true}`)
	if refused.status != http.StatusTooManyRequests || refused.json("error.code").Str != "insufficient_quota" {
		t.Fatalf("a second 600 while the first is running: %d %s, want 429 insufficient_quota", refused.status, refused.body)
	}
	if n := h.recorder.count(); n != 1 { // the refusal
		t.Fatalf("%d records while the response runs, want 1 (the refusal)", n)
	}
	c := h.send(http.MethodPost, "/v1/responses/"+id+"/cancel", "")
	if c.status != http.StatusOK || c.json("status").Str != "cancelled" {
		t.Fatalf("cancel: %d %s", c.status, c.body)
	}
	rec := h.recorder.wait(t, 2)
	if rec.CompletionID != id || rec.TotalTokens != 0 || !strings.Contains(rec.Error, "cancelled") {
		t.Fatalf("record of the cancelled response = %+v", rec)
	}
	// The reservation was settled at what the response used.
	if r := h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"x","max_output_tokens":600,"background":true}`); r.status != http.StatusOK {
		t.Fatalf("after the cancel: %d %s", r.status, r.body)
	}
}

// TestBackgroundResponsesBounded fills the set of background responses
// waiting for their usage and checks that one more is refused before it
// reaches the backend, and admitted again once one ended.
func TestBackgroundResponsesBounded(t *testing.T) {
	// One team may take every slot here: the shares of teams are
	// TestBackgroundTeamShare's.
	h := newHarness(t, harnessOptions{sim: simulated.Options{TimeToFirstToken: time.Hour, Tokens: 2}, server: "background_team_share: 100"})
	proxy.SetBackgroundCapacity(h.gw, 2)
	var ids []string
	for range 2 {
		r := h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"x","background":true}`)
		if r.status != http.StatusOK {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		ids = append(ids, r.json("id").Str)
	}
	sent := h.sim.Stats().Requests
	full := h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"x","background":true}`)
	if full.status != http.StatusServiceUnavailable || full.json("error.code").Str != "too_many_background_responses" ||
		!strings.Contains(full.json("error.message").Str, "limit of 2 background responses") ||
		full.header.Get("Retry-After") == "" {
		t.Fatalf("a third background response: %d %s", full.status, full.body)
	}
	if got := h.sim.Stats().Requests; got != sent {
		t.Fatalf("the refused request reached the backend (%d requests, want %d)", got, sent)
	}
	if c := h.send(http.MethodPost, "/v1/responses/"+ids[0]+"/cancel", ""); c.json("status").Str != "cancelled" {
		t.Fatalf("cancel: %d %s", c.status, c.body)
	}
	if r := h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"x","background":true}`); r.status != http.StatusOK {
		t.Fatalf("after a cancel: %d %s", r.status, r.body)
	}
}

// TestBackgroundResponseAtShutdown stops the gateway while a background
// response runs: the request is recorded then, with no tokens and an
// error saying its usage is not known, rather than lost.
func TestBackgroundResponseAtShutdown(t *testing.T) {
	var h *harness
	var id string
	t.Cleanup(func() {
		// Cleanups run last registered first: the harness has stopped
		// the gateway by now.
		rec := h.recorder.wait(t, 1)
		if rec.CompletionID != id || rec.TotalTokens != 0 || rec.Status != http.StatusOK ||
			!strings.Contains(rec.Error, "the gateway stopped before background response "+id+" finished") {
			t.Errorf("record at shutdown = %+v", rec)
		}
		if n := h.recorder.count(); n != 1 {
			t.Errorf("%d records, want 1", n)
		}
	})
	h = newHarness(t, harnessOptions{sim: simulated.Options{TimeToFirstToken: time.Hour, Tokens: 2}})
	r := h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"x","background":true}`)
	if r.status != http.StatusOK || r.json("status").Str != "queued" {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	id = r.json("id").Str
	if n := h.recorder.count(); n != 0 {
		t.Fatalf("%d records while the response runs, want 0", n)
	}
}

// TestBackgroundTeamShare floods the gateway with background responses
// from team rival: past its share of the slots (a quarter of 8 here) it
// gets a 429 with Retry-After, before any backend hears of the request,
// while team acme still gets its background responses; and rival gets a
// slot again once one of its own finished.
func TestBackgroundTeamShare(t *testing.T) {
	s := newSurface(t)
	proxy.SetBackgroundCapacity(s.gw, 8)
	const body = `{"model":"demo","input":"long","background":true}`
	var rivals []string
	for i := range 6 {
		r := s.doAs(rivalKey, http.MethodPost, "/v1/responses", body)
		if i < 2 {
			if r.status != http.StatusOK || r.json("status").String() != "queued" {
				t.Fatalf("rival's background response %d within its share: %d %s", i, r.status, r.body)
			}
			rivals = append(rivals, r.json("id").String())
			continue
		}
		wantOpenAIError(t, r, http.StatusTooManyRequests, "rate_limit_exceeded")
		if r.header.Get("Retry-After") == "" || !strings.Contains(r.json("error.message").String(), "Team rival has 2 background responses running") {
			t.Fatalf("rival's background response %d past its share: %s (Retry-After %q)", i, r.body, r.header.Get("Retry-After"))
		}
	}
	if n := len(s.upstreamCalls()); n != 2 {
		t.Errorf("backends received %d requests, want only rival's 2 admitted", n)
	}
	for i := range 2 {
		r := s.do(http.MethodPost, "/v1/responses", body)
		if r.status != http.StatusOK || r.json("status").String() != "queued" {
			t.Fatalf("acme's background response %d while rival floods: %d %s", i, r.status, r.body)
		}
	}
	// One of rival's ends (a cancel seen through the gateway settles it):
	// its slot is rival's again.
	if c := s.doAs(rivalKey, http.MethodPost, "/v1/responses/"+rivals[0]+"/cancel", ""); c.json("status").String() != "cancelled" {
		t.Fatalf("cancel: %d %s", c.status, c.body)
	}
	if r := s.doAs(rivalKey, http.MethodPost, "/v1/responses", body); r.status != http.StatusOK {
		t.Fatalf("rival after one of its responses ended: %d %s", r.status, r.body)
	}
}
