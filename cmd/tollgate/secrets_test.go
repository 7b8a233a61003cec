package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/servetest"
)

// Distinctive secrets: each holds a marker no other text in a log line, a
// reply or the store can hold by chance.
const (
	secretAdminKey    = "sk-admin-S3CRET-7c1d9e2f4a"
	secretTeamKey     = "sk-acme-S3CRET-5b8e0a3c6d"
	secretUnknownKey  = "sk-unknown-S3CRET-2e9f7d1b0c"
	secretUpstreamKey = "sk-upstream-S3CRET-9a4c6e8b2d"
)

// logCapture is an io.Writer the gateway's logger and the test can share.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logCapture) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logCapture) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// secretsCapture is one exchange with the gateway, kept whole for the final scan.
type secretsCapture struct {
	what   string
	status int
	header http.Header
	body   []byte
}

// TestSecretsNeverAppear runs a whole gateway with debug logging into a
// buffer, in front of a backend that needs an API key, and goes through
// every endpoint family, successes and failures alike. It then checks that
// no client key (known or unknown), no upstream key and no Authorization
// header value appears in any log line, in any reply header or body, or in
// the store; and that the backend did receive the upstream key, so that the
// key was in use and not merely absent.
func TestSecretsNeverAppear(t *testing.T) {
	sim := simulated.New(simulated.Options{Tokens: 4})
	sln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	simDone := make(chan error, 1)
	go func() { simDone <- sim.Serve(sln) }()
	t.Cleanup(func() {
		if err := sim.Shutdown(); err != nil {
			t.Errorf("backend shutdown: %v", err)
		}
		<-simDone
	})

	dir := t.TempDir()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listen: "127.0.0.1:0"
log: {level: debug, format: json}
auth:
  keys:
    - {name: admin-key, key: %q, teams: ["*"], default_team: acme, admin: true}
    - {name: acme-key, key: %q, teams: [acme], default_team: acme}
backends:
  - name: upstream
    url: "http://%s/v1"
    api_key: %q
models:
  - name: demo
    backends: [upstream]
store: {path: %q}
usage: {flush_interval: 50ms}
traces: {store_payloads: true}
`, secretAdminKey, secretTeamKey, sln.Addr(), secretUpstreamKey, filepath.Join(dir, "tollgate.db"))), "secrets.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}

	logs := &logCapture{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	stop := servetest.Start(t, func(ctx context.Context) error { return serveListener(ctx, cfg, ln, logs) })

	basic := func(key string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte("api:"+key))
	}
	bearer := func(key string) string { return "Bearer " + key }
	var captures []secretsCapture
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	send := func(what, method, path, auth, body string, headers ...string) secretsCapture {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		for _, h := range headers {
			k, v, _ := strings.Cut(h, ":")
			req.Header.Set(k, strings.TrimSpace(v))
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s: read: %v", what, err)
		}
		c := secretsCapture{what: what, status: resp.StatusCode, header: resp.Header, body: b}
		captures = append(captures, c)
		return c
	}
	const chat = `{"model":"demo","messages":[{"role":"user","content":"say hello"}],"max_tokens":3}`
	const chatStream = `{"model":"demo","messages":[{"role":"user","content":"say hello"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`
	now := time.Now().UTC().Format(time.RFC3339Nano)
	exchanges := []struct {
		what, method, path, auth, body string
		headers                        []string
		status                         int
	}{
		{"chat ok", "POST", "/v1/chat/completions", bearer(secretTeamKey), chat, []string{"Compat-Project: acme/app"}, 200},
		{"chat ok, admin key", "POST", "/v1/chat/completions/", bearer(secretAdminKey), chat, nil, 200},
		{"chat 400", "POST", "/v1/chat/completions", bearer(secretTeamKey), `{"model":"demo","messages":[{"role":"user","content":"x"}],"temperature":9}`, nil, 400},
		{"chat 400 not JSON", "POST", "/v1/chat/completions", bearer(secretTeamKey), `{"model":`, nil, 400},
		{"chat 401 unknown key", "POST", "/v1/chat/completions", bearer(secretUnknownKey), chat, nil, 401},
		{"chat 401 unknown key, Basic", "POST", "/v1/chat/completions", basic(secretUnknownKey), chat, nil, 401},
		{"chat 401 no key", "POST", "/v1/chat/completions", "", chat, nil, 401},
		{"chat 403 other team", "POST", "/v1/chat/completions", bearer(secretTeamKey), chat, []string{"Compat-Project: globex/app"}, 403},
		{"chat 404 model", "POST", "/v1/chat/completions", bearer(secretTeamKey), strings.Replace(chat, `"demo"`, `"nope"`, 1), nil, 404},
		{"chat 415", "POST", "/v1/chat/completions", bearer(secretTeamKey), chat, []string{"Content-Type: text/plain"}, 415},
		{"chat stream", "POST", "/v1/chat/completions", bearer(secretTeamKey), chatStream, nil, 200},
		{"chat stream broken", "POST", "/v1/chat/completions", bearer(secretTeamKey), chatStream, []string{"X-Mock-Break-After: 1"}, 200},
		{"chat upstream 500", "POST", "/v1/chat/completions", bearer(secretTeamKey), chat, []string{"X-Mock-Status: 500"}, 502},
		{"chat upstream 401", "POST", "/v1/chat/completions", bearer(secretTeamKey), chat, []string{"X-Mock-Status: 401", "X-Mock-Error-Shape: bare"}, 502},
		{"chat upstream 400", "POST", "/v1/chat/completions", bearer(secretTeamKey), chat, []string{"X-Mock-Status: 400"}, 400},
		{"models", "GET", "/v1/models", bearer(secretTeamKey), "", nil, 200},
		{"models 401", "GET", "/v1/models", bearer(secretUnknownKey), "", nil, 401},
		{"usage api", "GET", "/v1/organization/usage/completions?start_time=0&group_by=project_id,api_key_id,model", bearer(secretAdminKey), "", nil, 200},
		{"usage api team", "GET", "/v1/organization/usage/completions?start_time=0&group_by=api_key_id", bearer(secretTeamKey), "", nil, 200},
		{"usage api 400", "GET", "/v1/organization/usage/completions?start_time=x", bearer(secretTeamKey), "", nil, 400},
		{"usage api 401", "GET", "/v1/organization/usage/completions?start_time=0", bearer(secretUnknownKey), "", nil, 401},
		{"usage api 403", "GET", "/v1/organization/usage/completions?start_time=0&project_ids=globex/app", bearer(secretTeamKey), "", nil, 403},
		{"projects info", "POST", "/service/projects_info", basic(secretTeamKey), `{"project_ids":["acme/app"]}`, nil, 200},
		{"ops create", "POST", "/v2/acme/app/ops", basic(secretTeamKey), `{"name":"predict","source_code":"def predict(): pass"}`, nil, 200},
		{"ops list", "GET", "/v2/acme/app/ops", bearer(secretTeamKey), "", nil, 200},
		{"evaluation run", "POST", "/v2/acme/app/evaluation_runs", basic(secretTeamKey), `{"evaluation":"weave:///acme/app/object/e:v1","model":"weave:///acme/app/object/m:v1"}`, nil, 200},
		{"evaluation runs list", "GET", "/v2/acme/app/evaluation_runs", basic(secretAdminKey), "", nil, 200},
		{"call start", "POST", "/call/start", basic(secretTeamKey), `{"start":{"project_id":"acme/app","id":"c1","op_name":"step","started_at":"` + now + `","inputs":{"q":1}}}`, nil, 200},
		{"call end", "POST", "/call/end", basic(secretTeamKey), `{"end":{"project_id":"acme/app","id":"c1","ended_at":"` + now + `","summary":{}}}`, nil, 200},
		{"call read", "POST", "/call/read", basic(secretTeamKey), `{"project_id":"acme/app","id":"c1"}`, nil, 200},
		{"calls query", "POST", "/calls/stream_query", basic(secretTeamKey), `{"project_id":"acme/app"}`, nil, 200},
		{"trace usage", "POST", "/trace/usage", basic(secretTeamKey), `{"project_id":"acme/app"}`, nil, 200},
		{"service 422", "POST", "/trace/usage", basic(secretTeamKey), `{"filter":{"bogus":1}}`, nil, 422},
		{"service 422 bad JSON", "POST", "/call/start", basic(secretTeamKey), `{"start":`, nil, 422},
		{"service 401", "POST", "/service/projects_info", basic(secretUnknownKey), `{"project_ids":["acme/app"]}`, nil, 401},
		{"service 403", "POST", "/service/projects_info", basic(secretTeamKey), `{"project_ids":["globex/app"]}`, nil, 403},
		{"service 404", "GET", "/v2/acme/app/evaluation_runs/nope", basic(secretTeamKey), "", nil, 404},
		{"unknown path", "GET", "/v3/nothing", bearer(secretTeamKey), "", nil, 404},
		{"metrics", "GET", "/metrics", bearer(secretAdminKey), "", nil, 200},
		{"readyz", "GET", "/readyz", "", "", nil, 200},
		{"healthz", "GET", "/healthz", bearer(secretTeamKey), "", nil, 200},
		{"ui", "GET", "/ui/", bearer(secretTeamKey), "", nil, 200},
	}
	for i, x := range exchanges {
		c := send(x.what, x.method, x.path, x.auth, x.body, x.headers...)
		if c.status != x.status {
			t.Errorf("%s: status %d, want %d: %.300s", x.what, c.status, x.status, c.body)
		}
		if i == 0 {
			// The backend got the gateway's own key, not the client's.
			_, hdr := sim.LastRequest()
			if got := hdr["Authorization"]; got != "Bearer "+secretUpstreamKey {
				t.Errorf("the backend received Authorization %q, want the upstream key", got)
			}
		}
	}
	// A request fasthttp refuses before the handler runs, carrying a key.
	t.Run("malformed request", func(t *testing.T) {
		c := rawSecretsExchange(t, ln.Addr().String(),
			"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer "+secretTeamKey+"\r\nContent-Length: -5\r\n\r\n")
		captures = append(captures, c)
		// A control byte in the Authorization value: fasthttp refuses the
		// request and logs why, quoting the value, through the gateway's
		// logger, which redacts it.
		c = rawSecretsExchange(t, ln.Addr().String(),
			"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer "+secretTeamKey+"\x01\r\nContent-Length: 2\r\n\r\n{}")
		if c.status != http.StatusBadRequest {
			t.Errorf("a control byte in Authorization: status %d, want 400", c.status)
		}
		captures = append(captures, c)
	})
	stop() // flushes the log and the usage queue
	if !strings.Contains(logs.String(), `"http server"`) {
		t.Errorf("fasthttp's own log line did not reach the gateway's log; the check would not cover it")
	}

	secrets := map[string]string{
		"admin key":                           secretAdminKey,
		"team key":                            secretTeamKey,
		"unknown client key":                  secretUnknownKey,
		"upstream key":                        secretUpstreamKey,
		"Basic credentials":                   strings.TrimPrefix(basic(secretTeamKey), "Basic "),
		"Basic credentials of the admin key":  strings.TrimPrefix(basic(secretAdminKey), "Basic "),
		"Basic credentials of an unknown key": strings.TrimPrefix(basic(secretUnknownKey), "Basic "),
		"secret marker":                       "S3CRET",
	}
	check := func(where, text string) {
		t.Helper()
		for name, s := range secrets {
			if i := strings.Index(text, s); i >= 0 {
				t.Errorf("%s holds the %s: …%s…", where, name, text[max(0, i-80):min(len(text), i+len(s)+40)])
			}
		}
	}

	logText := logs.String()
	if !strings.Contains(logText, `"acme-key"`) || !strings.Contains(logText, "stopped") {
		t.Fatalf("the log does not hold the request lines; the check would prove nothing:\n%s", logText)
	}
	for i, line := range strings.Split(logText, "\n") {
		check(fmt.Sprintf("log line %d", i+1), line)
	}
	for _, c := range captures {
		var hdr strings.Builder
		for k, vs := range c.header {
			fmt.Fprintf(&hdr, "%s: %s\n", k, strings.Join(vs, ", "))
		}
		check(c.what+" reply headers", hdr.String())
		check(c.what+" reply body", string(c.body))
	}
	// The store: the database and any write-ahead log left beside it.
	files, _ := filepath.Glob(filepath.Join(dir, "tollgate.db*"))
	if len(files) == 0 {
		t.Fatal("no store file to check")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		check("store file "+filepath.Base(f), string(b))
	}
}

// rawSecretsExchange writes raw bytes to addr and reads one response.
func rawSecretsExchange(t *testing.T, addr, raw string) secretsCapture {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, raw)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return secretsCapture{what: "malformed request", status: resp.StatusCode, header: resp.Header, body: b}
}

// testSecretsInProcessOutput runs the gateway binary (a subtest of
// TestGatewayBinary) with debug logging in front of a backend that needs a
// key, and checks that nothing the process writes, on stdout or stderr, by
// its own logger or by a library's, holds a client key, the upstream key or
// an Authorization value.
func testSecretsInProcessOutput(t *testing.T, bin string) {
	sim := simulated.New(simulated.Options{Tokens: 4})
	sln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	simDone := make(chan error, 1)
	go func() { simDone <- sim.Serve(sln) }()
	t.Cleanup(func() {
		if err := sim.Shutdown(); err != nil {
			t.Errorf("backend shutdown: %v", err)
		}
		<-simDone
	})
	p := startGatewayProcess(t, bin, fmt.Sprintf(`
log: {level: debug, format: console}
auth:
  keys:
    - {name: acme-key, key: %q, teams: [acme], default_team: acme}
backends:
  - name: upstream
    url: "http://%s/v1"
    api_key: %q
models:
  - name: demo
    backends: [upstream]
store: {path: %q}
`, secretTeamKey, sln.Addr(), secretUpstreamKey, filepath.Join(t.TempDir(), "tollgate.db")), false)

	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	post := func(auth, body string, headers ...string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, p.base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", auth)
		for _, h := range headers {
			k, v, _ := strings.Cut(h, ":")
			req.Header.Set(k, strings.TrimSpace(v))
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	const chat = `{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	for _, x := range []struct {
		auth, body string
		headers    []string
		status     int
	}{
		{"Bearer " + secretTeamKey, chat, nil, 200},
		{"Bearer " + secretTeamKey, `{"model":"demo","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, nil, 200},
		{"Bearer " + secretTeamKey, chat, []string{"X-Mock-Status: 401", "X-Mock-Error-Shape: bare"}, 502},
		{"Bearer " + secretTeamKey, `{"model":`, nil, 400},
		{"Bearer " + secretUnknownKey, chat, nil, 401},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+secretUnknownKey)), chat, nil, 401},
	} {
		if got := post(x.auth, x.body, x.headers...); got != x.status {
			t.Errorf("status %d, want %d", got, x.status)
		}
	}
	if _, hdr := sim.LastRequest(); hdr["Authorization"] != "Bearer "+secretUpstreamKey {
		t.Errorf("the backend received Authorization %q, want the upstream key", hdr["Authorization"])
	}
	t.Run("malformed requests", func(t *testing.T) {
		for _, raw := range []string{
			"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer " + secretTeamKey + "\r\nContent-Length: -5\r\n\r\n",
			"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer " + secretTeamKey + "\r\nX-Big: " + strings.Repeat("a", 20000) + "\r\n\r\n",
			// fasthttp refuses a control byte in a header value, and its
			// own log line quotes the value: it must not reach the output.
			"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer " + secretTeamKey + "\x01\r\nContent-Length: 2\r\n\r\n{}",
			"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer " + secretUnknownKey + "\x7f\r\nContent-Length: 2\r\n\r\n{}",
		} {
			rawSecretsExchange(t, strings.TrimPrefix(p.base, "http://"), raw)
		}
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(t, 20*time.Second); err != nil {
		t.Fatalf("the gateway exited with %v\n%s", err, p.output())
	}
	out := p.output()
	if !strings.Contains(out, "acme-key") {
		t.Fatalf("the output holds no request line; the check would prove nothing:\n%s", out)
	}
	for _, s := range []string{secretTeamKey, secretUnknownKey, secretUpstreamKey, "S3CRET",
		base64.StdEncoding.EncodeToString([]byte("u:" + secretUnknownKey))} {
		if i := strings.Index(out, s); i >= 0 {
			t.Errorf("the process output holds a secret: …%s…", out[max(0, i-120):min(len(out), i+len(s)+40)])
		}
	}
}
