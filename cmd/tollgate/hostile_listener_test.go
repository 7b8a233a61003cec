package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// The gateway's listeners against clients with no key, run as the binary
// under a lowered open-file limit: a connection flood, bodies declared
// large and sent slowly, clients that stop reading, and ambiguous framing.
// Each test bounds its connections (a few hundred) and its time (seconds).

const hostileKey = "sk-hostile-listener-key"

// hostileConfig is the binary's config: a simulated backend, the store in
// dir, admin_listen on adminAddr, and server settings.
func hostileConfig(dir, adminAddr, server string) string {
	return fmt.Sprintf(`
log: {level: info}
admin_listen: %q
auth:
  keys:
    - {name: hostile, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: sim
    simulated: {tokens: 4}
models:
  - name: demo
    backends: [sim]
store: {path: %q}
server: {shutdown_timeout: 5s%s}
`, adminAddr, hostileKey, filepath.Join(dir, "usage.db"), server)
}

// listenerGateway is the binary running with both listeners.
type listenerGateway struct {
	*gatewayProcess
	proxyAddr, adminAddr string
}

// startListenerGateway runs bin with an open-file limit of nofile (soft
// and hard, so that the Go runtime cannot raise it; zero leaves it), on
// hostileConfig with server.
func startListenerGateway(t *testing.T, bin string, nofile int, server string) *listenerGateway {
	t.Helper()
	if nofile > 0 {
		// A wrapper that lowers the limit and execs the gateway, which
		// keeps its pid.
		wrapper := filepath.Join(t.TempDir(), "tollgate-limited")
		script := fmt.Sprintf("#!/bin/sh\nulimit -n %d || exit 1\nexec %q \"$@\"\n", nofile, bin)
		if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
			t.Fatal(err)
		}
		bin = wrapper
	}
	adminAddr := freePort(t)
	p := startGatewayProcess(t, bin, hostileConfig(t.TempDir(), adminAddr, server), false)
	g := &listenerGateway{gatewayProcess: p, proxyAddr: strings.TrimPrefix(p.base, "http://"), adminAddr: adminAddr}
	if nofile > 0 {
		limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", p.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("Max open files            %d                  %d", nofile, nofile); !strings.Contains(string(limits), want) {
			t.Fatalf("the gateway's limits lack %q:\n%s", want, limits)
		}
	}
	g.waitServing(t, adminAddr, "/metrics", hostileKey)
	return g
}

// exited reports whether the process has exited, and how.
func (g *listenerGateway) exited() (bool, error) {
	select {
	case err := <-g.done:
		g.done <- err
		return true, err
	default:
		return false, nil
	}
}

// requireRunning fails the test when the gateway has exited.
func (g *listenerGateway) requireRunning(t *testing.T) {
	t.Helper()
	if gone, err := g.exited(); gone {
		t.Fatalf("the gateway exited (%v)\n%s", err, g.output())
	}
}

// get sends a GET with key to addr and returns the status and body.
func get(addr, path, key string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// waitServing asks addr for path until it answers 200, for up to ten
// seconds (a listener that ran out of descriptors retries its accepts
// after a backoff of up to a second), failing the test if the gateway
// exits or never answers.
func (g *listenerGateway) waitServing(t *testing.T, addr, path, key string) string {
	t.Helper()
	var (
		code int
		body string
		err  error
	)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		g.requireRunning(t)
		if code, body, err = get(addr, path, key); err == nil && code == http.StatusOK {
			return body
		}
	}
	t.Fatalf("GET %s%s: %d %v %.300s\n%s", addr, path, code, err, body, g.output())
	return ""
}

// chat sends a keyed chat completion to the proxy listener and checks the
// reply is one.
func (g *listenerGateway) chat(t *testing.T) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+g.proxyAddr+"/v1/chat/completions",
		strings.NewReader(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+hostileKey)
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("chat completion: %v\n%s", err, g.output())
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || gjson.Get(string(body), "object").String() != "chat.completion" ||
		gjson.Get(string(body), "choices.0.message.content").String() == "" {
		t.Fatalf("chat completion: %d %.300s", resp.StatusCode, body)
	}
}

// metric returns the value of series ("name{labels}" as exposed) in a
// scrape of the admin listener's /metrics; zero when absent.
func (g *listenerGateway) metric(t *testing.T, series string) float64 {
	t.Helper()
	body := g.waitServing(t, g.adminAddr, "/metrics", hostileKey)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// floodConns are the connections of a flood, and what the gateway did
// with them.
type floodConns struct {
	conns         []net.Conn
	held, refused int
}

// close closes the flood's connections.
func (f *floodConns) close() {
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

// flood opens n connections to addr that send nothing, and sorts them
// by what the gateway did within a second: refused them with a 503 whose
// body has want, or held them open. The connections stay open until
// closed, or the test ends.
func (g *listenerGateway) flood(t *testing.T, addr string, n int, want string) *floodConns {
	t.Helper()
	f := &floodConns{conns: make([]net.Conn, 0, n)}
	t.Cleanup(f.close)
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			g.requireRunning(t)
			t.Fatalf("flood %s: dial: %v", addr, err)
		}
		f.conns = append(f.conns, c)
	}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		bad []string
	)
	for _, c := range f.conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			mu.Lock()
			defer mu.Unlock()
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				f.held++
			case err != nil:
				bad = append(bad, err.Error())
			default:
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" && strings.Contains(string(body), want) {
					f.refused++
				} else {
					bad = append(bad, fmt.Sprintf("%d %s", resp.StatusCode, body))
				}
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("flood %s: %d connections neither held nor refused with a 503, e.g. %q", addr, len(bad), bad[0])
	}
	return f
}

// TestListenerFlood floods both listeners of a gateway whose open-file
// limit is 128 with connections that send nothing, more than the limit
// allows: the gateway keeps running, refuses what is past each listener's
// cap with a 503 in the listener's shape, and serves keyed requests on
// both once the flood ends. With caps set above the limit, the accepts
// that fail for want of descriptors are counted and retried.
func TestListenerFlood(t *testing.T) {
	bin := tollgateBinary(t)
	const nofile, perListener = 128, 200

	t.Run("derived caps", func(t *testing.T) {
		g := startListenerGateway(t, bin, nofile, "")
		proxy := g.flood(t, g.proxyAddr, perListener, `"code":"overloaded"`)
		admin := g.flood(t, g.adminAddr, perListener, `"detail":"The gateway is at its limit`)
		g.requireRunning(t)
		// The caps the config derives from 128 descriptors.
		if proxy.held != 42 || admin.held != 6 || proxy.refused != perListener-42 || admin.refused != perListener-6 {
			t.Errorf("held %d and refused %d on listen, held %d and refused %d on admin_listen; want 42, %d, 6, %d",
				proxy.held, proxy.refused, admin.held, admin.refused, perListener-42, perListener-6)
		}
		proxy.close()
		admin.close()
		g.chat(t)
		g.waitServing(t, g.adminAddr, "/v1/tollgate/budgets", hostileKey)
		if got := g.metric(t, `tollgate_connections_refused_total{listener="proxy"}`); got != perListener-42 {
			t.Errorf("refused on listen: %v, want %d", got, perListener-42)
		}
		if got := g.metric(t, `tollgate_connections_refused_total{listener="admin"}`); got != perListener-6 {
			t.Errorf("refused on admin_listen: %v, want %d", got, perListener-6)
		}
	})

	t.Run("caps above the limit", func(t *testing.T) {
		g := startListenerGateway(t, bin, nofile, ", max_connections: 1000, admin_max_connections: 1000")
		// The gateway holds every connection it can accept; the rest
		// wait in the kernel's queue while its accepts fail.
		proxy := g.flood(t, g.proxyAddr, perListener, "")
		admin := g.flood(t, g.adminAddr, perListener, "")
		g.requireRunning(t)
		if proxy.held+admin.held != 2*perListener {
			t.Errorf("held %d + %d connections, want all %d", proxy.held, admin.held, 2*perListener)
		}
		proxy.close()
		admin.close()
		g.chat(t)
		g.waitServing(t, g.adminAddr, "/v1/tollgate/budgets", hostileKey)
		failed := g.metric(t, `tollgate_accept_errors_total{listener="proxy"}`) + g.metric(t, `tollgate_accept_errors_total{listener="admin"}`)
		if failed == 0 {
			t.Errorf("no failed accept counted, though %d connections were opened to a process with %d descriptors", 2*perListener, nofile)
		}
		if !strings.Contains(g.output(), "accepting client connections failed; retrying") {
			t.Errorf("the failed accepts were not logged\n%s", g.output())
		}
		if !strings.Contains(g.output(), "the connection caps reach the open-file limit") {
			t.Errorf("no warning at start of caps above the open-file limit\n%s", g.output())
		}
	})
}

// vmRSS returns the resident memory of process pid, in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// slowBodyOutcome is what became of a request sent with a slow body.
type slowBodyOutcome struct {
	status int
	body   string
	err    error // nil when answered
}

// sendSlowBody sends a request to addr with head, declaring declared
// bytes of body, sends sent of them at once and then a byte every 100 ms,
// and returns what the gateway answered within five seconds. The
// connection is left open, for the caller to close.
func sendSlowBody(addr, head string, declared, sent int) (net.Conn, slowBodyOutcome) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, slowBodyOutcome{err: err}
	}
	answered := make(chan slowBodyOutcome, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			answered <- slowBodyOutcome{err: err}
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- slowBodyOutcome{status: resp.StatusCode, body: string(body)}
	}()
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = io.WriteString(c, head+"Content-Length: "+strconv.Itoa(declared)+"\r\n\r\n")
	chunk := []byte(strings.Repeat("x", 64<<10))
	for n := 0; err == nil && n < sent; n += len(chunk) {
		_, err = c.Write(chunk)
	}
	for tick := time.NewTicker(100 * time.Millisecond); ; {
		select {
		case out := <-answered:
			tick.Stop()
			return c, out
		case <-tick.C:
			if err == nil {
				_, err = c.Write(chunk[:1])
			}
		}
	}
}

// TestSlowBodyWithoutKey sends, to both listeners, requests with no key
// or a wrong one that declare a body of server.max_body_bytes, send a
// quarter of it and then a byte at a time: each gets its route's 401 (or
// its connection closed) at once, and the gateway's resident memory stays
// far below what the declared bodies would take.
func TestSlowBodyWithoutKey(t *testing.T) {
	g := startListenerGateway(t, tollgateBinary(t), 0, "")
	const declared, sent, perListener = 4 << 20, 1 << 20, 100
	before := vmRSS(t, g.cmd.Process.Pid)

	credentials := []string{"", "Authorization: Bearer sk-not-a-key\r\n", "Authorization: Basic YXBpOnNrLW5vdC1hLWtleQ==\r\n"}
	type target struct {
		addr, path string
		is401      func(body string) bool // the listener's own 401 shape
	}
	targets := []target{
		{g.proxyAddr, "/v1/chat/completions", func(body string) bool {
			return gjson.Get(body, "error.code").String() == "invalid_api_key"
		}},
		{g.adminAddr, "/obj/create", func(body string) bool {
			return strings.Contains(gjson.Get(body, "detail").String(), "API key")
		}},
	}
	var (
		mu       sync.Mutex
		conns    []net.Conn
		answered [2]int
		bad      []string
		wg       sync.WaitGroup
	)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for ti, tg := range targets {
		for i := range perListener {
			head := "POST " + tg.path + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + credentials[i%len(credentials)]
			wg.Go(func() {
				c, out := sendSlowBody(tg.addr, head, declared, sent)
				mu.Lock()
				defer mu.Unlock()
				if c != nil {
					conns = append(conns, c)
				}
				var ne net.Error
				switch {
				case out.err == nil && out.status == http.StatusUnauthorized && tg.is401(out.body):
					answered[ti]++
				case errors.Is(out.err, io.EOF), errors.Is(out.err, io.ErrUnexpectedEOF), errors.Is(out.err, syscall.ECONNRESET):
					// Closed after the 401, before the client read it.
				case errors.As(out.err, &ne) && ne.Timeout():
					bad = append(bad, tg.path+": no answer within 5s")
				default:
					bad = append(bad, fmt.Sprintf("%s: %d %v %.200s", tg.path, out.status, out.err, out.body))
				}
			})
		}
	}
	wg.Wait()
	grown := vmRSS(t, g.cmd.Process.Pid) - before
	g.requireRunning(t)
	if len(bad) > 0 {
		t.Errorf("%d of %d requests neither answered 401 nor closed, e.g. %s", len(bad), 2*perListener, bad[0])
	}
	if answered[0] == 0 || answered[1] == 0 {
		t.Errorf("401s in the listener's shape: %d on listen, %d on admin_listen; want some on each", answered[0], answered[1])
	}
	// The declared bodies would take 800 MiB, the bytes sent 200 MiB.
	if grown > 64<<20 {
		t.Errorf("the gateway's resident memory grew by %d MiB over %d connections with no key", grown>>20, 2*perListener)
	}
	t.Logf("resident memory grew by %d KiB; 401s: %d on listen, %d on admin_listen", grown>>10, answered[0], answered[1])
}

// TestWriteTimeout asks for a reply, and for a stream, far larger than
// the sockets' buffers, and reads nothing: after server.write_timeout the
// gateway closes the connection, with the reply cut short, and its
// goroutines and streams in flight return to what they were.
func TestWriteTimeout(t *testing.T) {
	g := startListenerGateway(t, tollgateBinary(t), 0, ", write_timeout: 1s")
	baseline := g.metric(t, "go_goroutines")
	// The simulated model's longest completion: eight choices of it make
	// about 10 MB of reply, and its stream more.
	const tokens = 130_000
	for _, tt := range []struct {
		name, stream string
		choices      int
		complete     func(reply string) bool
	}{
		{"reply", "false", 8, func(reply string) bool { return strings.HasSuffix(reply, "}") }},
		{"stream", "true", 1, func(reply string) bool { return strings.Contains(reply, "data: [DONE]") }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A receive buffer of a few KiB keeps the kernel from taking
			// the reply off the gateway's hands.
			d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
				return errors.Join(err, serr)
			}}
			c, err := d.Dial("tcp", g.proxyAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			body := fmt.Sprintf(`{"model":"demo","max_tokens":%d,"n":%d,"stream":%s,"messages":[{"role":"user","content":"hi"}]}`, tokens, tt.choices, tt.stream)
			if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				hostileKey, len(body), body); err != nil {
				t.Fatal(err)
			}
			// Read nothing for a while past the write timeout, then all
			// there is: the gateway must have closed the connection.
			time.Sleep(3 * time.Second)
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			reply, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("after %d bytes (%.300q): %v; want the gateway to have closed the connection", len(reply), reply, err)
			}
			if !strings.HasPrefix(string(reply), "HTTP/1.1 200") {
				t.Fatalf("reply: %.300q", reply)
			}
			if tt.complete(string(reply)) {
				t.Fatalf("the whole reply (%d bytes) came, and then the connection closed: the write did not time out", len(reply))
			}
			g.requireRunning(t)
			var goroutines, streams float64
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				goroutines, streams = g.metric(t, "go_goroutines"), g.metric(t, "tollgate_streams_in_flight")
				if goroutines <= baseline+2 && streams == 0 {
					return
				}
			}
			t.Fatalf("goroutines %v (before: %v), streams in flight %v, 10s after the connection closed", goroutines, baseline, streams)
		})
	}
}

// TestTwoTransferEncodings sends, to both listeners, a keyed request with
// two Transfer-Encoding fields (chunked, then identity) and a request
// smuggled after its chunked body: each gets a 400 naming the fault, and
// its connection is closed, so the smuggled request never runs.
func TestTwoTransferEncodings(t *testing.T) {
	g := startListenerGateway(t, tollgateBinary(t), 0, "")
	body := `{"model":"demo","messages":[{"role":"user","content":"hi"}]}`
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	for _, tt := range []struct{ name, addr, path string }{
		{"listen", g.proxyAddr, "/v1/chat/completions"},
		{"admin_listen", g.adminAddr, "/obj/create"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.DialTimeout("tcp", tt.addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			head := "POST " + tt.path + " HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + hostileKey + "\r\nContent-Type: application/json\r\n"
			smuggled := "GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n"
			if _, err := io.WriteString(c, head+"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n"+chunked+smuggled); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			reply, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(gjson.GetBytes(reply, "error.message").String(), "Transfer-Encoding") {
				t.Fatalf("%d %s", resp.StatusCode, reply)
			}
			if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
				t.Fatalf("after the 400: %q, %v; want the connection closed", rest, err)
			}
		})
	}
}
