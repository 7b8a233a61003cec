package accounting

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
)

// niceStore records the nice value of the thread each write runs on. With
// gate set, the first write waits for it to be closed.
type niceStore struct {
	gate    chan struct{}
	entered chan struct{}

	mu    sync.Mutex
	nices []int
}

func (*niceStore) SetAside(context.Context, Record, string) error { return nil }

func (s *niceStore) InsertRecords(ctx context.Context, recs []Record) error {
	// getpriority(2)'s raw value is 20 - nice (the libc wrapper undoes it).
	prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, syscall.Gettid())
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.nices = append(s.nices, 20-prio)
	first := len(s.nices) == 1
	s.mu.Unlock()
	if first && s.gate != nil {
		s.entered <- struct{}{}
		<-s.gate
	}
	return nil
}

func (s *niceStore) written() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.nices...)
}

func TestWriterRunsAtLowPriorityUntilBacklogged(t *testing.T) {
	st := &niceStore{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	r := newRecorder(st, RecorderOptions{QueueSize: 100, BatchSize: 2, FlushInterval: time.Hour}, zap.NewNop(), nil, testBackoff)
	r.Record(rec(0))
	r.Record(rec(1)) // a batch: the writer takes it and waits on the gate
	<-st.entered     // orders the writer's setting of lowPriority before this read
	if !r.lowPriority {
		t.Skip("this system does not let a thread lower its priority")
	}
	// 2 + 9 more batches of 2 queued: more than writerBacklogBatches.
	for i := 2; i < 2+2*(writerBacklogBatches+5); i++ {
		r.Record(rec(i))
	}
	close(st.gate)
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	nices := st.written()
	if len(nices) != 1+writerBacklogBatches+5 {
		t.Fatalf("%d batches written, want %d: %v", len(nices), 1+writerBacklogBatches+5, nices)
	}
	// The first batch was written with nothing else queued: low priority.
	if nices[0] != writerNice {
		t.Errorf("first batch written at nice %d, want %d", nices[0], writerNice)
	}
	// The next ones found more than writerBacklogBatches batches queued,
	// until the backlog fell to that many.
	normal := 0
	for _, n := range nices[1:] {
		if n == 0 {
			normal++
		} else if n != writerNice {
			t.Errorf("a batch written at nice %d, want 0 or %d", n, writerNice)
		}
	}
	if normal == 0 {
		t.Errorf("no backlogged batch was written at normal priority: %v", nices)
	}
	if nices[len(nices)-1] != writerNice {
		t.Errorf("the last batch, with no backlog, written at nice %d, want %d: %v", nices[len(nices)-1], writerNice, nices)
	}
	if got := int(testutil.ToFloat64(r.metrics.normalPriorityBatches)); got != normal {
		t.Errorf("backlogged batch counter = %d, want %d", got, normal)
	}
}
