package accounting

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate-dev/tollgate/config"
)

// testBackoff keeps retries fast; tests assert counts, never durations.
var testBackoff = backoff{min: time.Microsecond, max: time.Millisecond}

// memStore keeps what it is given. With gate set, every write first
// announces itself on entered (when set) and waits for gate to be closed.
// It fails the first failFirst writes, or every write with failAlways.
type memStore struct {
	gate    chan struct{}
	entered chan struct{}

	mu         sync.Mutex
	failFirst  int
	failAlways bool
	calls      int
	recs       []Record
	batches    []int
	// aside are the records set aside, reasons why.
	aside   []Record
	reasons []string
}

func (s *memStore) SetAside(_ context.Context, rec Record, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aside = append(s.aside, rec)
	s.reasons = append(s.reasons, reason)
	return nil
}

func (s *memStore) InsertRecords(ctx context.Context, recs []Record) error {
	if s.gate != nil {
		if s.entered != nil {
			s.entered <- struct{}{}
		}
		<-s.gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.failAlways || s.calls <= s.failFirst {
		return errors.New("disk on fire")
	}
	s.recs = append(s.recs, recs...)
	s.batches = append(s.batches, len(recs))
	return nil
}

func (s *memStore) callIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, len(s.recs))
	for i, r := range s.recs {
		ids[i] = r.CallID
	}
	return ids
}

func rec(i int) Record {
	return Record{
		RequestID: fmt.Sprintf("req-%d", i), CallID: fmt.Sprintf("call-%03d", i), TraceID: "t",
		KeyName: "k", Team: "acme", Project: "chatbot", Model: "m",
		PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15,
	}
}

func wantIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = rec(i).CallID
	}
	return ids
}

func equalStrings(a, b []string) bool {
	return strings.Join(a, ",") == strings.Join(b, ",")
}

// eventually polls cond until it holds. It bounds nothing about time: a
// condition that never holds is reported by the test binary's timeout.
func eventually(cond func() bool) {
	for !cond() {
		time.Sleep(time.Millisecond)
	}
}

func TestRecorderFullQueueBlocksInsteadOfDropping(t *testing.T) {
	st := &memStore{gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	core, logs := observer.New(zapcore.WarnLevel)
	reg := prometheus.NewRegistry()
	r := newRecorder(st, RecorderOptions{QueueSize: 2, BatchSize: 1, FlushInterval: time.Hour}, zap.New(core), reg, testBackoff)

	r.Record(rec(0))
	<-st.entered // The writer holds record 0 and is stuck writing it.
	r.Record(rec(1))
	r.Record(rec(2)) // The queue (2) is now full.

	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Record(rec(3))
	}()
	eventually(func() bool { return testutil.ToFloat64(r.metrics.backpressure) == 1 })
	select {
	case <-done:
		t.Fatal("Record returned while the queue was full")
	default:
	}
	if got := testutil.ToFloat64(r.metrics.lost); got != 0 {
		t.Errorf("lost = %v while waiting, want 0", got)
	}
	if n, err := testutil.GatherAndCount(reg, "tollgate_usage_queue_depth"); err != nil || n != 1 {
		t.Fatalf("queue depth gauge: n=%d err=%v", n, err)
	}
	if depth := r.queue.len(); depth != 2 {
		t.Errorf("queue depth = %d, want 2", depth)
	}

	close(st.gate) // The store recovers.
	<-done
	if logs.FilterMessageSnippet("usage queue full").Len() != 1 {
		t.Errorf("no warning about the full queue; logs: %v", logs.All())
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := st.callIDs(); !equalStrings(got, wantIDs(4)) {
		t.Errorf("written %v, want %v", got, wantIDs(4))
	}
	if got := testutil.ToFloat64(r.metrics.written); got != 4 {
		t.Errorf("written counter = %v, want 4", got)
	}
}

func TestRecorderCloseDrainsQueue(t *testing.T) {
	st := &memStore{}
	// A flush interval of an hour means only Close can make the writer
	// write the last partial batch.
	r := newRecorder(st, RecorderOptions{QueueSize: 1000, BatchSize: 10, FlushInterval: time.Hour}, zap.NewNop(), nil, testBackoff)
	for i := range 95 {
		r.Record(rec(i))
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := st.callIDs(); !equalStrings(got, wantIDs(95)) {
		t.Errorf("written %d records %v, want %d in order", len(got), got, 95)
	}
	for _, n := range st.batches {
		if n > 10 {
			t.Errorf("batch of %d records, want at most 10", n)
		}
	}
	if got := testutil.ToFloat64(r.metrics.written); got != 95 {
		t.Errorf("written counter = %v, want 95", got)
	}
}

func TestRecorderFlushesPartialBatchAfterInterval(t *testing.T) {
	st := &memStore{}
	r := newRecorder(st, RecorderOptions{QueueSize: 100, BatchSize: 100, FlushInterval: time.Millisecond}, zap.NewNop(), nil, testBackoff)
	r.Record(rec(0))
	eventually(func() bool { return len(st.callIDs()) == 1 })
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// A tick writes what was queued at the tick. Records that arrive during
// that write wait for the next tick (or a full batch) rather than each
// becoming a transaction of its own right after it.
func TestRecorderTickWritesWhatWasQueuedAtTheTick(t *testing.T) {
	ticks := make(chan time.Time)
	st := &memStore{gate: make(chan struct{}), entered: make(chan struct{})}
	r := newRecorder(st, RecorderOptions{QueueSize: 100, BatchSize: 100, ticks: ticks}, zap.NewNop(), nil, testBackoff)
	for i := range 3 {
		r.Record(rec(i))
	}
	ticks <- time.Now()
	<-st.entered // the tick's write of the three records, held at the gate
	for i := 3; i < 5; i++ {
		r.Record(rec(i))
	}
	st.gate <- struct{}{}
	// The writer either starts another write at once (chasing the two
	// records) or goes back to waiting, where it takes the next tick.
	select {
	case <-st.entered:
		t.Fatal("the writer wrote records queued after the tick in the tick's flush")
	case ticks <- time.Now():
	}
	<-st.entered
	close(st.gate)
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	st.mu.Lock()
	batches := slices.Clone(st.batches)
	st.mu.Unlock()
	if !slices.Equal(batches, []int{3, 2}) {
		t.Errorf("batches %v, want [3 2]: one per tick", batches)
	}
	if got := st.callIDs(); !equalStrings(got, wantIDs(5)) {
		t.Errorf("written %v, want %v", got, wantIDs(5))
	}
}

func TestRecorderRetriesFailedWrites(t *testing.T) {
	st := &memStore{failFirst: 3}
	core, logs := observer.New(zapcore.ErrorLevel)
	r := newRecorder(st, RecorderOptions{QueueSize: 100, BatchSize: 5, FlushInterval: time.Hour}, zap.New(core), nil, testBackoff)
	for i := range 5 {
		r.Record(rec(i))
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := st.callIDs(); !equalStrings(got, wantIDs(5)) {
		t.Errorf("written %v, want %v exactly once", got, wantIDs(5))
	}
	for name, tc := range map[string]struct {
		c    prometheus.Counter
		want float64
	}{
		"written": {r.metrics.written, 5},
		"failed":  {r.metrics.failed, 15},
		"retried": {r.metrics.retried, 15},
		"lost":    {r.metrics.lost, 0},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%s = %v, want %v", name, got, tc.want)
		}
	}
	if n := logs.FilterMessageSnippet("retrying").Len(); n != 3 {
		t.Errorf("%d retry errors logged, want 3", n)
	}
}

func TestRecorderCloseDeadlineReportsUnwritten(t *testing.T) {
	st := &memStore{failAlways: true}
	core, logs := observer.New(zapcore.ErrorLevel)
	r := newRecorder(st, RecorderOptions{QueueSize: 100, BatchSize: 2, FlushInterval: time.Hour}, zap.New(core), nil, testBackoff)
	for i := range 3 {
		r.Record(rec(i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := r.Close(ctx)
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "3 usage records not written") {
		t.Fatalf("Close = %v, want the 3 unwritten records and context.Canceled", err)
	}
	if got := testutil.ToFloat64(r.metrics.lost); got != 3 {
		t.Errorf("lost = %v, want 3", got)
	}
	lost := logs.FilterMessageSnippet("usage record lost")
	if lost.Len() != 3 {
		t.Fatalf("%d lost records logged, want 3", lost.Len())
	}
	for _, e := range lost.All() {
		if e.ContextMap()["call_id"] == "" {
			t.Errorf("lost record logged without its call_id: %v", e.ContextMap())
		}
	}
}

func TestRecorderCloseDeadlineReleasesBlockedRecord(t *testing.T) {
	st := &memStore{gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	r := newRecorder(st, RecorderOptions{QueueSize: 1, BatchSize: 1, FlushInterval: time.Hour}, zap.NewNop(), nil, testBackoff)
	r.Record(rec(0))
	<-st.entered
	r.Record(rec(1)) // The queue is full.
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Record(rec(2))
	}()
	eventually(func() bool { return testutil.ToFloat64(r.metrics.backpressure) == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	closed := make(chan error)
	go func() { closed <- r.Close(ctx) }()
	cancel()
	<-done // Giving up releases the waiting Record...
	close(st.gate)
	err := <-closed // ...and the writer.
	if err == nil {
		t.Fatal("Close = nil, want an error after its deadline")
	}
	// Record 0 may or may not have been written, depending on whether the
	// store noticed the cancelled context; every record is accounted for.
	written := len(st.callIDs())
	if lost := int(testutil.ToFloat64(r.metrics.lost)); written+lost != 3 {
		t.Errorf("written %d + lost %d, want 3", written, lost)
	}
}

func TestRecordAfterCloseIsLostLoudly(t *testing.T) {
	st := &memStore{}
	core, logs := observer.New(zapcore.ErrorLevel)
	r := newRecorder(st, RecorderOptions{}, zap.New(core), nil, testBackoff)
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	r.Record(rec(7)) // Must not panic.
	if got := testutil.ToFloat64(r.metrics.lost); got != 1 {
		t.Errorf("lost = %v, want 1", got)
	}
	entries := logs.FilterMessageSnippet("usage record lost").All()
	if len(entries) != 1 || entries[0].ContextMap()["call_id"] != "call-007" {
		t.Errorf("lost record logs = %v, want one naming call-007", entries)
	}
	if err := r.Close(context.Background()); err == nil {
		t.Error("second Close = nil, want an error")
	}
}

func TestRecorderConcurrentRecordAndClose(t *testing.T) {
	st := &memStore{}
	r := newRecorder(st, RecorderOptions{QueueSize: 64, BatchSize: 16, FlushInterval: time.Millisecond}, zap.NewNop(), nil, testBackoff)
	const goroutines, each = 20, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				r.Record(rec(g*each + i))
			}
		})
	}
	eventually(func() bool { return len(st.callIDs()) > 0 })
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	written := len(st.callIDs())
	lost := int(testutil.ToFloat64(r.metrics.lost))
	if written+lost != goroutines*each {
		t.Errorf("written %d + lost %d = %d, want %d: a record vanished", written, lost, written+lost, goroutines*each)
	}
	if got := int(testutil.ToFloat64(r.metrics.written)); got != written {
		t.Errorf("written counter = %d, store has %d", got, written)
	}
}

func TestRecorderCountsTokensByLabels(t *testing.T) {
	st := &memStore{}
	reg := prometheus.NewRegistry()
	labels := NewLabelPolicy(&config.Config{
		Metrics: config.Metrics{Teams: []string{"acme", "beta"}, Projects: []string{"bot", "inference"}},
		Models:  []config.Model{{Name: "m1"}, {Name: "m2"}},
	})
	r := newRecorder(st, RecorderOptions{Labels: labels}, zap.NewNop(), reg, testBackoff)
	r.Record(Record{CallID: "a", Team: "acme", Project: "bot", Model: "m1", PromptTokens: 10, CompletionTokens: 3})
	r.Record(Record{CallID: "b", Team: "acme", Project: "bot", Model: "m1", PromptTokens: 5, CompletionTokens: 2})
	r.Record(Record{CallID: "c", Team: "beta", Project: "inference", Model: "m2", PromptTokens: 1})
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	tests := []struct {
		name string
		c    prometheus.Counter
		want float64
	}{
		{"prompt acme/bot/m1", r.metrics.promptTokens.WithLabelValues("acme", "bot", "m1"), 15},
		{"completion acme/bot/m1", r.metrics.completionTokens.WithLabelValues("acme", "bot", "m1"), 5},
		{"prompt beta/inference/m2", r.metrics.promptTokens.WithLabelValues("beta", "inference", "m2"), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := testutil.ToFloat64(tt.c); got != tt.want {
				t.Errorf("= %v, want %v", got, tt.want)
			}
		})
	}
	// Every series the issue asks for is registered on the registry given.
	for _, name := range []string{
		"tollgate_prompt_tokens_total", "tollgate_completion_tokens_total", "tollgate_usage_queue_depth",
		"tollgate_usage_records_written_total", "tollgate_usage_records_failed_total",
		"tollgate_usage_records_retried_total", "tollgate_usage_records_lost_total",
		"tollgate_usage_recorder_backpressure_waits_total",
	} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n == 0 {
			t.Errorf("%s: %d series, err %v", name, n, err)
		}
	}
}

// panickyStore panics, as a store choking on bytes might, on every write
// holding a record with CallID "poison", and on every write holding a
// record with Input "boom"; it keeps the other writes.
type panickyStore struct{ memStore }

func (s *panickyStore) InsertRecords(ctx context.Context, recs []Record) error {
	for _, r := range recs {
		if r.CallID == "poison" || string(r.Input) == "boom" {
			panic("store cannot take " + r.CallID)
		}
	}
	return s.memStore.InsertRecords(ctx, recs)
}

func (s *panickyStore) byID() map[string]Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]Record, len(s.recs))
	for _, r := range s.recs {
		m[r.CallID] = r
	}
	return m
}

func TestRecorderStoresImpossibleCountsAsErrors(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Record)
		wantErr string
	}{
		{"negative prompt", func(r *Record) { r.PromptTokens = -5 }, "invalid usage reported: prompt_tokens=-5"},
		{"negative completion", func(r *Record) { r.CompletionTokens = -1 }, "invalid usage reported: completion_tokens=-1"},
		{"huge total", func(r *Record) { r.TotalTokens = 1 << 62 }, "invalid usage reported: total_tokens=4611686018427387904"},
		{"negative cached keeps the earlier error", func(r *Record) { r.CachedTokens = -7; r.Error = "upstream 502" },
			"upstream 502; invalid usage reported: cached_tokens=-7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &memStore{}
			core, logs := observer.New(zapcore.WarnLevel)
			reg := prometheus.NewRegistry()
			r := newRecorder(st, RecorderOptions{BatchSize: 8}, zap.New(core), reg, testBackoff)
			bad := rec(1)
			tt.mutate(&bad)
			r.Record(rec(0))
			r.Record(bad)
			r.Record(rec(2))
			if err := r.Close(context.Background()); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if got, want := st.callIDs(), wantIDs(3); !equalStrings(got, want) {
				t.Fatalf("stored %v, want %v", got, want)
			}
			st.mu.Lock()
			good, got := st.recs[0], st.recs[1]
			st.mu.Unlock()
			if good.PromptTokens != 10 || good.Error != "" {
				t.Errorf("valid record changed: %+v", good)
			}
			if got.Error != tt.wantErr {
				t.Errorf("Error = %q, want %q", got.Error, tt.wantErr)
			}
			if got.PromptTokens != 0 || got.CompletionTokens != 0 || got.TotalTokens != 0 || got.CachedTokens != 0 {
				t.Errorf("tokens = %d/%d/%d/%d, want all zero", got.PromptTokens, got.CompletionTokens, got.TotalTokens, got.CachedTokens)
			}
			if n := testutil.ToFloat64(r.metrics.invalid); n != 1 {
				t.Errorf("invalid records counted %v, want 1", n)
			}
			// The token counters hold the two valid records only (with no
			// label policy, under "other").
			if n := testutil.ToFloat64(r.metrics.promptTokens.WithLabelValues(OtherLabel, OtherLabel, OtherLabel)); n != 20 {
				t.Errorf("prompt tokens counter = %v, want 20", n)
			}
			if logs.FilterMessageSnippet("impossible token count").FilterField(zap.String("call_id", bad.CallID)).Len() != 1 {
				t.Errorf("no warning names the record: %v", logs.All())
			}
		})
	}
}

func TestRecorderSurvivesAStoreThatPanics(t *testing.T) {
	st := &panickyStore{}
	core, logs := observer.New(zapcore.ErrorLevel)
	reg := prometheus.NewRegistry()
	r := newRecorder(st, RecorderOptions{BatchSize: 16, FlushInterval: time.Hour}, zap.New(core), reg, testBackoff)
	var want []string
	for i := range 10 {
		rc := rec(i)
		switch i {
		case 3:
			rc.CallID = "poison"
		case 6:
			rc.Input = []byte("boom")
		default:
			want = append(want, rc.CallID)
		}
		r.Record(rc)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got := st.byID()
	for _, id := range want {
		if g, ok := got[id]; !ok || g.PromptTokens != 10 || g.Error != "" {
			t.Errorf("record %s: stored %v as %+v, want it whole", id, ok, g)
		}
	}
	// The record the store choked on because of its payload is kept,
	// stripped to its accounting, as an error.
	stripped, ok := got[rec(6).CallID]
	if !ok {
		t.Fatalf("record %s not stored", rec(6).CallID)
	}
	if stripped.Input != nil || stripped.PromptTokens != 0 || !strings.Contains(stripped.Error, "store panicked") {
		t.Errorf("stripped record = %+v, want no payload, zero tokens and the panic in Error", stripped)
	}
	// The one it cannot take at all is set aside whole, and said so once.
	if _, ok := got["poison"]; ok {
		t.Errorf("the poison record was stored")
	}
	st.mu.Lock()
	aside := st.aside
	st.mu.Unlock()
	if len(aside) != 1 || aside[0].CallID != "poison" || aside[0].PromptTokens != 10 {
		t.Errorf("set aside %+v, want the poison record whole", aside)
	}
	if n := testutil.ToFloat64(r.metrics.lost); n != 0 {
		t.Errorf("lost = %v, want 0", n)
	}
	if n := testutil.ToFloat64(r.metrics.refused); n != 1 {
		t.Errorf("refused = %v, want 1", n)
	}
	if logs.FilterMessageSnippet("set aside").FilterField(zap.String("call_id", "poison")).Len() != 1 {
		t.Errorf("the record set aside is not logged once: %v", logs.All())
	}
	if n := testutil.ToFloat64(r.metrics.panics); n < 3 {
		t.Errorf("panics counted %v, want at least 3 (the batch, then each bad record)", n)
	}
	if n := int(testutil.ToFloat64(r.metrics.written)); n != len(want)+1 {
		t.Errorf("written counter = %d, want %d", n, len(want)+1)
	}
}
