package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/proxy"
)

// This file is the harness of the routing fault tests: a gateway on a real listener, with its
// health checker running as the tollgate binary runs it, in front of several simulated backends
// on real 127.0.0.1 listeners that a test can kill and restart on the same port, and whose
// failure status it can switch while they serve.

// node is one simulated backend on a real listener.
type node struct {
	t    *testing.T
	name string
	opts simulated.Options
	addr string // host:port, kept across restarts

	mu   sync.Mutex
	srv  *simulated.Server // nil while killed
	ln   *trackingListener
	done chan error
	past simulated.Stats // the counts of earlier lives
}

// trackingListener remembers every connection it accepted, so that a kill can cut them all as a
// crashing process would.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// cut closes every accepted connection; closing one already closed does no harm.
func (l *trackingListener) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

// newNode starts a simulated backend on a fresh port. It is killed when the test ends, after the
// gateway in front of it has shut down (cleanups run last registered first).
func newNode(t *testing.T, name string, opts simulated.Options) *node {
	t.Helper()
	checkLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, name: name, opts: opts, addr: ln.Addr().String()}
	n.serve(ln)
	t.Cleanup(n.kill)
	return n
}

func (n *node) serve(ln net.Listener) {
	tl := &trackingListener{Listener: ln}
	srv := simulated.New(n.opts)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(tl) }()
	n.mu.Lock()
	n.srv, n.ln, n.done = srv, tl, done
	n.mu.Unlock()
}

// kill stops the backend as a crash would: the listener closes, so new connections are refused,
// and every open connection is cut, so requests in flight on it fail. Killing a killed node does
// nothing.
func (n *node) kill() {
	n.mu.Lock()
	srv, ln, done := n.srv, n.ln, n.done
	n.srv = nil
	n.mu.Unlock()
	if srv == nil {
		return
	}
	_ = ln.Close()
	ln.cut()
	if err := srv.Shutdown(); err != nil {
		n.t.Errorf("node %s: shutdown: %v", n.name, err)
	}
	// Serve reports the listener closed under it; that is the point of a kill.
	<-done
	st := srv.Stats()
	n.mu.Lock()
	n.past.Requests += st.Requests
	n.past.Completed += st.Completed
	n.past.Cancelled += st.Cancelled
	n.mu.Unlock()
}

// restart starts a fresh simulated backend (a new process, so its fail status is reset) on the
// node's old port.
func (n *node) restart() {
	n.t.Helper()
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		if ln, err = net.Listen("tcp", n.addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("node %s: listen again on %s: %v", n.name, n.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.serve(ln)
}

// sim is the running server; the test fails if the node is killed.
func (n *node) sim() *simulated.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv == nil {
		n.t.Fatalf("node %s is killed", n.name)
	}
	return n.srv
}

// requests is the number of chat completion requests the node saw over all its lives; health
// probes are not counted.
func (n *node) requests() int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.past.Requests
	if n.srv != nil {
		r += n.srv.Stats().Requests
	}
	return r
}

// backendSpec is a backend of the gateway: a node, and YAML keys added under the backend
// (weight, health, timeouts, max_concurrency...), one per line.
type backendSpec struct {
	node *node
	yaml string
}

// clusterOptions configure a gateway in front of nodes.
type clusterOptions struct {
	backends []backendSpec
	// models is the YAML list of models, items indented by two spaces.
	models string
	// extra is top-level YAML added to the configuration (retries...).
	extra string
}

// cluster is a gateway on a real listener in front of simulated backends.
type cluster struct {
	t      *testing.T
	base   string
	reg    *backends.Registry
	rec    *recorder
	client *http.Client
}

// newCluster starts a gateway, and its health checker, for the configuration o describes. Its
// cleanup shuts everything down and checks that no goroutine started during the test is left.
func newCluster(t *testing.T, o clusterOptions) *cluster {
	t.Helper()
	checkLeaks(t)
	var b strings.Builder
	for _, s := range o.backends {
		fmt.Fprintf(&b, "  - name: %s\n    url: \"http://%s/v1\"\n", s.node.name, s.node.addr)
		if s.yaml != "" {
			b.WriteString(indent(s.yaml, "    "))
			b.WriteByte('\n')
		}
	}
	yaml := fmt.Sprintf(`listen: "127.0.0.1:0"
auth:
  keys:
    - name: acme-key
      key: %q
      teams: [acme]
      default_team: acme
backends:
%smodels:
%s
%s
`, testKey, b.String(), o.models, o.extra)
	cfg, err := config.Parse([]byte(yaml), "routing.yaml")
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	reg, err := backends.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.NewKeyring(cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, reg: reg, rec: newRecorder(), client: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 32},
	}}
	gw, err := proxy.New(proxy.Options{
		Config: cfg, Registry: reg, Keys: keys, Recorder: c.rec,
		Limiter: accounting.NewLimiter(cfg.Limits, time.Now),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ln) }()
	hc := reg.StartHealthChecks()
	c.base = "http://" + ln.Addr().String()
	t.Cleanup(func() {
		c.client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
		<-done
		hc.Stop()
		if err := reg.Close(); err != nil {
			t.Errorf("registry close: %v", err)
		}
	})
	return c
}

// leakChecked holds the tests whose goroutines checkLeaks already watches.
var leakChecked sync.Map // *testing.T → struct{}

// checkLeaks fails the test if goroutines started during it are still running once every other
// cleanup has run. The first node or gateway of a test registers it, so it runs after all their
// cleanups; later calls for the same test do nothing.
func checkLeaks(t *testing.T) {
	t.Helper()
	if _, dup := leakChecked.LoadOrStore(t, struct{}{}); dup {
		return
	}
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		leakChecked.Delete(t)
		goleak.VerifyNone(t, before,
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
			// fasthttp's worker pool cleaner checks for the stop only after sleeping for the
			// server's MaxIdleWorkerDuration.
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		)
	})
}

// newNodes starts one node per name, all with opts.
func newNodes(t *testing.T, opts simulated.Options, names ...string) []*node {
	t.Helper()
	nodes := make([]*node, len(names))
	for i, name := range names {
		nodes[i] = newNode(t, name, opts)
	}
	return nodes
}

// sameSpecs makes a backend of each node, all with the same YAML.
func sameSpecs(yaml string, nodes ...*node) []backendSpec {
	out := make([]backendSpec, len(nodes))
	for i, n := range nodes {
		out[i] = backendSpec{node: n, yaml: yaml}
	}
	return out
}

// do posts a chat completion and reads the whole reply. It is safe to call from any goroutine:
// it reports failures as errors, never through t.
func (c *cluster) do(body string, headers ...string) (response, error) {
	req, err := http.NewRequest(http.MethodPost, c.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testKey)
	for _, hv := range headers {
		k, v, _ := strings.Cut(hv, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return response{}, fmt.Errorf("read body: %w", err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: buf.Bytes()}, nil
}

// post is do for the test's goroutine.
func (c *cluster) post(body string, headers ...string) response {
	c.t.Helper()
	r, err := c.do(body, headers...)
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

// postOK posts and fails the test unless the reply is a 200.
func (c *cluster) postOK(body string, headers ...string) response {
	c.t.Helper()
	r := c.post(body, headers...)
	if r.status != http.StatusOK {
		c.t.Fatalf("status %d: %s", r.status, r.body)
	}
	return r
}

// stream posts a streamed chat completion and returns the status and the events' data, up to
// [DONE] or the end of the body.
func (c *cluster) stream(body string, headers ...string) (int, []string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testKey)
	for _, hv := range headers {
		k, v, _ := strings.Cut(hv, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	resp, err := c.client.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	events := readEvents(c.t, bufio.NewReader(resp.Body))
	// Whatever follows [DONE] would be a second reply.
	if rest, _ := io.ReadAll(resp.Body); len(bytes.TrimSpace(rest)) > 0 {
		c.t.Errorf("bytes after [DONE]: %q", rest)
	}
	return resp.StatusCode, events
}

// states returns each backend's state from GET /readyz.
func (c *cluster) states() (map[string]string, error) {
	resp, err := c.client.Get(c.base + "/readyz")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string)
	for _, b := range gjson.GetBytes(body, "backends").Array() {
		out[b.Get("name").String()] = b.Get("state").String()
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no backends in /readyz: %s", body)
	}
	return out, nil
}

// state is one backend's state from GET /readyz.
func (c *cluster) state(name string) string {
	c.t.Helper()
	s, err := c.states()
	if err != nil {
		c.t.Fatal(err)
	}
	return s[name]
}

// waitState waits, up to within, for /readyz to show the backend in state want.
func (c *cluster) waitState(name, want string, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := c.state(name)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("backend %s is %q, not %q, after %v", name, got, want, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pollUntil polls cond every few milliseconds, up to within.
func pollUntil(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// snapshot returns a copy of every usage record so far.
func (r *recorder) snapshot() []accounting.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]accounting.Record(nil), r.recs...)
}

// routeChatBody is a non-streamed request for model with maxTokens tokens.
func routeChatBody(model string, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"route me"}],"max_tokens":%d}`, model, maxTokens)
}

// routeStreamBody is a streamed request for model with maxTokens tokens.
func routeStreamBody(model string, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"route me"}],"max_tokens":%d,"stream":true}`, model, maxTokens)
}

// countTokenEvents counts the events carrying content, and fails on repeated tokens, which would mean
// two replies were spliced together.
func countTokenEvents(t *testing.T, events []string) int {
	t.Helper()
	seen := map[string]bool{}
	n := 0
	for _, ev := range events {
		c := gjson.Get(ev, "choices.0.delta.content").String()
		if c == "" {
			continue
		}
		if seen[c] {
			t.Errorf("token %q streamed twice: %v", c, events)
		}
		seen[c] = true
		n++
	}
	return n
}

// endsWithInBandError checks the stream's last events are an error and [DONE], and returns the
// error's code.
func endsWithInBandError(t *testing.T, events []string) string {
	t.Helper()
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("the stream does not end with an error event and [DONE]: %v", events)
	}
	e := gjson.Get(events[len(events)-2], "error")
	if !e.Exists() {
		t.Fatalf("the event before [DONE] is not an error: %s", events[len(events)-2])
	}
	return e.Get("code").String()
}
