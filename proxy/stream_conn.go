package proxy

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/bufpool"
	"github.com/tollgate-dev/tollgate/internal/handover"
)

// A stream held open costs what holds it while it waits for the next event.
// Written by fasthttp's worker (streamBody as a body stream), that is the
// worker's goroutine, whose stack grew to the depth of the whole request
// path, the connection's 4 KiB write buffer and the 4 KiB copy buffer that
// fasthttp reads the body stream into, for the life of the stream. So a
// stream on a connection of the gateway's own listener is written by a
// goroutine of its own instead (run): fasthttp hands the connection over
// (Hijack) and its worker, buffers and request context go back to their
// pools at once. While it waits, the stream holds its state and a small
// stack: the upstream connection's read buffer goes back to its pool for
// the wait (see backends.AwaitStream), and a buffer for events is taken
// from a pool only once an event has come, and given back once it is
// written. When the stream is over, the same goroutine serves the client's
// next requests on the connection (keep), so keep-alive is kept.

// serverName is the Server header of every reply.
const serverName = "tollgate"

// Chunked framing (RFC 9112 section 7.1) around the events of one write.
const (
	// chunkLead is the room kept in front of the events for the chunk
	// size line: up to eight hex digits and CRLF.
	chunkLead = 10
	// chunkTrail is the room kept after them for the CRLF that ends the
	// chunk and, after the stream's last events, the last chunk.
	chunkTrail = len("\r\n") + len(lastChunk)
	// lastChunk is the zero-size chunk that follows the stream's last
	// events. The empty trailer section after it (bodyEnd), which ends
	// the body, is written only once the stream is settled (see run).
	lastChunk = "0\r\n"
	bodyEnd   = "\r\n"
)

// maxHeadWithEvent is the longest response head sent in one write with
// the first events; a longer one (a client's long X-Request-Id) goes out
// on its own first, so that the events keep most of a pooled buffer.
const maxHeadWithEvent = 1 << 10

// headBufs holds buffers for response heads, by pointer so that Put does
// not allocate.
var headBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// writeOnConn has the stream written on the client's connection by a
// goroutine of its own (see run), rather than by fasthttp's worker. The
// response head is rendered here, where the headers set on ctx are, and
// sent at once: with the first events when they came with the upstream's
// headers, alone otherwise, as fasthttp's ImmediateHeaderFlush would.
func (s *Server) writeOnConn(ctx *fasthttp.RequestCtx, sb *streamBody) {
	sb.keepAlive = !ctx.Request.Header.ConnectionClose() && !s.stopping.Load()
	h := &ctx.Response.Header
	if !sb.keepAlive {
		h.SetConnectionClose()
	}
	h.SetServer(serverName)
	h.SetContentLength(-1) // chunked
	hp := headBufs.Get().(*[]byte)
	sb.head, sb.headPooled = h.AppendBytes((*hp)[:0]), hp
	// Counted before the handler returns: fasthttp stops counting the
	// connection as open when it is handed over, and Shutdown must find
	// the stream counted here by then.
	s.connStreams.Add(1)
	// The head, with the first events when they came with the upstream's
	// headers, goes out from here, before the connection is handed over:
	// the two goroutines the hand-over starts stay off the client's time
	// to the first token. run sees a failed write in writeErr.
	if len(sb.head) <= maxHeadWithEvent && sb.backend.StreamBuffered(sb.resp) > 0 {
		sb.over, sb.writeErr = sb.writeNext(ctx.Conn())
	} else {
		_, sb.writeErr = ctx.Conn().Write(sb.head)
		sb.releaseHead()
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(sb.onHijack)
}

// hijacked takes the connection fasthttp hands over, on fasthttp's
// goroutine, and starts the stream's own.
func (sb *streamBody) hijacked(c net.Conn) {
	buf, bp := bufpool.Get(bufpool.Small)
	conn, pipelined, ok := handover.TakeConn(c, buf)
	bufpool.Put(bp)
	if !ok {
		sb.keepAlive = false
	}
	go sb.run(conn, pipelined)
}

// run writes the stream on conn, settles it, and then serves the client's
// next requests on conn (see keep), or closes it.
func (sb *streamBody) run(conn net.Conn, pipelined []byte) {
	s, keepAlive := sb.srv, sb.keepAlive
	defer s.connStreams.Add(-1)
	err := sb.writeErr
	grown := false
	for over := sb.over; err == nil && !over; {
		if !sb.pending() {
			// Wait for the upstream with no buffer of the stream's nor,
			// when the scanner has nothing left, of its upstream
			// connection's (see backends.AwaitStream), and from here,
			// where the stack is shallow: a stream idles far longer than
			// it works, and a goroutine's stack is halved by a
			// collection only while it uses under a quarter of it.
			if sb.scan.Drained() {
				sb.backend.AwaitStream(sb.resp)
			}
			sb.scan.Await()
		}
		if !grown {
			// Writing events outgrows the stack the goroutine began
			// with: grown here, before the first events, the stack is
			// copied with only this frame below, not at the deepest
			// call of an event's read or processing.
			grown = true
			handover.GrowEventStack(0)
		}
		over, err = sb.writeNext(conn)
	}
	sb.CloseWithError(err) // sb is recycled
	// The body ends only now that the stream is settled: its stream slot
	// and rate-limit reservation released and its record queued, as a
	// reply that is not streamed is settled before it is sent. A client
	// that has read a stream to its end and sends its next request, on
	// this connection or another, finds them settled. (fasthttp, writing
	// a body stream itself, also sends the trailer section that ends it
	// after closing the stream.)
	if err == nil {
		err = writeBodyEnd(conn)
	}
	if err == nil && keepAlive {
		s.keep(conn, pipelined)
		return
	}
	_ = conn.Close()
}

// writeBodyEnd writes bodyEnd from a pooled buffer: a slice of the
// constant would be allocated, since the write may keep it.
func writeBodyEnd(conn net.Conn) error {
	buf, bp := bufpool.Get(len(bodyEnd))
	defer bufpool.Put(bp)
	_, err := conn.Write(buf[:copy(buf, bodyEnd)])
	return err
}

// keep serves the client's next requests on conn after a stream, from the
// stream's goroutine, as fasthttp's worker would have after writing the
// stream itself: a client sends its next request as soon as it has read
// the stream's end, and handing the connection to another goroutine would
// put the wake-ups of a hand-over in its way. The server takes the
// connection for a new one, which its Shutdown closes only once it has been
// idle for five seconds, so until the next request begins the connection
// is counted as waiting (see keptConn), for Shutdown to end the wait at
// once (see stopIdleWaits), as fasthttp ends its own keep-alive waits.
// keep returns when the server closes the connection, or a later stream
// on it has been handed over in turn.
//
// The stream's goroutine began with a small stack, and while it waits the
// stack stays as small as the wait. The client's next request must not
// find it so: the request path is deeper than a stream's wait, and a
// stack that grows at the request path's deepest point is copied with
// every frame of it, a copy the stream's first event would wait for. So
// the stack grows once the request has begun to arrive, from the server's
// first read of it, where it is still shallow (see keptConn.Read and
// handover.GrowStack).
func (s *Server) keep(conn net.Conn, pipelined []byte) {
	base := conn
	if kc, ok := conn.(*keptConn); ok && len(kc.prefix) == 0 {
		// The bytes it held were read: no wrapper on a wrapper.
		base = kc.Conn
	}
	kc := &keptConn{Conn: base, prefix: pipelined, srv: s, growStack: true}
	if len(pipelined) == 0 {
		// The next request has not begun.
		if !s.startIdleWait(kc) {
			_ = base.Close()
			return
		}
		kc.waiting = true
	}
	if s.keepIdle > 0 {
		// fasthttp sets no deadline for a new connection's first byte.
		_ = base.SetReadDeadline(time.Now().Add(s.keepIdle))
	}
	_ = s.srv.ServeConn(kc) // errors are the connection's, and end it
	if kc.waiting {
		// The server ended the connection before reading it.
		s.endIdleWait(kc)
	}
}

// startIdleWait records conn as waiting for a request, unless the server
// is stopping.
func (s *Server) startIdleWait(conn net.Conn) bool {
	s.idleMu.Lock()
	defer s.idleMu.Unlock()
	if s.stopping.Load() {
		return false
	}
	if s.idleWaits == nil {
		s.idleWaits = make(map[net.Conn]struct{})
	}
	s.idleWaits[conn] = struct{}{}
	return true
}

func (s *Server) endIdleWait(conn net.Conn) {
	s.idleMu.Lock()
	delete(s.idleWaits, conn)
	s.idleMu.Unlock()
}

// stopIdleWaits marks the server stopping and ends every wait for a
// request on a connection kept after a stream: the server's read of it
// fails at once, and the server closes it.
func (s *Server) stopIdleWaits() {
	s.idleMu.Lock()
	defer s.idleMu.Unlock()
	s.stopping.Store(true)
	for c := range s.idleWaits {
		_ = handover.StopRead(c)
	}
}

// errStreamWriter ends a stream whose writer panicked outside the reads
// of its events (which recover on their own, see streamBody.Read).
var errStreamWriter = errors.New("the gateway failed while writing the stream")

// writeNext writes the events read at once, as one chunk in one write,
// with the response head before them when it is not sent yet, and the last
// chunk after the last events; over says the stream was written to its
// end. err is that of a write that failed (the client left). A panic (a
// bug) ends the stream and its connection rather than the process.
func (sb *streamBody) writeNext(w net.Conn) (over bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			sb.srv.countPanic("stream", r)
			over, err = true, errStreamWriter
		}
	}()
	buf, bp := bufpool.Get(bufpool.Small)
	defer bufpool.Put(bp)
	lead := chunkLead + len(sb.head)
	n, rerr := sb.Read(buf[lead : len(buf)-chunkTrail])
	end := lead + n
	start := lead
	if rerr == nil {
		start -= handover.PutChunkSize(buf[:lead], n)
		end += copy(buf[end:], "\r\n")
	}
	over = rerr != nil || sb.ended && sb.pos >= len(sb.out)
	if over {
		end += copy(buf[end:], lastChunk)
	}
	start -= copy(buf[start-len(sb.head):start], sb.head)
	_, err = w.Write(buf[start:end])
	sb.releaseHead()
	if err == nil && sb.firstEvent && !sb.firstNoted {
		sb.noteFirstEvent()
	}
	return over, err
}

// pending reports whether the stream has processed bytes to send, or is
// over; what the scanner holds unread, await looks at itself.
func (sb *streamBody) pending() bool { return sb.pos < len(sb.out) || sb.ended }

// releaseHead gives the response head's buffer back, once sent.
func (sb *streamBody) releaseHead() {
	if sb.headPooled != nil {
		*sb.headPooled = (*sb.headPooled)[:0]
		headBufs.Put(sb.headPooled)
	}
	sb.head, sb.headPooled = nil, nil
}

// keptConn is a connection given back to the server after a stream. Until
// the server's first read of it returns, the client's next request has not
// begun, and it waits in the server's idleWaits; the bytes of a request the
// client had pipelined behind the stream's come first.
type keptConn struct {
	net.Conn
	prefix []byte
	srv    *Server
	// waiting says the connection is in srv's idleWaits; only the
	// server's reading goroutine reads and clears it.
	waiting bool
	// growStack says the reading goroutine's stack has yet to grow for
	// the request path, once the next request's first bytes are read
	// (see keep).
	growStack bool
}

func (c *keptConn) Read(p []byte) (n int, err error) {
	if len(c.prefix) > 0 {
		n = copy(p, c.prefix)
		c.prefix = c.prefix[n:]
	} else {
		n, err = c.Conn.Read(p)
		if c.waiting {
			c.waiting = false
			c.srv.endIdleWait(c)
		}
	}
	if n > 0 && c.growStack {
		c.growStack = false
		handover.GrowStack(0)
	}
	return n, err
}

// ownConn reports whether c is a connection of the gateway's own listener,
// which its server can serve again after a stream (see keep).
func ownConn(c net.Conn) bool {
	switch c.(type) {
	case *countedConn, *keptConn:
		return true
	}
	return false
}

// NetConn returns the connection under it, for the client watch, which
// checks the socket itself.
func (c *keptConn) NetConn() net.Conn { return c.Conn }
