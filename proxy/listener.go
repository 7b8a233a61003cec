package proxy

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// overloadedReply is what a connection past its listener's cap gets: a
// complete HTTP response with body in the listener's error shape and
// Retry-After, so that SDKs back off, after which the connection is closed.
func overloadedReply(body string) []byte {
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

var (
	// proxyOverloaded is listen's, in the OpenAI error shape.
	proxyOverloaded = overloadedReply(`{"error":{"message":"The gateway is at its limit of concurrent connections; retry shortly.","type":"api_error","param":null,"code":"overloaded"}}`)
	// adminOverloaded is admin_listen's, in the trace service's shape.
	adminOverloaded = overloadedReply(`{"detail":"The gateway is at its limit of concurrent connections; retry shortly."}`)
)

// The wait between failed accepts doubles from minAcceptBackoff up to
// maxAcceptBackoff, as net/http's does: a listener out of descriptors is
// ready again at once, and retrying without a pause would spin.
const (
	minAcceptBackoff = 5 * time.Millisecond
	maxAcceptBackoff = time.Second
	// acceptLogEvery spaces the log lines of failed accepts: a flood
	// fails them for as long as it lasts.
	acceptLogEvery = time.Minute
)

// listenerMetrics count, by listener ("proxy" for listen, "admin" for
// admin_listen), the accepts that failed and the connections refused at
// the cap.
type listenerMetrics struct {
	acceptErrors *prometheus.CounterVec
	refused      *prometheus.CounterVec
}

func newListenerMetrics(reg prometheus.Registerer) listenerMetrics {
	m := listenerMetrics{
		acceptErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_accept_errors_total",
			Help: "Accepts of a client connection that failed (out of descriptors: EMFILE, ENFILE), by listener (proxy, admin); each is retried after a backoff.",
		}, []string{"listener"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_connections_refused_total",
			Help: "Client connections answered 503 and closed at their listener's cap (server.max_connections, server.admin_max_connections), by listener (proxy, admin).",
		}, []string{"listener"}),
	}
	if reg != nil {
		reg.MustRegister(m.acceptErrors, m.refused)
	}
	return m
}

// limitListener caps the connections open at once. fasthttp's own cap
// (Server.Concurrency) answers a plain-text 503 without Retry-After, which
// clients cannot parse or back off on, so the cap is enforced here and
// fasthttp's is set above it.
//
// A failed accept (the process out of descriptors) is counted, logged and
// retried after a backoff: fasthttp's Serve returns on any accept error
// but a timeout, which would stop the gateway.
//
// It also gives every accepted connection a read deadline of
// server.read_timeout for its first request byte. fasthttp, with
// ReduceMemoryUsage, waits for a new connection's first byte with no
// deadline at all (it sets read_timeout only once that byte came, and
// idle_timeout only before later requests), so a client that connects and
// sends nothing would hold a place under the cap for ever. And it bounds
// every write to a connection by server.write_timeout (see
// countedConn.Write).
type limitListener struct {
	net.Listener
	name         string // the metrics' listener label
	max          int64
	open         atomic.Int64
	overloaded   []byte
	firstByte    time.Duration
	writeTimeout time.Duration
	acceptErrors prometheus.Counter
	refused      prometheus.Counter
	log          *zap.Logger
	// closed is set by Close: after it, a failed accept ends Serve
	// whatever error the listener returns (not every listener wraps
	// net.ErrClosed, fasthttputil's in-memory one for instance).
	closed atomic.Bool
	// Only the server's accepting goroutine reads and writes these.
	backoff      time.Duration
	failed       int // accepts failed since the last log line
	lastFailNote time.Time
}

// listenerOptions configure a limitListener.
type listenerOptions struct {
	name         string
	max          int
	overloaded   []byte
	firstByte    time.Duration
	writeTimeout time.Duration
}

func (s *Server) newLimitListener(ln net.Listener, o listenerOptions) *limitListener {
	return &limitListener{Listener: ln, name: o.name, max: int64(o.max), overloaded: o.overloaded,
		firstByte: o.firstByte, writeTimeout: o.writeTimeout,
		acceptErrors: s.listenerMetrics.acceptErrors.WithLabelValues(o.name),
		refused:      s.listenerMetrics.refused.WithLabelValues(o.name), log: s.log}
}

// Close closes the listener, after which Accept returns its error.
func (l *limitListener) Close() error {
	l.closed.Store(true)
	return l.Listener.Close()
}

// Accept returns the next connection within the cap, answering and closing
// those beyond it. It returns an error only once the listener is closed.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || l.closed.Load() {
				return nil, err
			}
			l.acceptFailed(err)
			continue
		}
		l.backoff = 0
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refuse(c)
			continue
		}
		if l.firstByte > 0 {
			if err := c.SetReadDeadline(time.Now().Add(l.firstByte)); err != nil {
				l.open.Add(-1)
				_ = c.Close()
				continue
			}
		}
		return &countedConn{Conn: c, l: l}, nil
	}
}

// acceptFailed counts a failed accept, logs it (once a minute, with the
// count of those not logged), and waits before the next.
func (l *limitListener) acceptFailed(err error) {
	l.acceptErrors.Inc()
	l.failed++
	if now := time.Now(); now.Sub(l.lastFailNote) >= acceptLogEvery {
		l.log.Warn("accepting client connections failed; retrying", zap.String("listener", l.name),
			zap.Int("failures", l.failed), zap.Error(err))
		l.failed, l.lastFailNote = 0, now
	}
	l.backoff = min(max(2*l.backoff, minAcceptBackoff), maxAcceptBackoff)
	time.Sleep(l.backoff)
}

// refuse answers a connection beyond the cap and closes it. The reply
// fits in the socket buffer; the deadline only guards against a peer that
// never reads.
func (l *limitListener) refuse(c net.Conn) {
	l.refused.Inc()
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(l.overloaded)
	_ = c.Close()
}

// countedConn gives its place back to the listener when closed.
type countedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
	// writeDeadline is the write deadline last set (see Write).
	writeDeadline time.Time
}

// Write bounds each write by server.write_timeout: a client that stops
// reading a reply, or a stream, has the write fail once it has waited
// that long, and the server then closes the connection. Every writer of
// the connection goes through here: fasthttp's, and a stream's goroutine
// after fasthttp hands the connection over (whose deadline fasthttp, with
// no WriteTimeout of its own, never sets). Setting a deadline takes the
// poller's lock, so it is moved only once less than half of it is left: a
// stalled write then fails after between half and all of write_timeout.
// Writers of one connection take turns, never writing at once. The time
// left is read with time.Until, which for a deadline Write set itself reads
// only the monotonic clock; the wall clock is read only to move it.
func (c *countedConn) Write(p []byte) (int, error) {
	if t := c.l.writeTimeout; t > 0 {
		if time.Until(c.writeDeadline) < t/2 {
			c.writeDeadline = time.Now().Add(t)
			if err := c.Conn.SetWriteDeadline(c.writeDeadline); err != nil {
				return 0, err
			}
		}
	}
	return c.Conn.Write(p)
}

// SetWriteDeadline and SetDeadline keep Write's record of the deadline
// true: fasthttp clears every deadline before it hands a connection over.
func (c *countedConn) SetWriteDeadline(t time.Time) error {
	c.writeDeadline = t
	return c.Conn.SetWriteDeadline(t)
}

func (c *countedConn) SetDeadline(t time.Time) error {
	c.writeDeadline = t
	return c.Conn.SetDeadline(t)
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// NetConn returns the accepted connection, for the client watch, which
// checks the socket itself.
func (c *countedConn) NetConn() net.Conn { return c.Conn }
