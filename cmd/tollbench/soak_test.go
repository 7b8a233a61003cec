package main

import (
	"io"
	"maps"
	"strings"
	"testing"
	"time"
)

func TestSoakMix(t *testing.T) {
	tests := []struct {
		stream, abandon float64
		n               int
		want            [numSoakKinds]int
	}{
		{0.25, 0.1, 1000, [numSoakKinds]int{750, 225, 25}},
		{0.25, 0, 1000, [numSoakKinds]int{750, 250, 0}},
		{0.25, 1, 1000, [numSoakKinds]int{750, 0, 250}},
		{0, 0.1, 1000, [numSoakKinds]int{1000, 0, 0}},
		{1, 0.5, 10, [numSoakKinds]int{0, 5, 5}},
		{0.1, 0.1, 100_000, [numSoakKinds]int{90_000, 9_000, 1_000}},
	}
	for _, tt := range tests {
		m := newSoakMix(tt.stream, tt.abandon)
		var got [numSoakKinds]int
		for i := range tt.n {
			got[m.kind(i)]++
		}
		if got != tt.want {
			t.Errorf("mix %v/%v over %d: plain, streams, abandoned = %v, want %v", tt.stream, tt.abandon, tt.n, got, tt.want)
		}
	}
	// The mix is spread, not bunched: every 4th request is a stream.
	m := newSoakMix(0.25, 0.1)
	for i := range 40 {
		if isStream := m.kind(i) != soakPlain; isStream != (i%4 == 3) {
			t.Errorf("request %d: kind %s", i, soakKindNames[m.kind(i)])
		}
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 42
go_goroutines_extra 7
tollgate_backend_requests_in_flight{backend="mock-fast"} 3
tollgate_backend_requests_in_flight{backend="odd } name"} 2
tollgate_queue_depth{model="bench"} 0 1700000000000
tollgate_stream_aborts_total{model="bench-stream",side="client"} 1.5e+03
tollgate_usage_queue_depth 0
`
	got, err := parseMetrics([]byte(text), soakScraped)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"go_goroutines": 42, "tollgate_backend_requests_in_flight": 5, "tollgate_queue_depth": 0,
		"tollgate_stream_aborts_total": 1500, "tollgate_usage_queue_depth": 0,
	}
	if !maps.Equal(got, want) {
		t.Errorf("parseMetrics = %v, want %v", got, want)
	}
	if _, ok := got["tollgate_streams_in_flight"]; ok {
		t.Error("a family absent from the text is in the result")
	}
	for _, bad := range []string{"go_goroutines\n", "go_goroutines x\n", `tollgate_queue_depth{model="a" 1` + "\n"} {
		if _, err := parseMetrics([]byte(bad), soakScraped); err == nil {
			t.Errorf("parseMetrics(%q) succeeded, want an error", bad)
		}
	}
}

func TestAddUsagePage(t *testing.T) {
	got := map[string]int64{"200": 1}
	next, err := addUsagePage(got, []byte(`{"object":"page","data":[
		{"results":[{"status":"200","num_requests":10,"num_model_requests":10},{"status":"499","num_requests":2}]},
		{"results":[]},{"results":[{"status":"200","num_requests":5}]}],"has_more":true,"next_page":"page_x"}`))
	if err != nil || next != "page_x" {
		t.Fatalf("addUsagePage = %q, %v; want page_x", next, err)
	}
	if want := map[string]int64{"200": 16, "499": 2}; !maps.Equal(got, want) {
		t.Errorf("counts = %v, want %v", got, want)
	}
	if _, err := addUsagePage(got, []byte(`{"data":[{"results":[{"num_model_requests":3}]}]}`)); err == nil {
		t.Error("a page without group_by=status was accepted")
	}
}

func TestRSSAllowance(t *testing.T) {
	for _, tt := range []struct{ base, want uint64 }{
		{20 << 20, 4 << 20},   // 10% is 2 MiB: the floor wins
		{40 << 20, 4 << 20},   // 10% is exactly the floor
		{100 << 20, 10 << 20}, // 10% wins
	} {
		if got := rssAllowance(tt.base); got != tt.want {
			t.Errorf("rssAllowance(%d MiB) = %d, want %d", tt.base>>20, got, tt.want)
		}
	}
}

// soakSampleOf is a drained sample with every gauge at 0.
func soakSampleOf(rss uint64, fds int, goroutines float64) soakSample {
	m := map[string]float64{metricGoroutines: goroutines, "tollgate_stream_aborts_total": 0}
	for _, g := range soakGauges {
		m[g] = 0
	}
	return soakSample{RSS: rss, FDs: fds, Goroutines: goroutines, Metrics: m}
}

// soakStatus returns the status of the row whose metric starts with prefix.
func soakStatus(t *testing.T, rows []row, prefix string) row {
	t.Helper()
	for _, r := range rows {
		if strings.HasPrefix(r.Metric, prefix) {
			return r
		}
	}
	t.Fatalf("no row %q in %v", prefix, rows)
	return row{}
}

func TestSoakRows(t *testing.T) {
	good := func() *soakResult {
		r := &soakResult{Duration: 3 * time.Minute, Rate: 1000, Achieved: 1000,
			Baseline: soakSampleOf(30<<20, 20, 15), End: soakSampleOf(33<<20, 30, 25),
			Warmup: soakTally{Sent: [numSoakKinds]int64{75, 23, 2}}, Load: soakTally{Sent: [numSoakKinds]int64{750, 225, 25}},
			UsageRecords: map[string]int64{"200": 1073, "499": 27}}
		r.Samples = []soakSample{r.Baseline, soakSampleOf(50<<20, 300, 400), r.End}
		return r
	}
	tests := []struct {
		name   string
		change func(r *soakResult)
		row    string
		status string
		note   string
	}{
		{"rss within the floor", nil, "RSS", "PASS", "max 50.0 MiB"},
		{"rss over", func(r *soakResult) { r.End.RSS = 35 << 20 }, "RSS", "MISS", "baseline 30.0 MiB"},
		{"goroutines at +10", nil, "goroutines", "PASS", "baseline 15, end 25, max 400"},
		{"goroutines at +11", func(r *soakResult) { r.End.Goroutines = 26 }, "goroutines", "MISS", ""},
		{"fds at +10", nil, "open descriptors", "PASS", "baseline 20, end 30, max 300"},
		{"fds at +11", func(r *soakResult) { r.End.FDs = 31 }, "open descriptors", "MISS", ""},
		{"streams drained", nil, "tollgate_streams_in_flight", "PASS", ""},
		{"a stream left in flight", func(r *soakResult) { r.End.Metrics["tollgate_streams_in_flight"] = 1 }, "tollgate_streams_in_flight", "MISS", ""},
		{"a usage record queued", func(r *soakResult) { r.End.Metrics["tollgate_usage_queue_depth"] = 3 }, "tollgate_usage_queue_depth", "MISS", ""},
		{"gauge not exposed", func(r *soakResult) { delete(r.End.Metrics, "tollgate_queue_depth") }, "tollgate_queue_depth", "MISS", "not exposed"},
		{"no failures", nil, "failed requests", "PASS", "abandoned 0 of 27"},
		{"an abandoned stream failed", func(r *soakResult) { r.Load.Failed[soakAbandon] = 1; r.Load.FirstError = "abandoned: status 502" },
			"failed requests", "MISS", "first: abandoned: status 502"},
		{"abandoned counted apart", nil, "streams abandoned", "", ""},
		{"usage exact", nil, "usage records", "PASS", "1100 records (200: 1073, 499: 27) for 1100 requests"},
		{"usage short by one", func(r *soakResult) { r.UsageRecords["499"] = 26 }, "usage records", "MISS", "1099 records"},
		{"usage unreadable", func(r *soakResult) { r.UsageError = "status 401" }, "usage records", "MISS", "status 401"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := good()
			if tt.change != nil {
				tt.change(r)
			}
			rep := &report{}
			for _, rw := range soakRows(r) {
				rep.add(rw)
			}
			got := soakStatus(t, rep.Rows, tt.row)
			if got.Status != tt.status || !strings.Contains(got.Note, tt.note) {
				t.Errorf("row %q: status %q note %q; want %q with %q", got.Metric, got.Status, got.Note, tt.status, tt.note)
			}
		})
	}
	rep := &report{}
	for _, rw := range soakRows(good()) {
		rep.add(rw)
	}
	if got := soakStatus(t, rep.Rows, "streams abandoned"); got.Value != 27 {
		t.Errorf("abandoned = %v, want 27", got.Value)
	}
}

func TestParseOptionsSoak(t *testing.T) {
	o, err := parseOptions([]string{"-only", "soak", "-soak", "3m", "-soak-warmup", "30s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.only != "soak" || o.soak != 3*time.Minute || o.soakWarmup != 30*time.Second || o.soakRate != 1000 ||
		o.soakStreamShare != 0.25 || o.soakAbandon != 0.1 {
		t.Errorf("options = %+v", o)
	}
	if o, err := parseOptions([]string{"-only", "streams"}, io.Discard); err != nil || o.only != "streams" {
		t.Errorf("-only streams: %+v, %v", o, err)
	}
	if o, err := parseOptions([]string{"-only", "open", "-rates", "2000"}, io.Discard); err != nil || o.only != "open" || len(o.rates) != 1 || o.rates[0] != 2000 {
		t.Errorf("-only open -rates 2000: %+v, %v", o, err)
	}
	for _, args := range [][]string{{"-only", "soak"}, {"-only", "ratios"}, {"-only", "open", "-rates="}, {"-soak", "-1s"}, {"-soak", "1m", "-soak-abandon", "1.5"},
		{"-soak", "1m", "-soak-rate", "0"}, {"-soak", "1m", "-soak-stream-share", "NaN"}} {
		if _, err := parseOptions(args, io.Discard); err == nil {
			t.Errorf("parseOptions(%q) succeeded, want an error", args)
		}
	}
}
