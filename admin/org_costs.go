package admin

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
)

// OrgCostsPath is OpenAI's costs API.
const OrgCostsPath = "/v1/organization/costs"

// CostsAPI serves GET /v1/organization/costs in the shape of OpenAI's
// costs API: pages of daily buckets whose results are
// organization.costs.result, in float US dollars ("usd"). Costs are the
// usage records' tokens priced by the price history (accounting.Prices),
// each second at the prices in force then. A project is a tollgate team
// (an Admin API project's team is its id; a configured team's is its
// name). An admin key reads every team's costs; any other key its own
// teams'.
type CostsAPI struct {
	store accounting.CostSource
	keys  *auth.Keyring
	// pricing is the configuration's current prices, for models the
	// history does not hold.
	pricing func() map[string]config.Pricing
}

// NewCostsAPI returns the costs API over st.
func NewCostsAPI(st accounting.CostSource, keys *auth.Keyring, pricing func() map[string]config.Pricing) *CostsAPI {
	return &CostsAPI{store: st, keys: keys, pricing: pricing}
}

// costsWidths: OpenAI's costs API buckets by day only, up to 180 a page.
var costsWidths = map[string]usageWidth{"1d": {24 * time.Hour, 7, 180}}

// costsRequest is a validated costs request.
type costsRequest struct {
	query                 accounting.UsageQuery
	byProject, byLineItem bool
	byKey                 bool
	keyIDs                []string
	hasMore               bool
}

func parseCostsRequest(args *fasthttp.Args, now time.Time) (*costsRequest, *usageError) {
	w, uerr := parseUsageWindow(args, now, costsWidths)
	if uerr != nil {
		return nil, uerr
	}
	r := &costsRequest{query: accounting.UsageQuery{Start: w.start, End: w.end, BucketWidth: w.width}, hasMore: w.hasMore}
	for _, g := range usageList(args, "group_by") {
		switch g {
		case "project_id":
			r.byProject = true
		case "line_item":
			r.byLineItem = true
		case "api_key_id":
			r.byKey = true
		default:
			return nil, usageInvalid("group_by", "Invalid 'group_by' value "+strconv.Quote(g)+": want project_id, line_item or api_key_id.")
		}
	}
	if ids := usageList(args, "project_ids"); len(ids) > 0 {
		r.query.Teams = ids
	}
	r.keyIDs = usageList(args, "api_key_ids")
	r.query.GroupByProject = r.byProject
	r.query.GroupByKey = r.byKey || len(r.keyIDs) > 0
	return r, nil
}

// Serve answers GET /v1/organization/costs.
func (a *CostsAPI) Serve(ctx *fasthttp.RequestCtx) {
	key := usageGetKey(ctx, a.keys)
	if key == nil {
		return
	}
	req, uerr := parseCostsRequest(ctx.QueryArgs(), time.Now())
	if uerr != nil {
		usageWriteError(ctx, uerr)
		return
	}
	if !key.AllowsAnyTeam() {
		for _, team := range req.query.Teams {
			if !key.AllowsTeam(team) {
				usageWriteError(ctx, &usageError{status: fasthttp.StatusForbidden, typ: "permission_denied", param: "project_ids",
					message: "The API key may not read the costs of project " + strconv.Quote(team) + "."})
				return
			}
		}
		if req.query.Teams == nil {
			req.query.Teams = key.Teams()
		}
	}
	// The store gets a context of its own: fasthttp reuses a RequestCtx.
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rows, err := accounting.ReadCosts(sctx, a.store, a.pricing(), req.query)
	if err != nil {
		ctx.Logger().Printf("costs api: %v", err)
		usageWriteError(ctx, &usageError{status: fasthttp.StatusInternalServerError, typ: "api_error",
			message: "The server had an error while reading costs."})
		return
	}
	usageWriteJSON(ctx, fasthttp.StatusOK, req.page(rows))
}

type costsAmount struct {
	Value    float64 `json:"value"`
	Currency string  `json:"currency"`
}

type costsResult struct {
	Object       string      `json:"object"`
	Amount       costsAmount `json:"amount"`
	LineItem     *string     `json:"line_item"`
	ProjectID    *string     `json:"project_id"`
	APIKeyID     *string     `json:"api_key_id"`
	Quantity     *float64    `json:"quantity"`
	QuantityUnit *string     `json:"quantity_unit"`
}

type costsBucket struct {
	Object    string        `json:"object"`
	StartTime int64         `json:"start_time"`
	EndTime   int64         `json:"end_time"`
	Results   []costsResult `json:"results"`
}

type costsPage struct {
	Object   string        `json:"object"`
	Data     []costsBucket `json:"data"`
	HasMore  bool          `json:"has_more"`
	NextPage *string       `json:"next_page"`
}

// costsLineItems are a model's line items, as OpenAI names them
// ("<model>, input"), with what each counts and costs.
var costsLineItems = []struct {
	suffix string
	tokens func(*accounting.CostRow) int64
	cost   func(*accounting.CostRow) float64
}{
	{", input", func(r *accounting.CostRow) int64 { return max(r.InputTokens-r.CachedTokens-r.CacheWriteTokens, 0) }, func(r *accounting.CostRow) float64 { return r.Cost.Input }},
	{", cache write input", func(r *accounting.CostRow) int64 { return r.CacheWriteTokens }, func(r *accounting.CostRow) float64 { return r.Cost.CacheWriteInput }},
	{", cached input", func(r *accounting.CostRow) int64 { return min(r.CachedTokens, r.InputTokens) }, func(r *accounting.CostRow) float64 { return r.Cost.CachedInput }},
	{", output", func(r *accounting.CostRow) int64 { return r.OutputTokens }, func(r *accounting.CostRow) float64 { return r.Cost.Output }},
}

// page lays the priced rows out in the page's buckets, one result per
// group a bucket has (empty buckets have none).
func (r *costsRequest) page(rows []accounting.CostRow) costsPage {
	q := &r.query
	width := int64(q.BucketWidth / time.Second)
	start, end := q.Start.Unix(), q.End.Unix()
	p := costsPage{Object: "page", Data: make([]costsBucket, 0, max(end-start, 0)/width)}
	for s := start; s < end; s += width {
		p.Data = append(p.Data, costsBucket{Object: "bucket", StartTime: s, EndTime: s + width, Results: []costsResult{}})
	}
	type group struct{ project, key, lineItem string }
	index := make([]map[group]int, len(p.Data))
	add := func(b int, g group, value float64, quantity int64) {
		if index[b] == nil {
			index[b] = map[group]int{}
		}
		i, ok := index[b][g]
		if !ok {
			i = len(p.Data[b].Results)
			index[b][g] = i
			res := costsResult{Object: "organization.costs.result", Amount: costsAmount{Currency: "usd"}}
			if r.byProject {
				res.ProjectID = &g.project
			}
			if r.byKey {
				res.APIKeyID = &g.key
			}
			if r.byLineItem {
				res.LineItem, res.Quantity, res.QuantityUnit = &g.lineItem, new(float64), new(string)
				*res.QuantityUnit = "tokens"
			}
			p.Data[b].Results = append(p.Data[b].Results, res)
		}
		res := &p.Data[b].Results[i]
		res.Amount.Value += value
		if res.Quantity != nil {
			*res.Quantity += float64(quantity)
		}
	}
	for i := range rows {
		row := &rows[i]
		b := (row.BucketStart.Unix() - start) / width
		if b < 0 || b >= int64(len(p.Data)) || len(r.keyIDs) > 0 && !slices.Contains(r.keyIDs, row.KeyName) {
			continue
		}
		g := group{}
		if r.byProject {
			g.project = row.Team
		}
		if r.byKey {
			g.key = row.KeyName
		}
		if !r.byLineItem {
			if row.Cost.Total() != 0 || row.Requests != 0 {
				add(int(b), g, row.Cost.Total(), 0)
			}
			continue
		}
		for _, li := range costsLineItems {
			if n := li.tokens(row); n != 0 {
				g.lineItem = row.Model + li.suffix
				add(int(b), g, li.cost(row), n)
			}
		}
	}
	if r.hasMore {
		next := encodeUsagePage(end)
		p.HasMore, p.NextPage = true, &next
	}
	return p
}
