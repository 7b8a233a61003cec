package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// streamTimeout bounds one stream of the latency phase, whose streams last
// a few hundred milliseconds.
const streamTimeout = 30 * time.Second

var doneMarker = []byte("data: [DONE]")

// eventCounter finds the ends of server-sent events ("\n\n", or
// "\r\n\r\n") in a byte stream that arrives in arbitrary pieces.
type eventCounter struct {
	afterNewline bool
}

// count returns how many events end in p.
func (c *eventCounter) count(p []byte) int {
	n := 0
	for _, b := range p {
		switch b {
		case '\n':
			if c.afterNewline {
				n++
				c.afterNewline = false
			} else {
				c.afterNewline = true
			}
		case '\r':
		default:
			c.afterNewline = false
		}
	}
	return n
}

// streamResult is what the streaming latency phase measured on one side.
type streamResult struct {
	// TTFT is, per stream, the time from sending the request to having
	// read the first whole event.
	TTFT []time.Duration
	// Gaps are the times between consecutive events of a stream, as
	// the client reads them.
	Gaps       []time.Duration
	Streams    int
	Events     int
	Errors     int
	FirstError string
	Elapsed    time.Duration
}

func (r *streamResult) merge(o streamResult) {
	r.TTFT = append(r.TTFT, o.TTFT...)
	r.Gaps = append(r.Gaps, o.Gaps...)
	r.Streams += o.Streams
	r.Events += o.Events
	r.Errors += o.Errors
	r.Elapsed += o.Elapsed
	if r.FirstError == "" {
		r.FirstError = o.FirstError
	}
}

// runStreamLatency keeps conc streams going for d (closed loop: a worker
// starts its next stream when the last one ended) and times the events of
// each stream as the client receives them.
//
// Worker w starts w*stagger after the first, with stagger the length of a
// stream divided by conc. Started together, the workers' streams would
// stay in step, their requests and events reaching the server in bursts
// of conc at once, which measures queueing behind the burst rather than
// the latency of a stream among independent clients.
func runStreamLatency(ctx context.Context, e *endpoint, body []byte, conc int, d, stagger time.Duration) streamResult {
	results := make([]streamResult, conc)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &results[w]
			req := e.newRequest(body)
			defer fasthttp.ReleaseRequest(req)
			buf := make([]byte, 16<<10)
			if sleepCtx(ctx, time.Duration(w)*stagger) != nil {
				return
			}
			for time.Now().Before(end) && ctx.Err() == nil {
				if err := readStream(e, req, buf, res); err != nil {
					res.Errors++
					if res.FirstError == "" {
						res.FirstError = err.Error()
					}
					// A failing server answers at once; do not spin.
					_ = sleepCtx(ctx, 10*time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	var r streamResult
	for _, w := range results {
		r.merge(w)
	}
	r.Elapsed = time.Since(start)
	return r
}

// sendStream sends a streaming request and returns the body stream of its
// reply, which the caller closes with resp.CloseBodyStream (also after an
// error). A status other than 200 is an error, and its connection is
// dropped rather than drained for reuse.
func sendStream(e *endpoint, req *fasthttp.Request, resp *fasthttp.Response) (io.Reader, error) {
	resp.StreamBody = true
	if err := e.client.DoTimeout(req, resp, streamTimeout); err != nil {
		return nil, err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		resp.SetConnectionClose()
		return nil, fmt.Errorf("status %d", resp.StatusCode())
	}
	body := resp.BodyStream()
	if body == nil {
		return nil, errors.New("no body stream")
	}
	return body, nil
}

// readStream sends one streaming request and reads its events to the end,
// adding its timings to res.
func readStream(e *endpoint, req *fasthttp.Request, buf []byte, res *streamResult) error {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	sent := time.Now()
	body, err := sendStream(e, req, resp)
	defer resp.CloseBodyStream() //nolint:errcheck // the body was read to its end or the connection is dropped
	if err != nil {
		return err
	}
	var (
		counter eventCounter
		last    time.Time
		events  int
		done    bool
		ttft    time.Duration
		gaps    = make([]time.Duration, 0, 80)
	)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			now := time.Now()
			if bytes.Contains(buf[:n], doneMarker) {
				done = true
			}
			for range counter.count(buf[:n]) {
				if events == 0 {
					ttft = now.Sub(sent)
				} else {
					gaps = append(gaps, now.Sub(last))
				}
				last = now
				events++
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			resp.SetConnectionClose()
			return fmt.Errorf("read stream after %d events: %w", events, err)
		}
	}
	if !done {
		return fmt.Errorf("stream ended after %d events without [DONE]", events)
	}
	res.Streams++
	res.Events += events
	res.TTFT = append(res.TTFT, ttft)
	res.Gaps = append(res.Gaps, gaps...)
	return nil
}

// connTracker remembers every connection a client dialed, so that
// streams blocked in a read can all be ended at once by closing them.
type connTracker struct {
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	dialer net.Dialer
}

func (t *connTracker) dial(addr string) (net.Conn, error) {
	c, err := t.dialer.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = c.Close()
		return nil, errors.New("benchmark phase is over")
	}
	t.conns = append(t.conns, c)
	return c, nil
}

func (t *connTracker) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for _, c := range t.conns {
		_ = c.Close()
	}
	t.conns = nil
}

// openStreamsResult is what holding many streams open measured.
type openStreamsResult struct {
	N int
	// Open is the number of streams that got their first event and were
	// still running when memory was read.
	Open int
	// Errors counts streams that failed to open, got no first event in
	// time, or ended before they were released.
	Errors int
	// ErrorSample lists the distinct failure messages with their counts.
	ErrorSample []string
	// OpenTime is how long it took until every stream had its first
	// event (or had failed).
	OpenTime time.Duration
	Baseline memInfo
	Loaded   memInfo
}

// openStreamsOptions configure holdStreams.
type openStreamsOptions struct {
	addr, key string
	body      []byte
	n         int
	// openConc bounds the streams being opened at once, so that 10,000
	// connection attempts do not overflow the listen backlog.
	openConc int
	// firstEventTimeout bounds the wait for every stream's first event.
	firstEventTimeout time.Duration
	// settle is how long to hold all streams before reading memory, so
	// that every stream has passed at least one token event.
	settle time.Duration
	// measure reads the memory of the process the streams go through.
	measure func() (memInfo, error)
}

// streamCounters are shared by the goroutines holding streams.
type streamCounters struct {
	first      atomic.Int64 // streams that got their first event
	failedOpen atomic.Int64 // streams that failed before their first event
	dropped    atomic.Int64 // streams that failed after it, before release
	// released is set when the benchmark starts closing the streams
	// itself, after which a stream ending is no failure.
	released atomic.Bool

	mu sync.Mutex
	// reasons counts failures by message, for the first maxReasons
	// distinct messages.
	reasons map[string]int
	order   []string
}

const maxReasons = 5

func (c *streamCounters) fail(opened bool, err error) {
	if c.released.Load() {
		return
	}
	if opened {
		c.dropped.Add(1)
	} else {
		c.failedOpen.Add(1)
	}
	msg := err.Error()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reasons == nil {
		c.reasons = make(map[string]int)
	}
	if _, ok := c.reasons[msg]; !ok {
		if len(c.order) == maxReasons {
			return
		}
		c.order = append(c.order, msg)
	}
	c.reasons[msg]++
}

// summary lists the failure messages with their counts.
func (c *streamCounters) summary() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.order))
	for _, m := range c.order {
		out = append(out, fmt.Sprintf("%d× %s", c.reasons[m], m))
	}
	return out
}

// holdStreams opens n streams, waits until every one has received its
// first event, holds them for o.settle, reads the memory of the process
// they go through (the gateway or a bare proxy), and then closes every
// connection.
func holdStreams(ctx context.Context, o openStreamsOptions) (openStreamsResult, error) {
	res := openStreamsResult{N: o.n}
	tracker := &connTracker{dialer: net.Dialer{Timeout: 5 * time.Second}}
	client := &fasthttp.HostClient{
		Addr:                     o.addr,
		MaxConns:                 o.n + 16,
		Dial:                     tracker.dial,
		NoDefaultUserAgentHeader: true,
		MaxIdleConnDuration:      time.Minute,
	}
	ep := &endpoint{side: "held", client: client, url: "http://" + o.addr + "/v1/chat/completions", key: o.key}

	var (
		c  streamCounters
		wg sync.WaitGroup
	)
	sem := make(chan struct{}, o.openConc)
	start := time.Now()
	for range o.n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The stream ends when closeAll below closes its
			// connection, or when it fails.
			holdOne(ep, o.body, sem, &c)
		}()
	}

	// Wait until every stream has its first event or has failed.
	deadline := time.Now().Add(o.firstEventTimeout)
	for c.first.Load()+c.failedOpen.Load() < int64(o.n) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	res.OpenTime = time.Since(start)
	var measureErr error
	if err := sleepCtx(ctx, o.settle); err == nil {
		res.Loaded, measureErr = o.measure()
	}
	res.Open = int(c.first.Load() - c.dropped.Load())
	c.released.Store(true)
	tracker.closeAll()
	wg.Wait()
	client.CloseIdleConnections()

	res.Errors = int(c.failedOpen.Load() + c.dropped.Load())
	res.ErrorSample = c.summary()
	// Streams still waiting for their first event at the deadline were
	// cut by closeAll without counting as failures; they are.
	if missing := o.n - int(c.first.Load()+c.failedOpen.Load()); missing > 0 && ctx.Err() == nil {
		res.Errors += missing
		res.ErrorSample = append(res.ErrorSample, fmt.Sprintf("%d streams got no first event within %s", missing, o.firstEventTimeout))
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	return res, measureErr
}

// holdOne opens one stream, gives its slot in sem back once the first
// event arrived (or the stream failed), and keeps reading until the stream
// ends.
func holdOne(ep *endpoint, body []byte, sem <-chan struct{}, c *streamCounters) {
	opened := false
	defer func() {
		if !opened {
			<-sem
		}
	}()
	req := ep.newRequest(body)
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.StreamBody = true
	if err := ep.client.Do(req, resp); err != nil {
		c.fail(false, fmt.Errorf("open: %w", err))
		return
	}
	resp.SetConnectionClose()
	defer resp.CloseBodyStream() //nolint:errcheck // the connection is closed anyway
	if resp.StatusCode() != fasthttp.StatusOK {
		c.fail(false, fmt.Errorf("status %d", resp.StatusCode()))
		return
	}
	stream := resp.BodyStream()
	buf := make([]byte, 4<<10)
	var counter eventCounter
	for {
		n, err := stream.Read(buf)
		if n > 0 && counter.count(buf[:n]) > 0 && !opened {
			opened = true
			c.first.Add(1)
			<-sem
		}
		if bytes.Contains(buf[:n], doneMarker) {
			c.fail(opened, errors.New("stream ended before it was released"))
			return
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("stream ended before it was released")
			}
			c.fail(opened, err)
			return
		}
	}
}
