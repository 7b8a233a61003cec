package store_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/store"
)

// TestRecorderKeepsLargeTokenCounts records, through a Recorder as the
// gateway does, counts up to 2^40, the most a backend's usage block may
// report (the proxy serves them), and reads them back exactly from the
// gateway call, the roll-up and the spend: none is made an error with
// zero tokens on the way.
func TestRecorderKeepsLargeTokenCounts(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		recs := []accounting.Record{
			usageRec("c-2p33", "acme", "p33", "m", "k", usageT0, 1<<33, 1<<33-7, 1<<32+1),
			usageRec("c-2p40", "acme", "p40", "m", "k", usageT0, 1<<39, 1<<39, 1<<39),
		}
		rec := accounting.NewRecorder(d, accounting.RecorderOptions{}, zap.NewNop(), nil)
		for _, r := range recs {
			rec.Record(r)
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := rec.Close(cctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		for _, w := range recs {
			t.Run(w.CallID, func(t *testing.T) {
				got := gatewayCallRecord(t, d, w.CallID)
				if got.Error != "" || got.PromptTokens != w.PromptTokens || got.CompletionTokens != w.CompletionTokens ||
					got.TotalTokens != w.TotalTokens || got.CachedTokens != w.CachedTokens {
					t.Errorf("stored error %q, tokens %d/%d/%d/%d; want no error, %d/%d/%d/%d", got.Error,
						got.PromptTokens, got.CompletionTokens, got.TotalTokens, got.CachedTokens,
						w.PromptTokens, w.CompletionTokens, w.TotalTokens, w.CachedTokens)
				}
			})
		}
		sec := usageT0.Unix()
		want := []rollupRow{
			{sec, "acme", "p33", "k", "m", "chat.completions", "complete", 1 << 33, 1<<33 - 7, 1<<32 + 1, 1<<34 - 7, 1<<34 - 7, 1, 1},
			{sec, "acme", "p40", "k", "m", "chat.completions", "complete", 1 << 39, 1 << 39, 1 << 39, 1 << 40, 1 << 40, 1, 1},
		}
		if got := rollupRows(t, d); len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("usage_rollup =\n%+v\nwant\n%+v", got, want)
		}
		spent, err := d.SpentTokens(ctx, usageT0)
		if err != nil {
			t.Fatalf("SpentTokens: %v", err)
		}
		byProject := map[string]int64{}
		for _, s := range spent {
			byProject[s.Subject.Project] = s.Tokens
		}
		if byProject["p33"] != 1<<34-7 || byProject["p40"] != 1<<40 {
			t.Errorf("SpentTokens = %+v; want p33 %d, p40 %d", spent, int64(1<<34-7), int64(1<<40))
		}
	})
}
