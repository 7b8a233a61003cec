package backends

import (
	"bufio"
	"net"
	"sync"

	"github.com/valyala/fasthttp"
)

// openStream is the connection under a streamed body, and the read buffer
// it is read through. fasthttp's body stream keeps the *bufio.Reader (br)
// the headers were read with, so the buffer under it is changed by
// swapping the readers' contents, never the pointer: a reader with
// nothing buffered has no other state to carry over.
type openStream struct {
	hc *fasthttp.HostClient
	br *bufio.Reader
	// conn is what br reads from.
	conn net.Conn
	// buf says which buffer br reads through now.
	buf readBuffer
	// parked is the parkedBufferSize reader, holding its contents while
	// br reads through another buffer, for the next wait; nil before the
	// stream first waited.
	parked *bufio.Reader
	// release gives the connection back to the pool, or closes it.
	release func(closeConn bool)
	// closeConn says the connection must not be reused whatever happens.
	closeConn bool
}

// readBuffer is the kind of buffer an open stream's reader has.
type readBuffer uint8

const (
	// headerBuffer is the HostClient's (ReadBufferSize), which the
	// response headers were read with.
	headerBuffer readBuffer = iota
	// eventBuffer is one of streamReaders's, while events are read.
	eventBuffer
	// parkedBuffer is the stream's own parkedBufferSize one, while it
	// waits for the upstream (see AwaitStream).
	parkedBuffer
)

// streamReadBufferSize is the read buffer of an open stream's upstream
// connection once its headers are in (see ShrinkStream): the chunk
// framing and an event or two. A read for more than it holds goes
// straight to the connection, so larger events cost no copy, only reads.
const streamReadBufferSize = 1 << 10

// parkedBufferSize is the buffer of a waiting stream's reader (see
// AwaitStream): bufio's smallest. Nothing reads through it; the reader
// needs one.
const parkedBufferSize = 16

// streamReaders holds streamReadBufferSize readers for open streams.
var streamReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, streamReadBufferSize) }}

// use makes the stream read through a buffer of kind to, and gives the one
// it read through back to where it came from. br must have nothing
// buffered.
func (st *openStream) use(to readBuffer) {
	var r *bufio.Reader
	switch to {
	case eventBuffer:
		r = streamReaders.Get().(*bufio.Reader)
	case parkedBuffer:
		r, st.parked = st.parked, nil
		if r == nil {
			r = bufio.NewReaderSize(nil, parkedBufferSize)
		}
	default:
		panic("backends: an open stream cannot go back to a header buffer")
	}
	r.Reset(st.conn)
	*st.br, *r = *r, *st.br
	st.putBack(r, st.buf)
	st.buf = to
}

// putBack gives r, holding a buffer of kind k, back to where it came from.
func (st *openStream) putBack(r *bufio.Reader, k readBuffer) {
	r.Reset(nil)
	switch k {
	case headerBuffer:
		st.hc.ReleaseReader(r)
	case eventBuffer:
		streamReaders.Put(r)
	case parkedBuffer:
		st.parked = r
	}
}

// releaseReader gives br's buffer back, once the stream is closed.
func (st *openStream) releaseReader() { st.putBack(st.br, st.buf) }

// openStreamOf returns the open stream of resp, or nil when resp is not
// one of this backend's transport (fasthttp's own transport has no
// buffers to change).
func (b *Backend) openStreamOf(resp *fasthttp.Response) *openStream {
	t, ok := b.client.Transport.(*abortableTransport)
	if !ok {
		return nil
	}
	v, ok := t.streams.Load(resp)
	if !ok {
		return nil
	}
	return v.(*openStream)
}

// StreamBuffered reports how many bytes of resp's open stream have
// arrived and wait in its read buffer: more than zero right after the
// headers means the first event (or part of it) came with them.
func (b *Backend) StreamBuffered(resp *fasthttp.Response) int {
	if st := b.openStreamOf(resp); st != nil {
		return st.br.Buffered()
	}
	return 0
}

// ShrinkStream gives the read buffer of resp's open stream back to the
// client's pool, for a smaller one, and reports whether the stream now
// reads through the smaller one. The buffer the response headers were
// read with must hold a whole header block (ReadBufferSize), but a stream
// can stay open for minutes with a few hundred bytes arriving at a time,
// so the proxy calls ShrinkStream between events. It can only swap a
// buffer with nothing in it: it reports false while bytes are waiting in
// it, to be called again later. It is called from the goroutine that
// reads the stream.
func (b *Backend) ShrinkStream(resp *fasthttp.Response) bool {
	st := b.openStreamOf(resp)
	if st == nil || st.buf != headerBuffer {
		return true
	}
	if st.br.Buffered() > 0 {
		return false
	}
	st.use(eventBuffer)
	return true
}

// AwaitStream blocks until resp's open stream has bytes to read, has
// ended, or has failed or timed out as a read would, holding no read
// buffer while it waits: its buffer goes back to the pool for the wait,
// which watches the socket itself, and a buffer is taken again once bytes
// are there. A stream waits far longer than it reads, and the buffer is
// most of what it would hold while it waits. The read that follows
// returns what ended the wait: the bytes, the end or the error.
//
// It returns at once, for the read to wait in the buffer as before, when
// bytes wait in the buffer already, when the body is not read from the
// socket as it arrives (fasthttp has read a body of known length whole),
// or when the connection is not a socket the wait can watch (TLS, whose
// records are read whole). The proxy calls it from the goroutine that
// reads the stream, only when the stream has nothing else to read.
func (b *Backend) AwaitStream(resp *fasthttp.Response) {
	st := b.openStreamOf(resp)
	if st == nil || st.br.Buffered() > 0 || resp.Header.ContentLength() >= 0 {
		return
	}
	tc, ok := st.conn.(*timeoutConn)
	if !ok || !tc.canAwait() {
		return
	}
	st.use(parkedBuffer)
	tc.awaitReadable()
	st.use(eventBuffer)
}
