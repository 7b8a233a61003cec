package proxy_test

import (
	"strings"
	"testing"
)

// TestReloadAppliesRequestSettingsOnly reloads a configuration that lowers
// server.max_messages, which a reload applies, and raises
// server.max_body_bytes, which fasthttp holds from start: new requests get
// the new message cap, while the body limit, and the 413 that quotes it,
// stay at the running value.
func TestReloadAppliesRequestSettingsOnly(t *testing.T) {
	h := newHarness(t, harnessOptions{server: "max_messages: 4, max_body_bytes: 4096"})
	threeMessages := `{"model":"demo","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`
	if r := h.post(threeMessages); r.status != 200 {
		t.Fatalf("three messages under max_messages 4: %d %s", r.status, r.body)
	}

	next := *h.cfg
	next.Server.MaxMessages = 2
	next.Server.MaxBodyBytes = 1 << 20
	h.reload(&next)
	r := h.post(threeMessages)
	if r.status != 400 || r.json("error.message").String() != "messages has 3 entries; the gateway accepts at most 2." ||
		r.json("error.param").String() != "messages" {
		t.Fatalf("three messages after max_messages was reloaded to 2: %d %s", r.status, r.body)
	}
	// Over the running 4096 bytes, well under the reloaded 1 MiB.
	big := `{"model":"demo","messages":[{"role":"user","content":"` + strings.Repeat("x", 8000) + `"}]}`
	r = h.post(big)
	if r.status != 413 || r.json("error.message").String() != "The request body exceeds the gateway's limit of 4096 bytes." {
		t.Fatalf("a body over the running max_body_bytes after a reload that raised it: %d %s", r.status, r.body)
	}
	// Under the running limit, the request is served.
	if r := h.post(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`); r.status != 200 {
		t.Fatalf("a small request after the reload: %d %s", r.status, r.body)
	}
}

// TestProjectHeaderRefusalSaysItOnce checks the 400 for a malformed
// Compat-Project header word for word.
func TestProjectHeaderRefusalSaysItOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	r := h.post(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`, "Compat-Project: acme/chat/bot")
	if r.status != 400 || r.json("error.code").String() != "invalid_project" ||
		r.json("error.message").String() != "Invalid Compat-Project header: want <team>/<project>, with at most one slash." {
		t.Fatalf("malformed Compat-Project: %d %s", r.status, r.body)
	}
}
