package proxy

import (
	"net"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/handover"
	"github.com/tollgate-dev/tollgate/internal/stackprobe"
)

// TestKeptConnGrowsStack checks that the first bytes read from a
// connection kept after a stream leave the reading goroutine, whose stack
// began small, handover.RequestStack of free stack: a call chain of nearly that
// depth then runs without its stack being copied, as the request path
// those bytes begin must (see keep). The chain must move a stack that was
// not grown: TestKeptConnGrowsStack/not_grown checks that it does.
func TestKeptConnGrowsStack(t *testing.T) {
	tests := []struct {
		name      string
		pipelined bool // the request's bytes came behind the stream's
		grow      bool
		wantMoved bool
	}{
		{"next request from the socket", false, true, false},
		{"pipelined request", true, true, false},
		{"not grown", false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer client.Close()
			defer server.Close()
			kc := &keptConn{Conn: server, growStack: tt.grow}
			wrote := make(chan error, 1)
			if tt.pipelined {
				kc.prefix = []byte("POST")
				wrote <- nil
			} else {
				go func() {
					_, err := client.Write([]byte("POST"))
					wrote <- err
				}()
			}
			moved := make(chan bool, 1)
			go func() {
				if n, err := kc.Read(make([]byte, 4)); n == 0 || err != nil {
					t.Errorf("read %d bytes, %v", n, err)
				}
				moved <- stackprobe.MovedBelow(handover.RequestStack*7/8, nil)
			}()
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			if got := <-moved; got != tt.wantMoved {
				t.Errorf("a call chain of %d bytes after the first read moved the stack: %v, want %v", handover.RequestStack*7/8, got, tt.wantMoved)
			}
		})
	}
}
