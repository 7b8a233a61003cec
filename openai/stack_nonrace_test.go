//go:build !race

package openai

import (
	"runtime/debug"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/handover"
	"github.com/tollgate-dev/tollgate/internal/stackprobe"
)

// TestUsageChunkStack checks that processing a stream's usage chunk needs
// no more stack than processing its content chunks: a stream's goroutine
// grows its stack for its events before it writes them
// (handover.GrowEventStack), to what they take, and the usage chunk, which
// ends most streams, must not grow it again at its deepest call, which
// would copy every frame below. The race detector deepens every stack, so
// the test runs without it.
func TestUsageChunkStack(t *testing.T) {
	// A collection may change the stack new goroutines begin with
	// (adaptive stack start), which would make the rooms incomparable.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	usage := room(t, chunkSeeds[2])
	for _, chunk := range chunkSeeds[:2] {
		if content := room(t, chunk); usage < content {
			t.Errorf("the usage chunk leaves %d frames of room, a content chunk %d (%s)", usage, content, chunk)
		}
	}
}

// room is how many roomFrame frames a goroutine can hold, after it grew
// its stack for its events, below the processing of chunk without its
// stack being copied.
func room(t *testing.T, chunk string) int {
	ev := []byte("data: " + chunk + "\n\n")
	c := new(EventProcessor)
	dst := make([]byte, 0, 1<<10)
	// A first call takes the runtime's slow paths.
	c.Reset(StreamOptions{StripContinuous: true, PublicModel: []byte(`"m"`)})
	_ = c.Process(dst, ev)
	for n := 0; n < 1<<10; n++ {
		moved := make(chan bool, 1)
		go func() {
			handover.GrowEventStack(0)
			moved <- stackprobe.MovedBelow(n*roomFrame, func() {
				c.Reset(StreamOptions{StripContinuous: true, PublicModel: []byte(`"m"`)})
				_ = c.Process(dst, ev)
			})
		}()
		if <-moved {
			return n
		}
	}
	t.Fatalf("processing %s never moved the stack", chunk)
	return 0
}

// roomFrame is the depth of one frame of room.
const roomFrame = 64
