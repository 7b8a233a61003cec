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
    - {name: hostile, key: %q, teams: ["*"], default_team: acme}
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
	g.waitServing(t, adminAddr, "/metrics", "")
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
	body := g.waitServing(t, g.adminAddr, "/metrics", "")
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
	})
}
