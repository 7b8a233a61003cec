package proxy_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/scripted"
)

// bareBackendKey is a backend's API key in no shape a pattern knows: no
// "sk-", no "Bearer" before it.
const bareBackendKey = "vllm-local-Q7x9Tz3Kp2Lm"

// TestBackendKeyRedactedByValue has a backend repeat its own configured
// key, bare, in its error text: a 400 passed on to the client, a 500
// described by the gateway, a 422 whose message is clipped in the middle of
// the key, and an in-band stream error. Neither the client's reply nor any
// log line nor the usage record's error may hold the key, or the clipped
// start of it; the rest of the backend's text still reaches the record.
func TestBackendKeyRedactedByValue(t *testing.T) {
	http := func(status, contentType, body string) string {
		return fmt.Sprintf("HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", status, contentType, len(body), body)
	}
	// The 422's message is 1,024 bytes (the clip) before the key's ninth
	// byte: the client's copy ends with the key's first eight.
	clipped := strings.Repeat("x", 1024-8) + bareBackendKey
	tests := []struct {
		name, reply, body string
		wantStatus        int
		wantInReply       string // backend text the client still sees
	}{
		{"400 passed on", http("400 Bad Request", "application/json",
			`{"error":{"message":"upstream key `+bareBackendKey+` may not set max_tokens","type":"BadRequestError","param":"max_tokens","code":400}}`),
			badBody, 400, "may not set max_tokens"},
		{"500 described", http("500 Internal Server Error", "text/plain",
			"Traceback: auth failed for api_key="+bareBackendKey+" at worker 3"),
			badBody, 502, ""},
		{"422 clipped in the key", http("422 Unprocessable Entity", "application/json",
			`{"object":"error","message":"`+clipped+`"}`),
			badBody, 422, "xxxx"},
		{"in-band stream error", http("200 OK", "text/event-stream",
			`data: {"error":{"message":"engine died holding `+bareBackendKey+`"}}`+"\n\n"),
			badStreamBody, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up, err := scripted.Start(func(c net.Conn) { _, _ = io.WriteString(c, tt.reply) })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = up.Close() })
			log, logs := debugLogger()
			h := newHarness(t, harnessOptions{
				log: log,
				extraBackends: fmt.Sprintf("  - name: keyed\n    url: \"http://%s/v1\"\n    api_key: %q\n    max_conns: 1\n",
					up.Addr(), bareBackendKey),
				models: "  - name: bad\n    backends: [keyed]\n",
			})
			r := h.post(tt.body)
			if r.status != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tt.wantStatus, r.body)
			}
			if !strings.Contains(string(r.body), tt.wantInReply) {
				t.Errorf("the reply lost the backend's text %q: %s", tt.wantInReply, r.body)
			}
			rec := h.recorder.wait(t, 1)
			if !strings.Contains(rec.Error, "[redacted]") {
				t.Errorf("the record's error shows no redaction: %q", rec.Error)
			}
			// The key's first eight bytes: what a clip could leave.
			leak := bareBackendKey[:8]
			for what, text := range map[string]string{
				"the client's reply":      string(r.body),
				"the record's error":      rec.Error,
				"the record's output":     string(rec.Output),
				"the gateway's log lines": logs.String(),
			} {
				if strings.Contains(text, leak) {
					t.Errorf("%s holds the backend's key:\n%s", what, text)
				}
			}
		})
	}
}
