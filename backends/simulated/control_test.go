package simulated

import "testing"

func TestSetFailStatus(t *testing.T) {
	h := start(t, Options{FailStatus: 500}, false)
	chat := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
	steps := []struct {
		set  int // -1: leave as is
		knob int // what FailStatus reports
		want int // the status every endpoint answers
	}{
		{-1, 500, 500}, // Options.FailStatus is the starting value
		{503, 503, 503},
		{0, 0, 200},
		{99, 0, 200}, // invalid codes count as zero
		{429, 429, 429},
	}
	for i, s := range steps {
		if s.set >= 0 {
			h.srv.SetFailStatus(s.set)
		}
		if got := h.srv.FailStatus(); got != s.knob {
			t.Errorf("step %d: FailStatus() = %d", i, got)
		}
		for _, path := range []string{"/v1/models", "/health"} {
			if r := h.do(t, "GET", path, ""); r.status != s.want {
				t.Errorf("step %d: GET %s = %d, want %d", i, path, r.status, s.want)
			}
		}
		if r := h.do(t, "POST", "/v1/chat/completions", chat); r.status != s.want {
			t.Errorf("step %d: chat = %d, want %d", i, r.status, s.want)
		}
	}
	// X-Mock-Status still wins over the switched status.
	h.srv.SetFailStatus(503)
	if r := h.do(t, "POST", "/v1/chat/completions", chat, "X-Mock-Status", "429"); r.status != 429 {
		t.Errorf("X-Mock-Status: status %d, want 429", r.status)
	}
}

func TestRoutingCounters(t *testing.T) {
	h := start(t, Options{}, false)
	h.do(t, "GET", "/v1/models", "")
	h.do(t, "GET", "/models", "")
	h.do(t, "GET", "/health", "")
	h.srv.SetFailStatus(503)
	h.do(t, "GET", "/v1/models", "") // a failed listing is not counted
	h.srv.SetFailStatus(0)
	if got := h.srv.ModelListings(); got != 2 {
		t.Errorf("ModelListings = %d, want 2", got)
	}
	if got := h.srv.Stats().Requests; got != 0 {
		t.Errorf("listings counted as chat requests: %d", got)
	}
	h.do(t, "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	if got := h.srv.MaxInFlight(); got != 1 {
		t.Errorf("MaxInFlight = %d after one request at a time, want 1", got)
	}
}
