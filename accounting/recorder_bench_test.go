package accounting

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
)

// nopStore accepts every batch at once, so that the benchmarks measure the
// enqueue, not the database.
type nopStore struct{}

func (nopStore) InsertRecords(context.Context, []Record) error { return nil }

func (nopStore) SetAside(context.Context, Record, string) error { return nil }

// BenchmarkRecord measures what recording costs the request path: one
// enqueue of a Record of realistic size, with the writer draining the queue
// concurrently. It should cost an append under a mutex and allocate nothing.
func BenchmarkRecord(b *testing.B) {
	rec := Record{
		RequestID: "req-0123456789abcdef", CallID: "0190f2a4-7b1c-7c3e-9d2a-3f4b5c6d7e8f", TraceID: "0190f2a4-7b1c-7c3e-9d2a-3f4b5c6d7e8f",
		KeyName: "ci", Team: "acme", Project: "chatbot", Model: "llama-3.1-8b", ServedModel: "llama-3.1-8b", Backend: "gpu-1",
		Status: 200, Stream: true, PromptTokens: 812, CompletionTokens: 256, TotalTokens: 1068, CachedTokens: 512,
		Started: time.Now(), Ended: time.Now(),
	}
	bench := func(b *testing.B, parallel bool) {
		r := NewRecorder(nopStore{}, RecorderOptions{}, zap.NewNop(), prometheus.NewRegistry())
		b.ReportAllocs()
		b.ResetTimer()
		if parallel {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r.Record(rec)
				}
			})
		} else {
			for b.Loop() {
				r.Record(rec)
			}
		}
		b.StopTimer()
		if err := r.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
		// Waits show whether the writer kept up: a wait is the request
		// path paying for the store.
		b.ReportMetric(testutil.ToFloat64(r.metrics.backpressure)/float64(b.N), "waits/op")
	}
	b.Run("serial", func(b *testing.B) { bench(b, false) })
	b.Run("parallel", func(b *testing.B) { bench(b, true) })
}
