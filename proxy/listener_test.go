package proxy

import (
	"net"
	"testing"
	"time"
)

// deadlineConn records the write deadlines set on it and accepts every write.
type deadlineConn struct {
	net.Conn
	deadlines []time.Time
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.deadlines = append(c.deadlines, t)
	return nil
}

func (c *deadlineConn) Write(p []byte) (int, error) { return len(p), nil }

// TestCountedConnWriteDeadline checks that a write moves the write deadline to write_timeout
// from now only once less than half of it is left, whoever set it last.
func TestCountedConnWriteDeadline(t *testing.T) {
	const timeout = time.Minute
	tests := []struct {
		name     string
		set      time.Time // the deadline set before the write; zero sets none
		wantMove bool
	}{
		{"no deadline yet", time.Time{}, true},
		{"most of the timeout left", time.Now().Add(timeout - time.Second), false},
		{"just over half left", time.Now().Add(timeout/2 + 5*time.Second), false},
		{"under half left", time.Now().Add(timeout/2 - 5*time.Second), true},
		{"past", time.Now().Add(-time.Second), true},
		{"a wall-clock deadline with most left", time.Now().Add(timeout - time.Second).Round(0), false},
		{"a wall-clock deadline with under half left", time.Now().Add(time.Second).Round(0), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := &deadlineConn{}
			c := &countedConn{Conn: raw, l: &limitListener{writeTimeout: timeout}}
			if !tt.set.IsZero() {
				_ = c.SetWriteDeadline(tt.set)
			}
			before := time.Now()
			if n, err := c.Write([]byte("data")); n != 4 || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
			set := len(raw.deadlines)
			if !tt.set.IsZero() {
				set-- // SetWriteDeadline's own
			}
			if moved := set > 0; moved != tt.wantMove {
				t.Fatalf("deadline moved = %v, want %v (deadlines %v)", moved, tt.wantMove, raw.deadlines)
			}
			if !tt.wantMove {
				return
			}
			got := raw.deadlines[len(raw.deadlines)-1]
			if got.Before(before.Add(timeout)) || got.After(time.Now().Add(timeout)) {
				t.Errorf("deadline moved to %v, want write_timeout after %v", got, before)
			}
			// A second write right after leaves it.
			n := len(raw.deadlines)
			_, _ = c.Write([]byte("more"))
			if len(raw.deadlines) != n {
				t.Errorf("a second write moved the deadline again: %v", raw.deadlines)
			}
		})
	}
}
