package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// requestTimeout bounds every non-streaming request the generator sends,
// so that a stuck server cannot hold a phase open.
const requestTimeout = 10 * time.Second

// endpoint is where the generator sends chat completions: the mock backend
// directly, or the gateway in front of it.
type endpoint struct {
	side   string // "direct" or "gateway"
	client *fasthttp.HostClient
	url    string
	key    string
}

func newEndpoint(side, addr, key string, maxConns int) *endpoint {
	return &endpoint{
		side: side,
		client: &fasthttp.HostClient{
			Addr:     addr,
			MaxConns: maxConns,
			// Keep connections across phases: reconnecting would add
			// handshakes to the first requests of every phase.
			MaxIdleConnDuration: time.Minute,
			// LIFO keeps reusing the few connections the load needs,
			// instead of cycling through every one ever opened.
			ConnPoolStrategy:         fasthttp.LIFO,
			NoDefaultUserAgentHeader: true,
			ReadBufferSize:           16 << 10,
		},
		url: "http://" + addr + "/v1/chat/completions",
		key: key,
	}
}

// newRequest returns a chat completion request with body, to be reused by
// one worker for all its requests.
func (e *endpoint) newRequest(body []byte) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI(e.url)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	// The same header goes to the backend directly, which ignores it, so
	// that both sides receive byte-for-byte the same request.
	req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+e.key)
	req.SetBody(body)
	return req
}

// do sends one non-streaming request and checks that it succeeded.
func (e *endpoint) do(req *fasthttp.Request, resp *fasthttp.Response) error {
	resp.Reset()
	if err := e.client.DoTimeout(req, resp, requestTimeout); err != nil {
		return err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode(), resp.Body())
	}
	return nil
}

// loadResult is what one phase of load measured on one side.
type loadResult struct {
	// Latencies of successful requests: for the open loop from the
	// scheduled send time, for the closed loop from the actual send.
	Latencies []time.Duration
	// Lags are, for the open loop, how late each request was actually
	// sent after its scheduled time: the generator's own delay, which is
	// included in Latencies and the same for both sides.
	Lags    []time.Duration
	OK      int
	Errors  int
	Elapsed time.Duration
	// FirstError is the first error seen, to say what went wrong.
	FirstError string
}

func (r *loadResult) merge(o loadResult) {
	r.Latencies = append(r.Latencies, o.Latencies...)
	r.Lags = append(r.Lags, o.Lags...)
	r.OK += o.OK
	r.Errors += o.Errors
	r.Elapsed += o.Elapsed
	if r.FirstError == "" {
		r.FirstError = o.FirstError
	}
}

// workerResult is one worker's share of a phase, merged at the end so
// that workers never contend on shared slices.
type workerResult struct {
	lat, lag   []time.Duration
	ok, errs   int
	firstError string
}

func (w *workerResult) fail(err error) {
	w.errs++
	if w.firstError == "" {
		w.firstError = err.Error()
	}
}

func collect(results []workerResult, elapsed time.Duration) loadResult {
	var r loadResult
	for _, w := range results {
		r.Latencies = append(r.Latencies, w.lat...)
		r.Lags = append(r.Lags, w.lag...)
		r.OK += w.ok
		r.Errors += w.errs
		if r.FirstError == "" {
			r.FirstError = w.firstError
		}
	}
	r.Elapsed = elapsed
	return r
}

// runOpenLoop sends rate requests of body per second to e for d, on a
// fixed schedule; see runOpenLoopWith.
func runOpenLoop(ctx context.Context, e *endpoint, body []byte, rate int, d time.Duration, workers int) (loadResult, error) {
	return runOpenLoopWith(ctx, rate, d, workers, func() (func(int) error, func()) {
		req := e.newRequest(body)
		resp := fasthttp.AcquireResponse()
		send := func(int) error { return e.do(req, resp) }
		release := func() {
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
		}
		return send, release
	})
}

// newSender returns one open-loop worker's send, which sends request i of
// the schedule and returns an error if it failed, and release, called
// once the worker is done.
type newSender func() (send func(i int) error, release func())

// dueRequest is request i of an open loop's schedule, due at at.
type dueRequest struct {
	at time.Time
	i  int
}

// runOpenLoopWith sends rate requests per second for d, on a fixed
// schedule whatever the responses do: request i is due at start + i/rate.
// Workers (one connection each at most, each with its own sender) take
// due requests from a queue; when all are busy, due requests wait in the
// queue, and since latency is measured from the scheduled time, that wait
// is counted rather than omitted.
//
// The schedule is kept by a goroutine locked to its own OS thread sleeping
// in nanosleep with a 1 ns timer slack: Go's timers round sub-millisecond
// sleeps up to about a millisecond on Linux, which would turn a 5k/s
// schedule into bursts of five.
func runOpenLoopWith(ctx context.Context, rate int, d time.Duration, workers int, sender newSender) (loadResult, error) {
	if rate <= 0 {
		return loadResult{}, errors.New("open loop: rate must be positive")
	}
	n := int(float64(rate) * d.Seconds())
	interval := time.Second / time.Duration(rate)
	due := make(chan dueRequest, min(n, 1<<16))
	results := make([]workerResult, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &results[w]
			res.lat = make([]time.Duration, 0, n/workers+16)
			res.lag = make([]time.Duration, 0, n/workers+16)
			send, release := sender()
			defer release()
			// The queue is closed when the schedule ends, which ends
			// the worker once it has sent what was due.
			for r := range due {
				sent := time.Now()
				if err := send(r.i); err != nil {
					res.fail(err)
					continue
				}
				res.ok++
				res.lat = append(res.lat, time.Since(r.at))
				res.lag = append(res.lag, sent.Sub(r.at))
			}
		}()
	}

	start := time.Now()
	schedErr := schedule(ctx, due, start, interval, n)
	close(due)
	wg.Wait()
	return collect(results, time.Since(start)), schedErr
}

// schedule puts each of n requests on due, at its time.
func schedule(ctx context.Context, due chan<- dueRequest, start time.Time, interval time.Duration, n int) error {
	runtime.LockOSThread()
	// Unlocking (rather than letting the thread die with the goroutine)
	// keeps the thread: a thread that exits would deliver the parent-death
	// signal to any child process it happened to fork.
	defer runtime.UnlockOSThread()
	const prSetTimerSlack = 29
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1, 0)
	defer func() { _, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 0, 0) }()

	for i := range n {
		if i&63 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		at := start.Add(time.Duration(i) * interval)
		// nanosleep returns early when a signal arrives (the Go runtime
		// sends them for preemption), so sleep until the time has come.
		for {
			left := time.Until(at)
			if left <= 0 {
				break
			}
			ts := syscall.NsecToTimespec(int64(left))
			_ = syscall.Nanosleep(&ts, nil)
		}
		due <- dueRequest{at: at, i: i}
	}
	return nil
}

// runClosedLoop keeps conns requests in flight for d: each worker sends
// its next request as soon as the previous one is answered. The count of
// answers over the elapsed time is the throughput.
func runClosedLoop(ctx context.Context, e *endpoint, body []byte, conns int, d time.Duration) loadResult {
	results := make([]workerResult, conns)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &results[w]
			req := e.newRequest(body)
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for i := 0; ; i++ {
				now := time.Now()
				if !now.Before(end) || (i&63 == 0 && ctx.Err() != nil) {
					return
				}
				if err := e.do(req, resp); err != nil {
					res.fail(err)
					continue
				}
				res.ok++
				res.lat = append(res.lat, time.Since(now))
			}
		}()
	}
	wg.Wait()
	return collect(results, time.Since(start))
}
