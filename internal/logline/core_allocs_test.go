//go:build !race

// The race detector drops sync.Pool puts at random, so that allocations
// are counted without it.

package logline

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestCoreWriteAllocs(t *testing.T) {
	var out sink
	out.Grow(1 << 20)
	core := NewJSONCore(&out, zapcore.InfoLevel)
	ent := zapcore.Entry{Level: zapcore.InfoLevel, Time: time.Now(), Message: "request"}
	fields := []zapcore.Field{zap.Inline(testFields{s: "gpt-4o", d: time.Millisecond, n: 60})}
	allocs := testing.AllocsPerRun(100, func() {
		out.Reset()
		if err := core.Write(ent, fields); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per line, want 0", allocs)
	}
}
