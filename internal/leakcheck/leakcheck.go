// Package leakcheck holds what the test suites tell goleak about
// goroutines that are not theirs to stop: fasthttp runs some of its own
// that outlive any one server or client by design, and a suite that fails
// on leaked goroutines must not count them.
package leakcheck

import "go.uber.org/goleak"

// IgnoreFasthttp returns goleak options that ignore fasthttp's background
// goroutines:
//   - the server date ticker, started once per process and never stopped;
//   - a client's idle-connection cleaner, which stops only once the
//     client's idle connections have timed out or been closed;
//   - a server's worker-pool cleaner, which looks for its stop only after
//     sleeping for the server's MaxIdleWorkerDuration;
//   - the default dialer's DNS cache cleaner, started once and never
//     stopped.
func IgnoreFasthttp() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
	}
}
