package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// replica is one gateway process.
type replica struct {
	base   string
	cmd    *exec.Cmd
	stderr *lockedBuffer
	done   chan error
}

// lockedBuffer collects a process's output for the failure message.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// replicaBinary builds the gateway binary once for the test.
func replicaBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tollgate")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startReplica runs the binary on config and waits until it answers.
func startReplica(t *testing.T, bin, config string) *replica {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tollgate.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	r := &replica{base: "http://" + addr, stderr: &lockedBuffer{}, done: make(chan error, 1)}
	r.cmd = exec.Command(bin, "-config", path, "-listen", addr)
	r.cmd.Stderr = r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(r.base + "/healthz")
		if err == nil {
			resp.Body.Close()
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica did not start: %v\n%s", err, r.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// terminate stops the replica as an orchestrator does and waits for it.
func (r *replica) terminate(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("replica exited with %v\n%s", err, r.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("replica did not exit after SIGTERM\n%s", r.stderr)
	}
	r.done <- nil // for the cleanup
}

func (r *replica) post(client *http.Client, key, project, body string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Compat-Project", project)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// replicaStores skips the test unless PostgreSQL and Redis are there for
// three gateway processes to share, and returns a fresh PostgreSQL store,
// Redis's address and a key prefix of the test's own.
func replicaStores(t *testing.T) (st config.Store, redisAddr, prefix string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts three gateway processes")
	}
	redisAddr = os.Getenv("TOLLGATE_TEST_REDIS_ADDR")
	if os.Getenv(storetest.EnvDSN) == "" || redisAddr == "" {
		t.Skip("needs TOLLGATE_TEST_PG_DSN and TOLLGATE_TEST_REDIS_ADDR: multi-replica test skipped")
	}
	return storetest.Config(t, storetest.Postgres), redisAddr, fmt.Sprintf("tollgate-test-%d:", time.Now().UnixNano())
}

// TestReplicasShareBudgetAndUsage runs three gateway processes on one
// PostgreSQL and one Redis: concurrent load spread over them spends one
// team budget exactly up to its limit, a replica stopped mid-load loses
// none of the records it acknowledged, and every replica reports the same,
// exact usage totals.
func TestReplicasShareBudgetAndUsage(t *testing.T) {
	st, redisAddr, prefix := replicaStores(t)
	// Each request costs exactly 8 prompt + 10 completion tokens, and the
	// gateway reserves exactly 18 for it, so 111 fit in a budget of 2000.
	// The Redis timeout is far above the 50 ms default: past it a replica
	// falls back to local counters (the documented fail-open policy), and
	// a loaded CI machine running the race detector can take longer than
	// 50 ms; this test is about the shared counters, not the fall back.
	config := fmt.Sprintf(`
log: {level: warn}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: sim
    simulated: {tokens: 16}
models:
  - name: demo
    backends: [sim]
store: {driver: postgres, dsn: %q}
usage: {flush_interval: 100ms}
limits_backend: {driver: redis, addr: %q, prefix: %q, timeout: 5s}
limits:
  - {team: acme, token_budget: 2000, budget_window: day}
`, adminKey, st.DSN, redisAddr, prefix)
	bin := replicaBinary(t)
	replicas := []*replica{startReplica(t, bin, config), startReplica(t, bin, config), startReplica(t, bin, config)}
	client := &http.Client{Timeout: 10 * time.Second}
	body := chatBody(10, "")

	// One budget, enforced across the replicas.
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 150 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, resp, err := replicas[i%3].post(client, adminKey, "acme/shared", body)
			switch {
			case err != nil:
				t.Error(err)
			case code == 200:
				admitted.Add(1)
			case code == 429 && gjson.Get(resp, "error.code").String() == "insufficient_quota":
				refused.Add(1)
			default:
				t.Errorf("unexpected %d %s", code, resp)
			}
		}()
	}
	wg.Wait()
	for i, r := range replicas {
		if n, err := redisErrors(client, r); err != nil {
			t.Fatal(err)
		} else if n != 0 {
			t.Errorf("replica %d: %v failed Redis calls, so it enforced the budget on local counters", i, n)
		}
	}
	if admitted.Load() != 111 || refused.Load() != 39 {
		t.Errorf("budget of 2000 across 3 replicas: %d admitted, %d refused; want 111 and 39", admitted.Load(), refused.Load())
	}

	// Load on another team while one replica is stopped: it answers what
	// it accepted, then its records must all be in the store.
	var acked atomic.Int64
	stopLoad := make(chan struct{})
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				select {
				case <-stopLoad:
					return
				default:
				}
				code, _, err := replicas[(w+i)%3].post(client, adminKey, "globex/load", body)
				if err == nil && code == 200 {
					acked.Add(1)
				}
			}
		}()
	}
	for acked.Load() < 60 {
		time.Sleep(10 * time.Millisecond)
	}
	replicas[2].terminate(t)
	for acked.Load() < 150 {
		time.Sleep(10 * time.Millisecond)
	}
	close(stopLoad)
	wg.Wait()

	// Every replica still running reads the same, exact totals.
	want := map[string]struct{ requests, tokens int64 }{
		"acme/shared": {111, 111 * 18},
		"globex/load": {acked.Load(), acked.Load() * 18},
	}
	for i, r := range replicas[:2] {
		// Records reach the store within the 100 ms flush interval; the
		// wide deadline is for a loaded CI machine, and the loop ends at
		// the first read that matches.
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := replicaUsageTotals(client, r, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			match := true
			for p, w := range want {
				if got[p].requests != w.requests || got[p].tokens != w.tokens {
					match = false
				}
			}
			if match {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d reads %v, want %v", i, got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// redisErrors reads tollgate_limits_redis_errors_total from a replica's
// metrics: the Redis calls that failed or timed out, each of which made it
// fall back to its local counters.
func redisErrors(client *http.Client, r *replica) (float64, error) {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, r.base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("metrics: %d %s", resp.StatusCode, b)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "tollgate_limits_redis_errors_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("metrics: no tollgate_limits_redis_errors_total in\n%s", b)
}

// replicaUsageTotals reads requests and tokens per project from a replica's
// usage API for today.
func replicaUsageTotals(client *http.Client, r *replica, now time.Time) (map[string]struct{ requests, tokens int64 }, error) {
	start := now.Add(-time.Hour).Unix()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet,
		fmt.Sprintf("%s/v1/organization/usage/completions?start_time=%d&bucket_width=1d&group_by=project_id", r.base, start), nil)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("usage API: %d %s", resp.StatusCode, b)
	}
	out := map[string]struct{ requests, tokens int64 }{}
	gjson.GetBytes(b, "data.#.results").ForEach(func(_, results gjson.Result) bool {
		results.ForEach(func(_, r gjson.Result) bool {
			p := r.Get("project_id").String()
			sum := out[p]
			sum.requests += r.Get("num_model_requests").Int()
			sum.tokens += r.Get("input_tokens").Int() + r.Get("output_tokens").Int()
			out[p] = sum
			return true
		})
		return true
	})
	return out, nil
}
