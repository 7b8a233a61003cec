package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/scripted"
)

// TestClientRequestIDBoundedAtEntry: a body's request_id, which a backend
// names its completion or stored response after (vLLM does), is refused
// with a 400 in OpenAI's shape naming the field when it is longer than
// 128 bytes or holds a NUL or other byte a client id may not, on every
// endpoint that forwards it; nothing reaches the backend or the usage
// records. A valid one passes.
func TestClientRequestIDBoundedAtEntry(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	long := strings.Repeat("r", 3000)
	endpoints := []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"hi"}],"request_id":%s}`},
		{"/v1/completions", `{"model":"demo","prompt":"hi","request_id":%s}`},
		{"/v1/embeddings", `{"model":"demo","input":"hi","request_id":%s}`},
		{"/v1/responses", `{"model":"demo","input":"hi","request_id":%s}`},
	}
	ids := []struct{ name, json string }{
		{"3 KB", `"` + long + `"`},
		{"129 bytes", `"` + strings.Repeat("r", 129) + `"`},
		{"escaped NUL", `"req-\u0000-1"`},
		{"a space", `"req 1"`},
		{"not ASCII", `"req-é"`},
	}
	for _, ep := range endpoints {
		for _, id := range ids {
			t.Run(ep.path+"/"+id.name, func(t *testing.T) {
				r := h.send(http.MethodPost, ep.path, fmt.Sprintf(ep.body, id.json))
				if r.status != http.StatusBadRequest || r.json("error.param").Str != "request_id" ||
					r.json("error.type").Str != "invalid_request_error" ||
					!strings.Contains(r.json("error.message").Str, "at most 128 visible ASCII characters") {
					t.Fatalf("status %d, body %.300s; want a 400 naming request_id", r.status, r.body)
				}
				if bytes.Contains(r.body, []byte(long)) {
					t.Errorf("the error repeats the 3 KB id")
				}
			})
		}
	}
	if n := h.recorder.count(); n != 0 {
		t.Errorf("%d usage records of refused requests", n)
	}
	r := h.send(http.MethodPost, "/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"hi"}],"request_id":"req-Valid_1.2"}`)
	if r.status != http.StatusOK {
		t.Fatalf("valid request_id: status %d, body %s", r.status, r.body)
	}
}

// TestBackendIDBoundedWhereRead: a backend whose completion ids are 3 KB
// or hold a NUL (as a vLLM would answer a client's request_id, were it not
// bounded at entry) is still served, the reply as the backend sent it, and
// its usage is recorded exactly, but the record keeps no id: a store
// cannot index or hold it. A valid id is kept. Streamed and not.
func TestBackendIDBoundedWhereRead(t *testing.T) {
	long := "chatcmpl-" + strings.Repeat("x", 3000)
	tests := []struct {
		name   string
		idJSON string // the id as the reply writes it
		want   string // the record's CompletionID
	}{
		{"3 KB", `"` + long + `"`, ""},
		{"escaped NUL", `"chatcmpl-a\u0000b"`, ""},
		{"raw control byte escaped", `"chatcmpl-a\u0007b"`, ""},
		{"valid", `"chatcmpl-fine-1"`, "chatcmpl-fine-1"},
	}
	var reply atomic.Value // string: the raw HTTP response the backend writes next
	up, err := scripted.Start(func(c net.Conn) {
		_, _ = io.WriteString(c, reply.Load().(string))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	h := newHarness(t, harnessOptions{
		extraBackends: "  - name: ext\n    url: \"http://" + up.Addr() + "/v1\"",
		models:        "  - name: demo\n    backends: [ext]\n",
	})
	records := 0
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"id":` + tt.idJSON + `,"object":"chat.completion","created":1700000000,"model":"demo",` +
				`"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`
			reply.Store(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
			r := h.post(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`)
			if r.status != http.StatusOK || r.json("id").Raw != tt.idJSON {
				t.Fatalf("status %d, id %.80s; want 200 and the backend's id as sent", r.status, r.json("id").Raw)
			}
			records++
			rec := h.recorder.wait(t, records)
			if rec.CompletionID != tt.want || rec.PromptTokens != 7 || rec.TotalTokens != 10 || rec.Error != "" {
				t.Errorf("record: completion id %.40q (%d bytes), tokens %d/%d, error %q; want %q, 7/10, none",
					rec.CompletionID, len(rec.CompletionID), rec.PromptTokens, rec.TotalTokens, rec.Error, tt.want)
			}

			chunk := func(data string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(data), data) }
			ev := func(json string) string { return chunk("data: " + json + "\n\n") }
			reply.Store("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
				ev(`{"id":`+tt.idJSON+`,"object":"chat.completion.chunk","created":1700000000,"model":"demo","choices":[{"index":0,"delta":{"content":"hi"}}]}`) +
				ev(`{"id":`+tt.idJSON+`,"object":"chat.completion.chunk","created":1700000000,"model":"demo","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`) +
				chunk("data: [DONE]\n\n") + "0\r\n\r\n")
			resp, err := http.DefaultClient.Do(h.request(`{"model":"demo","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			events := readEvents(t, bufio.NewReader(resp.Body))
			if resp.StatusCode != http.StatusOK || len(events) == 0 || gjson.Get(events[0], "id").Raw != tt.idJSON {
				t.Fatalf("stream: status %d, events %.200q", resp.StatusCode, events)
			}
			records++
			rec = h.recorder.wait(t, records)
			if rec.CompletionID != tt.want || rec.PromptTokens != 7 || rec.TotalTokens != 10 || rec.Error != "" {
				t.Errorf("stream record: completion id %.40q (%d bytes), tokens %d/%d, error %q; want %q, 7/10, none",
					rec.CompletionID, len(rec.CompletionID), rec.PromptTokens, rec.TotalTokens, rec.Error, tt.want)
			}
		})
	}
}
