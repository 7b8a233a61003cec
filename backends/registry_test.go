package backends

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/config"
)

const priorityTestConfig = `auth:
  keys:
    - {name: dev, key: sk-test-0001}
backends:
  - name: a
    simulated: {}
    max_concurrency: 1
    health: {interval: 1h}
models:
  - name: ranked
    backends: [a]
    priority_scheduling: true
    queue: {depth: 4, wait: 1h}
  - name: plain
    backends: [a]
    priority_scheduling: false
  - name: unset
    backends: [a]
`

// TestAcceptsPriority checks the priority rule per model as the configuration sets it: a model
// served with priority scheduling takes any priority (it is forwarded), another only 0.
func TestAcceptsPriority(t *testing.T) {
	cfg, err := config.Parse([]byte(priorityTestConfig), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tests := []struct {
		model    string
		priority int64
		want     bool
	}{
		{"ranked", 0, true},
		{"ranked", 3, true},
		{"ranked", -7, true},
		{"plain", 0, true},
		{"plain", 3, false},
		{"plain", -1, false},
		{"unset", 0, true},
		{"unset", 1, false},
	}
	for _, tt := range tests {
		if got := r.Route([]byte(tt.model)).AcceptsPriority(tt.priority); got != tt.want {
			t.Errorf("%s: AcceptsPriority(%d) = %v, want %v", tt.model, tt.priority, got, tt.want)
		}
	}
}

// TestRegistryReleaseServesQueues checks NewRegistry's wiring: a release of a backend serves the
// requests queued on any model it serves, first the one a higher priority.
func TestRegistryReleaseServesQueues(t *testing.T) {
	cfg, err := config.Parse([]byte(priorityTestConfig), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a := r.Backends()[0]
	// The model without priority scheduling, whose queue orders by priority too: with it, the
	// higher band would pass the lower one to the server (TestQueuePassesHigherBands).
	ranked := r.Route([]byte("plain"))
	if !a.tryAcquire() {
		t.Fatal("no slot on a")
	}
	out := make(chan outcome, 2)
	for _, c := range []struct {
		name     string
		priority int64
	}{{"low", 4}, {"high", -4}} {
		go func() {
			b, err := ranked.WaitForSlot(nil, nil, 0, Claim{Priority: c.priority}, nil, nil, nil)
			out <- outcome{name: c.name, b: b, err: err}
		}()
		want := int64(1)
		if c.name == "high" {
			want = 2
		}
		waitFor(t, c.name+" queued", 5*time.Second, func() bool { return ranked.queued.Load() == want })
	}
	for _, want := range []string{"high", "low"} {
		a.Release()
		o := <-out
		if o.name != want || o.b != a || o.err != nil {
			t.Fatalf("release served %s (%v, %v), want %s", o.name, o.b, o.err, want)
		}
	}
	a.Release()
}
