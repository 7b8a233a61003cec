package stackprobe

import "testing"

// A chain deeper than a new goroutine's stack moves it; a shallow one and
// one run again on the grown stack do not.
func TestMoved(t *testing.T) {
	for _, tt := range []struct {
		name  string
		depth int
		again bool
		want  bool
	}{
		{"shallow", 512, false, false},
		{"deep", 64 << 10, false, true},
		{"deep again", 64 << 10, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			moved := make(chan bool, 1)
			go func() {
				if tt.again {
					Below(tt.depth, nil)
				}
				moved <- Moved(func() { Below(tt.depth, nil) })
			}()
			if got := <-moved; got != tt.want {
				t.Errorf("Moved = %v, want %v", got, tt.want)
			}
		})
	}
}

// Below calls its function at the bottom of the chain.
func TestBelowCalls(t *testing.T) {
	called := false
	Below(4<<10, func() { called = true })
	if !called {
		t.Error("f was not called")
	}
}
