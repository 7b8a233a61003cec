package proxy

import (
	"bufio"
	"encoding/base64"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
)

// TestHeaderReceived checks which requests may send a large body: only
// those with a valid key, however the key is sent; and that the check
// allocates nothing, on the path of every request with a large body.
func TestHeaderReceived(t *testing.T) {
	const secret = "sk-preauth-valid"
	keys, err := auth.NewKeyring(config.Auth{Keys: []config.Key{{Name: "k", Key: secret, Teams: []string{"acme"}, DefaultTeam: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{keys: keys}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("api:"+secret))
	large := "Content-Length: 1048576\r\n"
	tests := []struct {
		name, headers string
		wantLimit     int // 0: the server's own
	}{
		{"no body", "", 0},
		{"small body, no key", "Content-Length: 100\r\n", 0},
		{"body at the allowance, no key", "Content-Length: 8192\r\n", 0},
		{"large body, no key", large, unauthenticatedBodyBytes},
		{"chunked, no key", "Transfer-Encoding: chunked\r\n", unauthenticatedBodyBytes},
		{"large body, wrong key", large + "Authorization: Bearer sk-wrong\r\n", unauthenticatedBodyBytes},
		{"large body, malformed Basic", large + "Authorization: Basic !!!\r\n", unauthenticatedBodyBytes},
		{"large body, Bearer key", large + "Authorization: Bearer " + secret + "\r\n", 0},
		{"chunked, Bearer key", "Transfer-Encoding: chunked\r\nAuthorization: Bearer " + secret + "\r\n", 0},
		{"large body, Basic key", large + "Authorization: " + basic + "\r\n", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n" + tt.headers + "\r\n"
			if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				t.Fatal(err)
			}
			if got := s.headerReceived(&h).MaxRequestBodySize; got != tt.wantLimit {
				t.Fatalf("body limit %d, want %d", got, tt.wantLimit)
			}
			if allocs := testing.AllocsPerRun(100, func() { s.headerReceived(&h) }); allocs != 0 {
				t.Errorf("%v allocations per request", allocs)
			}
		})
	}
}

// failingListener fails its first accepts with err, then returns conn,
// then reports itself closed.
type failingListener struct {
	net.Listener
	fails int
	err   error
	conn  net.Conn
}

func (l *failingListener) Accept() (net.Conn, error) {
	switch {
	case l.fails > 0:
		l.fails--
		return nil, l.err
	case l.conn != nil:
		c := l.conn
		l.conn = nil
		return c, nil
	}
	return nil, net.ErrClosed
}

// TestAcceptRetries checks that accepts failing for want of descriptors
// are counted and retried, never returned, and that a closed listener
// ends Accept.
func TestAcceptRetries(t *testing.T) {
	s := &Server{listenerMetrics: newListenerMetrics(nil), log: zap.NewNop()}
	client, server := net.Pipe()
	defer client.Close()
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	ln := s.newLimitListener(&failingListener{fails: 3, err: emfile, conn: server}, listenerOptions{name: "proxy", max: 1})
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("Accept: %v, want the connection after the failures", err)
	}
	defer c.Close()
	if got := testutil.ToFloat64(s.listenerMetrics.acceptErrors.WithLabelValues("proxy")); got != 3 {
		t.Errorf("accept errors counted: %v, want 3", got)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept on a closed listener: %v, want net.ErrClosed", err)
	}
}

// TestAcceptEndsOnceClosed: a listener whose Accept after Close fails
// with an error that is not net.ErrClosed (fasthttputil's in-memory one)
// still ends Serve once closed, rather than being retried for ever.
func TestAcceptEndsOnceClosed(t *testing.T) {
	s := &Server{listenerMetrics: newListenerMetrics(nil), log: zap.NewNop()}
	ln := s.newLimitListener(fasthttputil.NewInmemoryListener(), listenerOptions{name: "proxy", max: 1})
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Accept on a closed listener returned a connection")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept on a closed in-memory listener kept retrying")
	}
}
