package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// percentile returns the p-th percentile (0 < p <= 100) of sorted, which
// must be in ascending order, by the nearest-rank method: the smallest
// sample with at least p percent of the samples at or below it. Nearest
// rank never invents a value between two samples, so a p99 is always a
// latency some request really saw. An empty slice gives 0.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// sortedCopy returns the samples sorted, leaving the argument untouched, so
// that pooled samples can be summarised more than once.
func sortedCopy(samples []time.Duration) []time.Duration {
	s := slices.Clone(samples)
	slices.Sort(s)
	return s
}

// quantiles are the percentiles the report shows of a latency
// distribution.
type quantiles struct {
	P50, P90, P99 time.Duration
	N             int
}

func summarize(samples []time.Duration) quantiles {
	s := sortedCopy(samples)
	return quantiles{P50: percentile(s, 50), P90: percentile(s, 90), P99: percentile(s, 99), N: len(s)}
}

// Units of a row's values. Durations are kept in microseconds in the JSON
// so that a reader never has to guess the scale.
const (
	unitMicros = "us"
	unitRatio  = "ratio"
	unitTimes  = "times"
	unitRate   = "req/s"
	unitKiB    = "KiB"
	unitMiB    = "MiB"
	unitCount  = "count"
	unitCores  = "cores"
)

// target is the bound a result is checked against.
type target struct {
	// Op is "<=" or ">=".
	Op    string  `json:"op"`
	Limit float64 `json:"limit"`
}

func atMost(limit float64) *target  { return &target{Op: "<=", Limit: limit} }
func atLeast(limit float64) *target { return &target{Op: ">=", Limit: limit} }

func (t *target) met(v float64) bool {
	if t.Op == ">=" {
		return v >= t.Limit
	}
	return v <= t.Limit
}

// row is one line of the report. Direct, Bare and Gateway are the sides'
// measurements where the metric has sides; Value is the result: the ratio,
// difference or figure that the target is about.
type row struct {
	Section string `json:"section"`
	Metric  string `json:"metric"`
	Unit    string `json:"unit"`
	// SideUnit is the unit of Direct, Bare and Gateway when it is not
	// Unit, as for a throughput ratio computed from rates.
	SideUnit string   `json:"side_unit,omitempty"`
	Direct   *float64 `json:"direct,omitempty"`
	Bare     *float64 `json:"bare,omitempty"`
	Gateway  *float64 `json:"gateway,omitempty"`
	Value    float64  `json:"value"`
	// Signed says the value is a difference, shown with its sign.
	Signed bool    `json:"-"`
	Target *target `json:"target,omitempty"`
	// Status is PASS or MISS for rows with a target, empty otherwise.
	Status string `json:"status,omitempty"`
	// Note explains a value that needs it (errors, samples, a limit hit).
	Note string `json:"note,omitempty"`
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func ptr(v float64) *float64 { return &v }

// machine describes where the run happened, for the report's header.
type machine struct {
	CPU         string `json:"cpu"`
	Cores       int    `json:"cores"`
	MemoryMiB   int64  `json:"memory_mib"`
	Kernel      string `json:"kernel"`
	NoFileLimit uint64 `json:"nofile_limit"`
	GoVersion   string `json:"go_version"`
}

// report is everything a run produced; it is printed as a table and
// written as JSON.
type report struct {
	Date     string   `json:"date"`
	Command  string   `json:"command"`
	Machine  machine  `json:"machine"`
	Settings settings `json:"settings"`
	Rows     []row    `json:"results"`
	// OtherCores is the average CPU, in cores, that programs other than
	// the gateway, the mocks and tollbench used during measured phases.
	OtherCores float64 `json:"other_programs_cores"`
	// StealCores is the average hypervisor steal, in cores: CPU the host
	// gave to other virtual machines. It counts in OtherCores and also in
	// the CPU times of the processes it interrupted.
	StealCores float64  `json:"hypervisor_steal_cores"`
	Notes      []string `json:"notes,omitempty"`
	Elapsed    string   `json:"elapsed"`
	// Soak holds the soak's samples, when it ran.
	Soak *soakResult `json:"soak,omitempty"`
}

// settings are the options of the run, as the JSON reports them.
type settings struct {
	Phase         string `json:"phase"`
	Rounds        int    `json:"rounds"`
	Rates         []int  `json:"rates"`
	OpenLoopConns int    `json:"open_loop_conns"`
	Conns         int    `json:"closed_loop_conns"`
	StreamConc    int    `json:"stream_concurrency"`
	StreamTokens  int    `json:"stream_tokens"`
	StreamITL     string `json:"stream_itl"`
	OpenStreams   []int  `json:"open_streams"`
	SlowITL       string `json:"slow_itl"`
	GatewayLog    string `json:"gateway_log_level"`
	// BareStore is set when the bare proxy recorded every request
	// (-bare-store).
	BareStore bool `json:"bare_store,omitempty"`
	// BareHandOver is set when a floor stream phase set a bare proxy that
	// hands its streams over beside a plain one (-bare-handover).
	BareHandOver bool `json:"bare_handover,omitempty"`
	// Otel is set when the gateway exported its spans to tollbench's
	// collector (-otel); OtelSpans and OtelExports are what it received.
	Otel        bool  `json:"otel,omitempty"`
	OtelSpans   int64 `json:"otel_spans,omitempty"`
	OtelExports int64 `json:"otel_exports,omitempty"`
	// Only names the one part that ran (-only): "soak", "streams" or
	// "open"; empty when every part did.
	Only            string  `json:"only,omitempty"`
	Soak            string  `json:"soak,omitempty"`
	SoakWarmup      string  `json:"soak_warmup,omitempty"`
	SoakRate        int     `json:"soak_rate,omitempty"`
	SoakStreamShare float64 `json:"soak_stream_share,omitempty"`
	SoakAbandon     float64 `json:"soak_abandon,omitempty"`
}

func (r *report) add(rw row) {
	if rw.Target != nil {
		rw.Status = "MISS"
		if rw.Target.met(rw.Value) {
			rw.Status = "PASS"
		}
	}
	r.Rows = append(r.Rows, rw)
}

func (r *report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// writeTable prints the report as aligned text.
func (r *report) writeTable(w io.Writer) error {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "tollbench %s (%s)\n", r.Date, r.Command)
	fmt.Fprintf(&b, "machine: %s, %d cores, %d MiB, kernel %s, %s, open-file limit %d\n",
		m.CPU, m.Cores, m.MemoryMiB, m.Kernel, m.GoVersion, m.NoFileLimit)
	s := r.Settings
	if s.Only != "soak" {
		// Each part that runs, and no other (-only).
		fmt.Fprintf(&b, "phases: %s each, %d rounds of direct/bare/gateway", s.Phase, s.Rounds)
		if s.Only != "streams" {
			fmt.Fprintf(&b, "; open loop rates %v on up to %d conns", s.Rates, s.OpenLoopConns)
		}
		if s.Only == "" {
			fmt.Fprintf(&b, "; closed loop %d conns", s.Conns)
		}
		b.WriteString("\n")
		if s.Only != "open" {
			fmt.Fprintf(&b, "streams: %d concurrent, %d events at %s; open streams %v at %s per event\n",
				s.StreamConc, s.StreamTokens, s.StreamITL, s.OpenStreams, s.SlowITL)
		}
	}
	if s.Soak != "" {
		fmt.Fprintf(&b, "soak: %s after a %s warm-up, %d req/s open loop on up to %d conns, %.0f%% streams of %d events at %s, "+
			"%.0f%% of those abandoned after the first event\n",
			s.Soak, s.SoakWarmup, s.SoakRate, s.OpenLoopConns, 100*s.SoakStreamShare, s.StreamTokens, s.StreamITL, 100*s.SoakAbandon)
	}
	fmt.Fprintf(&b, "gateway log level %s\n", s.GatewayLog)
	if s.BareStore {
		fmt.Fprintf(&b, "bare proxy: cmd/barestore, which records every request through the gateway's usage writer into SQLite (-bare-store); "+
			"the floor sections set it beside a plain bare proxy, as their notes say\n")
	}
	if s.BareHandOver {
		fmt.Fprintf(&b, "floor: streams: a plain bare proxy beside one that writes each stream from a goroutine of its own, "+
			"as the gateway does (bareproxy -handover; -bare-handover)\n")
	}
	if s.Otel {
		fmt.Fprintf(&b, "export: the gateway sent %d spans in %d exports to an OTLP/HTTP collector in tollbench (-otel)\n", s.OtelSpans, s.OtelExports)
	}
	fmt.Fprintln(&b)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SECTION\tMETRIC\tDIRECT\tBARE\tGATEWAY\tRESULT\tTARGET\tSTATUS\tNOTE")
	section := ""
	for _, rw := range r.Rows {
		sec := rw.Section
		if sec == section {
			sec = ""
		} else {
			section = sec
		}
		sideUnit := rw.Unit
		if rw.SideUnit != "" {
			sideUnit = rw.SideUnit
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sec, rw.Metric,
			formatOpt(rw.Direct, sideUnit), formatOpt(rw.Bare, sideUnit), formatOpt(rw.Gateway, sideUnit),
			formatValue(rw.Value, rw.Unit, rw.Signed), formatTarget(rw.Target, rw.Unit, rw.Signed),
			rw.Status, rw.Note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var nb strings.Builder
	for _, n := range r.Notes {
		fmt.Fprintf(&nb, "note: %s\n", n)
	}
	fmt.Fprintf(&nb, "elapsed: %s\n", r.Elapsed)
	_, err := io.WriteString(w, "\n"+nb.String())
	return err
}

func formatOpt(v *float64, unit string) string {
	if v == nil {
		return "-"
	}
	return formatValue(*v, unit, false)
}

// formatValue renders v in its unit; latencies of a millisecond and more
// are shown in milliseconds to keep the columns narrow.
func formatValue(v float64, unit string, signed bool) string {
	sign := ""
	if signed && v >= 0 {
		sign = "+"
	}
	switch unit {
	case unitMicros:
		if math.Abs(v) >= 1e6 {
			return fmt.Sprintf("%s%.2fs", sign, v/1e6)
		}
		if math.Abs(v) >= 1000 {
			return fmt.Sprintf("%s%.3fms", sign, v/1000)
		}
		return fmt.Sprintf("%s%.1fµs", sign, v)
	case unitRatio:
		return fmt.Sprintf("%.1f%%", v*100)
	case unitTimes:
		return fmt.Sprintf("%.2f×", v)
	case unitRate:
		return fmt.Sprintf("%.0f/s", v)
	case unitKiB:
		return fmt.Sprintf("%s%.1f KiB", sign, v)
	case unitMiB:
		return fmt.Sprintf("%.1f MiB", v)
	case unitCount:
		return fmt.Sprintf("%.0f", v)
	case unitCores:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%g", v)
}

func formatTarget(t *target, unit string, signed bool) string {
	if t == nil {
		return "-"
	}
	op := map[string]string{"<=": "≤ ", ">=": "≥ "}[t.Op]
	return op + formatValue(t.Limit, unit, signed)
}

// writeJSON writes the report to path.
func (r *report) writeJSON(path string) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	// Targets read "<=" and ">=", not "\u003c=".
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}
