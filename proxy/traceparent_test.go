package proxy

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestUpstreamTraceparentAllocs keeps the upstream traceparent free: the
// gateway's span id comes from the call id, and the header is written from
// a stack buffer into the request's pooled header storage.
func TestUpstreamTraceparentAllocs(t *testing.T) {
	var g callIDs
	tc, err := parseTraceHeaders(nil, nil, []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
	if err != nil {
		t.Fatal(err)
	}
	var req fasthttp.Request
	req.Header.DisableNormalizing()
	now := time.Now()
	allocs := testing.AllocsPerRun(200, func() {
		call := g.nextUUID(now)
		sp := callSpan(&tc, &call)
		var traceparent [55]byte
		req.Header.SetCanonical(traceparentName, appendTraceparent(traceparent[:0], &sp))
	})
	if allocs != 0 {
		t.Errorf("the upstream traceparent costs %v allocations, want 0", allocs)
	}
	call := g.nextUUID(now)
	sp := callSpan(&tc, &call)
	req.Header.SetCanonical(traceparentName, appendTraceparent(nil, &sp))
	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + formatUUID(&call)[19:23] + formatUUID(&call)[24:] + "-01"
	if got := string(req.Header.Peek(headerTraceparent)); got != want {
		t.Errorf("traceparent %q, want %q", got, want)
	}
}

// TestCallSpan checks the W3C span each kind of trace header gives: a
// traceparent's ids and sampled flag; a Compat-Trace-Id's UUID or hex
// digits, or a hash of any other; a Compat-Parent-Id of 16 hex digits as
// the parent span, none otherwise; and a call starting a trace named after
// its own id. The span id is always the call id's last 8 bytes.
func TestCallSpan(t *testing.T) {
	var g callIDs
	call := g.nextUUID(time.Now())
	callHex := formatUUID(&call)
	tests := []struct {
		name                         string
		traceID, parentID, tp        string
		wantTrace, wantParent, flags string
		wantUUID                     bool
	}{
		{name: "no headers", wantTrace: callHex, wantParent: "0000000000000000", flags: "01", wantUUID: true},
		{name: "traceparent sampled", tp: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			wantTrace: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", wantParent: "00f067aa0ba902b7", flags: "01"},
		{name: "traceparent not sampled", tp: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02",
			wantTrace: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", wantParent: "00f067aa0ba902b7", flags: "00"},
		{name: "compat uuid", traceID: "0190a000-0000-7000-8000-000000000001", parentID: "1111222233334444",
			wantTrace: "0190a000-0000-7000-8000-000000000001", wantParent: "1111222233334444", flags: "01", wantUUID: true},
		{name: "compat hex", traceID: "4bf92f3577b34da6a3ce929d0e0e4736", parentID: "call-2",
			wantTrace: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", wantParent: "0000000000000000", flags: "01"},
		{name: "compat other", traceID: "run-1",
			wantTrace: "hash", wantParent: "0000000000000000", flags: "01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc, err := parseTraceHeaders([]byte(tt.traceID), []byte(tt.parentID), []byte(tt.tp))
			if err != nil {
				t.Fatal(err)
			}
			sp := callSpan(&tc, &call)
			trace := formatUUID(&sp.TraceID)
			if sp.UUIDTraceID != tt.wantUUID {
				t.Errorf("UUIDTraceID = %v, want %v", sp.UUIDTraceID, tt.wantUUID)
			}
			if tt.wantTrace == "hash" {
				again, _ := w3cTraceID([]byte(tt.traceID))
				other, _ := w3cTraceID([]byte("run-2"))
				if sp.TraceID == ([16]byte{}) || sp.TraceID != again || sp.TraceID == other {
					t.Errorf("trace %s of %q is not a stable hash of it", trace, tt.traceID)
				}
			} else if trace != tt.wantTrace {
				t.Errorf("trace %s, want %s", trace, tt.wantTrace)
			}
			if got := string(appendTraceparent(nil, &sp)); got[36:52] != callHex[19:23]+callHex[24:] || got[53:] != tt.flags {
				t.Errorf("traceparent %s: want span id %s and flags %s", got, callHex[19:23]+callHex[24:], tt.flags)
			}
			var parent [16]byte
			copy(parent[8:], sp.ParentSpanID[:])
			if got := formatUUID(&parent)[19:23] + formatUUID(&parent)[24:]; got != tt.wantParent {
				t.Errorf("parent %s, want %s", got, tt.wantParent)
			}
		})
	}
}
