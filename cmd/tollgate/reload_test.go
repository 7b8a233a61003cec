package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/config"
)

// reloadConfig renders a configuration file; extraModel adds a model on a
// second simulated backend, newKey a second API key.
func reloadConfig(dir string, extraModel, newKey bool, tail string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `listen: "127.0.0.1:0"
log: {level: error}
reload: {watch: true, interval: 50ms}
store: {path: %q}
usage: {flush_interval: 50ms}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
`, filepath.Join(dir, "tollgate.db"), adminKey)
	if newKey {
		b.WriteString("    - {name: added, key: \"sk-added-after-reload\", teams: [acme], default_team: acme}\n")
	}
	b.WriteString("backends:\n  - name: sim\n    simulated: {inter_token: 1ms, tokens: 8}\n")
	if extraModel {
		b.WriteString("  - name: sim2\n    simulated: {inter_token: 1ms, tokens: 8}\n")
	}
	b.WriteString("models:\n  - name: demo\n    backends: [sim]\n")
	if extraModel {
		b.WriteString("  - name: demo2\n    backends: [sim2]\n")
	}
	b.WriteString(tail)
	return b.String()
}

func TestHotReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tollgate.yaml")
	write := func(content string) {
		t.Helper()
		// Write beside and rename, as editors and config managers do, so
		// the watcher never reads a half-written file.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(reloadConfig(dir, false, false, ""))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	g := start(t, cfg)

	var ok, failed atomic.Int64
	var firstFailure atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				stream := ""
				if (w+i)%2 == 0 {
					stream = `,"stream":true`
				}
				req, _ := http.NewRequest(http.MethodPost, g.base+"/v1/chat/completions",
					strings.NewReader(`{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":4`+stream+`}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+adminKey)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, err.Error())
					continue
				}
				body, err := io.ReadAll(bufio.NewReader(resp.Body))
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || (stream != "" && !strings.Contains(string(body), "[DONE]")) ||
					strings.Contains(string(body), `"error"`) {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, fmt.Sprintf("%d %v %s", resp.StatusCode, err, body))
					continue
				}
				ok.Add(1)
			}
		}()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		// A bound on liveness, not a timing goal: generous enough for a
		// host also running the race-enabled suite's other packages.
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	listsModel := func(key, model string) bool {
		code, body := g.do(t, "GET", "/v1/models", key, "")
		return code == 200 && gjson.Get(body, `data.#(id=="`+model+`")`).Exists()
	}

	waitFor("load running", func() bool { return ok.Load() > 50 })
	// A new model on a new backend, and a new key.
	write(reloadConfig(dir, true, true, ""))
	waitFor("reload picked up", func() bool { return listsModel(adminKey, "demo2") })
	if code, body := g.do(t, "POST", "/v1/chat/completions", "sk-added-after-reload",
		`{"model":"demo2","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`); code != 200 {
		t.Fatalf("new key on new model after reload: %d %s", code, body)
	}
	// A broken file is refused; the running configuration keeps serving.
	before := ok.Load()
	write(reloadConfig(dir, false, false, "bogus_key: 1\n"))
	time.Sleep(300 * time.Millisecond)
	if !listsModel(adminKey, "demo2") {
		t.Fatal("a refused reload changed the running configuration")
	}
	waitFor("load continues after a refused reload", func() bool { return ok.Load() > before+20 })
	// And back to the first configuration.
	write(reloadConfig(dir, false, false, ""))
	waitFor("second reload", func() bool { return !listsModel(adminKey, "demo2") })
	before = ok.Load()
	waitFor("load continues", func() bool { return ok.Load() > before+20 })
	close(stop)
	wg.Wait()

	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed during reloads; first: %v", failed.Load(), failed.Load()+ok.Load(), firstFailure.Load())
	}
	g.stop(t)
}

// TestReloadAppliesOrNeedsRestart reloads a file that changes a setting a
// reload applies (server.max_messages) and one fasthttp holds
// (server.max_body_bytes): the first takes effect for new requests, the
// second keeps its running value everywhere, the 413's message included,
// and the reload's log line names each.
func TestReloadAppliesOrNeedsRestart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tollgate.yaml")
	render := func(maxMessages, maxBody int) string {
		return fmt.Sprintf(`listen: "127.0.0.1:0"
log: {level: info}
reload: {watch: true, interval: 50ms}
store: {path: %q}
usage: {flush_interval: 50ms}
server: {max_messages: %d, max_body_bytes: %d}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: sim
    simulated: {tokens: 2}
models:
  - name: demo
    backends: [sim]
`, filepath.Join(dir, "tollgate.db"), maxMessages, maxBody, adminKey)
	}
	write := func(content string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(render(4, 4096))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	g := &running{base: "http://" + ln.Addr().String(), cfg: cfg, cancel: cancel, done: make(chan error, 1)}
	go func() { g.done <- serveListener(ctx, cfg, ln, logs) }()
	t.Cleanup(func() {
		cancel()
		<-g.done
	})

	threeMessages := `{"model":"demo","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`
	if code, body := g.do(t, "POST", "/v1/chat/completions", adminKey, threeMessages); code != 200 {
		t.Fatalf("three messages under max_messages 4: %d %s", code, body)
	}
	// Over the running 4096-byte limit, under the 1 MiB the file will ask for.
	big := `{"model":"demo","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("x", 8000) + `"}]}`

	write(render(2, 1<<20))
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := g.do(t, "POST", "/v1/chat/completions", adminKey, threeMessages)
		if code == 400 {
			if msg := gjson.Get(body, "error.message").String(); msg != "messages has 3 entries; the gateway accepts at most 2." {
				t.Fatalf("after the reload, three messages: %s", body)
			}
			break
		}
		if code != 200 || time.Now().After(deadline) {
			t.Fatalf("max_messages 2 not applied within 10s: %d %s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, body := g.do(t, "POST", "/v1/chat/completions", adminKey, big)
	if code != 413 || gjson.Get(body, "error.message").String() != "The request body exceeds the gateway's limit of 4096 bytes." {
		t.Fatalf("a body over the running max_body_bytes after a reload that raised it: %d %s", code, body)
	}

	// The log is flushed every second; wait for the reload's line.
	var line string
	for deadline := time.Now().Add(10 * time.Second); line == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "configuration reloaded") {
				line = l
			}
		}
	}
	if line == "" {
		t.Fatalf("no reload line logged:\n%s", logs.String())
	}
	if got := gjson.Get(line, "level").String(); got != "warn" {
		t.Errorf("a reload leaving a change for a restart logged at %q, want warn: %s", got, line)
	}
	if got := gjson.Get(line, "applied").Raw; got != `["server.max_messages"]` {
		t.Errorf("applied = %s, want [\"server.max_messages\"]: %s", got, line)
	}
	if got := gjson.Get(line, "needs_restart").Raw; got != `["server.max_body_bytes"]` {
		t.Errorf("needs_restart = %s, want [\"server.max_body_bytes\"]: %s", got, line)
	}
	if n := strings.Count(logs.String(), "configuration reloaded"); n != 1 {
		t.Errorf("one reload logged %d lines:\n%s", n, logs.String())
	}
	g.stop(t)
}

// TestReloadPricesTraceUsage reloads a model's prices: the trace service
// costs the calls already recorded at the new prices, as it costs them at
// the configured prices whenever it is asked.
func TestReloadPricesTraceUsage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tollgate.yaml")
	render := func(prompt, completion int) string {
		return fmt.Sprintf(`listen: "127.0.0.1:0"
log: {level: error}
reload: {watch: true, interval: 50ms}
store: {path: %q}
usage: {flush_interval: 50ms}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: sim
    simulated: {tokens: 3}
models:
  - name: demo
    backends: [sim]
    pricing: {prompt_per_mtok: %d, completion_per_mtok: %d}
`, filepath.Join(dir, "tollgate.db"), adminKey, prompt, completion)
	}
	write := func(content string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(render(1_000_000, 2_000_000)) // 1 and 2 per token
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	g := start(t, cfg)

	code, body := g.do(t, "POST", "/v1/chat/completions", adminKey, chatBody(3, ""), "Compat-Project: acme/prices")
	if code != 200 {
		t.Fatalf("completion: %d %s", code, body)
	}
	prompt, completion := gjson.Get(body, "usage.prompt_tokens").Float(), gjson.Get(body, "usage.completion_tokens").Float()
	// costs waits, up to 10s, for the call's costs to be these.
	costs := func(what string, wantPrompt, wantCompletion float64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, usage := g.do(t, "POST", "/trace/usage", adminKey, `{"project_id":"acme/prices","include_costs":true}`)
			if code != 200 {
				t.Fatalf("trace usage: %d %s", code, usage)
			}
			var got gjson.Result
			gjson.Get(usage, "call_usage").ForEach(func(_, byModel gjson.Result) bool {
				got = byModel.Get("demo")
				return false
			})
			if got.Get("prompt_tokens_total_cost").Float() == wantPrompt && got.Get("completion_tokens_total_cost").Float() == wantCompletion {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: costs %s, want %v prompt and %v completion", what, usage, wantPrompt, wantCompletion)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	costs("at the first prices", prompt, 2*completion)
	write(render(3_000_000, 5_000_000))
	costs("after the reload", 3*prompt, 5*completion)
	g.stop(t)
}
