package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/proxy"
)

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

// harness is a gateway on a real listener in front of a simulated backend
// on another real listener.
type harness struct {
	t        *testing.T
	sim      *simulated.Server
	gw       *proxy.Server
	base     string // http://127.0.0.1:port
	recorder *recorder
}

type harnessOptions struct {
	sim simulated.Options
	// yaml is appended to the generated config (models, limits...); the
	// backend "sim" points at the simulated server.
	models string
	// backendExtra is YAML appended under the "sim" backend.
	backendExtra string
	// extraBackends is YAML appended to the backends list.
	extraBackends string
	limits        []config.Limit
	// server is YAML for the server section (limits, timeouts).
	server string
	// log is the gateway's logger; nil means none.
	log *zap.Logger
	// next serves the paths the proxy does not own.
	next fasthttp.RequestHandler
}

func newHarness(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	h := &harness{t: t, recorder: newRecorder()}
	h.sim = simulated.New(o.sim)
	sln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	simDone := make(chan error, 1)
	go func() { simDone <- h.sim.Serve(sln) }()

	models := o.models
	if models == "" {
		models = `
  - name: demo
    backends: [sim]
  - name: llama
    upstream_model: meta-llama/Llama-3.1-8B-Instruct
    backends: [sim]
  - name: prio
    backends: [sim]
    priority_scheduling: true
`
	}
	yaml := fmt.Sprintf(`
listen: "127.0.0.1:0"
%s
auth:
  keys:
    - name: acme-key
      key: %q
      teams: [acme]
      default_team: acme
backends:
  - name: sim
    url: "http://%s/v1"
    api_key: "sk-upstream-secret"
%s
%s
models:
%s
`, serverSection(o.server), testKey, sln.Addr().String(), indent(o.backendExtra, "    "), o.extraBackends, models)
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	cfg.Limits = o.limits
	reg, err := backends.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.NewKeyring(cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	h.gw, err = proxy.New(proxy.Options{
		Config: cfg, Registry: reg, Keys: keys, Recorder: h.recorder,
		Limiter: accounting.NewLimiter(cfg.Limits, time.Now), Log: o.log, Next: o.next,
	})
	if err != nil {
		t.Fatal(err)
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gwDone := make(chan error, 1)
	go func() { gwDone <- h.gw.Serve(gln) }()
	h.base = "http://" + gln.Addr().String()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := h.gw.Shutdown(ctx); err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
		<-gwDone
		if err := reg.Close(); err != nil {
			t.Errorf("registry close: %v", err)
		}
		if err := h.sim.Shutdown(); err != nil {
			t.Errorf("sim shutdown: %v", err)
		}
		<-simDone
	})
	return h
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

// post sends a chat completion with the test key and extra headers
// ("Name: value" strings) and reads the whole reply.
func (h *harness) post(body string, headers ...string) response {
	h.t.Helper()
	req := h.request(body, headers...)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		h.t.Fatalf("read body: %v", err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: buf.Bytes()}
}

func (h *harness) request(body string, headers ...string) *http.Request {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
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
	return req
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
