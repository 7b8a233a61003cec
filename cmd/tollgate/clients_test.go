package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	tollgate "github.com/tollgate-dev/tollgate"
)

// clientSuiteDir is the npm package of real client libraries (the official
// OpenAI SDK, the Vercel AI SDK, LangChain and the Weave SDK) whose
// node:test files run against the gateway binary.
const clientSuiteDir = "../../clients"

// clientSuiteTimeout bounds the whole npm suite; a client that hangs on a
// stream the gateway never ends must fail the test, not CI's time limit.
const clientSuiteTimeout = 10 * time.Minute

// nodeSummary matches the closing counts node's test runner prints.
var nodeSummary = regexp.MustCompile(`(?m)^# (tests|pass|fail|skipped|cancelled) (\d+)$`)

// TestClientSuite runs clients/test/*.test.mjs with node's test runner
// against the real binary on the embedded example configuration, exactly
// as a user runs it: clients change only their base URL. The suite needs
// Node.js and `npm ci` in clients/ (.ci/run does both); without them it
// is skipped, and says how to run it.
func TestClientSuite(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("SKIPPED: node is not installed; the npm client suite needs Node.js 20 or later")
	}
	dir, err := filepath.Abs(clientSuiteDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		t.Skip("SKIPPED: clients/node_modules is missing; run `npm ci --prefix clients` to run the npm client suite")
	}
	bin := tollgateBinary(t)
	p := startGatewayProcess(t, bin, string(tollgate.ExampleConfig()), false)

	ctx, cancel := context.WithTimeout(context.Background(), clientSuiteTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-concurrency=4", "--test-reporter=tap", "test/")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"TOLLGATE_URL="+p.base,
		"TOLLGATE_KEY=sk-tollgate-demo",
		"NO_COLOR=1",
	)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test output:\n%s", out)
	counts := map[string]int{}
	for _, m := range nodeSummary.FindAllSubmatch(out, -1) {
		n, _ := strconv.Atoi(string(m[2]))
		counts[string(m[1])] = n
	}
	t.Logf("client suite: %d tests, %d passed, %d failed, %d skipped, %d cancelled",
		counts["tests"], counts["pass"], counts["fail"], counts["skipped"], counts["cancelled"])
	if err != nil {
		t.Fatalf("the npm client suite failed: %v\ngateway output:\n%s", err, p.output())
	}
	if counts["tests"] == 0 || counts["pass"] == 0 {
		t.Fatalf("the npm client suite ran no test")
	}
}
