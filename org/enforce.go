package org

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
)

// Limits counts requests, tokens and spend: accounting's Limiter or
// RedisLimiter, built from the projects' limits.
type Limits interface {
	Reserve(s accounting.Subject, estimate int64) (accounting.Reservation, error)
	Settle(r accounting.Reservation, used int64)
}

// LimitsFactory builds the Limits of a set of limits from the previous
// ones (nil the first time), so that counts carry over, with the spend
// counters seeded from spent. It runs off the request path.
type LimitsFactory func(ctx context.Context, prev Limits, limits []config.Limit, spent accounting.LimitsStore) Limits

// DefaultPollEvery is how often an Enforcer polls the change version.
const DefaultPollEvery = 250 * time.Millisecond

// EnforcerOptions configure an Enforcer.
type EnforcerOptions struct {
	Store Store
	// Usage is where spend is read from, priced by its price history.
	Usage accounting.CostSource
	// Keys receives the runtime keys.
	Keys   *auth.Keyring
	Limits LimitsFactory
	// Log reports failed polls. Nil means no logging.
	Log *zap.Logger
	// PollEvery paces the polls. Zero means DefaultPollEvery.
	PollEvery time.Duration
}

// Enforcer holds in memory what the request path enforces of the
// organization: the runtime keys (installed in the Keyring), model
// permissions, and per-model rate limits and spend limits counted on
// Limits. Run polls the store's change version and reloads it all when the
// version moves, so that a change made on any replica applies on every
// other within a poll; no request reads the store.
//
// Spend is counted in billionths of a dollar (accounting.NanoUSD) at the
// configuration's prices: a request reserves its token estimate priced at
// the model's highest price, and settles with its record's cost.
type Enforcer struct {
	opts    EnforcerOptions
	pricing atomic.Pointer[map[string]config.Pricing]
	state   atomic.Pointer[enforcedState]

	// What follows is the poller's own.
	loaded  bool
	version int64
	rules   []config.Limit
	limits  Limits
	failing bool
}

// enforcedState is one immutable reading of the organization.
type enforcedState struct {
	projects map[string]*projectPolicy
	// limits counts every project's limits; nil when none has any.
	limits Limits
}

// projectPolicy is what a project's keys are held to.
type projectPolicy struct {
	// permissions is nil when every model is allowed.
	permissions *ModelPermissions
	// rated holds the models with a rate limit.
	rated map[string]bool
	spend bool
}

// spendKey is the key of the subject a project's spend counts under: no
// rate limit's subject has a key, so the two never select each other.
const spendKey = "$spend"

// NewEnforcer returns an Enforcer holding nothing until Refresh.
func NewEnforcer(opts EnforcerOptions) *Enforcer {
	if opts.PollEvery <= 0 {
		opts.PollEvery = DefaultPollEvery
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	e := &Enforcer{opts: opts}
	e.state.Store(&enforcedState{})
	return e
}

// SetPricing installs the models' prices spend is counted at (the
// configuration's, at build and at every reload).
func (e *Enforcer) SetPricing(p map[string]config.Pricing) { e.pricing.Store(&p) }

func (e *Enforcer) price(model string) config.Pricing {
	return e.prices()[model]
}

func (e *Enforcer) prices() map[string]config.Pricing {
	if p := e.pricing.Load(); p != nil {
		return *p
	}
	return nil
}

// Run polls until ctx ends, refreshing when the version moves.
func (e *Enforcer) Run(ctx context.Context) {
	t := time.NewTicker(e.opts.PollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := e.Refresh(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil && !e.failing:
			e.failing = true
			e.opts.Log.Error("reading the Admin API's keys and limits failed; the last ones read keep applying", zap.Error(err))
		case err == nil && e.failing:
			e.failing = false
			e.opts.Log.Info("reading the Admin API's keys and limits works again")
		}
	}
}

// Refresh reads the organization if its version moved since the last read
// and installs it. Only one goroutine may call it at a time (Run's, or
// the builder's before Run starts).
func (e *Enforcer) Refresh(ctx context.Context) error {
	v, err := e.opts.Store.Version(ctx)
	if err != nil {
		return err
	}
	if e.loaded && v == e.version {
		return nil
	}
	en, err := e.opts.Store.Enforced(ctx)
	if err != nil {
		return err
	}
	st := &enforcedState{projects: make(map[string]*projectPolicy, len(en.Projects))}
	for _, id := range en.Projects {
		p := &projectPolicy{}
		if mp, ok := en.Permissions[id]; ok {
			p.permissions = &mp
		}
		st.projects[id] = p
	}
	rules := make([]config.Limit, 0, len(en.RateLimits)+len(en.SpendLimits))
	for _, rl := range en.RateLimits {
		p := st.projects[rl.ProjectID]
		if p == nil || rl.MaxRequestsPer1Minute <= 0 && rl.MaxTokensPer1Minute <= 0 {
			continue
		}
		if p.rated == nil {
			p.rated = map[string]bool{}
		}
		p.rated[rl.Model] = true
		rules = append(rules, config.Limit{Team: rl.ProjectID, Project: rl.Model,
			RPM: rl.MaxRequestsPer1Minute, TPM: rl.MaxTokensPer1Minute})
	}
	for _, id := range en.Projects {
		if sl, ok := en.SpendLimits[id]; ok {
			st.projects[id].spend = true
			// A limit of 0 cents refuses every request: the budget is the
			// smallest the limiter counts.
			rules = append(rules, config.Limit{Team: id, Key: spendKey, BudgetWindow: "month",
				TokenBudget: max(sl.ThresholdCents*accounting.NanoUSDPerCent, 1)})
		}
	}
	if !e.loaded || !slices.Equal(rules, e.rules) {
		e.limits = e.opts.Limits(ctx, e.limits, rules, spentCost{e})
		e.rules = rules
	}
	st.limits = e.limits
	keys := make(map[[sha256.Size]byte]*auth.Key, len(en.Keys))
	for _, k := range en.Keys {
		keys[k.Digest] = auth.RuntimeKey(k.KeyID, k.ProjectID, k.Digest)
	}
	// The policies go in before the keys, so that a new key is never
	// admitted without its project's.
	e.state.Store(st)
	e.opts.Keys.SetRuntime(keys)
	e.loaded, e.version = true, en.Version
	return nil
}

// Refusal is a request the organization's policies refuse, as OpenAI
// answers it: the proxy writes it in OpenAI's error shape.
type Refusal struct {
	Status  int
	Type    string
	Code    string
	Message string
	// RetryAfter, when positive, is when the request may succeed again.
	RetryAfter time.Duration
	// NoRetry tells SDKs not to retry (x-should-retry: false): retrying
	// cannot succeed before an administrator acts.
	NoRetry bool
}

func (r *Refusal) Error() string { return r.Message }

// Admit checks a request of key for model against its project's policies
// and reserves estimate tokens (its cost, for spend) against the
// project's limits. The Hold it returns (nil when nothing was reserved)
// must be settled with the request's record; a refusal is a *Refusal.
// Configured keys belong to no project and pass untouched.
func (e *Enforcer) Admit(key *auth.Key, model string, estimate int64) (accounting.Hold, error) {
	if key.Project == "" {
		return nil, nil
	}
	st := e.state.Load()
	p := st.projects[key.Project]
	if p == nil {
		return nil, nil
	}
	if p.permissions != nil && !p.permissions.Allows(model) {
		return nil, &Refusal{Status: 403, Type: "invalid_request_error", Code: "model_not_found", NoRetry: true,
			Message: "Project `" + key.Project + "` does not have access to model `" + model + "`"}
	}
	rated := p.rated[model]
	if !p.spend && !rated {
		return nil, nil
	}
	h := &hold{limits: st.limits, enforcer: e, project: key.Project}
	if p.spend {
		price := e.price(model)
		perToken := max(price.PromptPerMTok, price.CompletionPerMTok, price.CachedPromptPerMTok, price.CacheWritePerMTok) / 1e6
		r, err := st.limits.Reserve(accounting.Subject{Team: key.Project, Key: spendKey}, accounting.NanoUSD(float64(estimate)*perToken))
		if err != nil {
			return nil, quotaRefusal(err)
		}
		h.spend = r
	}
	if rated {
		r, err := st.limits.Reserve(accounting.Subject{Team: key.Project, Project: model}, estimate)
		if err != nil {
			st.limits.Settle(h.spend, 0)
			return nil, rateRefusal(err, key.Project, model)
		}
		h.rate = r
	}
	return h, nil
}

// hold is what Admit reserved for one request.
type hold struct {
	limits      Limits
	enforcer    *Enforcer
	project     string
	spend, rate accounting.Reservation
}

// Settle implements accounting.Hold: the rate limits get the tokens used,
// the spend limit their cost at the model's price.
func (h *hold) Settle(rec *accounting.Record) {
	h.limits.Settle(h.rate, rec.TotalTokens)
	cost := accounting.PriceUsage(h.enforcer.price(rec.Model), rec.PromptTokens, rec.CompletionTokens, rec.CachedTokens, rec.CacheWriteTokens)
	h.limits.Settle(h.spend, accounting.NanoUSD(cost.Total()))
}

func quotaRefusal(err error) error {
	var le *accounting.LimitError
	if !errors.As(err, &le) {
		return err
	}
	return &Refusal{Status: 429, Type: accounting.CodeInsufficientQuota, Code: accounting.CodeInsufficientQuota, NoRetry: true,
		Message: "You exceeded your current quota, please check your plan and billing details. " +
			"For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."}
}

func rateRefusal(err error, project, model string) error {
	var le *accounting.LimitError
	if !errors.As(err, &le) {
		return err
	}
	what, typ := "requests per min (RPM)", "requests"
	if le.Kind == accounting.RefusedTPM {
		what, typ = "tokens per min (TPM)", "tokens"
	}
	return &Refusal{Status: 429, Type: typ, Code: accounting.CodeRateLimitExceeded, RetryAfter: le.RetryAfter,
		Message: fmt.Sprintf("Rate limit reached for %s in project %s on %s. Please try again in %ds.",
			model, project, what, int64(le.RetryAfter/time.Second))}
}

// spentCost is the usage store's spend of each project since a time, in
// the spend counters' unit, for seeding them.
type spentCost struct{ e *Enforcer }

// SpentTokens implements accounting.LimitsStore.
func (s spentCost) SpentTokens(ctx context.Context, since time.Time) ([]accounting.SpentRow, error) {
	spent, err := monthSpend(ctx, s.e.opts.Usage, s.e.prices(), since, nil)
	if err != nil {
		return nil, err
	}
	byTeam := make(map[string]int64, len(spent))
	for team, usd := range spent {
		byTeam[team] = accounting.NanoUSD(usd)
	}
	out := make([]accounting.SpentRow, 0, len(byTeam))
	for team, n := range byTeam {
		out = append(out, accounting.SpentRow{Subject: accounting.Subject{Team: team, Key: spendKey}, Tokens: n})
	}
	return out, nil
}

// monthSpend is each team's cost since since (up to a minute from now), in
// dollars, priced by the price history: the spend limits' and the spend
// alerts' reading. teams, when not nil, keeps only those.
func monthSpend(ctx context.Context, src accounting.CostSource, current map[string]config.Pricing, since time.Time, teams []string) (map[string]float64, error) {
	end := time.Now().Add(time.Minute)
	rows, err := accounting.ReadCosts(ctx, src, current, accounting.UsageQuery{Start: since, End: end, BucketWidth: end.Sub(since),
		GroupByProject: true, Teams: teams})
	if err != nil {
		return nil, fmt.Errorf("spent cost: %w", err)
	}
	out := map[string]float64{}
	for _, r := range rows {
		out[r.Team] += r.Cost.Total()
	}
	return out, nil
}
