package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/internal/leakcheck"
)

// TestMain checks that run leaves nothing behind; fasthttp's own background goroutines are not
// ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.IgnoreFasthttp()...)
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		check func(config) bool
		err   bool
	}{
		{"defaults", nil, func(c config) bool {
			return c.listen == "127.0.0.1:8000" && c.opts.Tokens == 16 && c.opts.EmbeddingDimensions == 8 && c.opts.StoredResponses == 1024 && c.opts.Models == nil
		}, false},
		{"every flag", []string{"-listen", ":9", "-ttft", "20ms", "-itl", "5ms", "-tokens", "4", "-model", "a, b,", "-fail-status", "503",
			"-embedding-dims", "32", "-prefix-cache", "10", "-stored-responses", "5", "-varied"}, func(c config) bool {
			o := c.opts
			return c.listen == ":9" && o.TimeToFirstToken == 20*time.Millisecond && o.InterTokenDelay == 5*time.Millisecond &&
				o.Tokens == 4 && fmt.Sprint(o.Models) == "[a b]" && o.FailStatus == 503 && o.EmbeddingDimensions == 32 &&
				o.PrefixCache == 10 && o.StoredResponses == 5 && o.VariedText
		}, false},
		{"engine flags", []string{"-max-num-seqs", "8", "-prefill-per-token", "50us", "-kv-cache-blocks", "1536", "-block-size", "32",
			"-load-factor", "2", "-loras", "sql, chat", "-max-loras", "2", "-lora-load-time", "30ms"}, func(c config) bool {
			e := c.opts.Engine
			return e.MaxNumSeqs == 8 && e.PrefillPerToken == 50*time.Microsecond && e.KVCacheBlocks == 1536 && e.BlockSize == 32 &&
				e.LoadFactor == 2 && fmt.Sprint(e.LoRAs) == "[sql chat]" && e.MaxLoRAs == 2 && e.LoRALoadTime == 30*time.Millisecond
		}, false},
		{"stray argument", []string{"extra"}, nil, true},
		{"bad duration", []string{"-ttft", "soon"}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.args, io.Discard)
			if (err != nil) != tt.err {
				t.Fatalf("err %v, want error %v", err, tt.err)
			}
			if tt.check != nil && !tt.check(c) {
				t.Errorf("config %+v", c)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for the server's writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunServesEveryEndpoint starts the command on a free port, calls each endpoint, and stops
// it through its context.
func TestRunServesEveryEndpoint(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-model", "demo", "-embedding-dims", "4"}, &out)
	}()

	addr := regexp.MustCompile(`serving on (http://\S+)`)
	var base string
	for deadline := time.Now().Add(10 * time.Second); base == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		}
	}
	if base == "" {
		cancel()
		t.Fatalf("no address announced: %q (run: %v)", out.String(), <-done)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for _, c := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"hi"}]}`, `"object":"chat.completion"`},
		{"/v1/completions", `{"model":"demo","prompt":"hi"}`, `"object":"text_completion"`},
		{"/v1/embeddings", `{"model":"demo","input":"hi"}`, `"object":"embedding"`},
		{"/v1/responses", `{"model":"demo","input":"hi"}`, `"object":"response"`},
	} {
		resp, err := client.Post(base+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: %d %s", c.path, resp.StatusCode, body)
		}
	}
	client.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	if !strings.Contains(out.String(), "shutting down") {
		t.Errorf("output %q", out.String())
	}
}
