package proxy_test

import (
	"bufio"
	"net/http"
	"testing"

	"github.com/tidwall/gjson"
)

// TestRecordKeepsCompletionID: the usage record keeps the id of the
// completion the client was given, streamed or not, by which the trace
// service joins a Weave SDK's call of it to the gateway's.
func TestRecordKeepsCompletionID(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	r := h.post(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	id := r.json("id").String()
	if id == "" {
		t.Fatalf("reply without id: %s", r.body)
	}
	if rec := h.recorder.wait(t, 1); rec.CompletionID != id {
		t.Fatalf("record's completion id %q, reply's %q", rec.CompletionID, id)
	}

	resp, err := http.DefaultClient.Do(h.request(`{"model":"demo","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := readEvents(t, bufio.NewReader(resp.Body))
	if len(events) == 0 {
		t.Fatal("no events")
	}
	streamed := gjson.Get(events[0], "id").String()
	if streamed == "" || streamed == id {
		t.Fatalf("first chunk's id %q (the other completion's %q)", streamed, id)
	}
	if rec := h.recorder.wait(t, 2); rec.CompletionID != streamed {
		t.Fatalf("stream record's completion id %q, chunks' %q", rec.CompletionID, streamed)
	}
}
