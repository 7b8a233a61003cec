package simulated

import "sync/atomic"

// control is the part of the server's behaviour that can be switched while it serves, and the
// counters that only tests of the gateway's routing need. Every field is atomic, so a test may
// flip a knob from its own goroutine while requests are being answered.
type control struct {
	// failStatus is Options.FailStatus, or what SetFailStatus last set.
	failStatus atomic.Int64
	// listings counts answered GET /v1/models and /models requests, which is what a gateway's
	// health probes send; they are not counted in Stats.
	listings atomic.Int64
	// maxInFlight is the most chat completion requests seen in flight at once.
	maxInFlight atomic.Int64
}

// SetFailStatus makes every later request (chat completions, model listings and /health) fail
// with code, in the error shape the request asks for, as Options.FailStatus does; zero stops the
// failures. A code that Options.FailStatus would not accept counts as zero. A per-request
// X-Mock-Status header still takes precedence. Requests already past the check are not affected.
func (s *Server) SetFailStatus(code int) {
	if !validStatus(code) {
		code = 0
	}
	s.ctl.failStatus.Store(int64(code))
}

// FailStatus is the status every request currently fails with; zero means none.
func (s *Server) FailStatus() int { return int(s.ctl.failStatus.Load()) }

// ModelListings is the number of model listings (GET /v1/models or /models) answered with 200,
// which for a server behind a gateway is the number of its successful health probes.
func (s *Server) ModelListings() int64 { return s.ctl.listings.Load() }

// MaxInFlight is the largest number of chat completion requests the server has seen in flight
// at once, counted when each starts. It never over-counts: completions that race with the count
// can only lower it.
func (s *Server) MaxInFlight() int64 { return s.ctl.maxInFlight.Load() }

// noteStart records the in-flight count when a chat completion request starts.
func (s *Server) noteStart() {
	// Requests is read before the completions, so a request that ends in between lowers the
	// count rather than raising it.
	n := s.requests.Load()
	n -= s.completed.Load() + s.cancelled.Load()
	for {
		old := s.ctl.maxInFlight.Load()
		if n <= old || s.ctl.maxInFlight.CompareAndSwap(old, n) {
			return
		}
	}
}
