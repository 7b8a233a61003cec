package main

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/valyala/fasthttp"
)

// placementsFamily is the gateway's count of why its scheduler placed each request.
const placementsFamily = "tollgate_placements_total"

// placements reads, from the gateway's /metrics, how many of model's requests the scheduler
// placed for each reason (kept, moved, spread, ...).
func (f *fleetBench) placements(model string) (map[string]float64, error) {
	status, body, err := f.gw.client.GetTimeout(nil, "http://"+f.gwAddr+"/metrics", scrapeTimeout)
	if err != nil {
		return nil, fmt.Errorf("read the gateway's /metrics: %w", err)
	}
	if status != fasthttp.StatusOK {
		return nil, fmt.Errorf("read the gateway's /metrics: status %d: %.200s", status, body)
	}
	return placementsIn(body, model)
}

// placementsIn is placements on a /metrics page.
func placementsIn(page []byte, modelName string) (map[string]float64, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return nil, fmt.Errorf("parse the gateway's /metrics: %w", err)
	}
	fam := fams[placementsFamily]
	if fam == nil {
		return nil, fmt.Errorf("the gateway's /metrics has no %s", placementsFamily)
	}
	out := map[string]float64{}
	for _, m := range fam.GetMetric() {
		var forModel bool
		var why string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "model":
				forModel = l.GetValue() == modelName
			case "placement":
				why = l.GetValue()
			}
		}
		if forModel {
			out[why] = m.GetCounter().GetValue()
		}
	}
	return out, nil
}

// placementsSince is after minus before, reason by reason.
func placementsSince(before, after map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(after))
	for why, n := range after {
		out[why] = n - before[why]
	}
	return out
}

// placementOrder is the order placementsNote lists the reasons in: a conversation's turns
// first, then openings, then the rest.
var placementOrder = []string{"kept", "moved", "spread", "score", "queued", "priority"}

// placementsNote says, for the report, why tollgate's scheduler placed the requests of its
// measured conversation phases: "moved" are turns sent off a full server, each prefilling
// again what that server held.
func placementsNote(counts map[string]float64) string {
	var b strings.Builder
	b.WriteString("tollgate's placements in its conversation phases (first fifths included):")
	for i, why := range placementOrder {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %s %.0f", why, counts[why])
	}
	return b.String()
}
