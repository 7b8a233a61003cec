// Package hostile is an OpenAI-compatible backend that misbehaves on
// purpose, for tests of the gateway against broken and malicious upstreams.
// It speaks raw HTTP/1.1 on a TCP listener, so that it can send what a
// well-behaved server library refuses to: bodies that never end, events
// without an end, resets mid-body, counts that are not counts.
//
// The behaviour is chosen per request by the X-Hostile header (the gateway
// forwards it as an end-to-end header); see Behaviours. A request without
// it gets a valid chat completion, streamed when the body says
// "stream":true.
package hostile

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Header names the behaviour of a request.
const Header = "X-Hostile"

// Behaviours lists every behaviour by its X-Hostile value, with what it
// does. Responses "stream" when the request body has "stream":true unless
// the behaviour says otherwise.
var Behaviours = map[string]string{
	"ok":                 "a valid chat completion (or stream) with usage 10 + 5 = 15",
	"invalid-json":       "200 application/json whose body is an object that is not JSON",
	"not-json":           "200 application/json with an HTML page",
	"huge-body":          "200 with Content-Length 200 MiB, and 200 MiB of body",
	"endless-body":       "200 with a chunked JSON body that never ends",
	"endless-stream":     "a stream of valid chunks that never ends",
	"endless-error":      "500 with a chunked body that never ends",
	"giant-event":        "a stream whose first event is 200 MiB without an end",
	"reset-mid-body":     "200 with half of its body, then a TCP reset",
	"reset-mid-stream":   "two chunks of a stream, then a TCP reset",
	"slow-drip":          "200 whose body comes one byte every 50 ms, for ever",
	"hang":               "reads the request and never answers",
	"redirect":           "302 to a link-local metadata address",
	"unavailable":        "503 with Retry-After: 30",
	"usage-string":       `usage with "prompt_tokens":"10"`,
	"usage-negative":     "usage with prompt_tokens -5",
	"usage-huge":         "usage with prompt_tokens 2^63-1",
	"usage-float":        "usage with prompt_tokens 1e300",
	"usage-inconsistent": "usage with total_tokens below prompt + completion",
	"usage-cached":       "usage with cached_tokens above prompt_tokens",
	"usage-not-object":   `usage that is the string "lots"`,
	"stream-usage-bad":   "a stream whose continuous usage turns negative on the third chunk",
	"inband-error":       "a stream with one chunk, then an error event naming an internal address, then [DONE]",
	"error-leak":         "500 whose message names internal addresses and a file path",
	"error-leak-400":     "400 whose message names an internal address",
	"echo-key":           "401 whose message echoes the request's Authorization header",
	"echo-key-400":       "400 whose message echoes the request's Authorization header",
}

// LeakedAddress is the internal address the leaking behaviours put in
// their messages; a client must never see it.
const LeakedAddress = "10.31.7.42:8000"

// Server is a hostile backend listening on 127.0.0.1.
type Server struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}

	// requests counts requests read; open counts connections open now.
	requests atomic.Int64
	open     atomic.Int64
	// written counts body bytes written by the huge and endless
	// behaviours, so a test can see how far the gateway let them go.
	written atomic.Int64
	closing atomic.Bool
}

// Start listens on a free port of 127.0.0.1 and serves until Close.
func Start() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("hostile: listen: %w", err)
	}
	s := &Server{ln: ln, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// URL is the OpenAI base URL of the server, for a backend's url.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + "/v1" }

// Requests is the number of requests read so far.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Open is the number of connections open now.
func (s *Server) Open() int64 { return s.open.Load() }

// Written is the number of body bytes the unbounded behaviours wrote.
func (s *Server) Written() int64 { return s.written.Load() }

// Close stops listening, closes every connection and waits for every
// goroutine of the server.
func (s *Server) Close() error {
	s.closing.Store(true)
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.open.Add(1)
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		_ = c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.open.Add(-1)
	}()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
		_ = req.Body.Close()
		if err != nil {
			return
		}
		s.requests.Add(1)
		stream := bytes.Contains(body, []byte(`"stream":true`))
		if !s.respond(c, req.Header.Get(Header), stream, req.Header.Get("Authorization")) {
			return
		}
	}
}

// respond answers one request; false means the connection is done.
func (s *Server) respond(c net.Conn, behaviour string, stream bool, authorization string) bool {
	switch behaviour {
	case "", "ok":
		if stream {
			return writeStream(c, chunks(usageJSON(10, 5, 15)))
		}
		return writeJSON(c, 200, completion(usageJSON(10, 5, 15)))
	case "invalid-json":
		return writeJSON(c, 200, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":10,,}}`)
	case "not-json":
		return writeRaw(c, 200, "application/json", "<html><body>502 Bad Gateway</body></html>")
	case "huge-body":
		const size = 200 << 20
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(size)+"\r\n\r\n{\"pad\":\""); err != nil {
			return false
		}
		s.pour(c, size, false)
		return false
	case "endless-body":
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
			return false
		}
		s.pour(c, -1, true)
		return false
	case "endless-error":
		if _, err := io.WriteString(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
			return false
		}
		s.pour(c, -1, true)
		return false
	case "endless-stream":
		if _, err := io.WriteString(c, sseHead); err != nil {
			return false
		}
		for {
			if _, err := io.WriteString(c, "data: "+chunk("tok", "")+"\n\n"); err != nil {
				return false
			}
			s.written.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	case "giant-event":
		if _, err := io.WriteString(c, sseHead+"data: {\"pad\":\""); err != nil {
			return false
		}
		s.pour(c, 200<<20, false)
		return false
	case "reset-mid-body":
		body := completion(usageJSON(10, 5, 15))
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body[:len(body)/2])
		reset(c)
		return false
	case "reset-mid-stream":
		_, _ = io.WriteString(c, sseHead+"data: "+chunk("a", "")+"\n\ndata: "+chunk("b", "")+"\n\n")
		time.Sleep(20 * time.Millisecond)
		reset(c)
		return false
	case "slow-drip":
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"); err != nil {
			return false
		}
		for {
			time.Sleep(50 * time.Millisecond)
			if _, err := io.WriteString(c, " "); err != nil {
				return false
			}
			s.written.Add(1)
		}
	case "hang":
		// Wait for the peer to close: a read returns when it does.
		_, _ = io.Copy(io.Discard, c)
		return false
	case "unavailable":
		_, err := io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 30\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		return err == nil
	case "redirect":
		_, err := io.WriteString(c, "HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\nContent-Length: 0\r\n\r\n")
		return err == nil
	case "usage-string":
		return s.badUsage(c, stream, `{"prompt_tokens":"10","completion_tokens":5,"total_tokens":15}`)
	case "usage-negative":
		return s.badUsage(c, stream, usageJSON(-5, 5, 0))
	case "usage-huge":
		return s.badUsage(c, stream, `{"prompt_tokens":9223372036854775807,"completion_tokens":5,"total_tokens":9223372036854775807}`)
	case "usage-float":
		return s.badUsage(c, stream, `{"prompt_tokens":1e300,"completion_tokens":5,"total_tokens":1e300}`)
	case "usage-inconsistent":
		return s.badUsage(c, stream, usageJSON(10, 5, 3))
	case "usage-cached":
		return s.badUsage(c, stream, `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":11}}`)
	case "usage-not-object":
		return s.badUsage(c, stream, `"lots"`)
	case "stream-usage-bad":
		return writeStream(c, []string{
			chunk("a", usageJSON(10, 1, 11)),
			chunk("b", usageJSON(10, 2, 12)),
			chunk("c", usageJSON(10, -3, 7)),
			chunk("d", usageJSON(10, 4, 14)),
		})
	case "inband-error":
		return writeStream(c, []string{
			chunk("a", ""),
			`{"error":{"message":"CUDA out of memory on worker ` + LeakedAddress + `","type":"InternalServerError","code":500}}`,
		})
	case "error-leak":
		return writeJSON(c, 500, `{"error":{"message":"upstream connect error to `+LeakedAddress+` (http://vllm-7.internal:8000/v1): see /srv/vllm/logs/worker.log","type":"InternalServerError","code":500}}`)
	case "echo-key", "echo-key-400":
		status := 401
		if behaviour == "echo-key-400" {
			status = 400
		}
		return writeJSON(c, status, `{"error":{"message":"invalid credentials: `+strings.ReplaceAll(authorization, `"`, ``)+`","type":"AuthenticationError","code":401}}`)
	case "error-leak-400":
		return writeJSON(c, 400, `{"error":{"message":"max_tokens is too large for the model served at `+LeakedAddress+`","type":"BadRequestError","param":"max_tokens","code":400}}`)
	}
	return writeJSON(c, 400, `{"error":{"message":"unknown X-Hostile behaviour","type":"BadRequestError","code":400}}`)
}

// badUsage answers a valid reply (or stream, with the usage on its usage
// chunk) whose usage block is usage.
func (s *Server) badUsage(c net.Conn, stream bool, usage string) bool {
	if stream {
		return writeStream(c, append(chunks(""), `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"demo","choices":[],"usage":`+usage+`}`))
	}
	return writeJSON(c, 200, completion(usage))
}

// pour writes filler bytes until n are written (n < 0: for ever, chunked)
// or the peer stops reading. It writes from one small buffer, so the
// server's own memory does not grow with what it sends.
func (s *Server) pour(c net.Conn, n int, chunked bool) {
	buf := bytes.Repeat([]byte("x"), 32<<10)
	frame := buf
	if chunked {
		frame = append([]byte(strconv.FormatInt(int64(len(buf)), 16)+"\r\n"), buf...)
		frame = append(frame, "\r\n"...)
	}
	for n != 0 {
		w := frame
		if n > 0 && len(w) > n {
			w = w[:n]
		}
		if _, err := c.Write(w); err != nil {
			return
		}
		s.written.Add(int64(len(w)))
		if n > 0 {
			n -= len(w)
		}
		if s.closing.Load() {
			return
		}
	}
}

// reset closes c with a TCP RST rather than a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"

func usageJSON(prompt, completion, total int) string {
	return `{"prompt_tokens":` + strconv.Itoa(prompt) + `,"completion_tokens":` + strconv.Itoa(completion) +
		`,"total_tokens":` + strconv.Itoa(total) + `}`
}

func completion(usage string) string {
	return `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"demo","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there."},"finish_reason":"stop"}],"usage":` + usage + `}`
}

// chunk is one streamed chunk with content text, and usage when not "".
func chunk(text, usage string) string {
	s := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"demo","choices":[{"index":0,"delta":{"content":"` + text + `"},"finish_reason":null}]`
	if usage != "" {
		s += `,"usage":` + usage
	}
	return s + "}"
}

// chunks is a short valid stream's data payloads, ending with a usage
// chunk when usage is not "".
func chunks(usage string) []string {
	out := []string{chunk("Hello", ""), chunk(" there.", "")}
	if usage != "" {
		out = append(out, `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"demo","choices":[],"usage":`+usage+`}`)
	}
	return out
}

func writeStream(c net.Conn, payloads []string) bool {
	var b strings.Builder
	b.WriteString(sseHead)
	for _, p := range payloads {
		b.WriteString("data: " + p + "\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	_, _ = io.WriteString(c, b.String())
	return false // Connection: close
}

func writeJSON(c net.Conn, status int, body string) bool {
	return writeRaw(c, status, "application/json", body)
}

func writeRaw(c net.Conn, status int, contentType, body string) bool {
	_, err := io.WriteString(c, "HTTP/1.1 "+strconv.Itoa(status)+" "+http.StatusText(status)+"\r\nContent-Type: "+contentType+
		"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	return err == nil
}
