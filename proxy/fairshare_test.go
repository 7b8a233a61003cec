package proxy_test

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/hostile"
)

// TestTenantsCountedToRelease sends requests ending every way to a model
// that counts its tenants' slots (two backends with max_concurrency, so
// queue.reserve's default applies): each request is counted while it holds
// a slot or waits, and no count is left once it ends.
func TestTenantsCountedToRelease(t *testing.T) {
	hs := startHostile(t)
	h := hostileHarness(t, hs, harnessOptions{
		extraBackends: fmt.Sprintf("  - name: h1\n    url: %q\n    max_concurrency: 1\n  - name: h2\n    url: %q\n    max_concurrency: 1\n", hs.URL(), hs.URL()),
		models: `
  - name: demo
    backends: [sim]
  - name: fair
    backends: [h1, h2]
    queue: {depth: 4, wait: 5m}
retries: {attempts: 2, backoff: 1ms, max_backoff: 1ms}
`,
	})
	route := h.reg.Route([]byte("fair"))
	if !route.CountsTenants() {
		t.Fatal("a model of two backends with max_concurrency does not count its tenants")
	}
	body := strings.Replace(badBody, `"bad"`, `"fair"`, 1)
	streamBody := strings.Replace(badStreamBody, `"bad"`, `"fair"`, 1)
	const tenant = "acme/fair"
	tests := []struct {
		name, behaviour, body string
		// status is the answer; 0 for a client that leaves once its
		// request holds a slot.
		status int
		// retried says the request failed on one backend and was sent
		// to the other.
		retried bool
	}{
		{"success", "ok", body, http.StatusOK, false},
		{"stream", "ok", streamBody, http.StatusOK, false},
		{"error", "not-json", body, http.StatusBadGateway, false},
		{"retried on the other backend", "unavailable", body, http.StatusServiceUnavailable, true},
		{"client gone", "hang", body, 0, false},
		{"stream client gone", "hang", streamBody, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := h.recorder.count()
			if tt.status == 0 {
				sendAndLeave(t, h, tt.body, tt.behaviour, func() bool { return route.TenantsCounted() == 1 })
			} else {
				r := h.post(tt.body, hostile.Header+": "+tt.behaviour, "Compat-Project: "+tenant)
				if r.status != tt.status {
					t.Errorf("status %d %s, want %d", r.status, r.body, tt.status)
				}
			}
			waitUntil(t, "every count to end", func() bool { return route.TenantsCounted() == 0 })
			rec := h.recorder.wait(t, n+1)
			if retried := len(rec.Attempts) == 1 && rec.Attempts[0].Backend != rec.Backend; retried != tt.retried || rec.Backend == "" {
				t.Errorf("record: backend %q after %+v; want retried on the other backend %v", rec.Backend, rec.Attempts, tt.retried)
			}
		})
	}
	t.Run("client gone while waiting", func(t *testing.T) {
		// Two requests hang on the two slots; a third waits, counted as
		// waiting, and its client leaves.
		var holders []net.Conn
		for range 2 {
			c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nCompat-Project: %s\r\n%s: hang\r\nContent-Length: %d\r\n\r\n%s",
				testKey, tenant, hostile.Header, len(body), body)
			holders = append(holders, c)
		}
		waitUntil(t, "both slots taken", func() bool { n, _ := route.TenantLoad(tenant); return n == 2 })
		// The waiting request is of the key's default project: a second
		// tenant counted while it waits.
		sendAndLeave(t, h, body, "ok", func() bool { return route.TenantsCounted() == 2 })
		waitUntil(t, "the waiting request's count to end", func() bool { return route.TenantsCounted() == 1 })
		if n, w := route.TenantLoad(tenant); n != 2 || w != 0 {
			t.Errorf("the holders' tenant counts %d slots, %d waiting; want 2, 0", n, w)
		}
		for _, c := range holders {
			c.Close()
		}
		waitUntil(t, "every count to end", func() bool { return route.TenantsCounted() == 0 })
	})
}
