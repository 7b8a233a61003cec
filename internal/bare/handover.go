package bare

import (
	"errors"
	"io"
	"net"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/handover"
)

// A stream held by fasthttp's worker holds, for its whole life, the
// worker's stack, grown by the request path, its connection's 4 KiB write
// buffer, the 4 KiB buffer the body stream is copied through and the
// request context; so a proxy that holds an open stream in less than
// 16 KiB, as the gateway does, cannot leave it to the worker. A Proxy that
// hands its streams over does what the gateway does instead (its
// proxy/stream_conn.go): it sends the response head from the handler, has
// fasthttp hand the connection over (Hijack), which sends the worker, its
// buffers and the context back to their pools, and writes the stream from
// a goroutine of the stream's own, which then serves the connection's next
// requests. It does nothing else the gateway does, so tollbench
// -bare-handover measures what the hand-over costs a stream by itself.

// chunkLead is the room kept in front of an event for its chunk size line:
// up to eight hex digits and CRLF.
const chunkLead = 10

// lastChunk ends a chunked body with no trailers.
const lastChunk = "0\r\n\r\n"

// streamBufSize is the buffer a handed-over stream copies its upstream's
// body through, one read a chunk, as fasthttp copies a body stream.
const streamBufSize = 4 << 10

// streamConns are the client connections of handed-over streams and of
// the requests after them, for Serve to close on shutdown: fasthttp does
// not know them once they are handed over, and ServeConn takes one for a
// new connection, which its Shutdown closes only once idle for seconds.
// Each connection counts the goroutines that hold it: the one serving its
// requests again after a stream still holds it when a later stream on it
// has been handed to a goroutine of its own.
type streamConns struct {
	mu       sync.Mutex
	conns    map[net.Conn]int
	stopping bool
	// running counts the streams' goroutines, for Serve to wait for.
	running sync.WaitGroup
}

// add records conn, unless the proxy is stopping.
func (s *streamConns) add(conn net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[net.Conn]int)
	}
	s.conns[conn]++
	return true
}

// remove drops a hold on conn that add recorded.
func (s *streamConns) remove(conn net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns[conn]--; s.conns[conn] <= 0 {
		delete(s.conns, conn)
	}
}

// closeAll ends every stream and every wait for a request after one:
// each one's next read or write fails at once. Streams handed over later
// end as they begin.
func (s *streamConns) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
	for c := range s.conns {
		_ = c.Close() // the stream's goroutine sees the error
	}
}

// HandOverStreams has p write every reply of unknown length (an SSE
// stream) from a goroutine of the stream's own, as the gateway does, in
// place of fasthttp's worker. Call it before Serve or Run.
func (p *Proxy) HandOverStreams() {
	p.streams = &streamConns{}
	p.srv.KeepHijackedConns = true
}

// handOver sends the head of the reply resp, whose body is the stream
// body, at once, as fasthttp's ImmediateHeaderFlush would, and has fasthttp
// hand the connection over to writeStream.
func (p *Proxy) handOver(ctx *fasthttp.RequestCtx, resp *fasthttp.Response, body io.Reader) {
	h := &ctx.Response.Header
	h.SetContentLength(-1) // chunked
	buf := make([]byte, 0, streamBufSize)
	_, headErr := ctx.Conn().Write(h.AppendBytes(buf))
	// Counted before the handler returns, for Serve's wait to see it.
	p.streams.running.Add(1)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		conn, pipelined, ok := handover.TakeConn(c, buf[:cap(buf)])
		keep := ok && headErr == nil && !ctx.Request.Header.ConnectionClose()
		go p.writeStream(conn, pipelined, keep, headErr, resp, body, buf[:cap(buf)])
	})
}

// writeStream writes body on conn, a read a chunk, then releases resp and
// its upstream connection and ends the body; with keep it then serves the
// client's next requests on conn, the bytes it pipelined first, as
// fasthttp's worker would have. A failed write or upstream read closes
// conn, with no last chunk after an upstream failure, so that the client
// sees the stream cut short.
func (p *Proxy) writeStream(conn net.Conn, pipelined []byte, keep bool, err error, resp *fasthttp.Response, body io.Reader, buf []byte) {
	defer p.streams.running.Done()
	if pc, ok := conn.(*prefixedConn); ok && len(pc.prefix) == 0 {
		// A stream on a connection served again after an earlier one:
		// its pipelined bytes were read, so no wrapper on a wrapper.
		conn = pc.Conn
	}
	if !p.streams.add(conn) {
		err = errStopping
	}
	for err == nil {
		var n int
		n, err = body.Read(buf[chunkLead : len(buf)-len("\r\n")])
		if n > 0 {
			start := chunkLead - handover.PutChunkSize(buf[:chunkLead], n)
			end := chunkLead + n + copy(buf[chunkLead+n:], "\r\n")
			if _, werr := conn.Write(buf[start:end]); werr != nil {
				err = werr
			}
		}
	}
	closeErr := resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	// The upstream connection is back in its pool before the client can
	// send its next request.
	if errors.Is(err, io.EOF) && closeErr == nil {
		_, err = conn.Write(buf[:copy(buf, lastChunk)])
	}
	if err != nil || !keep {
		p.streams.remove(conn)
		_ = conn.Close()
		return
	}
	// The goroutine began with a small stack, which the request path
	// would grow at its deepest point (see handover.RequestStack).
	handover.GrowStack(0)
	_ = p.srv.ServeConn(&prefixedConn{Conn: conn, prefix: pipelined}) // errors are the connection's, and end it
	p.streams.remove(conn)
}

// errStopping ends a stream handed over while the proxy stops.
var errStopping = errors.New("the proxy is stopping")

// prefixedConn is a connection whose client pipelined bytes behind a
// stream's request: they are read first.
type prefixedConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixedConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
