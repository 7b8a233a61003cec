package main

import (
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func selfPID() int { return os.Getpid() }

func TestParseInts(t *testing.T) {
	got, err := parseInts(" 1000, 5000,,", "-rates")
	if err != nil || !slices.Equal(got, []int{1000, 5000}) {
		t.Errorf("parseInts = %v, %v; want [1000 5000]", got, err)
	}
	if got, err := parseInts("", "-streams"); err != nil || len(got) != 0 {
		t.Errorf("parseInts(\"\") = %v, %v; want empty", got, err)
	}
	for _, bad := range []string{"x", "0", "-5", "1k"} {
		if _, err := parseInts(bad, "-rates"); err == nil {
			t.Errorf("parseInts(%q) succeeded, want an error", bad)
		}
	}
}

func TestQuickKeepsExplicitFlags(t *testing.T) {
	o, err := parseOptions([]string{"-quick", "-rounds", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.phase != time.Second || o.rounds != 3 || !slices.Equal(o.openStreams, []int{1000}) {
		t.Errorf("quick options = phase %v rounds %d streams %v; want 1s, 3, [1000]", o.phase, o.rounds, o.openStreams)
	}
}

func TestParseOptionsRefusesUnbounded(t *testing.T) {
	for _, args := range [][]string{{"-duration", "0s"}, {"-rounds", "0"}, {"-streams", "1000000"}, {"-instructions", "-1"}, {"extra"}, {"-fleet", "-otel"}} {
		if _, err := parseOptions(args, io.Discard); err == nil {
			t.Errorf("parseOptions(%q) succeeded, want an error", args)
		}
	}
}

func TestEventCounter(t *testing.T) {
	// Events split at every possible point must be counted once each.
	stream := "data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n"
	for split := 0; split <= len(stream); split++ {
		var c eventCounter
		if n := c.count([]byte(stream[:split])) + c.count([]byte(stream[split:])); n != 3 {
			t.Errorf("split at %d: counted %d events, want 3", split, n)
		}
	}
}

func TestGatewayConfigYAML(t *testing.T) {
	y := gatewayConfig{key: "sk-x", logLevel: "info", store: "/tmp/d/t.db", fast: "127.0.0.1:1", stream: "127.0.0.1:2", slow: "127.0.0.1:3"}.yaml()
	for _, want := range []string{`url: "http://127.0.0.1:2/v1"`, "max_connections: 100000", "max_conns: 100000",
		`key: "sk-x"`, `path: "/tmp/d/t.db"`, "- name: bench-slow"} {
		if !strings.Contains(y, want) {
			t.Errorf("config lacks %q:\n%s", want, y)
		}
	}
}

func TestChatBody(t *testing.T) {
	if b := string(chatBody("m", 64, true)); !strings.Contains(b, `"max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}`) {
		t.Errorf("stream body = %s", b)
	}
	if b := string(chatBody("m", 16, false)); strings.Contains(b, "stream") || !strings.HasSuffix(b, `"max_tokens":16}`) {
		t.Errorf("body = %s", b)
	}
}
