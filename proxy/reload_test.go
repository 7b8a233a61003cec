package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/backends"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/proxy"
)

// reloadGateway is a gateway on a simulated in-process backend, built from
// yaml, that reload swaps to another configuration as a SIGHUP does.
type reloadGateway struct {
	t    *testing.T
	gw   *proxy.Server
	base string
	reg  *backends.Registry
}

func newReloadGateway(t *testing.T, yaml string) *reloadGateway {
	t.Helper()
	checkLeaks(t)
	g := &reloadGateway{t: t}
	cfg := reloadConfig(t, yaml)
	reg, err := backends.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.NewKeyring(cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	g.gw, err = proxy.New(proxy.Options{Config: cfg, Registry: reg, Keys: keys, Recorder: newRecorder(),
		Limiter: accounting.NewLimiter(cfg.Limits, time.Now)})
	if err != nil {
		t.Fatal(err)
	}
	g.reg = reg
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- g.gw.Serve(ln) }()
	g.base = "http://" + ln.Addr().String()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := g.gw.Shutdown(ctx); err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
		<-done
		if err := g.reg.Close(); err != nil {
			t.Errorf("registry close: %v", err)
		}
	})
	return g
}

// reloadConfig is a configuration with one key and model demo on a
// simulated backend; server is the server section's YAML.
func reloadConfig(t *testing.T, server string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
auth:
  keys: [{name: acme-key, key: %q, teams: [acme], default_team: acme}]
backends:
  - {name: sim, simulated: {tokens: 2}}
models:
  - {name: demo, backends: [sim]}
server: {%s}
`, testKey, server)), "reload.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// reload swaps in a generation built from yaml and closes the previous
// one's backends once no request uses them.
func (g *reloadGateway) reload(yaml string) {
	g.t.Helper()
	cfg := reloadConfig(g.t, yaml)
	reg, err := backends.NewRegistry(cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	old, wait := g.gw.Swap(proxy.Generation{Config: cfg, Registry: reg, Limiter: accounting.NewLimiter(cfg.Limits, time.Now)})
	g.reg = reg
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := wait(ctx); err != nil {
		g.t.Fatal(err)
	}
	if err := old.Registry.Close(); err != nil {
		g.t.Fatal(err)
	}
}

func (g *reloadGateway) post(body string) response {
	g.t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// TestReloadAppliesRequestSettingsOnly reloads a configuration that lowers
// server.max_messages, which a reload applies, and raises
// server.max_body_bytes, which fasthttp holds from start: new requests get
// the new message cap, while the body limit, and the 413 that quotes it,
// stay at the running value.
func TestReloadAppliesRequestSettingsOnly(t *testing.T) {
	g := newReloadGateway(t, "max_messages: 4, max_body_bytes: 4096")
	threeMessages := `{"model":"demo","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`
	if r := g.post(threeMessages); r.status != 200 {
		t.Fatalf("three messages under max_messages 4: %d %s", r.status, r.body)
	}

	g.reload("max_messages: 2, max_body_bytes: 1048576")
	r := g.post(threeMessages)
	if r.status != 400 || r.json("error.message").String() != "messages has 3 entries; the gateway accepts at most 2." ||
		r.json("error.param").String() != "messages" {
		t.Fatalf("three messages after max_messages was reloaded to 2: %d %s", r.status, r.body)
	}
	// Over the running 4096 bytes, well under the reloaded 1 MiB.
	big := `{"model":"demo","messages":[{"role":"user","content":"` + strings.Repeat("x", 8000) + `"}]}`
	r = g.post(big)
	if r.status != 413 || r.json("error.message").String() != "The request body exceeds the gateway's limit of 4096 bytes." {
		t.Fatalf("a body over the running max_body_bytes after a reload that raised it: %d %s", r.status, r.body)
	}
	// Under the running limit, the request is served.
	if r := g.post(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`); r.status != 200 {
		t.Fatalf("a small request after the reload: %d %s", r.status, r.body)
	}
}

// TestProjectHeaderRefusalSaysItOnce checks the 400 for a malformed
// Compat-Project header word for word.
func TestProjectHeaderRefusalSaysItOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	r := h.post(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`, "Compat-Project: acme/chat/bot")
	if r.status != 400 || r.json("error.code").String() != "invalid_project" ||
		r.json("error.message").String() != "Invalid Compat-Project header: want <team>/<project>, with at most one slash." {
		t.Fatalf("malformed Compat-Project: %d %s", r.status, r.body)
	}
}
