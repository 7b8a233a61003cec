package accounting

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// refusingStore refuses, as PostgreSQL refuses a text too long for an
// index or holding a NUL, every batch that holds a record whose
// CompletionID starts with "bad"; its first connectionFailures writes and
// first asideFailures set-asides fail as a lost connection does.
type refusingStore struct {
	memStore
	connectionFailures int
	asideFailures      int
}

func (s *refusingStore) InsertRecords(ctx context.Context, recs []Record) error {
	s.mu.Lock()
	if s.connectionFailures > 0 {
		s.connectionFailures--
		s.mu.Unlock()
		return errors.New("connection reset by peer")
	}
	s.mu.Unlock()
	for _, r := range recs {
		if strings.HasPrefix(r.CompletionID, "bad") {
			return fmt.Errorf("insert records: index row too large: %w", ErrRecordRefused)
		}
	}
	return s.memStore.InsertRecords(ctx, recs)
}

func (s *refusingStore) SetAside(ctx context.Context, rec Record, reason string) error {
	s.mu.Lock()
	if s.asideFailures > 0 {
		s.asideFailures--
		s.mu.Unlock()
		return errors.New("connection refused")
	}
	s.mu.Unlock()
	return s.memStore.SetAside(ctx, rec, reason)
}

// TestRecorderSetsAsideRefusedRecords: a batch the store refuses because
// of two of its records is written one record at a time; the others land,
// the two are set aside whole (each counted and logged once), and Close
// loses nothing. Failures to reach the store are retried as before, the
// batch whole, and so is setting a record aside.
func TestRecorderSetsAsideRefusedRecords(t *testing.T) {
	st := &refusingStore{connectionFailures: 2, asideFailures: 1}
	core, logs := observer.New(zapcore.ErrorLevel)
	r := newRecorder(st, RecorderOptions{BatchSize: 16, FlushInterval: time.Hour}, zap.New(core), prometheus.NewRegistry(), testBackoff)
	var want []string
	for i := range 10 {
		rc := rec(i)
		if i == 2 || i == 7 {
			rc.CompletionID = fmt.Sprintf("bad-%d", i)
			rc.Team = "mallory"
		} else {
			want = append(want, rc.CallID)
		}
		r.Record(rc)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := st.callIDs(); !equalStrings(got, want) {
		t.Errorf("stored %v, want %v", got, want)
	}
	st.mu.Lock()
	aside, reasons, batches := st.aside, st.reasons, st.batches
	st.mu.Unlock()
	if len(aside) != 2 || aside[0].CompletionID != "bad-2" || aside[1].CompletionID != "bad-7" || aside[0].PromptTokens != 10 {
		t.Fatalf("set aside %+v, want the two bad records whole", aside)
	}
	for _, why := range reasons {
		if !strings.Contains(why, "index row too large") {
			t.Errorf("reason %q does not say why the store refused it", why)
		}
	}
	// After the two connection failures the batch was tried whole, then
	// split: every record alone.
	for _, n := range batches {
		if n != 1 {
			t.Errorf("batches written %v, want the refused batch split to single records", batches)
			break
		}
	}
	for name, c := range map[string]prometheus.Counter{"refused": r.metrics.refused, "lost": r.metrics.lost, "written": r.metrics.written} {
		want := map[string]float64{"refused": 2, "lost": 0, "written": 8}[name]
		if n := testutil.ToFloat64(c); n != want {
			t.Errorf("%s = %v, want %v", name, n, want)
		}
	}
	for _, id := range []string{rec(2).CallID, rec(7).CallID} {
		if n := logs.FilterMessage("usage record refused by the store; set aside").FilterField(zap.String("call_id", id)).Len(); n != 1 {
			t.Errorf("record %s: %d refusal lines, want 1", id, n)
		}
	}
	if n := logs.FilterMessage("set aside a refused usage record failed; retrying").Len(); n != 1 {
		t.Errorf("%d retried set-asides logged, want 1", n)
	}
	if n := logs.FilterMessage("write usage records failed; retrying").Len(); n != 2 {
		t.Errorf("%d retried connection failures logged, want 2", n)
	}
}
