package accounting

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
)

// Record copies the record into the queue and nothing else: a record that
// holds no reservation stays off the heap, so the request path allocates
// nothing for it.
func TestRecordAllocatesNothing(t *testing.T) {
	// A batch larger than the runs and an hour's flush keep the writer
	// asleep, so that only Record's own allocations are counted.
	r := NewRecorder(nopStore{}, RecorderOptions{BatchSize: 4096, FlushInterval: time.Hour}, zap.NewNop(), nil)
	t.Cleanup(func() {
		if err := r.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	rec := Record{CallID: "0190f2a4-7b1c-7c3e-9d2a-3f4b5c6d7e8f", Team: "acme", Project: "search",
		Model: "demo", PromptTokens: 12, CompletionTokens: 4, TotalTokens: 16}
	r.Record(rec) // the first record allocates the queue's buffer
	if n := testing.AllocsPerRun(100, func() { r.Record(rec) }); n != 0 {
		t.Errorf("Record allocates %.1f times per record, want 0", n)
	}
}
