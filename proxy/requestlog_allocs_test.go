//go:build !race

// The race detector drops sync.Pool puts at random (zap's and logline's),
// so that allocations are counted without it.

package proxy

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/internal/logline"
)

// The line costs the logger no allocation but the field's slice (zap's
// Write takes ...Field) and the core none at all.
func TestRequestLogFastLineAllocs(t *testing.T) {
	var out lineSink
	out.Grow(1 << 20)
	core := logline.NewJSONCore(&out, zap.InfoLevel)
	log := zap.New(core)
	now := time.Now()
	rec := accounting.Record{RequestID: "0193b2f0-7c1e-7a3b-9a51-3f0c2d9e8b71", Endpoint: "chat", Model: "demo", Backend: "sim",
		Status: 200, Started: now, Ended: now.Add(3 * time.Millisecond), KeyName: "bench", Team: "bench", Project: "default",
		PromptTokens: 60, CompletionTokens: 16}
	fields := []zap.Field{zap.Inline(requestLog{&rec})}
	ent := zapcore.Entry{Level: zap.InfoLevel, Time: now, Message: "request"}
	if allocs := testing.AllocsPerRun(100, func() {
		out.Reset()
		if err := core.Write(ent, fields); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("core: %v allocations per line, want 0", allocs)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		out.Reset()
		if ce := log.Check(zap.InfoLevel, "request"); ce != nil {
			ce.Write(zap.Inline(requestLog{&rec}))
		}
	}); allocs > 1 {
		t.Errorf("logger: %v allocations per line, want at most 1", allocs)
	}
}
