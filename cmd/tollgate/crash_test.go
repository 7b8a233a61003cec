package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
)

// tollgateBinary builds the gateway binary for a test, as it is
// deployed: without the race detector even when the test binary has it,
// since the race detector slows the pure-Go SQLite driver down tenfold and
// with it every timing the tests bound. Under -short it skips the test.
func tollgateBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the gateway binary; skipped with -short")
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	bin := filepath.Join(t.TempDir(), "tollgate")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// gatewayProcess is the gateway binary running on a config file.
type gatewayProcess struct {
	base string
	cmd  *exec.Cmd
	// Its stdout and stderr go to a file, as under most supervisors that
	// redirect to a file, or, for the test of that case, to a pipe.
	outputPath string
	pipe       *logCapture
	done       chan error // the result of Wait
}

// output returns what the process wrote to stdout and stderr so far.
func (p *gatewayProcess) output() string {
	if p.pipe != nil {
		return p.pipe.String()
	}
	b, _ := os.ReadFile(p.outputPath)
	return string(b)
}

// startGatewayProcess writes configYAML to a file, runs bin on it on a free
// port, with its output on a file (or on a pipe when onPipe is set), and
// waits until /healthz answers. The process is killed at the end of the
// test if it still runs.
func startGatewayProcess(t *testing.T, bin, configYAML string, onPipe bool) *gatewayProcess {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "tollgate.yaml")
	if err := os.WriteFile(path, []byte(configYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := &gatewayProcess{base: "http://" + addr, outputPath: filepath.Join(dir, "output.log"), done: make(chan error, 1)}
	p.cmd = exec.Command(bin, "-config", path, "-listen", addr)
	if onPipe {
		p.pipe = &logCapture{}
		p.cmd.Stdout, p.cmd.Stderr = p.pipe, p.pipe
	} else {
		out, err := os.Create(p.outputPath)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close() // the child has its own descriptor
		p.cmd.Stdout, p.cmd.Stderr = out, out
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		// Killing a process that already exited is a harmless error.
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := client.Get(p.base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("the gateway exited at start: %v\n%s", err, p.output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not answer /healthz within 30s\n%s", p.output())
		}
	}
}

// wait waits for the process to exit, up to limit, and returns how.
func (p *gatewayProcess) wait(t *testing.T, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(limit):
		t.Fatalf("the gateway did not exit within %v\n%s", limit, p.output())
		return nil
	}
}

const crashKey = "sk-crash-test-key"

// crashConfig is the binary's config: a simulated backend, the store in
// dir, and records flushed every flushInterval.
func crashConfig(dir string, flushInterval time.Duration) string {
	return fmt.Sprintf(`
listen: "127.0.0.1:0"
log: {level: info}
auth:
  keys:
    - {name: crash, key: %q, teams: ["*"], default_team: acme}
backends:
  - name: sim
    simulated: {tokens: 4}
models:
  - name: demo
    backends: [sim]
store: {path: %q}
usage: {flush_interval: %s}
server: {shutdown_timeout: 10s}
`, crashKey, filepath.Join(dir, "usage.db"), flushInterval)
}

// ack is a request the gateway answered: its X-Request-Id and when the
// whole reply had arrived.
type ack struct {
	id string
	at time.Time
}

// sequentialLoad sends non-streaming chat completions one after another,
// each with its own X-Request-Id, until stop is closed or the gateway
// stops answering, and returns those answered with a 200. Any other
// answer fails the test.
func sequentialLoad(t *testing.T, base string, stop <-chan struct{}) []ack {
	var acks []ack
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	const body = `{"model":"demo","messages":[{"role":"user","content":"count this"}],"max_tokens":3}`
	for i := 0; i < 100000; i++ {
		select {
		case <-stop:
			return acks
		default:
		}
		id := fmt.Sprintf("crash-%06d", i)
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return acks
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+crashKey)
		req.Header.Set("X-Request-Id", id)
		resp, err := client.Do(req)
		if err != nil {
			return acks // the gateway is gone
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return acks // cut off mid-reply: not acknowledged
		}
		if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != id {
			t.Errorf("request %s: status %d, X-Request-Id %q", id, resp.StatusCode, resp.Header.Get("X-Request-Id"))
			return acks
		}
		acks = append(acks, ack{id: id, at: time.Now()})
	}
	return acks
}

// storedRequestIDs opens the store as the gateway does (recovering its
// write-ahead log after a crash), then reads every usage record's request
// id, from its gateway call, counting repeats, and checks that the usage
// roll-up counts each call once.
func storedRequestIDs(t *testing.T, dir string) map[string]int {
	t.Helper()
	path := filepath.Join(dir, "usage.db")
	st, err := store.Open(context.Background(), config.Store{Driver: "sqlite", Path: path})
	if err != nil {
		t.Fatalf("the store does not open after the gateway stopped: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Every record is a gateway call, whose attributes hold its request id.
	rows, err := db.Query(`SELECT json_extract(attributes, '$.request_id') FROM calls`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// A call and its count in the usage roll-up are written together: each
	// stored call counts once, whatever the crash cut off.
	var calls, counted sql.NullInt64
	if err := db.QueryRow(`SELECT (SELECT COUNT(*) FROM calls), (SELECT SUM(records) FROM usage_rollup)`).Scan(&calls, &counted); err != nil {
		t.Fatal(err)
	}
	if calls.Int64 != counted.Int64 {
		t.Errorf("%d calls stored, %d records in the usage roll-up", calls.Int64, counted.Int64)
	}
	return ids
}

// runUnderLoad starts the load, lets it run for loadFor, calls hit (which
// kills or stops the gateway and returns when), then stops the load and
// returns what was acknowledged.
func runUnderLoad(t *testing.T, p *gatewayProcess, loadFor time.Duration, hit func() time.Time) ([]ack, time.Time) {
	t.Helper()
	stop := make(chan struct{})
	var acks []ack
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		acks = sequentialLoad(t, p.base, stop)
	}()
	time.Sleep(loadFor)
	at := hit()
	close(stop)
	wg.Wait()
	if len(acks) == 0 {
		t.Fatalf("no request was answered before the gateway stopped\n%s", p.output())
	}
	return acks, at
}

// TestGatewayBinary builds the gateway binary once and runs the tests that
// need a real process: signals, process output.
func TestGatewayBinary(t *testing.T) {
	bin := tollgateBinary(t)
	t.Run("kill -9 loses at most the last flush", func(t *testing.T) { testKill9(t, bin) })
	t.Run("SIGTERM loses nothing", func(t *testing.T) { testSIGTERM(t, bin) })
	t.Run("SIGTERM exits 0 with output on a pipe", func(t *testing.T) { testSIGTERMOnAPipe(t, bin) })
	t.Run("secrets never in process output", func(t *testing.T) { testSecretsInProcessOutput(t, bin) })
}

// testKill9 runs the real binary under sequential load and kills it with
// SIGKILL. Every request acknowledged more than flush_interval + 1 s before
// the kill must be in the store (by its X-Request-Id), exactly once; what
// was lost of the last stretch is reported. The margin past the flush
// interval is for the commit itself, which a loaded CI machine running the
// race detector can stretch to hundreds of milliseconds.
func testKill9(t *testing.T, bin string) {
	const flush = 200 * time.Millisecond
	const margin = time.Second
	dir := t.TempDir()
	p := startGatewayProcess(t, bin, crashConfig(dir, flush), false)

	acks, killedAt := runUnderLoad(t, p, 3*time.Second, func() time.Time {
		at := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return at
	})
	var exitErr *exec.ExitError
	if err := p.wait(t, 10*time.Second); !errors.As(err, &exitErr) {
		t.Fatalf("the gateway did not die of SIGKILL: %v", err)
	}

	stored := storedRequestIDs(t, dir)
	bound := killedAt.Add(-(flush + margin))
	var mustHave, lostLate, storedLate int
	var missing, repeated []string
	var oldestLost time.Duration
	for _, a := range acks {
		n := stored[a.id]
		if n > 1 {
			repeated = append(repeated, a.id)
		}
		if a.at.Before(bound) {
			mustHave++
			if n == 0 {
				missing = append(missing, fmt.Sprintf("%s (acknowledged %v before the kill)", a.id, killedAt.Sub(a.at).Round(time.Millisecond)))
			}
			continue
		}
		if n == 0 {
			lostLate++
			oldestLost = max(oldestLost, killedAt.Sub(a.at))
		} else {
			storedLate++
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d requests acknowledged more than %v before the kill are not in the store; the first and the last: %s … %s",
			len(missing), mustHave, flush+margin, missing[0], missing[len(missing)-1])
	}
	if len(repeated) > 0 {
		t.Errorf("%d requests stored more than once, the first %s", len(repeated), repeated[0])
	}
	for id := range stored {
		if !strings.HasPrefix(id, "crash-") {
			t.Errorf("a record with request id %q nobody sent", id)
		}
	}
	t.Logf("kill -9 after %d acknowledged requests: all %d acknowledged more than %v before the kill are stored; "+
		"of the %d acknowledged in the last %v, %d were stored and %d lost (the oldest lost acknowledged %v before the kill); %d records in all",
		len(acks), mustHave, flush+margin, lostLate+storedLate, flush+margin, storedLate, lostLate,
		oldestLost.Round(time.Millisecond), len(stored))
	if mustHave == 0 {
		t.Errorf("no request was acknowledged before the last %v; the load proves nothing", flush+margin)
	}
}

// testSIGTERM runs the real binary under the same load and stops it with
// SIGTERM: it must exit with status 0, and the store must hold exactly the
// requests that were acknowledged, each once.
func testSIGTERM(t *testing.T, bin string) {
	dir := t.TempDir()
	p := startGatewayProcess(t, bin, crashConfig(dir, 200*time.Millisecond), false)

	var exit error
	acks, _ := runUnderLoad(t, p, time.Second, func() time.Time {
		at := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		// The load goes on until the gateway stops answering.
		exit = p.wait(t, 20*time.Second)
		return at
	})
	if exit != nil {
		t.Fatalf("the gateway exited with %v after SIGTERM, want status 0\n%s", exit, p.output())
	}

	stored := storedRequestIDs(t, dir)
	acked := map[string]bool{}
	var wrong []string
	for _, a := range acks {
		acked[a.id] = true
		if stored[a.id] != 1 {
			wrong = append(wrong, fmt.Sprintf("%s acknowledged, stored %d times", a.id, stored[a.id]))
		}
	}
	for id, n := range stored {
		if !acked[id] {
			wrong = append(wrong, fmt.Sprintf("%s never acknowledged, stored %d times", id, n))
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%d acknowledged replies, %d records, %d mismatches, such as: %s", len(acks), len(stored), len(wrong), wrong[0])
	}
	t.Logf("SIGTERM after %d acknowledged requests: %d records stored", len(acks), len(stored))
}

// testSIGTERMOnAPipe stops the binary with SIGTERM while its stderr is a
// pipe, as under Docker, Kubernetes or systemd's journal: a clean shutdown
// must still exit with status 0.
func testSIGTERMOnAPipe(t *testing.T, bin string) {
	p := startGatewayProcess(t, bin, crashConfig(t.TempDir(), 200*time.Millisecond), true)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(t, 20*time.Second); err != nil {
		t.Fatalf("the gateway exited with %v after SIGTERM, want status 0\n%s", err, p.output())
	}
}
