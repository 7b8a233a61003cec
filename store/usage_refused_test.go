package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// TestRecorderSetsAsidePoisonedRecords writes, through a Recorder as the
// gateway does, one team's records whose completion ids PostgreSQL cannot
// hold (3 KB, over its index row limit; a NUL), among other teams' records
// of the same batches and after them. Every other record lands, and Close
// (what SIGTERM runs) returns with nothing lost. On PostgreSQL the two are
// set aside in usage_refused, whole, and counted; SQLite holds them.
func TestRecorderSetsAsidePoisonedRecords(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		reg := prometheus.NewRegistry()
		rec := accounting.NewRecorder(d, accounting.RecorderOptions{BatchSize: 4, FlushInterval: time.Hour}, zap.NewNop(), reg)
		long := usageRec("poison-long", "mallory", "p", "m", "k", usageT0, 3, 4, 0)
		long.CompletionID = "chatcmpl-" + incompressible(3000)
		nul := usageRec("poison-nul", "mallory", "p", "m", "k", usageT0, 5, 6, 0)
		nul.CompletionID = "chatcmpl-a\x00b"
		poisoned := []accounting.Record{long, nul}
		var good []accounting.Record
		for i, team := range []string{"acme", "acme", "globex", "acme", "globex", "globex", "acme"} {
			good = append(good, usageRec("good-"+string(rune('a'+i)), team, "p", "m", "k", usageT0, 1, 1, 0))
		}
		// The poisoned records share the first batch with others, and
		// later batches follow.
		rec.Record(good[0])
		rec.Record(long)
		rec.Record(good[1])
		rec.Record(nul)
		for _, g := range good[2:] {
			rec.Record(g)
		}
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := rec.Close(cctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		for _, g := range good {
			if got := gatewayCallRecord(t, d, g.CallID); got.Team != g.Team || got.TotalTokens != 2 {
				t.Errorf("record %s stored as %+v", g.CallID, got)
			}
		}
		spent, err := d.SpentTokens(ctx, usageT0)
		if err != nil {
			t.Fatalf("SpentTokens: %v", err)
		}
		byTeam := map[string]int64{}
		for _, s := range spent {
			byTeam[s.Subject.Team] += s.Tokens
		}
		if byTeam["acme"] != 8 || byTeam["globex"] != 6 {
			t.Errorf("spent %v, want acme 8, globex 6", byTeam)
		}
		if n := counterValue(t, reg, "tollgate_usage_records_lost_total"); n != 0 {
			t.Errorf("%v records lost", n)
		}
		refused := counterValue(t, reg, "tollgate_usage_records_refused_total")
		aside := countRows(t, d, `SELECT COUNT(*) FROM usage_refused`)
		if d.Engine() == storetest.Postgres && (refused != 2 || aside != 2) {
			t.Errorf("refused %v, set aside %d; want both poisoned records", refused, aside)
		}
		if int64(refused) != aside {
			t.Errorf("refused %v, set aside %d; want the same", refused, aside)
		}
		// Each poisoned record is either stored or set aside whole, never
		// both, never neither.
		for _, p := range poisoned {
			stored := countRows(t, d, `SELECT COUNT(*) FROM calls WHERE id = '`+p.CallID+`'`)
			var doc string
			err := d.QueryRow(ctx, `SELECT record FROM usage_refused WHERE record LIKE '%"call_id":"`+p.CallID+`"%'`).Scan(&doc)
			switch {
			case err == nil && stored == 0:
				r := gjson.Parse(doc)
				if r.Get("completion_id").Str != p.CompletionID || r.Get("team").Str != "mallory" ||
					r.Get("prompt_tokens").Int() != p.PromptTokens || r.Get("total_tokens").Int() != p.TotalTokens {
					t.Errorf("record %s set aside as %s", p.CallID, doc)
				}
			case err != nil && stored == 1:
				if d.Engine() == storetest.Postgres {
					t.Errorf("record %s stored on PostgreSQL", p.CallID)
				}
			default:
				t.Errorf("record %s: %d calls stored, set aside: %v", p.CallID, stored, err)
			}
		}
	})
}

// counterValue is the value of the counter name registered on reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// incompressible is n hex digits that do not compress (PostgreSQL
// compresses an index entry before it measures it): a chain of SHA-256
// digests.
func incompressible(n int) string {
	var b strings.Builder
	sum := sha256.Sum256([]byte("seed"))
	for b.Len() < n {
		b.WriteString(hex.EncodeToString(sum[:]))
		sum = sha256.Sum256(sum[:])
	}
	return b.String()[:n]
}
