package admin

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/weave"
)

// defaultCostUnit and defaultProviderID are Weave's defaults for a price.
const (
	defaultCostUnit   = "USD"
	defaultProviderID = "default"
)

// costCreate serves POST /cost/create {project_id, costs: {llm_id:
// CostCreateInput}} → {"ids": [[id, llm_id], ...]}. Prices are per token.
func (s *Service) costCreate(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	now := time.Now().UTC()
	var costs []weave.Cost
	switch m, ok := body["costs"].(map[string]any); {
	case body["costs"] == nil:
		v.add(at(bodyLoc, "costs"), "missing", "Field required", body)
	case !ok:
		v.add(at(bodyLoc, "costs"), "dict_type", "Input should be a valid dictionary", body["costs"])
	default:
		llms := make([]string, 0, len(m))
		for llm := range m {
			llms = append(llms, llm)
		}
		sort.Strings(llms)
		for _, llm := range llms {
			v.boundString(at(bodyLoc, "costs", truncateInput(llm)), llm, maxIDBytes)
			if c, ok := parseCost(&v, m[llm], at(bodyLoc, "costs", llm), now); ok {
				c.LLMID = llm
				costs = append(costs, c)
			}
		}
	}
	_, proj, _, e := s.projectOf(ctx, &v, key, body, bodyLoc, forWrite)
	if e != nil {
		return e
	}
	ids := make([][2]string, len(costs))
	for i := range costs {
		id, err := uuid.NewV7()
		if err != nil {
			return internalError(err)
		}
		costs[i].ProjectID, costs[i].ID, costs[i].CreatedAt, costs[i].CreatedBy = proj.ID, id.String(), now, key.Name
		ids[i] = [2]string{costs[i].ID, costs[i].LLMID}
	}
	if err := s.weave.PutCosts(ctx, costs); err != nil {
		return internalError(err)
	}
	writeJSON(rc, fasthttp.StatusOK, map[string][][2]string{"ids": ids})
	return nil
}

func parseCost(v *validation, raw any, loc []any, now time.Time) (weave.Cost, bool) {
	obj, ok := v.object(raw, loc, "CostCreateInput")
	if !ok {
		return weave.Cost{}, false
	}
	n := len(v.errs)
	c := weave.Cost{PromptTokenCostUnit: defaultCostUnit, CompletionTokenCostUnit: defaultCostUnit,
		ProviderID: defaultProviderID, EffectiveDate: now}
	c.PromptTokenCost = reqCost(v, obj, "prompt_token_cost", loc)
	c.CompletionTokenCost = reqCost(v, obj, "completion_token_cost", loc)
	if u := v.optString(obj, "prompt_token_cost_unit", loc); u != nil {
		c.PromptTokenCostUnit = *u
	}
	if u := v.optString(obj, "completion_token_cost_unit", loc); u != nil {
		c.CompletionTokenCostUnit = *u
	}
	if p := v.optString(obj, "provider_id", loc); p != nil {
		c.ProviderID = *p
	}
	if raw, ok := obj["effective_date"]; ok && raw != nil {
		c.EffectiveDate, _ = parseTime(v, raw, at(loc, "effective_date"))
	}
	return c, len(v.errs) == n
}

func reqCost(v *validation, obj map[string]any, key string, loc []any) float64 {
	raw, ok := obj[key]
	if !ok {
		v.add(at(loc, key), "missing", "Field required", obj)
		return 0
	}
	n, ok := raw.(json.Number)
	f, err := n.Float64()
	if !ok || err != nil || f < 0 {
		v.add(at(loc, key), "float_type", "Input should be a valid non-negative number", raw)
		return 0
	}
	return f
}

func costDoc(c *weave.Cost) map[string]any {
	return map[string]any{
		"id": c.ID, "llm_id": c.LLMID, "prompt_token_cost": c.PromptTokenCost,
		"completion_token_cost": c.CompletionTokenCost, "prompt_token_cost_unit": c.PromptTokenCostUnit,
		"completion_token_cost_unit": c.CompletionTokenCostUnit, "effective_date": formatTime(c.EffectiveDate),
		"provider_id": c.ProviderID,
	}
}

// costQuery serves POST /cost/query {project_id, fields, query, sort_by,
// limit, offset} → {"results": [...]}.
func (s *Service) costQuery(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	return s.serveDocQuery(ctx, rc, key, "results", func(_ string, projectID int64, _ *docQuery) ([]map[string]any, error) {
		costs, err := s.weave.ListCosts(ctx, projectID)
		if err != nil {
			return nil, err
		}
		docs := make([]map[string]any, 0, len(costs))
		for i := range costs {
			docs = append(docs, costDoc(&costs[i]))
		}
		return docs, nil
	})
}

// costPurge serves POST /cost/purge {project_id, query} → {}.
func (s *Service) costPurge(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	return s.purgeByIDs(ctx, rc, key, s.weave.DeleteCosts)
}
