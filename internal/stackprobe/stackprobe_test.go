package stackprobe

import "testing"

// A chain deeper than a new goroutine's stack moves it; the same chain run
// again on the grown stack does not.
func TestMovedBelow(t *testing.T) {
	const depth = 64<<10 + 3*smallFrame
	for _, tt := range []struct {
		name  string
		again bool
		want  bool
	}{
		{"deep", false, true},
		{"deep again", true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			moved := make(chan bool, 1)
			go func() {
				if tt.again {
					MovedBelow(depth, nil)
				}
				moved <- MovedBelow(depth, nil)
			}()
			if got := <-moved; got != tt.want {
				t.Errorf("MovedBelow = %v, want %v", got, tt.want)
			}
		})
	}
}

// MovedBelow calls its function at the bottom of the chain.
func TestMovedBelowCalls(t *testing.T) {
	called := false
	MovedBelow(4<<10+smallFrame, func() { called = true })
	if !called {
		t.Error("f was not called")
	}
}
