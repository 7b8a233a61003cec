package admin

import (
	"context"
	"encoding/json"
	"math"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/jsonstr"
	"github.com/tollgate-dev/tollgate/trace"
)

// defaultTraceUsageLimit is how many calls /trace/usage processes when the
// request sets no limit.
const defaultTraceUsageLimit = 10000

// counts is one model's usage in one call, own or rolled up. The costs are
// only written out when the request asked for them.
type counts struct {
	requests, prompt, completion, total, cacheRead, cacheCreation int64

	promptCost, completionCost, cacheReadCost, cacheCreationCost float64
}

func (c *counts) add(o *counts) {
	c.requests += o.requests
	c.prompt += o.prompt
	c.completion += o.completion
	c.total += o.total
	c.cacheRead += o.cacheRead
	c.cacheCreation += o.cacheCreation
	c.promptCost += o.promptCost
	c.completionCost += o.completionCost
	c.cacheReadCost += o.cacheReadCost
	c.cacheCreationCost += o.cacheCreationCost
}

// sub subtracts o's token counts (not costs, which are priced after).
func (c *counts) sub(o *counts) {
	c.requests -= o.requests
	c.prompt -= o.prompt
	c.completion -= o.completion
	c.total -= o.total
	c.cacheRead -= o.cacheRead
	c.cacheCreation -= o.cacheCreation
}

// clampNegative raises negative token counts to 0: a child's summary
// larger than its parent's (a parent ended by another process, say) must
// not take tokens off the trace.
func (c *counts) clampNegative() {
	c.requests, c.prompt, c.completion = max(c.requests, 0), max(c.prompt, 0), max(c.completion, 0)
	c.total, c.cacheRead, c.cacheCreation = max(c.total, 0), max(c.cacheRead, 0), max(c.cacheCreation, 0)
}

func (c *counts) zero() bool {
	return c.requests == 0 && c.prompt == 0 && c.completion == 0 && c.total == 0 &&
		c.cacheRead == 0 && c.cacheCreation == 0 &&
		c.promptCost == 0 && c.completionCost == 0 && c.cacheReadCost == 0 && c.cacheCreationCost == 0
}

// modelEntry is one model's counts in one call's list. The lists of all
// calls live in one arena (traceUsage.entries), linked by index, so that
// the roll-up allocates a few growing slices instead of a map per call.
type modelEntry struct {
	model int32
	next  int32
	c     counts
}

// traceUsage is the result of the roll-up.
type traceUsage struct {
	ids        []string
	head, tail []int32
	entries    []modelEntry
	models     []string
	unfinished []string
	costs      bool
	// own is addOwn's scratch buffer.
	own []ownEntry
}

// ownEntry is one model's usage of the call addOwn is reading.
type ownEntry struct {
	model string
	c     counts
}

// computeTraceUsage rolls the selected calls' usage up their parent links,
// per the reference algorithm: every call gets its own usage (prompt =
// prompt_tokens + input_tokens, completion = completion_tokens +
// output_tokens, total filled in as prompt + completion when 0, all-zero
// entries dropped) plus that of all its selected descendants. A call whose
// parent is not selected is a root.
//
// It is linear in the number of calls: one pass builds the id index and
// counts each call's selected children, then calls are folded into their
// parents leaves first (Kahn's order), each exactly once. Calls on a parent
// cycle (which well-formed traces never have) keep their own usage plus
// what reached them from outside the cycle.
//
// Costs, with includeCosts, use pricing by model id (a model without a price
// costs 0), per million tokens:
//   - prompt: uncached prompt tokens at prompt_per_mtok plus cached ones
//     (cache_read_input_tokens, at most the prompt tokens, since OpenAI's
//     prompt_tokens include cached_tokens) at cached_prompt_per_mtok when
//     that is set, else at prompt_per_mtok, and cache writes at the cache
//     creation price below;
//   - completion: completion tokens at completion_per_mtok;
//   - cache read: cache_read_input_tokens at that same cached price. It is
//     the cached share of the prompt cost, shown apart, not an extra charge;
//   - cache creation: cache_creation_input_tokens at cache_write_per_mtok
//     when that is set, else at prompt_per_mtok: the share of the prompt
//     cost of the prompt tokens written to the cache (the gateway's calls
//     count them in prompt_tokens), shown apart as cache reads are.
//
// The prompt cost is accounting.PriceUsage's.
func computeTraceUsage(calls []trace.UsageCall, pricing map[string]config.Pricing, includeCosts bool) *traceUsage {
	n := len(calls)
	u := &traceUsage{
		ids:     make([]string, 0, n),
		head:    make([]int32, n),
		tail:    make([]int32, n),
		entries: make([]modelEntry, 0, n+n/2),
		costs:   includeCosts,
	}
	index := make(map[string]int32, n)
	dup := make([]bool, n)
	for i := range calls {
		if _, seen := index[calls[i].ID]; seen {
			dup[i] = true
			continue
		}
		index[calls[i].ID] = int32(i)
	}
	modelIndex := make(map[string]int32)
	parent := make([]int32, n)
	pending := make([]int32, n)
	for i := range calls {
		u.head[i], u.tail[i], parent[i] = -1, -1, -1
		if dup[i] {
			continue
		}
		c := &calls[i]
		u.ids = append(u.ids, c.ID)
		if c.Unfinished {
			u.unfinished = append(u.unfinished, c.ID)
		}
		if c.ParentID != "" {
			if p, ok := index[c.ParentID]; ok && p != int32(i) {
				parent[i] = p
				pending[p]++
			}
		}
		u.addOwn(int32(i), c, modelIndex, pricing, includeCosts)
	}
	stack := make([]int32, 0, n)
	for i := range calls {
		if !dup[i] && pending[i] == 0 {
			stack = append(stack, int32(i))
		}
	}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		p := parent[i]
		if p < 0 {
			continue
		}
		u.merge(p, i)
		if pending[p]--; pending[p] == 0 {
			stack = append(stack, p)
		}
	}
	// ids holds the distinct calls in input order; line head up with it.
	u.headOrder(dup)
	return u
}

// headOrder drops the duplicate calls' slots so that head[k] belongs to
// ids[k].
func (u *traceUsage) headOrder(dup []bool) {
	k := 0
	for i := range dup {
		if dup[i] {
			continue
		}
		u.head[k] = u.head[i]
		k++
	}
	u.head = u.head[:k]
	u.tail = nil
}

// addOwn appends a call's own non-zero model entries to its list. A call
// logged by a Weave SDK carries in summary.usage its own usage plus that
// of its SDK children (the SDKs fold each child's summary into its
// parent's before sending the end), so its own usage is its summary.usage
// minus its SDK children's, per model and count, none below zero: then the
// roll-up counts every token once, where Weave's own counts a three-deep
// SDK trace three times.
func (u *traceUsage) addOwn(i int32, call *trace.UsageCall, modelIndex map[string]int32, pricing map[string]config.Pricing, includeCosts bool) {
	// own reuses one buffer for every call, so that the roll-up still
	// allocates only its growing slices.
	own := u.own[:0]
	defer func() { u.own = own[:0] }()
	parseUsage(call.Usage, func(model string, c counts) {
		for k := range own {
			if own[k].model == model {
				// A repeated key in one usage object: sum both.
				own[k].c.add(&c)
				return
			}
		}
		own = append(own, ownEntry{model, c})
	})
	if call.SDK {
		for _, child := range call.ChildUsage {
			parseUsage(child, func(model string, c counts) {
				for k := range own {
					if own[k].model == model {
						own[k].c.sub(&c)
						return
					}
				}
			})
		}
	}
	for _, e := range own {
		c := e.c
		if call.SDK {
			c.clampNegative()
		}
		if includeCosts {
			priceCounts(&c, callPrice(call.Costs, e.model, pricing))
		}
		if c.zero() {
			continue
		}
		m, ok := modelIndex[e.model]
		if !ok {
			m = int32(len(u.models))
			u.models = append(u.models, e.model)
			modelIndex[e.model] = m
		}
		u.push(i, m, c)
	}
}

// parseUsage calls fn with each model's counts of a summary.usage object
// (JSON text): prompt = prompt_tokens + input_tokens, completion =
// completion_tokens + output_tokens, total = prompt + completion when it
// is 0. Entries that are not objects are skipped.
func parseUsage(usage string, fn func(model string, c counts)) {
	if len(usage) == 0 {
		return
	}
	doc := gjson.Parse(usage)
	if !doc.IsObject() {
		return
	}
	doc.ForEach(func(key, val gjson.Result) bool {
		if !val.IsObject() {
			return true
		}
		var c counts
		var input, output int64
		val.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "requests":
				c.requests = v.Int()
			case "prompt_tokens":
				c.prompt = v.Int()
			case "input_tokens":
				input = v.Int()
			case "completion_tokens":
				c.completion = v.Int()
			case "output_tokens":
				output = v.Int()
			case "total_tokens":
				c.total = v.Int()
			case "cache_read_input_tokens":
				c.cacheRead = v.Int()
			case "cache_creation_input_tokens":
				c.cacheCreation = v.Int()
			}
			return true
		})
		c.prompt += input
		c.completion += output
		if c.total == 0 {
			c.total = c.prompt + c.completion
		}
		fn(key.Str, c)
		return true
	})
}

// priceCounts prices c at p with accounting.PriceTokens, the one price
// function of costs, spend and the trace service: the prompt cost holds
// its cached part, which cacheReadCost shows apart.
func priceCounts(c *counts, p config.Pricing) {
	cost := accounting.PriceUsage(p, c.prompt, c.completion, c.cacheRead, c.cacheCreation)
	c.promptCost = cost.Input + cost.CachedInput + cost.CacheWriteInput
	c.completionCost = cost.Output
	c.cacheReadCost = float64(c.cacheRead) * p.CachedPromptPrice() / 1e6
	c.cacheCreationCost = float64(c.cacheCreation) * p.CacheWritePrice() / 1e6
}

// find returns the entry of model m in call i's list, or -1.
func (u *traceUsage) find(i, m int32) int32 {
	for e := u.head[i]; e >= 0; e = u.entries[e].next {
		if u.entries[e].model == m {
			return e
		}
	}
	return -1
}

// push appends a new entry for model m to call i's list.
func (u *traceUsage) push(i, m int32, c counts) {
	e := int32(len(u.entries))
	u.entries = append(u.entries, modelEntry{model: m, next: -1, c: c})
	if u.tail[i] < 0 {
		u.head[i] = e
	} else {
		u.entries[u.tail[i]].next = e
	}
	u.tail[i] = e
}

// merge adds call i's (already rolled-up) entries into its parent p's.
func (u *traceUsage) merge(p, i int32) {
	for e := u.head[i]; e >= 0; e = u.entries[e].next {
		m := u.entries[e].model
		if pe := u.find(p, m); pe >= 0 {
			c := u.entries[e].c
			u.entries[pe].c.add(&c)
			continue
		}
		u.push(p, m, u.entries[e].c)
	}
}

// appendJSON writes {"call_usage": {...}, "unfinished_call_ids": [...]}.
func (u *traceUsage) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"call_usage":{`...)
	for k, id := range u.ids {
		if k > 0 {
			dst = append(dst, ',')
		}
		dst = jsonstr.Append(dst, id)
		dst = append(dst, ":{"...)
		for e, first := u.head[k], true; e >= 0; e, first = u.entries[e].next, false {
			if !first {
				dst = append(dst, ',')
			}
			ent := &u.entries[e]
			dst = jsonstr.Append(dst, u.models[ent.model])
			dst = u.appendCounts(append(dst, ':'), &ent.c)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `},"unfinished_call_ids":[`...)
	for k, id := range u.unfinished {
		if k > 0 {
			dst = append(dst, ',')
		}
		dst = jsonstr.Append(dst, id)
	}
	return append(dst, "]}"...)
}

func (u *traceUsage) appendCounts(dst []byte, c *counts) []byte {
	dst = append(dst, `{"requests":`...)
	dst = strconv.AppendInt(dst, c.requests, 10)
	dst = append(dst, `,"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, c.prompt, 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, c.completion, 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, c.total, 10)
	dst = append(dst, `,"cache_read_input_tokens":`...)
	dst = strconv.AppendInt(dst, c.cacheRead, 10)
	dst = append(dst, `,"cache_creation_input_tokens":`...)
	dst = strconv.AppendInt(dst, c.cacheCreation, 10)
	dst = append(dst, `,"prompt_tokens_total_cost":`...)
	dst = u.appendCost(dst, c.promptCost)
	dst = append(dst, `,"completion_tokens_total_cost":`...)
	dst = u.appendCost(dst, c.completionCost)
	dst = append(dst, `,"cache_read_input_tokens_total_cost":`...)
	dst = u.appendCost(dst, c.cacheReadCost)
	dst = append(dst, `,"cache_creation_input_tokens_total_cost":`...)
	dst = u.appendCost(dst, c.cacheCreationCost)
	return append(dst, '}')
}

// appendCost writes a cost as encoding/json would, or null without costs.
func (u *traceUsage) appendCost(dst []byte, f float64) []byte {
	if !u.costs || math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	abs := math.Abs(f)
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		return strconv.AppendFloat(dst, f, 'e', -1, 64)
	}
	return strconv.AppendFloat(dst, f, 'f', -1, 64)
}

// serveTraceUsage serves POST /trace/usage. The request is strict: unknown keys
// are refused.
func (s *Service) serveTraceUsage(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	v.strict(body, bodyLoc, "project_id", "filter", "query", "include_costs", "limit")
	projectID, _ := v.reqString(body, "project_id", bodyLoc)
	filter := parseFilter(&v, body["filter"], at(bodyLoc, "filter"))
	query := parseQuery(&v, body["query"], at(bodyLoc, "query"))
	includeCosts := v.optBool(body, "include_costs", bodyLoc, false)
	limit := v.optNonNegInt(body, "limit", bodyLoc, defaultTraceUsageLimit)
	if v.failed() {
		return v.err()
	}
	calls, pricing, e := s.usageCalls(ctx, key, projectID, limit > 0, includeCosts, func(projectID int64) ([]trace.UsageCall, error) {
		return s.store.TraceUsageCalls(ctx, projectID, filter, query, limit)
	})
	if e != nil {
		return e
	}
	writeUsage(rc, computeTraceUsage(calls, pricing, includeCosts), len(calls))
	return nil
}

// usageCalls resolves the project a usage request names and, when it exists
// and want says the request can cover any call, reads the calls with read
// and, for include_costs, the project's prices. The prices are the
// configured ones otherwise.
func (s *Service) usageCalls(ctx context.Context, key *auth.Key, projectID string, want, includeCosts bool,
	read func(projectID int64) ([]trace.UsageCall, error)) ([]trace.UsageCall, map[string]config.Pricing, *apiError) {
	p, found, e := s.resolveProject(ctx, key, projectID, at(bodyLoc, "project_id"), forRead)
	if e != nil {
		return nil, nil, e
	}
	pricing := s.pricing()
	if !found || !want {
		return nil, pricing, nil
	}
	calls, err := read(p.ID)
	if err != nil {
		return nil, nil, internalError(err)
	}
	if includeCosts {
		if pricing, err = s.projectPricing(ctx, p.ID); err != nil {
			return nil, nil, internalError(err)
		}
	}
	return calls, pricing, nil
}

// writeUsage answers with roll-up u, which covers about rows rows.
func writeUsage(rc *fasthttp.RequestCtx, u *traceUsage, rows int) {
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetContentType("application/json")
	rc.SetBody(u.appendJSON(make([]byte, 0, 64+rows*128)))
}

// projectPricing returns the prices include_costs uses in a project, per
// million tokens by model id: the configured prices with the project's own
// (set through /cost/create, in effect now) laid over them. A project
// price has no cached-prompt price, so cached prompt tokens cost what the
// others do.
func (s *Service) projectPricing(ctx context.Context, projectID int64) (map[string]config.Pricing, error) {
	configured := s.pricing()
	if s.weave == nil {
		return configured, nil
	}
	own, err := s.weave.ProjectPrices(ctx, projectID, time.Now())
	if err != nil || len(own) == 0 {
		return configured, err
	}
	merged := make(map[string]config.Pricing, len(configured)+len(own))
	for m, p := range configured {
		merged[m] = p
	}
	for m, p := range own {
		merged[m] = config.Pricing{PromptPerMTok: p.PromptTokenCost * 1e6, CompletionPerMTok: p.CompletionTokenCost * 1e6}
	}
	return merged, nil
}

// maxUsageCallIDs bounds the call_ids of one /calls/usage request.
const maxUsageCallIDs = 1000

// serveCallsUsage serves POST /calls/usage {"project_id","call_ids",
// "include_costs","limit"} → {"call_usage": {id: {model: usage}},
// "unfinished_call_ids"}: Weave's CallsUsageReq. Each asked call's usage
// is its own plus that of all its descendants, whatever the traces hold
// besides (the calls of the asked calls' traces are read, at most limit of
// them); unfinished_call_ids lists the unfinished calls among the asked
// calls and their descendants. An asked id that names no call gets no key.
func (s *Service) serveCallsUsage(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, _ pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	v.strict(body, bodyLoc, "project_id", "call_ids", "include_costs", "limit")
	projectID, _ := v.reqString(body, "project_id", bodyLoc)
	ids := v.reqStringList(body, "call_ids", bodyLoc, maxUsageCallIDs)
	includeCosts := v.optBool(body, "include_costs", bodyLoc, false)
	limit := v.optNonNegInt(body, "limit", bodyLoc, defaultTraceUsageLimit)
	if v.failed() {
		return v.err()
	}
	calls, pricing, e := s.usageCalls(ctx, key, projectID, limit > 0 && len(ids) > 0, includeCosts, func(projectID int64) ([]trace.UsageCall, error) {
		return s.store.CallsUsageCalls(ctx, projectID, ids, limit)
	})
	if e != nil {
		return e
	}
	u := computeTraceUsage(calls, pricing, includeCosts)
	u.keepSubtrees(calls, ids)
	writeUsage(rc, u, len(ids))
	return nil
}

// keepSubtrees narrows a roll-up to the asked calls: call_usage keeps
// their keys only, in the order asked, and unfinished_call_ids the
// unfinished calls of their subtrees.
func (u *traceUsage) keepSubtrees(calls []trace.UsageCall, asked []string) {
	pos := make(map[string]int, len(u.ids))
	for k, id := range u.ids {
		pos[id] = k
	}
	parent := make(map[string]string, len(calls))
	for i := range calls {
		parent[calls[i].ID] = calls[i].ParentID
	}
	want := make(map[string]bool, len(asked))
	ids, head := make([]string, 0, len(asked)), make([]int32, 0, len(asked))
	for _, id := range asked {
		k, ok := pos[id]
		if !ok || want[id] {
			continue
		}
		want[id] = true
		ids, head = append(ids, id), append(head, u.head[k])
	}
	var unfinished []string
	for _, id := range u.unfinished {
		// Walk up to an asked call; the walk is bounded by the number of
		// calls, so that a parent cycle cannot hold it.
		for cur, steps := id, 0; cur != "" && steps <= len(calls); cur, steps = parent[cur], steps+1 {
			if want[cur] {
				unfinished = append(unfinished, id)
				break
			}
		}
	}
	u.ids, u.head, u.unfinished = ids, head, unfinished
}

// callPrice is the price of model in a call: the per-token prices its
// summary.weave.costs recorded for the model (what it was costed at when
// it was logged) when it has them, else pricing's.
func callPrice(costs, model string, pricing map[string]config.Pricing) config.Pricing {
	if costs != "" {
		r := gjson.Get(costs, gjsonKey(model))
		p, c := r.Get("prompt_token_cost"), r.Get("completion_token_cost")
		if p.Type == gjson.Number && c.Type == gjson.Number {
			return config.Pricing{PromptPerMTok: p.Num * 1e6, CompletionPerMTok: c.Num * 1e6}
		}
	}
	return pricing[model]
}

// gjsonKey escapes a key for a gjson or sjson path (model ids hold dots).
func gjsonKey(k string) string {
	var b []byte
	for i := 0; i < len(k); i++ {
		switch k[i] {
		case '.', '*', '?', '|', '#', '@', '\\', '!', '=', '<', '>', '%', ':':
			b = append(b, '\\')
		}
		b = append(b, k[i])
	}
	return string(b)
}

// summaryWithCosts returns a call's summary with summary.weave.costs
// filled in, per model of summary.usage that has a price, as Weave's
// include_costs does: the counts, the per-token prices and the totals.
// Prices the summary recorded already are kept.
func summaryWithCosts(summary json.RawMessage, pricing map[string]config.Pricing) json.RawMessage {
	usage := gjson.GetBytes(summary, "usage")
	if !usage.IsObject() {
		return summary
	}
	costs := gjson.GetBytes(summary, "weave.costs").Raw
	out := summary
	parseUsage(usage.Raw, func(model string, c counts) {
		price := callPrice(costs, model, pricing)
		if price == (config.Pricing{}) {
			return
		}
		priceCounts(&c, price)
		entry, err := json.Marshal(weaveCost{
			Requests: c.requests, PromptTokens: c.prompt, CompletionTokens: c.completion, TotalTokens: c.total,
			PromptTokenCost: price.PromptPerMTok / 1e6, CompletionTokenCost: price.CompletionPerMTok / 1e6,
			PromptTokensTotalCost: c.promptCost, CompletionTokensTotalCost: c.completionCost,
			PromptTokenCostUnit: "USD", CompletionTokenCostUnit: "USD",
		})
		if err != nil {
			return
		}
		if b, err := sjson.SetRawBytes(out, "weave.costs."+gjsonKey(model), entry); err == nil {
			out = b
		}
	})
	return out
}

// weaveCost is one model's entry of summary.weave.costs.
type weaveCost struct {
	Requests                  int64   `json:"requests"`
	PromptTokens              int64   `json:"prompt_tokens"`
	CompletionTokens          int64   `json:"completion_tokens"`
	TotalTokens               int64   `json:"total_tokens"`
	PromptTokenCost           float64 `json:"prompt_token_cost"`
	CompletionTokenCost       float64 `json:"completion_token_cost"`
	PromptTokensTotalCost     float64 `json:"prompt_tokens_total_cost"`
	CompletionTokensTotalCost float64 `json:"completion_tokens_total_cost"`
	PromptTokenCostUnit       string  `json:"prompt_token_cost_unit"`
	CompletionTokenCostUnit   string  `json:"completion_token_cost_unit"`
}
