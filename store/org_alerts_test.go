package store_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/org"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// TestSpendAlertsFireOncePerMonthAndThreshold creates two alerts on a
// project, one with a webhook, spends past one threshold, and checks: it
// fires once however often it is checked (a log line, the metric, one
// webhook POST), the other not until its threshold is reached; a new
// month fires again; a raised threshold fires again in the same month.
func TestSpendAlertsFireOncePerMonthAndThreshold(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		svc := org.NewService(d)
		p, err := svc.CreateProject(ctx, "admin", []byte(`{"name":"alerts"}`))
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var posts []org.AlertPayload
		hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var pl org.AlertPayload
			b, _ := io.ReadAll(r.Body)
			if err := json.Unmarshal(b, &pl); err != nil || r.Method != http.MethodPost {
				t.Errorf("webhook got %s %s", r.Method, b)
			}
			mu.Lock()
			posts = append(posts, pl)
			mu.Unlock()
		}))
		defer hook.Close()
		low, err := svc.CreateSpendAlert(ctx, "admin", p.ID, []byte(`{"threshold_amount":10,"currency":"USD","interval":"month",
			"notification_channel":{"type":"email","recipients":["fin@example.com"]},"webhook_url":"`+hook.URL+`/hook?token=x"}`))
		if err != nil {
			t.Fatal(err)
		}
		high, err := svc.CreateSpendAlert(ctx, "admin", p.ID, []byte(`{"threshold_amount":1000,"currency":"USD","interval":"month",
			"notification_channel":{"type":"email","recipients":[]}}`))
		if err != nil {
			t.Fatal(err)
		}
		// $1 per million prompt tokens: 150,000 tokens are 15 cents.
		if err := d.RecordPrices(ctx, map[string]config.Pricing{"m": {PromptPerMTok: 1}}, time.Unix(0, 0)); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		if err := d.InsertRecords(ctx, []accounting.Record{usageRec("a1", p.ID, "default", "m", "k", now.Add(-time.Second), 150_000, 0, 0)}); err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		var logged lockedLog
		a, err := org.NewAlerter(org.AlerterOptions{Store: d, Usage: d, Metrics: reg, Log: testLogger(&logged),
			Pricing: func() map[string]config.Pricing { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); a.Run(runCtx) }()
		for range 3 {
			if err := a.Check(ctx, now); err != nil {
				t.Fatal(err)
			}
		}
		fired := func() float64 { return firedCount(t, reg, p.ID) }
		if fired() != 1 {
			t.Fatalf("fired %v times after 3 checks, want 1", fired())
		}
		waitUntil(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(posts) == 1 })
		mu.Lock()
		got := posts[0]
		mu.Unlock()
		if got.AlertID != low.ID || got.ProjectID != p.ID || got.ThresholdAmount != 10 || got.Spend.Value < 0.15-1e-9 ||
			got.Spend.Value > 0.15+1e-9 || got.Spend.Currency != "usd" || len(got.Recipients) != 1 || got.Object != "project.spend_alert.fired" {
			t.Errorf("webhook payload %+v", got)
		}
		if !strings.Contains(logged.String(), "spend alert fired") || !strings.Contains(logged.String(), low.ID) || strings.Contains(logged.String(), high.ID) {
			t.Errorf("log: %s", logged.String())
		}

		// Next month, the same spend is last month's: nothing fires.
		// Spending again there fires again.
		next := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 5, 0, time.UTC)
		if err := a.Check(ctx, next); err != nil {
			t.Fatal(err)
		}
		if fired() != 1 {
			t.Fatalf("fired %v times in a month without spend", fired())
		}
		// A raised threshold, reached, fires again this month.
		if _, err := svc.UpdateSpendAlert(ctx, "admin", p.ID, low.ID, []byte(`{"threshold_amount":12,"currency":"USD","interval":"month",
			"notification_channel":{"type":"email","recipients":["fin@example.com"]}}`)); err != nil {
			t.Fatal(err)
		}
		if err := a.Check(ctx, now); err != nil {
			t.Fatal(err)
		}
		if fired() != 2 {
			t.Fatalf("fired %v times after the threshold changed, want 2", fired())
		}
		stop()
		<-done
	})
}

// TestSpendAlertWebhookFailureBlocksNothing points an alert at a webhook
// that never answers in time and one that fails: checks still return at
// once, Run stops at once, and each failure is logged.
func TestSpendAlertWebhookFailureBlocksNothing(t *testing.T) {
	d := storetest.OpenOne(t)
	ctx := context.Background()
	svc := org.NewService(d)
	p, err := svc.CreateProject(ctx, "admin", []byte(`{"name":"slow"}`))
	if err != nil {
		t.Fatal(err)
	}
	var calls sync.Map // path → *atomic.Int64
	release := make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := calls.LoadOrStore(r.URL.Path, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if r.URL.Path == "/hang" {
			<-release
		}
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer hook.Close()
	defer close(release)
	for i, path := range []string{"/hang", "/fail"} {
		if _, err := svc.CreateSpendAlert(ctx, "admin", p.ID, []byte(`{"threshold_amount":`+string(rune('1'+i))+`,"currency":"USD","interval":"month",
			"notification_channel":{"type":"email","recipients":[]},"webhook_url":"`+hook.URL+path+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.InsertRecords(ctx, []accounting.Record{usageRec("s1", p.ID, "default", "m", "k", time.Now().Add(-time.Second), 1_000_000, 0, 0)}); err != nil {
		t.Fatal(err)
	}
	var logged lockedLog
	a, err := org.NewAlerter(org.AlerterOptions{Store: d, Usage: d, Log: testLogger(&logged), RetryWait: time.Millisecond,
		Client:  &http.Client{Timeout: 200 * time.Millisecond},
		Pricing: func() map[string]config.Pricing { return map[string]config.Pricing{"m": {PromptPerMTok: 1}} }})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(runCtx) }()
	began := time.Now()
	if err := a.Check(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("a check with failing webhooks took %v", d)
	}
	waitUntil(t, func() bool { return strings.Count(logged.String(), "spend alert webhook failed") == 2 })
	for _, path := range []string{"/hang", "/fail"} {
		if n, ok := calls.Load(path); !ok || n.(*atomic.Int64).Load() != 3 {
			t.Errorf("%s tried %v times, want 3", path, n)
		}
	}
	stop()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
}

// lockedLog collects a logger's lines for a test, safe to read while the
// alerter's goroutine writes.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) Sync() error { return nil }

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testLogger(w *lockedLog) *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), w, zap.InfoLevel))
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("not within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// firedCount reads tollgate_spend_alerts_fired_total{project} from reg.
func firedCount(t *testing.T, reg *prometheus.Registry, project string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if f.GetName() == "tollgate_spend_alerts_fired_total" && l.GetName() == "project" && l.GetValue() == project {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
