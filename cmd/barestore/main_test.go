package main

import (
	"bufio"
	"context"
	"database/sql"
	"net"
	"path/filepath"
	"testing"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/tollgate-dev/tollgate/internal/bare"
	"github.com/tollgate-dev/tollgate/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind;
// fasthttp's own background goroutines are not ours and are ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.IgnoreFasthttp()...)
}

// TestStoresEveryRequest checks that each request forwarded, plain or
// streamed, is stored as the gateway stores a chat completion (one trace
// call with its completion link, its tokens in the usage roll-up), and that
// every record queued is written by the time serve returns.
func TestStoresEveryRequest(t *testing.T) {
	upstream := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/v1/stream" {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) { w.WriteString("data: [DONE]\n\n") })
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"chatcmpl-1"}`)
	}}
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go upstream.Serve(uln) //nolint:errcheck // ends with Shutdown below
	defer upstream.Shutdown()

	path := filepath.Join(t.TempDir(), "floor.db")
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, uln.Addr().String(), path, func(p *bare.Proxy) error { return p.Serve(ctx, pln) })
	}()

	client := &fasthttp.HostClient{Addr: pln.Addr().String()}
	for _, p := range []string{"/v1/chat/completions", "/v1/chat/completions", "/v1/stream"} {
		code, body, err := client.Post(nil, "http://"+pln.Addr().String()+p, nil)
		if err != nil || code != fasthttp.StatusOK {
			t.Fatalf("%s: %d %q %v", p, code, body, err)
		}
	}
	client.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []struct {
		name, sql string
	}{
		{"calls", `SELECT count(*) FROM calls c JOIN projects p ON p.id = c.project_id
			WHERE p.entity = 'bench' AND p.name = 'floor' AND c.op_name = 'openai.chat.completions.create'
			AND c.trace_id = c.id AND json_extract(c.summary, '$.usage."bench-model".total_tokens') = 28`},
		{"completion links", `SELECT count(DISTINCT l.completion_id) FROM call_completions l JOIN calls c
			ON c.project_id = l.project_id AND c.id = l.call_id`},
		{"rolled-up requests", `SELECT coalesce(sum(requests), 0) FROM usage_rollup`},
	} {
		var got int64
		if err := db.QueryRow(q.sql).Scan(&got); err != nil {
			t.Fatalf("%s: %v", q.name, err)
		}
		if got != 3 {
			t.Errorf("%s: %d, want 3", q.name, got)
		}
	}
}
