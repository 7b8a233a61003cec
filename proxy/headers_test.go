package proxy

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestHeaderNamesCanonical guards serve's and attempt's DisableNormalizing:
// with it, a name Peeked or Set that is not in fasthttp's canonical form
// would miss the client's header, or go out in another case.
func TestHeaderNamesCanonical(t *testing.T) {
	for _, name := range []string{
		headerRequestID, headerProject, headerTraceID, headerParentID, headerCallID,
		headerTraceparent, headerServedModel, "X-Accel-Buffering",
		fasthttp.HeaderConnection, fasthttp.HeaderAuthorization, fasthttp.HeaderRetryAfter,
		fasthttp.HeaderCacheControl, fasthttp.HeaderAllow,
	} {
		t.Run(name, func(t *testing.T) {
			var h fasthttp.ResponseHeader
			h.Set(name, "v") // normalizes the name
			for k := range h.All() {
				if string(k) == name {
					return
				}
			}
			t.Errorf("%q is not canonical: fasthttp stores it as another name", name)
		})
	}
}

// TestForwardHeadersNormalizingOff checks that the upstream request gets
// the client's end-to-end headers, and none of the dropped ones, when
// both headers have normalizing off, as in attempt.
func TestForwardHeadersNormalizingOff(t *testing.T) {
	var src fasthttp.RequestHeader
	if err := src.Read(bufio.NewReader(strings.NewReader("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nauthorization: Bearer sk\r\n" +
		"content-type: application/json\r\nx-custom-thing: 1\r\nconnection: keep-alive, x-hop\r\nx-hop: 2\r\n" +
		"compat-project: t/p\r\naccept-encoding: gzip\r\nuser-agent: ua\r\nx-request-id: r1\r\n\r\n"))); err != nil {
		t.Fatal(err)
	}
	src.DisableNormalizing()
	var dst fasthttp.RequestHeader
	dst.DisableNormalizing()
	forwardHeaders(&dst, &src)
	got := map[string]string{}
	for k, v := range dst.All() {
		got[string(k)] = string(v)
	}
	for _, name := range []string{"X-Custom-Thing", "User-Agent"} {
		if _, ok := got[name]; !ok {
			t.Errorf("%s not forwarded; got %v", name, got)
		}
	}
	for _, name := range []string{"Authorization", "Connection", "X-Hop", "Compat-Project", "Accept-Encoding", "X-Request-Id", "Host"} {
		if v, ok := got[name]; ok {
			t.Errorf("%s forwarded (%q)", name, v)
		}
	}
}

func TestDropHeader(t *testing.T) {
	for _, h := range droppedRequestHeaders {
		for _, name := range []string{string(h), strings.ToLower(string(h)), strings.ToUpper(string(h))} {
			if !dropHeader([]byte(name), nil) {
				t.Errorf("%s is forwarded", name)
			}
		}
	}
	for _, tt := range []struct {
		name, connection string
		drop             bool
	}{
		{"Compat-Trace-Id", "", true},
		{"compat-anything", "", true},
		{"X-Hop", "keep-alive, x-hop", true},
		{"X-Hop", "keep-alive", false},
		{"User-Agent", "", false},
		{"X-Custom-Thing", "", false},
		{"Hosts", "", false},
		{"Te-", "", false},
		{"A-Header-Name-Longer-Than-Any-Dropped-One", "", false},
		{"", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := dropHeader([]byte(tt.name), []byte(tt.connection)); got != tt.drop {
				t.Errorf("dropHeader(%q, %q) = %v, want %v", tt.name, tt.connection, got, tt.drop)
			}
		})
	}
}

// TestReadClientHeadersMatchesPeek checks the one pass of serve against a
// Peek of each name, as serve did before, on parsed requests with
// normalizing off: names in any case, duplicates (the first wins, empty or
// not), cookies, Connection: close, and headers absent.
func TestReadClientHeadersMatchesPeek(t *testing.T) {
	for _, tt := range []struct {
		name    string
		headers string
	}{
		{"none", "Host: gw\r\n"},
		{"all", "Host: gw\r\nAuthorization: Bearer sk\r\nX-Request-Id: r1\r\nCompat-Project: t/p\r\nCompat-Trace-Id: tr\r\n" +
			"Compat-Parent-Id: pa\r\nTraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"},
		{"lower case", "host: gw\r\nauthorization: Bearer sk\r\nx-request-id: r1\r\ncompat-project: t/p\r\ncompat-trace-id: tr\r\n" +
			"compat-parent-id: pa\r\ntraceparent: tp\r\n"},
		{"duplicates", "Host: gw\r\nX-Request-Id: r1\r\nAuthorization: Bearer a\r\nX-Request-Id: r2\r\nAuthorization: Bearer b\r\n"},
		{"empty first", "Host: gw\r\nX-Request-Id:\r\nX-Request-Id: r2\r\nCompat-Project: \r\nCompat-Project: t\r\n"},
		{"cookies and close", "Host: gw\r\nCookie: a=1\r\nAuthorization: Bearer sk\r\nConnection: close\r\nCookie: b=2\r\nCompat-Trace-Id: tr\r\n"},
		{"specials", "Host: gw\r\nContent-Type: application/json\r\nUser-Agent: x\r\nContent-Length: 0\r\nCompat-Parent-Id: pa\r\n"},
		{"near names", "Host: gw\r\nX-Request-Ids: no\r\nCompat-Trace: no\r\nAuthorizatio: no\r\nTraceparent: tp\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			if err := h.Read(bufio.NewReader(strings.NewReader("POST /v1/chat/completions HTTP/1.1\r\n" + tt.headers + "\r\n"))); err != nil {
				t.Fatal(err)
			}
			h.DisableNormalizing()
			got := readClientHeaders(&h)
			for _, c := range []struct {
				name string
				got  []byte
			}{
				{fasthttp.HeaderAuthorization, got.authorization}, {headerRequestID, got.requestID}, {headerProject, got.project},
				{headerTraceID, got.traceID}, {headerParentID, got.parentID}, {headerTraceparent, got.traceparent},
			} {
				if want := h.Peek(c.name); !bytes.Equal(c.got, want) {
					t.Errorf("%s = %q, Peek says %q", c.name, c.got, want)
				}
			}
		})
	}
}
