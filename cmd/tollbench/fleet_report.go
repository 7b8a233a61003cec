package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// The routings -fleet measures in one run, alternated phase by phase on the same script.
const (
	routeGateway = iota // tollgate's default scheduler
	routeRR             // round-robin in the client, straight to the servers
	routeOracle         // each conversation pinned at its first turn to the least-loaded server
	numRoutes
)

var routeNames = [numRoutes]string{"tollgate", "round-robin", "pinned oracle"}

// fleetSample is one request of a fleet phase.
type fleetSample struct {
	ttft   time.Duration
	err    error
	tokens int // completion tokens asked for (max_tokens), served when err is nil
	// late says it ended after its phase: its tokens were served from a backlog, once the
	// load that competed with it had stopped, and do not count as served under that load.
	late bool
	// tail says it was sent within a saturated service time of its phase's end: no routing
	// could answer it within the phase, so its tokens count neither as asked for nor as
	// served, or the light tenants' last requests would count as demand left unserved.
	tail bool
}

// routeResult is what the conversations measured through one routing, pooled over rounds.
type routeResult struct {
	TTFT       []time.Duration `json:"-"`
	Requests   int             `json:"requests"`
	Errors     int             `json:"errors"`
	FirstError string          `json:"first_error,omitempty"`
	// Queries and Hits are the growth of the servers' prefix cache counters, in prompt tokens,
	// over the measured part of each phase.
	Queries float64 `json:"prefix_cache_queries"`
	Hits    float64 `json:"prefix_cache_hits"`
}

func (r *routeResult) add(s fleetSample) {
	r.Requests++
	if s.err != nil {
		r.Errors++
		if r.FirstError == "" {
			r.FirstError = s.err.Error()
		}
		return
	}
	r.TTFT = append(r.TTFT, s.ttft)
}

// hitRate is the share of prompt tokens the servers found cached; 0 without queries.
func (r *routeResult) hitRate() float64 {
	if r.Queries <= 0 {
		return 0
	}
	return r.Hits / r.Queries
}

// fleetRow is one line of the fleet table: the routings' figures where the metric has them, the
// value its goal is about, and the goal.
type fleetRow struct {
	Metric string              `json:"metric"`
	Unit   string              `json:"unit"`
	Routes *[numRoutes]float64 `json:"routes,omitempty"`
	Value  float64             `json:"value"`
	Target *target             `json:"target,omitempty"`
	// Status is PASS or MISS against Target.
	Status string `json:"status,omitempty"`
	Note   string `json:"note,omitempty"`
}

func newFleetRow(metric, unit string, routes *[numRoutes]float64, value float64, t *target, note string) fleetRow {
	r := fleetRow{Metric: metric, Unit: unit, Routes: routes, Value: value, Target: t, Note: note}
	if t != nil {
		r.Status = "MISS"
		if t.met(value) {
			r.Status = "PASS"
		}
	}
	return r
}

// conversationRows are the goals of issue 35 on the conversations: TTFT p50 no worse than the
// oracle's, p90 and p99 no worse than the better of round-robin and the oracle, a prefix cache
// hit rate no lower than the oracle's, and no errors through the gateway.
func conversationRows(res [numRoutes]*routeResult) []fleetRow {
	var q [numRoutes]quantiles
	for i, r := range res {
		q[i] = summarize(r.TTFT)
	}
	ms := func(p int) *[numRoutes]float64 {
		var v [numRoutes]float64
		for i := range q {
			v[i] = float64(pickQ(q[i], p)) / float64(time.Millisecond)
		}
		return &v
	}
	var rows []fleetRow
	for _, p := range []int{50, 90, 99} {
		v := ms(p)
		ref, refName := v[routeOracle], "the oracle's"
		if p != 50 && v[routeRR] < ref {
			ref, refName = v[routeRR], "round-robin's"
		}
		rows = append(rows, newFleetRow(fmt.Sprintf("TTFT p%d", p), unitTimes, v, safeRatio(v[routeGateway], ref),
			atMost(1), fmt.Sprintf("tollgate's over %s (ms: %.1f against %.1f)", refName, v[routeGateway], ref)))
	}
	var hit, errs [numRoutes]float64
	for i, r := range res {
		hit[i], errs[i] = r.hitRate(), float64(r.Errors)
	}
	rows = append(rows, newFleetRow("prefix cache hit rate", unitTimes, &hit, safeRatio(hit[routeGateway], hit[routeOracle]),
		atLeast(1), fmt.Sprintf("tollgate's over the oracle's (%.3f against %.3f)", hit[routeGateway], hit[routeOracle])))
	note := fmt.Sprintf("of %d requests through tollgate", res[routeGateway].Requests)
	if e := res[routeGateway].FirstError; e != "" {
		note += "; first: " + e
	}
	rows = append(rows, newFleetRow("errors", unitCount, &errs, errs[routeGateway], atMost(0), note))
	return rows
}

// pickQ is quantile p (50, 90 or 99) of q.
func pickQ(q quantiles, p int) time.Duration {
	switch p {
	case 50:
		return q.P50
	case 90:
		return q.P90
	}
	return q.P99
}

// tenantLoad is what one tenant (or priority class) of a scenario sent and got.
type tenantLoad struct {
	Name         string          `json:"name"`
	TTFT         []time.Duration `json:"-"`
	Sent, Errors int             `json:"-"`
	// OfferedTokens and ServedTokens are the completion tokens asked for by every request sent
	// early enough to be answered within the phase, and by those answered in full within it.
	OfferedTokens, ServedTokens int `json:"-"`
}

func (t *tenantLoad) add(s fleetSample) {
	t.Sent++
	if !s.tail {
		t.OfferedTokens += s.tokens
	}
	if s.err != nil {
		t.Errors++
		return
	}
	t.TTFT = append(t.TTFT, s.ttft)
	if !s.late && !s.tail {
		t.ServedTokens += s.tokens
	}
}

// fairnessRows are the fairness goals: each well-behaved tenant's TTFT p99 under the flood
// within 1.5× of its p99 alone, and the flooding tenant served no more than its max-min fair
// share of tokens: an equal share, or more only as far as the others did not ask for theirs.
// unloaded and loaded hold the same tenants in the same order; the flooder is the last of
// loaded.
func fairnessRows(unloaded, loaded []*tenantLoad) []fleetRow {
	var rows []fleetRow
	others := loaded[:len(loaded)-1]
	worst, worstName := 0.0, ""
	for i, t := range others {
		base, under := summarize(unloaded[i].TTFT).P99, summarize(t.TTFT).P99
		r := safeRatio(float64(under), float64(base))
		if r >= worst {
			worst, worstName = r, fmt.Sprintf("%s: %.1f ms against %.1f ms alone, %d errors of %d", t.Name,
				float64(under)/float64(time.Millisecond), float64(base)/float64(time.Millisecond), t.Errors, t.Sent)
		}
	}
	rows = append(rows, newFleetRow("fairness: others' TTFT p99 / unloaded", unitTimes, nil, worst, atMost(1.5), "worst tenant, "+worstName))
	flood := loaded[len(loaded)-1]
	total, othersOffered := 0, 0
	for _, t := range loaded {
		total += t.ServedTokens
	}
	for _, t := range others {
		othersOffered += t.OfferedTokens
	}
	share := safeRatio(float64(flood.ServedTokens), float64(total))
	fair := max(1/float64(len(loaded)), 1-safeRatio(float64(othersOffered), float64(total)))
	rows = append(rows, newFleetRow("fairness: flooder's share of served tokens", unitRatio, nil, share, atMost(fair),
		fmt.Sprintf("%d of %d tokens; its max-min fair share is %.3f (the others asked for %d); %d errors of %d",
			flood.ServedTokens, total, fair, othersOffered, flood.Errors, flood.Sent)))
	return rows
}

// priorityRows is the priority goal: the high-priority trickle's TTFT p99 under a low-priority
// flood within 1.2× of its p99 alone.
func priorityRows(unloaded, loaded, flood *tenantLoad) []fleetRow {
	base, under := summarize(unloaded.TTFT).P99, summarize(loaded.TTFT).P99
	return []fleetRow{newFleetRow("priority: high's TTFT p99 / unloaded", unitTimes, nil, safeRatio(float64(under), float64(base)), atMost(1.2),
		fmt.Sprintf("%.1f ms against %.1f ms alone; high: %d errors of %d; low flood: %d errors of %d", float64(under)/float64(time.Millisecond),
			float64(base)/float64(time.Millisecond), loaded.Errors, loaded.Sent, flood.Errors, flood.Sent))}
}

// fleetReport is the result of a -fleet run.
type fleetReport struct {
	Date    string                  `json:"date"`
	Command string                  `json:"command"`
	Machine machine                 `json:"machine"`
	Setup   string                  `json:"setup"`
	Routes  [numRoutes]*routeResult `json:"routes"`
	Rows    []fleetRow              `json:"results"`
	Notes   []string                `json:"notes,omitempty"`
	Elapsed string                  `json:"elapsed"`
	// Placements counts why tollgate's scheduler placed the requests of its measured
	// conversation phases, by the gateway's tollgate_placements_total.
	Placements map[string]float64       `json:"placements,omitempty"`
	Tenants    map[string][]*tenantLoad `json:"-"`
	Settings   map[string]string        `json:"settings"`
}

// writeTable prints the report as aligned text.
func (r *fleetReport) writeTable(w io.Writer) error {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "tollbench -fleet %s (%s)\n", r.Date, r.Command)
	fmt.Fprintf(&b, "machine: %s, %d cores, %d MiB, kernel %s, %s\n", m.CPU, m.Cores, m.MemoryMiB, m.Kernel, m.GoVersion)
	fmt.Fprintf(&b, "setup: %s\n\n", r.Setup)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintf(tw, "metric\t%s\t%s\t%s\tvalue\tgoal\tstatus\t\n", routeNames[0], routeNames[1], routeNames[2])
	for _, row := range r.Rows {
		cells := [numRoutes]string{"", "", ""}
		if row.Routes != nil {
			for i, v := range row.Routes {
				switch {
				case strings.HasPrefix(row.Metric, "TTFT"):
					cells[i] = fmt.Sprintf("%.1f ms", v)
				case row.Unit == unitCount:
					cells[i] = fmt.Sprintf("%.0f", v)
				default:
					cells[i] = fmt.Sprintf("%.3f", v)
				}
			}
		}
		goal := formatTarget(row.Target, row.Unit, false)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", row.Metric, cells[0], cells[1], cells[2],
			formatValue(row.Value, row.Unit, false), goal, row.Status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\n")
	for _, row := range r.Rows {
		if row.Note != "" {
			fmt.Fprintf(&b, "  %s: %s\n", row.Metric, row.Note)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	fmt.Fprintf(&b, "elapsed %s\n", r.Elapsed)
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *fleetReport) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
