package main

import (
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		out := make([]time.Duration, len(n))
		for i, v := range n {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one sample", ms(7), 99, 7 * time.Millisecond},
		{"median of odd count", ms(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		// Nearest rank: the 2nd of 4 has 50% of the samples at or below it.
		{"median of even count", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p90 of ten", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 90, 9 * time.Millisecond},
		{"p99 of ten is the max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{"p100 is the max", ms(1, 2, 3), 100, 3 * time.Millisecond},
		{"tiny p is the min", ms(1, 2, 3), 0.001, time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}
}

func TestPercentileOfHundred(t *testing.T) {
	s := make([]time.Duration, 100)
	for i := range s {
		s[i] = time.Duration(i+1) * time.Microsecond
	}
	for _, p := range []float64{1, 50, 90, 99, 100} {
		if got, want := percentile(s, p), time.Duration(p)*time.Microsecond; got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
}

func TestSummarizeLeavesInputUnsorted(t *testing.T) {
	in := []time.Duration{3, 1, 2}
	q := summarize(in)
	if q.P50 != 2 || q.P99 != 3 || q.N != 3 {
		t.Errorf("summarize = %+v, want P50 2, P99 3, N 3", q)
	}
	if in[0] != 3 || in[1] != 1 || in[2] != 2 {
		t.Errorf("summarize reordered its input: %v", in)
	}
}

func TestTargetMet(t *testing.T) {
	if !atMost(25).met(25) || atMost(25).met(25.1) {
		t.Error("atMost(25) must accept 25 and refuse 25.1")
	}
	if !atLeast(0.6).met(0.6) || atLeast(0.6).met(0.59) {
		t.Error("atLeast(0.6) must accept 0.6 and refuse 0.59")
	}
}

func TestReportStatus(t *testing.T) {
	var r report
	r.add(row{Metric: "a", Value: 10, Target: atMost(25)})
	r.add(row{Metric: "b", Value: 30, Target: atMost(25)})
	r.add(row{Metric: "c", Value: 30})
	want := []string{"PASS", "MISS", ""}
	for i, w := range want {
		if r.Rows[i].Status != w {
			t.Errorf("row %s status %q, want %q", r.Rows[i].Metric, r.Rows[i].Status, w)
		}
	}
}

func TestFormatValue(t *testing.T) {
	tests := []struct {
		v      float64
		unit   string
		signed bool
		want   string
	}{
		{41.25, unitMicros, true, "+41.2µs"},
		{-3, unitMicros, true, "-3.0µs"},
		{1500, unitMicros, false, "1.500ms"},
		{2_500_000, unitMicros, false, "2.50s"},
		{0.254, unitRatio, false, "25.4%"},
		{16, unitKiB, false, "16.0 KiB"},
	}
	for _, tt := range tests {
		if got := formatValue(tt.v, tt.unit, tt.signed); got != tt.want {
			t.Errorf("formatValue(%v, %q, %v) = %q, want %q", tt.v, tt.unit, tt.signed, got, tt.want)
		}
	}
}

func TestWriteJSON(t *testing.T) {
	r := report{Date: "2026-01-01T00:00:00Z"}
	r.add(row{Section: "s", Metric: "m", Unit: unitMicros, Value: 10, Target: atMost(25)})
	path := t.TempDir() + "/r.json"
	if err := r.writeJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Rows) != 1 || back.Rows[0].Status != "PASS" || back.Rows[0].Target.Op != "<=" {
		t.Errorf("round trip = %+v", back.Rows)
	}
	if !strings.Contains(string(b), `"op": "<="`) {
		t.Errorf("targets are escaped in the JSON:\n%s", b)
	}
}

// TestWriteTableHeaderNamesWhatRan checks that the table's header
// describes the parts that ran, and no other (-only).
func TestWriteTableHeaderNamesWhatRan(t *testing.T) {
	base := settings{Phase: "5s", Rounds: 2, Rates: []int{1000, 2000}, OpenLoopConns: 256, Conns: 64,
		StreamConc: 16, StreamTokens: 64, StreamITL: "5ms", OpenStreams: []int{1000}, SlowITL: "1s", GatewayLog: "info"}
	const (
		open    = "open loop rates [1000 2000] on up to 256 conns"
		closed  = "closed loop 64 conns"
		streams = "streams: 16 concurrent"
	)
	tests := []struct {
		only          string
		want, wantNot []string
	}{
		{"", []string{open, closed, streams}, nil},
		{"open", []string{"phases: 5s each, 2 rounds", open}, []string{closed, streams}},
		{"streams", []string{"phases: 5s each, 2 rounds", streams}, []string{open, closed}},
		{"soak", nil, []string{"phases:", open, closed, streams}},
	}
	for _, tt := range tests {
		t.Run("only="+tt.only, func(t *testing.T) {
			s := base
			s.Only = tt.only
			r := report{Date: "2026-01-01T00:00:00Z", Settings: s}
			var b strings.Builder
			if err := r.writeTable(&b); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("header lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(b.String(), w) {
					t.Errorf("header names %q, which did not run:\n%s", w, b.String())
				}
			}
		})
	}
}

// TestCompareIsARatioToTheBareProxy checks the rows that judge the
// gateway: what it adds over direct, divided by what the bare proxy adds.
func TestCompareIsARatioToTheBareProxy(t *testing.T) {
	us := time.Microsecond
	tests := []struct {
		name       string
		d          [numSides]time.Duration
		wantValue  float64
		wantStatus string
		wantNote   string
	}{
		{"at the goal", [numSides]time.Duration{100 * us, 150 * us, 160 * us}, 1.2, "PASS", "added: bare proxy +50.0µs, gateway +60.0µs"},
		{"over the goal", [numSides]time.Duration{100 * us, 150 * us, 200 * us}, 2, "MISS", "gateway +100.0µs"},
		{"bare proxy adds nothing", [numSides]time.Duration{100 * us, 90 * us, 120 * us}, 0, "", "no ratio"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &bench{rep: &report{}}
			b.compare("s", "latency p50", tt.d, atMost(1.2), "")
			rw := b.rep.Rows[0]
			if math.Abs(rw.Value-tt.wantValue) > 1e-9 || rw.Status != tt.wantStatus || !strings.Contains(rw.Note, tt.wantNote) {
				t.Errorf("row = value %v status %q note %q; want %v %q containing %q", rw.Value, rw.Status, rw.Note,
					tt.wantValue, tt.wantStatus, tt.wantNote)
			}
			if *rw.Direct != micros(tt.d[direct]) || *rw.Bare != micros(tt.d[bare]) || *rw.Gateway != micros(tt.d[gateway]) {
				t.Errorf("sides = %v %v %v", *rw.Direct, *rw.Bare, *rw.Gateway)
			}
		})
	}
}

func TestKiBPerStream(t *testing.T) {
	tests := []struct {
		name          string
		before, after uint64
		held          int
		want          float64
	}{
		{"growth spread over the streams", 10 << 20, 20 << 20, 1024, 10},
		{"nothing held", 10 << 20, 20 << 20, 0, 0},
		{"shrank", 20 << 20, 10 << 20, 1024, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := kibPerStream(tt.before, tt.after, tt.held); got != tt.want {
				t.Errorf("kibPerStream(%d, %d, %d) = %v, want %v", tt.before, tt.after, tt.held, got, tt.want)
			}
		})
	}
}

// TestOpenStreamsRows checks that an open-streams section shows the bare
// proxy and the gateway side by side, judges only the gateway's figure
// against the absolute goal, and notes the difference, the anonymous
// memory per stream and how far the file-backed pages moved.
func TestOpenStreamsRows(t *testing.T) {
	mem := func(anonMiB, fileMiB uint64) memInfo {
		return memInfo{RSS: (anonMiB + fileMiB) << 20, HWM: (anonMiB + fileMiB) << 20, Anon: anonMiB << 20, File: fileMiB << 20}
	}
	// 1,024 streams: the bare proxy grows by 8 MiB of anonymous memory
	// (8 KiB a stream), the gateway by 12 MiB anonymous and 1 MiB file
	// (13 KiB a stream, 12 anonymous).
	bp := openStreamsResult{N: 1024, Open: 1024, OpenTime: 2 * time.Second, Baseline: mem(3, 10), Loaded: mem(11, 10)}
	gw := openStreamsResult{N: 1024, Open: 1024, OpenTime: 3 * time.Second, Baseline: mem(15, 20), Loaded: mem(27, 21)}

	tests := []struct {
		name       string
		bp, gw     openStreamsResult
		wantBare   float64
		wantGW     float64
		wantStatus string
		wantNote   []string
		wantErrors float64
		wantErrTxt string
	}{
		{"both held every stream", bp, gw, 8, 13, "PASS", []string{"gateway − bare +5.0 KiB", "anon only: bare 8.0, gateway 12.0 KiB/stream",
			"bare 13.0 → 21.0 MiB, gateway 35.0 → 48.0 MiB", "file-backed moved: bare +0.0, gateway +1.0 MiB"}, 0, ""},
		{"the gateway over the goal", bp, func() openStreamsResult { r := gw; r.Loaded = mem(35, 21); return r }(), 8, 21, "MISS",
			[]string{"gateway − bare +13.0 KiB"}, 0, ""},
		{"the bare proxy held fewer", func() openStreamsResult {
			r := bp
			r.Open, r.Errors, r.ErrorSample = 512, 512, []string{"512× open: dial tcp: too many open files"}
			return r
		}(), gw, 16, 13, "PASS", []string{"bare 13.0 → 21.0 MiB (divided by the 512 held, not 1024)"}, 512, "bare: 512× open"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows := openStreamsRows(1024, tt.bp, tt.gw)
			if len(rows) != 3 {
				t.Fatalf("got %d rows, want 3", len(rows))
			}
			var r report
			for _, rw := range rows {
				if rw.Section != "1024 open streams" || rw.Direct != nil || rw.Bare == nil || rw.Gateway == nil {
					t.Errorf("row %q: section %q, sides direct %v bare %v gateway %v; want bare and gateway only",
						rw.Metric, rw.Section, rw.Direct, rw.Bare, rw.Gateway)
				}
				r.add(rw)
			}
			perStream := r.Rows[0]
			if *perStream.Bare != tt.wantBare || *perStream.Gateway != tt.wantGW || perStream.Value != tt.wantGW || perStream.Status != tt.wantStatus ||
				perStream.Target.Limit != targetKiBPerStream {
				t.Errorf("memory row = bare %v gateway %v value %v status %q target %+v; want %v, %v, %v, %q, ≤ %v",
					*perStream.Bare, *perStream.Gateway, perStream.Value, perStream.Status, perStream.Target, tt.wantBare, tt.wantGW, tt.wantGW, tt.wantStatus,
					targetKiBPerStream)
			}
			for _, w := range tt.wantNote {
				if !strings.Contains(perStream.Note, w) {
					t.Errorf("memory note %q lacks %q", perStream.Note, w)
				}
			}
			failed := r.Rows[1]
			if failed.Value != tt.wantErrors || !strings.Contains(failed.Note, tt.wantErrTxt) {
				t.Errorf("failed row = value %v note %q; want %v containing %q", failed.Value, failed.Note, tt.wantErrors, tt.wantErrTxt)
			}
			if open := r.Rows[2]; *open.Bare != 2e6 || *open.Gateway != 3e6 || open.Value != 3e6 {
				t.Errorf("open time row = bare %v gateway %v value %v; want 2s, 3s, 3s", *open.Bare, *open.Gateway, open.Value)
			}
		})
	}
}

func TestMemoryRowOf(t *testing.T) {
	bp := memInfo{RSS: 14 << 20, HWM: 16 << 20, Anon: 3 << 20, File: 11 << 20}
	gw := memInfo{RSS: 36 << 20, HWM: 40 << 20, Anon: 16 << 20, File: 20 << 20}
	var r report
	r.add(memoryRowOf("after load", bp, gw))
	rw := r.Rows[0]
	if rw.Metric != "RSS after load" || *rw.Bare != 14 || *rw.Gateway != 36 || rw.Value != 36 || rw.Status != "MISS" {
		t.Errorf("row = %q bare %v gateway %v value %v status %q; want 14, 36, 36 MISS", rw.Metric, *rw.Bare, *rw.Gateway, rw.Value, rw.Status)
	}
	if want := "anon 16.0 / file 20.0 MiB; bare proxy anon 3.0 / file 11.0 MiB; peak (VmHWM): gateway 40.0 MiB, bare proxy 16.0 MiB"; rw.Note != want {
		t.Errorf("note = %q, want %q", rw.Note, want)
	}
}

// TestOpenLoopRowsGoals checks that an open loop's rows are judged by the
// issue's goals only when they are the gateway's: the floor's open loops,
// whose GATEWAY column is the bare proxy that stores, report ratios with
// no goal, and their latency and CPU rows say what the columns are.
func TestOpenLoopRowsGoals(t *testing.T) {
	us := time.Microsecond
	var res [numSides]loadResult
	for side, added := range [numSides]time.Duration{0, 50 * us, 70 * us} {
		lat := make([]time.Duration, 100)
		for i := range lat {
			lat[i] = 100*us + added + time.Duration(i)*us
		}
		res[side] = loadResult{Latencies: lat, Lags: make([]time.Duration, 100), OK: 100, Elapsed: time.Second}
	}
	var cpu [numSides]cpuDelta
	for side := range cpu {
		cpu[side] = cpuDelta{front: time.Duration(side) * 10 * time.Millisecond, wall: time.Second}
	}
	const note = "BARE is a plain bare proxy, GATEWAY the one that stores"
	tests := []struct {
		name      string
		rep       loopReport
		wantGoals []string // metrics that carry a goal, besides failed requests
	}{
		{"gateway", loopReport{section: "open loop 2000/s", goals: true},
			[]string{"latency p50 (from scheduled send), added over bare", "latency p99, added over bare", "CPU/request, gateway / bare proxy"}},
		{"floor", loopReport{section: "floor: open loop 2000/s", note: note}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &bench{rep: &report{}}
			b.openLoopRows(tt.rep, targetRateForP99, res, cpu)
			var goals []string
			for _, rw := range b.rep.Rows {
				if rw.Section != tt.rep.section {
					t.Errorf("row %q in section %q, want %q", rw.Metric, rw.Section, tt.rep.section)
				}
				if rw.Target != nil && rw.Metric != "failed requests" {
					goals = append(goals, rw.Metric)
				}
				if (strings.Contains(rw.Metric, "added over bare") || strings.HasPrefix(rw.Metric, "CPU/request, gateway")) &&
					tt.rep.note != "" && !strings.Contains(rw.Note, tt.rep.note) {
					t.Errorf("row %q note %q lacks %q", rw.Metric, rw.Note, tt.rep.note)
				}
			}
			if !slices.Equal(goals, tt.wantGoals) {
				t.Errorf("rows with a goal = %q, want %q", goals, tt.wantGoals)
			}
		})
	}
}
