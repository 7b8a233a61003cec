package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/backends/simulated"
	"github.com/tollgate-dev/tollgate/internal/scripted"
)

// openStreamMem is what the process holds, measured once streams are open.
type openStreamMem struct {
	heapInuse, stackInuse, rss uint64
	// heapRetained is heap the runtime holds free but has not given back
	// to the OS: it counts in RSS, and is most of what RSS has beyond the
	// heap and stacks in use.
	heapRetained uint64
	// allocated is the heap allocated since the process started: what
	// opening the streams allocated, live or garbage, is its growth.
	allocated  uint64
	goroutines int
}

func readStreamMem(t *testing.T) openStreamMem {
	t.Helper()
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return openStreamMem{heapInuse: ms.HeapInuse, stackInuse: ms.StackInuse, rss: vmRSS(t),
		heapRetained: ms.HeapIdle - ms.HeapReleased, allocated: ms.TotalAlloc, goroutines: runtime.NumGoroutine()}
}

// vmRSS is the process's resident set from /proc/self/status, 0 where
// there is none.
func vmRSS(t *testing.T) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("parse VmRSS %q: %v", line, err)
			}
			return kb << 10
		}
	}
	return 0
}

// openSlowStream sends a streamed chat completion on a new connection and
// reads up to its first event; the connection is then left open, unread,
// as a client waiting for its next token leaves it.
func openSlowStream(t *testing.T, addr, prompt string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"demo","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":1000,"stream":true}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", testKey, len(body), body)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(c, 256)
	var seen []byte
	for !bytes.Contains(seen, []byte("data: ")) {
		b, err := br.ReadByte()
		if err != nil {
			t.Fatalf("first event: %v (got %q)", err, seen)
		}
		seen = append(seen, b)
	}
	if !bytes.HasPrefix(seen, []byte("HTTP/1.1 200")) {
		t.Fatalf("stream reply: %q", seen)
	}
	return c
}

// Bounds of TestOpenStreamMemory, with the in-process simulated backend's
// side of each stream included: one goroutine each side, with its heap and
// stack (the test logs what each stream holds). The heap bound catches a
// regression of about 8 KiB per stream or more (a buffer held while the
// stream waits); it holds under -race too. The upstream
// read buffer a waiting stream gives back is checked apart, by
// backends.TestAwaitStreamHoldsNoBuffer. The stack bound
// catches the gateway's stream goroutine growing to 8 KiB (see
// chunk_choices.go); the race detector's instrumentation deepens every
// stack, so it is checked without it.
const (
	openStreamGoroutines = 2
	openStreamHeapBytes  = 42 << 10
	openStreamStackBytes = 14 << 10
)

// TestOpenStreamMemory holds n slow streams through the gateway (200, or
// TOLLGATE_STREAM_MEM) and checks what each adds in goroutines and heap,
// logging stacks and RSS too, with the goroutines by function. The numbers
// include the in-process simulated backend's side of every stream; the
// listing tells them apart. With TOLLGATE_STREAM_MEM_UPSTREAM set to a
// mockllm's address the figures are the gateway's alone, and with
// TOLLGATE_STREAM_MEM_DIR the heap and goroutine profiles are written there.
func TestOpenStreamMemory(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TOLLGATE_STREAM_MEM"))
	if n <= 0 {
		n = 200
	}
	// A prompt of TOLLGATE_STREAM_MEM_PROMPT bytes shows what a stream
	// holds of its request while it is open.
	prompt := "hi"
	if n, _ := strconv.Atoi(os.Getenv("TOLLGATE_STREAM_MEM_PROMPT")); n > 0 {
		prompt = strings.Repeat("a", n)
	}
	runtime.MemProfileRate = 512
	defer func() { runtime.MemProfileRate = 512 << 10 }()
	o := harnessOptions{
		sim:    simulated.Options{InterTokenDelay: 2 * time.Second, Tokens: 1000},
		server: "max_connections: 100000",
	}
	if up := os.Getenv("TOLLGATE_STREAM_MEM_UPSTREAM"); up != "" {
		// A backend in another process (mockllm -itl 2s), so that the
		// figures are the gateway's alone.
		o.extraBackends = "  - name: ext\n    url: \"http://" + up + "/v1\"\n    max_conns: 100000"
		o.models = "  - name: demo\n    backends: [ext]\n"
	}
	h := newHarness(t, o)
	addr := strings.TrimPrefix(h.base, "http://")
	// Warm the pools and the first-request paths.
	for range 4 {
		_ = openSlowStream(t, addr, prompt).Close()
	}
	time.Sleep(200 * time.Millisecond)
	var before bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&before, 0); err != nil {
		t.Fatal(err)
	}
	base := readStreamMem(t)
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = openSlowStream(t, addr, prompt)
	}
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	time.Sleep(200 * time.Millisecond)
	loaded := readStreamMem(t)
	per := func(a, b uint64) float64 { return (float64(b) - float64(a)) / float64(n) }
	heap, goroutines := per(base.heapInuse, loaded.heapInuse), float64(loaded.goroutines-base.goroutines)/float64(n)
	t.Logf("%d streams: per stream heap %.0f B, stack %.0f B, RSS %.0f B (free heap not returned to the OS %.0f B), goroutines %.2f; allocated %.0f B",
		n, heap, per(base.stackInuse, loaded.stackInuse), per(base.rss, loaded.rss), per(base.heapRetained, loaded.heapRetained), goroutines,
		per(base.allocated, loaded.allocated))
	if os.Getenv("TOLLGATE_STREAM_MEM_UPSTREAM") == "" {
		if goroutines > openStreamGoroutines+0.05 {
			t.Errorf("%.2f goroutines per open stream, want at most %d (one each side)", goroutines, openStreamGoroutines)
		}
		if stack := per(base.stackInuse, loaded.stackInuse); !raceEnabled && stack > openStreamStackBytes {
			t.Errorf("%.0f B of stack per open stream, want at most %d", stack, openStreamStackBytes)
		}
		if heap > openStreamHeapBytes {
			t.Errorf("%.0f B of heap per open stream, want at most %d", heap, openStreamHeapBytes)
		}
	}
	if dir := os.Getenv("TOLLGATE_STREAM_MEM_DIR"); dir != "" {
		for name, debug := range map[string]int{"heap": 0, "goroutine": 1} {
			f, err := os.Create(dir + "/" + name + ".prof")
			if err != nil {
				t.Fatal(err)
			}
			if err := pprof.Lookup(name).WriteTo(f, debug); err != nil {
				t.Fatal(err)
			}
			_ = f.Close()
		}
		_ = os.WriteFile(dir+"/heap_before.prof", before.Bytes(), 0o644)
	}
	var stacks bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
	t.Logf("goroutine groups of %d or more:\n%s", n, goroutineGroups(stacks.String(), n))
}

// goroutineGroups lists the goroutine profile's groups of at least min
// goroutines, each by the first frames of its stack.
func goroutineGroups(profile string, min int) string {
	var out []string
	for _, g := range strings.Split(profile, "\n\n") {
		first, rest, _ := strings.Cut(g, "\n")
		count, _, ok := strings.Cut(first, " @ ")
		if !ok {
			continue
		}
		c, err := strconv.Atoi(count)
		if err != nil || c < min {
			continue
		}
		var frames []string
		for line := range strings.Lines(rest) {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" {
				frames = append(frames, f[2])
			}
		}
		out = append(out, fmt.Sprintf("%6d  %s", c, strings.Join(frames, " < ")))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestStreamShrunkReaderKeepsEvents streams events of every size, small
// and larger than the small read buffer an open stream's upstream
// connection switches to once idle (backends.Backend.ShrinkStream, and
// between waits, AwaitStream), twice over one upstream connection: both
// streams must arrive byte for byte, and the connection, given back after
// the first, must serve the second.
func TestStreamShrunkReaderKeepsEvents(t *testing.T) {
	sizes := []int{10, 900, 1500, 40, 3000, 700, 9000, 60, 5000}
	content := func(i, size int) string { return strings.Repeat(string(rune('a'+i)), size) }
	event := func(i int) string {
		return fmt.Sprintf("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"demo\","+
			"\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", content(i, sizes[i]))
	}
	chunk := func(data string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(data), data) }
	// The upstream writes the events in groups of three chunks, each group
	// in one write: the gateway reads a group at once, so bytes wait in
	// its upstream buffer when the group's first event is done. The wait
	// after each group lets it drain the buffer, and the next group
	// arrives on a shrunk reader.
	up, err := scripted.Start(func(c net.Conn) {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		var group strings.Builder
		for i := range sizes {
			group.WriteString(chunk(event(i)))
			if i%3 == 2 || i == len(sizes)-1 {
				if _, err := io.WriteString(c, group.String()); err != nil {
					return
				}
				group.Reset()
				time.Sleep(20 * time.Millisecond)
			}
		}
		_, _ = io.WriteString(c, chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	h := newHarness(t, harnessOptions{
		extraBackends: "  - name: ext\n    url: \"http://" + up.Addr() + "/v1\"\n    max_conns: 1",
		models:        "  - name: demo\n    backends: [ext]\n",
	})
	for round := range 2 {
		status, events := h.stream(`{"model":"demo","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		if status != 200 {
			t.Fatalf("round %d: status %d", round, status)
		}
		var got []string
		for _, data := range events {
			if c := gjson.Get(data, "choices.0.delta.content"); c.Exists() {
				got = append(got, c.String())
			}
		}
		body := []byte(strings.Join(events, "\n"))
		if len(got) != len(sizes) || events[len(events)-1] != "[DONE]" {
			t.Fatalf("round %d: %d content events, want %d, ending in [DONE]:\n%.400s", round, len(got), len(sizes), body)
		}
		for i, size := range sizes {
			if got[i] != content(i, size) {
				t.Fatalf("round %d: event %d is %d bytes of %.10q…, want %d of %q", round, i, len(got[i]), got[i], size, content(i, size)[:1])
			}
		}
	}
	if n := up.Accepted(); n != 1 {
		t.Fatalf("upstream accepted %d connections for two streams, want 1 (the connection reused)", n)
	}
}
