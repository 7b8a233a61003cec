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
	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/leakcheck"
	"github.com/tollgate-dev/tollgate/proxy"
)

// This file is the proxy tests' one harness: a gateway on a real listener,
// optionally with its health checker running as the tollgate binary runs
// it, in front of simulated backends on real listeners.

const testKey = "sk-test-key-acme"

// recorder collects usage records in memory.
type recorder struct {
	mu   sync.Mutex
	recs []accounting.Record
	cond chan struct{}
}

func newRecorder() *recorder { return &recorder{cond: make(chan struct{}, 1024)} }

func (r *recorder) Record(rec accounting.Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
	r.cond <- struct{}{}
}

// wait returns the n-th record (1-based), waiting up to 5 s for it: a
// stream's record is written after its last byte reached the client.
func (r *recorder) wait(t *testing.T, n int) accounting.Record {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		r.mu.Lock()
		if len(r.recs) >= n {
			rec := r.recs[n-1]
			r.mu.Unlock()
			return rec
		}
		r.mu.Unlock()
		select {
		case <-r.cond:
		case <-deadline:
			t.Fatalf("no usage record #%d after 5s", n)
		}
	}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// harnessOptions configure a test gateway: one simulated backend "sim"
// by default, or the nodes of backends.
type harnessOptions struct {
	// backends are the gateway's backends, each a node on its own
	// listener. Zero means one node named "sim", with options sim,
	// backendExtra under it, and the upstream key "sk-upstream-secret".
	backends []backendSpec
	sim      simulated.Options
	// backendExtra is YAML appended under the default backend "sim".
	backendExtra string
	// extraBackends is YAML appended to the backends list.
	extraBackends string
	// models is the YAML list of models, items indented by two spaces.
	// Zero means demo, llama (upstream meta-llama/Llama-3.1-8B-Instruct)
	// and prio (priority scheduling), all on "sim".
	models string
	// server is YAML for the server section (limits, timeouts).
	server string
	// extra is top-level YAML added to the configuration (retries...).
	extra  string
	limits []config.Limit
	// healthChecks runs the registry's health checker, as the tollgate
	// binary does. Zero means no probes: a test's backend sees only the
	// requests the test sends.
	healthChecks bool
	// log is the gateway's logger; nil means none.
	log *zap.Logger
	// next serves the paths the proxy does not own (see OwnRouter).
	next fasthttp.RequestHandler
}

// harness is a gateway on a real listener in front of simulated backends
// on real 127.0.0.1 listeners, which a test can kill and restart on the
// same port, and whose failure status it can switch while they serve.
type harness struct {
	t *testing.T
	// sim is the default backend's server; nil when options name backends.
	sim *simulated.Server
	gw  *proxy.Server
	// cfg and reg are the configuration and registry in use; reload
	// replaces them.
	cfg      *config.Config
	reg      *backends.Registry
	base     string // http://127.0.0.1:port
	recorder *recorder
	client   *http.Client
}

// newHarness starts a gateway for the configuration o describes. Its
// cleanup shuts everything down and checks that no goroutine started
// during the test is left.
func newHarness(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	checkLeaks(t)
	h := &harness{t: t, recorder: newRecorder(), client: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 32},
	}}
	specs := o.backends
	if len(specs) == 0 {
		n := newNode(t, "sim", o.sim)
		h.sim = n.sim()
		extra := `api_key: "sk-upstream-secret"`
		if o.backendExtra != "" {
			extra += "\n" + strings.TrimSpace(o.backendExtra)
		}
		specs = []backendSpec{{node: n, yaml: extra}}
	}
	models := o.models
	if models == "" {
		models = `  - name: demo
    backends: [sim]
  - name: llama
    upstream_model: meta-llama/Llama-3.1-8B-Instruct
    backends: [sim]
  - name: prio
    backends: [sim]
    priority_scheduling: true
`
	}
	var b strings.Builder
	for _, s := range specs {
		fmt.Fprintf(&b, "  - name: %s\n    url: \"http://%s/v1\"\n", s.node.name, s.node.addr)
		if s.yaml != "" {
			b.WriteString(indent(s.yaml, "    "))
			b.WriteByte('\n')
		}
	}
	if o.extraBackends != "" {
		b.WriteString(strings.TrimRight(o.extraBackends, "\n") + "\n")
	}
	yaml := fmt.Sprintf(`listen: "127.0.0.1:0"
%s
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
`, serverSection(o.server), testKey, b.String(), models, o.extra)
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	cfg.Limits = append(cfg.Limits, o.limits...)
	h.cfg = cfg
	h.reg, err = backends.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.NewKeyring(cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	h.gw, err = proxy.New(proxy.Options{
		Config: cfg, Registry: h.reg, Keys: keys, Recorder: h.recorder,
		Limiter: accounting.NewLimiter(cfg.Limits, time.Now), Log: o.log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.gw.Serve(ln, proxy.OwnRouter(h.gw, o.next)) }()
	var hc *backends.HealthChecker
	if o.healthChecks {
		hc = h.reg.StartHealthChecks()
	}
	h.base = "http://" + ln.Addr().String()
	t.Cleanup(func() {
		h.client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.gw.Shutdown(ctx); err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
		<-done
		if hc != nil {
			hc.Stop()
		}
		if err := h.reg.Close(); err != nil {
			t.Errorf("registry close: %v", err)
		}
	})
	return h
}

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
		goleak.VerifyNone(t, append(leakcheck.IgnoreFasthttp(), before)...)
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

// serverSection is the config's server section holding yaml, or nothing
// (tests may append their own).
func serverSection(yaml string) string {
	if yaml == "" {
		return ""
	}
	return "server: {" + yaml + "}"
}

func indent(s, prefix string) string {
	if s == "" {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}

// response is a finished HTTP exchange.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(path string) gjson.Result { return gjson.GetBytes(r.body, path) }

// reload swaps in a generation built from cfg, as a configuration reload
// does, and closes the previous one's backends once no request uses them.
func (h *harness) reload(cfg *config.Config) {
	h.t.Helper()
	reg, err := backends.NewRegistry(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	old, wait := h.gw.Swap(proxy.Generation{Config: cfg, Registry: reg, Limiter: accounting.NewLimiter(cfg.Limits, time.Now)})
	h.cfg, h.reg = cfg, reg
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := wait(ctx); err != nil {
		h.t.Fatal(err)
	}
	if err := old.Registry.Close(); err != nil {
		h.t.Fatal(err)
	}
}

// post sends a chat completion with the test key and extra headers
// ("Name: value" strings; "Authorization:" with no value sends none) and
// reads the whole reply.
func (h *harness) post(body string, headers ...string) response {
	h.t.Helper()
	r, err := h.do(body, headers...)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// request is the chat completion request post sends.
func (h *harness) request(body string, headers ...string) *http.Request {
	h.t.Helper()
	req, err := h.newRequest(body, headers...)
	if err != nil {
		h.t.Fatal(err)
	}
	return req
}

func (h *harness) newRequest(body string, headers ...string) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodPost, h.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testKey)
	for _, hv := range headers {
		k, v, _ := strings.Cut(hv, ":")
		if v = strings.TrimSpace(v); v == "" && k == "Authorization" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	return req, nil
}

// do posts a chat completion and reads the whole reply. It is safe to call from any goroutine:
// it reports failures as errors, never through t.
func (h *harness) do(body string, headers ...string) (response, error) {
	req, err := h.newRequest(body, headers...)
	if err != nil {
		return response{}, err
	}
	resp, err := h.client.Do(req)
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

// postOK posts and fails the test unless the reply is a 200.
func (h *harness) postOK(body string, headers ...string) response {
	h.t.Helper()
	r := h.post(body, headers...)
	if r.status != http.StatusOK {
		h.t.Fatalf("status %d: %s", r.status, r.body)
	}
	return r
}

// stream posts a streamed chat completion and returns the status and the events' data, up to
// [DONE] or the end of the body.
func (h *harness) stream(body string, headers ...string) (int, []string) {
	h.t.Helper()
	resp, err := h.client.Do(h.request(body, headers...))
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	events := readEvents(h.t, bufio.NewReader(resp.Body))
	// Whatever follows [DONE] would be a second reply.
	if rest, _ := io.ReadAll(resp.Body); len(bytes.TrimSpace(rest)) > 0 {
		h.t.Errorf("bytes after [DONE]: %q", rest)
	}
	return resp.StatusCode, events
}

// states returns each backend's state from GET /readyz.
func (h *harness) states() (map[string]string, error) {
	resp, err := h.client.Get(h.base + "/readyz")
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
func (h *harness) state(name string) string {
	h.t.Helper()
	s, err := h.states()
	if err != nil {
		h.t.Fatal(err)
	}
	return s[name]
}

// waitState waits, up to within, for /readyz to show the backend in state want.
func (h *harness) waitState(name, want string, within time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := h.state(name)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("backend %s is %q, not %q, after %v", name, got, want, within)
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

// readEvents reads SSE events from r until [DONE] or the end, returning
// each event's data payload.
func readEvents(t *testing.T, r *bufio.Reader) []string {
	t.Helper()
	var events []string
	for {
		ev, err := readEvent(r)
		if err != nil {
			return events
		}
		events = append(events, ev)
		if ev == "[DONE]" {
			return events
		}
	}
}

// readEvent reads one SSE event's data payload.
func readEvent(r *bufio.Reader) (string, error) {
	var data string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if data != "" {
				return data, nil
			}
			continue
		}
		if d, ok := strings.CutPrefix(line, "data:"); ok {
			data = strings.TrimPrefix(d, " ")
		}
	}
}
