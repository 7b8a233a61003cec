package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tidwall/gjson"
)

// TestRecordKeepsCompletionID: the usage record keeps the id and the date
// of the completion the client was given, streamed or not, by which the
// trace service joins a Weave SDK's call of it to the gateway's.
func TestRecordKeepsCompletionID(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	r := h.post(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	id, created := r.json("id").String(), r.json("created").Int()
	if id == "" || created == 0 {
		t.Fatalf("reply without id or created: %s", r.body)
	}
	if rec := h.recorder.wait(t, 1); rec.CompletionID != id || rec.CompletionCreated != created {
		t.Fatalf("record's completion %q created %d, reply's %q created %d", rec.CompletionID, rec.CompletionCreated, id, created)
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
	streamed, streamedAt := gjson.Get(events[0], "id").String(), gjson.Get(events[0], "created").Int()
	if streamed == "" || streamed == id || streamedAt == 0 {
		t.Fatalf("first chunk's id %q created %d (the other completion's %q)", streamed, streamedAt, id)
	}
	if rec := h.recorder.wait(t, 2); rec.CompletionID != streamed || rec.CompletionCreated != streamedAt {
		t.Fatalf("stream record's completion %q created %d, chunks' %q created %d",
			rec.CompletionID, rec.CompletionCreated, streamed, streamedAt)
	}

	// A response is dated by its created_at.
	r = h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"hi"}`)
	id, created = r.json("id").String(), r.json("created_at").Int()
	if r.status != http.StatusOK || id == "" || created == 0 {
		t.Fatalf("status %d, response without id or created_at: %s", r.status, r.body)
	}
	if rec := h.recorder.wait(t, 3); rec.CompletionID != id || rec.CompletionCreated != created {
		t.Fatalf("response record's completion %q created %d, response's %q created_at %d",
			rec.CompletionID, rec.CompletionCreated, id, created)
	}

	// A streamed response, by the response object its events carry, whole
	// in response.created.
	r = h.send(http.MethodPost, "/v1/responses", `{"model":"demo","input":"hi","stream":true}`)
	events = readEvents(t, bufio.NewReader(bytes.NewReader(r.body)))
	if r.status != http.StatusOK || len(events) < 2 || gjson.Get(events[0], "type").Str != "response.created" ||
		gjson.Get(events[len(events)-1], "type").Str != "response.completed" {
		t.Fatalf("status %d, events %q", r.status, events)
	}
	streamed, streamedAt = gjson.Get(events[0], "response.id").Str, gjson.Get(events[0], "response.created_at").Int()
	if streamed == "" || streamed == id || streamedAt == 0 ||
		gjson.Get(events[len(events)-1], "response.id").Str != streamed {
		t.Fatalf("response.created's id %q created_at %d (the other response's %q), events %q", streamed, streamedAt, id, events)
	}
	if rec := h.recorder.wait(t, 4); rec.CompletionID != streamed || rec.CompletionCreated != streamedAt || !rec.Stream {
		t.Fatalf("streamed response record's completion %q created %d stream %v, events' %q created_at %d",
			rec.CompletionID, rec.CompletionCreated, rec.Stream, streamed, streamedAt)
	}
}

// TestRecordKeepsLastChunkDate: a backend that dates every chunk (as
// llama.cpp and Ollama do) crosses a second in a long stream; the record
// keeps the last date that is not 0, which is what the Weave SDK's stream
// reducer keeps as its call's output, so that both sides key the link
// alike.
func TestRecordKeepsLastChunkDate(t *testing.T) {
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range []string{
			`{"id":"chatcmpl-dated","object":"chat.completion.chunk","created":1764000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}]}`,
			`{"id":"chatcmpl-dated","object":"chat.completion.chunk","created":1764000001,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}`,
			`{"id":"chatcmpl-dated","object":"chat.completion.chunk","created":0,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", c)
		}
		io.WriteString(w, "data: [DONE]\n\n") //nolint:errcheck // the test reads what arrived
	}))
	h := newHarness(t, harnessOptions{
		extraBackends: fmt.Sprintf("  - name: dated\n    url: \"http://%s/v1\"\n", upstream.Listener.Addr()),
		models:        "  - name: dated\n    backends: [dated]\n",
	})
	upstream.Start()
	t.Cleanup(upstream.Close)
	status, events := h.stream(`{"model":"dated","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if status != http.StatusOK || len(events) < 2 {
		t.Fatalf("status %d, events %q", status, events)
	}
	if rec := h.recorder.wait(t, 1); rec.CompletionID != "chatcmpl-dated" || rec.CompletionCreated != 1764000001 {
		t.Fatalf("record's completion %q created %d, want chatcmpl-dated created 1764000001", rec.CompletionID, rec.CompletionCreated)
	}
}
