package admin

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
)

// BudgetStore is what the budgets API reads spend from.
type BudgetStore interface {
	// SpentTokens sums the tokens recorded since since, by team, project
	// and key.
	SpentTokens(ctx context.Context, since time.Time) ([]accounting.SpentRow, error)
}

// BudgetAPI serves GET /v1/tollgate/budgets: every token budget of the
// configured limits, with what has been spent against it in the current
// window. Spend comes from the store, so it is the settled, exact count
// whichever limits backend (memory or Redis) enforces the budget; requests
// in flight are not in it yet.
type BudgetAPI struct {
	store  BudgetStore
	keys   *auth.Keyring
	limits func() []config.Limit
	now    func() time.Time
}

// NewBudgetAPI returns the budgets API. limits returns the limits in force
// (they change on a configuration reload).
func NewBudgetAPI(st BudgetStore, keys *auth.Keyring, limits func() []config.Limit) *BudgetAPI {
	return &BudgetAPI{store: st, keys: keys, limits: limits, now: time.Now}
}

// budgetJSON is one budget: the selector values it counts (empty when the
// limit counts every value together), its window and its spend.
type budgetJSON struct {
	Team        string `json:"team"`
	Project     string `json:"project"`
	Key         string `json:"key"`
	Window      string `json:"window"`
	WindowStart int64  `json:"window_start"`
	Budget      int64  `json:"budget"`
	Used        int64  `json:"used"`
}

// ServeBudgets answers GET /v1/tollgate/budgets. An admin key sees every
// budget; another key only those of teams it may use, and not budgets
// that count all teams together (their spend includes other teams').
func (a *BudgetAPI) ServeBudgets(ctx *fasthttp.RequestCtx) {
	key := usageGetKey(ctx, a.keys)
	if key == nil {
		return
	}
	now := a.now().UTC()
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	// One read covers both windows: a month always starts no later than
	// the day, and day spend is filtered from the same rows below.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	monthRows, err := a.store.SpentTokens(sctx, month)
	dayRows := monthRows
	if err == nil && day.After(month) {
		dayRows, err = a.store.SpentTokens(sctx, day)
	}
	if err != nil {
		ctx.Logger().Printf("budgets api: read spend: %v", err)
		usageWriteError(ctx, &usageError{status: fasthttp.StatusInternalServerError, typ: "api_error",
			message: "The server had an error while reading spend."})
		return
	}
	out := []budgetJSON{}
	for _, l := range a.limits() {
		if l.TokenBudget <= 0 {
			continue
		}
		rows, start := monthRows, month
		if l.BudgetWindow == "day" {
			rows, start = dayRows, day
		}
		for _, b := range budgetsOf(l, rows) {
			if !key.AllowsAnyTeam() && (b.Team == "" || !key.AllowsTeam(b.Team)) {
				continue
			}
			b.Window, b.WindowStart, b.Budget = l.BudgetWindow, start.Unix(), l.TokenBudget
			out = append(out, b)
		}
	}
	body, err := json.Marshal(struct {
		Object string       `json:"object"`
		Data   []budgetJSON `json:"data"`
	}{"list", out})
	if err != nil {
		usageWriteError(ctx, &usageError{status: fasthttp.StatusInternalServerError, typ: "api_error", message: err.Error()})
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// budgetsOf groups spend rows as limit l counts them: a "*" selector
// counts each value apart, a named one only its value, an empty one every
// value together. A named budget with no spend yet is listed at zero.
func budgetsOf(l config.Limit, rows []accounting.SpentRow) []budgetJSON {
	group := func(sel, v string) (string, bool) {
		switch sel {
		case "":
			return "", true
		case "*":
			return v, true
		}
		return sel, sel == v
	}
	sums := map[budgetJSON]int64{}
	if l.Team != "*" && l.Project != "*" && l.Key != "*" {
		sums[budgetJSON{Team: l.Team, Project: l.Project, Key: l.Key}] = 0
	}
	for _, r := range rows {
		team, ok1 := group(l.Team, r.Subject.Team)
		project, ok2 := group(l.Project, r.Subject.Project)
		key, ok3 := group(l.Key, r.Subject.Key)
		if ok1 && ok2 && ok3 {
			// Saturating: a store's sums are never negative but may be as
			// large as a backend claimed, and a wrapped sum would show a
			// spent budget as unspent.
			b := budgetJSON{Team: team, Project: project, Key: key}
			sums[b] = accounting.AddTokens(sums[b], max(r.Tokens, 0))
		}
	}
	out := make([]budgetJSON, 0, len(sums))
	for b, used := range sums {
		b.Used = used
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Team != out[j].Team {
			return out[i].Team < out[j].Team
		}
		if out[i].Project != out[j].Project {
			return out[i].Project < out[j].Project
		}
		return out[i].Key < out[j].Key
	})
	return out
}
