package proxy

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestRedactSecrets(t *testing.T) {
	tests := []struct{ in, leak string }{
		{`error when serving connection "127.0.0.1:8080"<->"127.0.0.1:5555": invalid header value "Bearer sk-live-123456\x01"`, "sk-live-123456"},
		{`cannot find whitespace in the first line of request "POST /v1 HTTP/1.1\r\nAuthorization: Bearer abcdef"`, "abcdef"},
		{`Authorization: Bearer tok_9f8e7d6c5b`, "tok_9f8e7d6c5b"},
		{`key sk-proj-AbC123_def in a message`, "sk-proj-AbC123_def"},
		{`basic dXNlcjpwYXNz`, "dXNlcjpwYXNz"},
	}
	for _, tt := range tests {
		got := redactSecrets(tt.in)
		if strings.Contains(got, tt.leak) || !strings.Contains(got, "[redacted]") {
			t.Errorf("redactSecrets(%q) = %q", tt.in, got)
		}
	}
	if got := redactSecrets("Permanent error when accepting new connections: too many open files"); got != "Permanent error when accepting new connections: too many open files" {
		t.Errorf("a message without secrets changed: %q", got)
	}
}

func TestRefuseBadFraming(t *testing.T) {
	tests := []struct {
		name, head string
		refused    bool
	}{
		{"plain", "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n", false},
		{"chunked", "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", false},
		{"both", "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", true},
		{"both, odd case", "POST /x HTTP/1.1\r\nHost: a\r\ncOnTeNt-LeNgTh: 2\r\nTRANSFER-ENCODING: chunked\r\n\r\n", true},
		{"space before colon", "POST /x HTTP/1.1\r\nHost : a\r\n\r\n", true},
		{"value with spaces", "POST /x HTTP/1.1\r\nHost: a\r\nX-A: b : c\r\n\r\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ctx fasthttp.RequestCtx
			if err := ctx.Request.Header.Read(bufio.NewReader(strings.NewReader(tt.head))); err != nil {
				t.Fatal(err)
			}
			called := false
			RefuseBadFraming(func(*fasthttp.RequestCtx) { called = true })(&ctx)
			if refused := ctx.Response.StatusCode() == 400 && !called; refused != tt.refused {
				t.Errorf("refused = %v (status %d, handler called %v), want %v", refused, ctx.Response.StatusCode(), called, tt.refused)
			}
			if tt.refused && !ctx.Response.ConnectionClose() {
				t.Error("a refused request leaves its connection open")
			}
		})
	}
}
