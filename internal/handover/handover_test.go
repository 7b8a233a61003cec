package handover

import (
	"strconv"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/stackprobe"
)

// TestPutChunkSize checks the chunk size line against strconv's hex, at the
// end of the room given, for sizes up to what fills eight hex digits.
func TestPutChunkSize(t *testing.T) {
	for _, n := range []int{0, 1, 9, 10, 15, 16, 255, 4096, 4086, 1<<32 - 1} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			var room [10]byte
			l := PutChunkSize(room[:], n)
			want := strconv.FormatInt(int64(n), 16) + "\r\n"
			if got := string(room[len(room)-l:]); got != want {
				t.Errorf("PutChunkSize(%d) wrote %q, want %q", n, got, want)
			}
		})
	}
}

// TestGrowEventStack checks that GrowEventStack, called from a goroutine's
// first frames, leaves EventStack of free stack: a call chain of three
// quarters of that depth then runs without its stack being copied (the
// probe's own frames, and the race detector's, take some of the rest). The
// chain must move a stack that was not grown: TestGrowEventStack/not_grown
// checks that it does.
func TestGrowEventStack(t *testing.T) {
	for _, tt := range []struct {
		name      string
		grow      bool
		wantMoved bool
	}{
		{"grown", true, false},
		{"not grown", false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			moved := make(chan bool, 1)
			go func() {
				if tt.grow {
					GrowEventStack(0)
				}
				moved <- stackprobe.MovedBelow(EventStack*3/4, nil)
			}()
			if got := <-moved; got != tt.wantMoved {
				t.Errorf("a call chain of %d bytes moved the stack: %v, want %v", EventStack*3/4, got, tt.wantMoved)
			}
		})
	}
}
