package admin_test

import (
	"context"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/admin"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// costsEnv is the costs API over a real store holding, from usageDay:
//
//	day 0 01:00  acme m1 in 1000 out 100 cached 400
//	day 1 02:00  acme m1 in 2000
//	day 1 04:00  beta m1 in 3000 out 300
//	day 2 00:30  acme m2 in 500 out 500
//
// priced from day 0 at m1 {1, 2, cached 0.5} and m2 {10, 20} per million,
// m1 changing to {3, 4, cached 1} at day 1 03:00: between the two day-1
// records, so that day 1 prices each at its own price.
func costsEnv(t *testing.T, db *store.DB) *admin.CostsAPI {
	t.Helper()
	ctx := context.Background()
	kr, err := auth.NewKeyring(config.Auth{Keys: []config.Key{
		{Name: "root", Key: usageRootKey, Admin: true},
		{Name: "acme-ci", Key: usageAcmeKey, Teams: []string{"acme"}, DefaultTeam: "acme"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	rec := func(call, team, model string, at time.Duration, in, out, cached int64) accounting.Record {
		return accounting.Record{RequestID: call, CallID: call, TraceID: call, KeyName: "k-" + team, Team: team, Project: "default",
			Model: model, ServedModel: model, Backend: "b", Status: 200, PromptTokens: in, CompletionTokens: out,
			TotalTokens: in + out, CachedTokens: cached, Started: usageDay.Add(at), Ended: usageDay.Add(at + time.Second)}
	}
	const day = 24 * time.Hour
	if err := db.InsertRecords(ctx, []accounting.Record{
		rec("c1", "acme", "m1", time.Hour, 1000, 100, 400),
		rec("c2", "acme", "m1", day+2*time.Hour, 2000, 0, 0),
		rec("c3", "beta", "m1", day+4*time.Hour, 3000, 300, 0),
		rec("c4", "acme", "m2", 2*day+30*time.Minute, 500, 500, 0),
	}); err != nil {
		t.Fatal(err)
	}
	m2 := config.Pricing{PromptPerMTok: 10, CompletionPerMTok: 20}
	if err := db.RecordPrices(ctx, map[string]config.Pricing{"m1": {PromptPerMTok: 1, CompletionPerMTok: 2, CachedPromptPerMTok: 0.5}, "m2": m2}, usageDay); err != nil {
		t.Fatal(err)
	}
	changed := map[string]config.Pricing{"m1": {PromptPerMTok: 3, CompletionPerMTok: 4, CachedPromptPerMTok: 1}, "m2": m2}
	// A fraction of a second rounds up: the change applies from 03:00:00.
	if err := db.RecordPrices(ctx, changed, usageDay.Add(day+3*time.Hour-time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// The same prices again append nothing.
	if err := db.RecordPrices(ctx, changed, usageDay.Add(day+5*time.Hour)); err != nil {
		t.Fatal(err)
	}
	history, err := db.PriceHistory(ctx)
	if err != nil || len(history) != 3 || history[2].Model != "m1" || !history[2].From.Equal(usageDay.Add(day+3*time.Hour)) {
		t.Fatalf("price history = %+v, %v", history, err)
	}
	// The current prices are not the history's: costs never use them for
	// a model the history knows.
	return admin.NewCostsAPI(db, kr, func() map[string]config.Pricing { return map[string]config.Pricing{"m1": {PromptPerMTok: 1000}} })
}

type costsAnswer struct {
	Object string `json:"object"`
	Data   []struct {
		Object    string `json:"object"`
		StartTime int64  `json:"start_time"`
		EndTime   int64  `json:"end_time"`
		Results   []struct {
			Object string `json:"object"`
			Amount struct {
				Value    float64 `json:"value"`
				Currency string  `json:"currency"`
			} `json:"amount"`
			LineItem  *string  `json:"line_item"`
			ProjectID *string  `json:"project_id"`
			Quantity  *float64 `json:"quantity"`
		} `json:"results"`
	} `json:"data"`
	HasMore  bool    `json:"has_more"`
	NextPage *string `json:"next_page"`
}

func getCosts(t *testing.T, api *admin.CostsAPI, key, query string) (int, costsAnswer, string) {
	t.Helper()
	var req fasthttp.Request
	req.SetRequestURI(admin.OrgCostsPath + "?" + query)
	req.Header.Set("Authorization", "Bearer "+key)
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil)
	api.Serve(&ctx)
	var out costsAnswer
	body := string(ctx.Response.Body())
	if ctx.Response.StatusCode() == fasthttp.StatusOK {
		if err := json.Unmarshal(ctx.Response.Body(), &out); err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
	}
	return ctx.Response.StatusCode(), out, body
}

// costKey names a result by its groups, for comparing answers.
func costKey(project, lineItem *string) string {
	s := ""
	if project != nil {
		s += *project
	}
	if lineItem != nil {
		s += "|" + *lineItem
	}
	return s
}

func TestCostsAPIPricesEachSecondAtItsPrice(t *testing.T) {
	storetest.ForEach(t, func(t *testing.T, db *store.DB) {
		api := costsEnv(t, db)
		start := strconv.FormatInt(usageDay.Unix(), 10)
		end := strconv.FormatInt(usageDay.Add(72*time.Hour).Unix(), 10)
		type result struct {
			value, quantity float64
		}
		cases := []struct {
			name  string
			query string
			// want holds each bucket's results by costKey.
			want     []map[string]result
			hasMore  bool
			nextPage bool
		}{
			{"by project, first page", "start_time=" + start + "&end_time=" + end + "&limit=2&group_by[]=project_id",
				[]map[string]result{
					{"acme": {(600*1 + 400*0.5 + 100*2) / 1e6, 0}},
					// 02:00 at the old price, 04:00 at the new one.
					{"acme": {2000 * 1 / 1e6, 0}, "beta": {(3000*3 + 300*4) / 1e6, 0}},
				}, true, true},
			{"no group sums a day", "start_time=" + start + "&end_time=" + end,
				[]map[string]result{
					{"": {1000 / 1e6, 0}},
					{"": {(2000 + 9000 + 1200) / 1e6, 0}},
					{"": {(500*10 + 500*20) / 1e6, 0}},
				}, false, false},
			{"by line item", "start_time=" + start + "&end_time=" + end + "&group_by=line_item",
				[]map[string]result{
					{"|m1, input": {600 / 1e6, 600}, "|m1, cached input": {200 / 1e6, 400}, "|m1, output": {200 / 1e6, 100}},
					{"|m1, input": {(2000 + 9000) / 1e6, 5000}, "|m1, output": {1200 / 1e6, 300}},
					{"|m2, input": {5000 / 1e6, 500}, "|m2, output": {10000 / 1e6, 500}},
				}, false, false},
			{"one project", "start_time=" + start + "&end_time=" + end + "&project_ids[]=beta&group_by[]=project_id&group_by[]=line_item",
				[]map[string]result{{}, {"beta|m1, input": {9000 / 1e6, 3000}, "beta|m1, output": {1200 / 1e6, 300}}, {}}, false, false},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				status, got, body := getCosts(t, api, usageRootKey, c.query)
				if status != fasthttp.StatusOK {
					t.Fatalf("status %d: %s", status, body)
				}
				if got.Object != "page" || len(got.Data) != len(c.want) || got.HasMore != c.hasMore || (got.NextPage != nil) != c.nextPage {
					t.Fatalf("answer %s", body)
				}
				for i, b := range got.Data {
					if b.Object != "bucket" || b.StartTime != usageDay.Add(time.Duration(i)*24*time.Hour).Unix() || b.EndTime != b.StartTime+86400 {
						t.Errorf("bucket %d = %+v", i, b)
					}
					if len(b.Results) != len(c.want[i]) {
						t.Errorf("bucket %d has %d results, want %d: %s", i, len(b.Results), len(c.want[i]), body)
					}
					for _, r := range b.Results {
						w, ok := c.want[i][costKey(r.ProjectID, r.LineItem)]
						if !ok || r.Object != "organization.costs.result" || r.Amount.Currency != "usd" || math.Abs(r.Amount.Value-w.value) > 1e-12 {
							t.Errorf("bucket %d result %+v, want %+v", i, r, w)
						}
						if (r.Quantity != nil) != (r.LineItem != nil) || r.Quantity != nil && *r.Quantity != w.quantity {
							t.Errorf("bucket %d result %s quantity %v, want %v", i, costKey(r.ProjectID, r.LineItem), r.Quantity, w.quantity)
						}
					}
				}
				if c.nextPage {
					status, next, body := getCosts(t, api, usageRootKey, c.query+"&page="+*got.NextPage)
					if status != fasthttp.StatusOK || len(next.Data) != 1 || next.HasMore || len(next.Data[0].Results) != 1 ||
						math.Abs(next.Data[0].Results[0].Amount.Value-15000/1e6) > 1e-12 {
						t.Errorf("next page %d: %s", status, body)
					}
				}
			})
		}
	})
}

func TestCostsAPIKeysAndBadInput(t *testing.T) {
	api := costsEnv(t, storetest.OpenOne(t))
	start := strconv.FormatInt(usageDay.Unix(), 10)
	end := strconv.FormatInt(usageDay.Add(72*time.Hour).Unix(), 10)
	// A team's key reads its own team's costs only.
	status, got, body := getCosts(t, api, usageAcmeKey, "start_time="+start+"&end_time="+end+"&group_by=project_id")
	if status != fasthttp.StatusOK || len(got.Data) != 3 || len(got.Data[1].Results) != 1 || *got.Data[1].Results[0].ProjectID != "acme" {
		t.Fatalf("acme's costs %d: %s", status, body)
	}
	for _, c := range []struct{ key, query, want string }{
		{usageAcmeKey, "start_time=" + start + "&project_ids=beta", `"param":"project_ids"`},
		{usageRootKey, "", `"param":"start_time"`},
		{usageRootKey, "start_time=" + start + "&bucket_width=1h", `"param":"bucket_width"`},
		{usageRootKey, "start_time=" + start + "&limit=181", `"param":"limit"`},
		{usageRootKey, "start_time=" + start + "&group_by=model", `"param":"group_by"`},
		{"sk-nobody", "start_time=" + start, `"code":"invalid_api_key"`},
	} {
		status, _, body := getCosts(t, api, c.key, c.query)
		if status < 400 || !json.Valid([]byte(body)) || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s, want an error with %s", c.query, status, body, c.want)
		}
	}
}
