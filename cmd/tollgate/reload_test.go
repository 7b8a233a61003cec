package main

import (
	"bufio"
	"fmt"
	"io"
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
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5s", what)
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
