package org

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
)

// Bounds of a spend alert's body.
const (
	maxRecipients    = 100
	maxRecipientLen  = 320
	maxWebhookURLLen = 2048
)

// parseSpendAlert validates a spend alert's body, OpenAI's
// {threshold_amount (cents), currency: "USD", interval: "month",
// notification_channel: {type: "email", recipients, subject_prefix}} and
// tollgate's optional webhook_url.
func parseSpendAlert(body []byte) (SpendAlert, error) {
	var in struct {
		Threshold *int64  `json:"threshold_amount"`
		Currency  *string `json:"currency"`
		Interval  *string `json:"interval"`
		Channel   *struct {
			Type          *string   `json:"type"`
			Recipients    *[]string `json:"recipients"`
			SubjectPrefix *string   `json:"subject_prefix"`
		} `json:"notification_channel"`
		WebhookURL *string `json:"webhook_url"`
	}
	if err := decode(body, &in); err != nil {
		return SpendAlert{}, err
	}
	switch {
	case in.Threshold == nil:
		return SpendAlert{}, invalid("threshold_amount", "Missing required parameter: 'threshold_amount'.")
	case *in.Threshold < 1 || *in.Threshold > maxSpendCents:
		return SpendAlert{}, invalid("threshold_amount", "Invalid 'threshold_amount': expected cents between 1 and %d, got %d.", int64(maxSpendCents), *in.Threshold)
	case in.Currency == nil:
		return SpendAlert{}, invalid("currency", "Missing required parameter: 'currency'.")
	case *in.Currency != "USD":
		return SpendAlert{}, invalid("currency", "Invalid 'currency': expected 'USD', got '%s'.", clip(*in.Currency))
	case in.Interval == nil:
		return SpendAlert{}, invalid("interval", "Missing required parameter: 'interval'.")
	case *in.Interval != "month":
		return SpendAlert{}, invalid("interval", "Invalid 'interval': expected 'month', got '%s'.", clip(*in.Interval))
	case in.Channel == nil:
		return SpendAlert{}, invalid("notification_channel", "Missing required parameter: 'notification_channel'.")
	case in.Channel.Type == nil || *in.Channel.Type != "email":
		return SpendAlert{}, invalid("notification_channel.type", "Invalid 'notification_channel.type': expected 'email'.")
	case in.Channel.Recipients == nil:
		return SpendAlert{}, invalid("notification_channel.recipients", "Missing required parameter: 'notification_channel.recipients'.")
	case len(*in.Channel.Recipients) > maxRecipients:
		return SpendAlert{}, invalid("notification_channel.recipients", "Invalid 'notification_channel.recipients': expected at most %d addresses.", maxRecipients)
	}
	sa := SpendAlert{ThresholdCents: *in.Threshold, Recipients: make([]string, 0, len(*in.Channel.Recipients))}
	for i, r := range *in.Channel.Recipients {
		if r == "" || len(r) > maxRecipientLen {
			return SpendAlert{}, invalid(fmt.Sprintf("notification_channel.recipients[%d]", i),
				"Invalid 'notification_channel.recipients[%d]': expected an address of 1 to %d characters.", i, maxRecipientLen)
		}
		sa.Recipients = append(sa.Recipients, r)
	}
	if p := in.Channel.SubjectPrefix; p != nil {
		if len(*p) > maxNameLen {
			return SpendAlert{}, invalid("notification_channel.subject_prefix", "Invalid 'notification_channel.subject_prefix': expected at most %d characters.", maxNameLen)
		}
		sa.SubjectPrefix = *p
	}
	if w := in.WebhookURL; w != nil && *w != "" {
		u, err := url.Parse(*w)
		if err != nil || len(*w) > maxWebhookURLLen || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return SpendAlert{}, invalid("webhook_url", "Invalid 'webhook_url': expected an http or https URL of at most %d characters.", maxWebhookURLLen)
		}
		sa.WebhookURL = *w
	}
	return sa, nil
}

func (s *Service) spendAlertAudit(actor, typ string, sa SpendAlert) AuditLog {
	return s.audit(actor, typ, sa.ProjectID, sa.ID, map[string]any{"threshold_amount": sa.ThresholdCents, "currency": "USD", "interval": "month"})
}

// CreateSpendAlert validates body and adds the alert to the project.
func (s *Service) CreateSpendAlert(ctx context.Context, actor, projectID string, body []byte) (SpendAlert, error) {
	sa, err := parseSpendAlert(body)
	if err != nil {
		return SpendAlert{}, err
	}
	if _, err := s.activeProject(ctx, projectID); err != nil {
		return SpendAlert{}, err
	}
	sa.ID, sa.ProjectID, sa.CreatedAt = newID("spend_alert_"), projectID, s.now().Unix()
	return sa, s.store.PutSpendAlert(ctx, sa, s.spendAlertAudit(actor, "spend_alert.created", sa))
}

// UpdateSpendAlert validates body (the whole alert, as on create) and
// replaces the alert's settings. A new threshold may fire again within
// the month.
func (s *Service) UpdateSpendAlert(ctx context.Context, actor, projectID, id string, body []byte) (SpendAlert, error) {
	sa, err := parseSpendAlert(body)
	if err != nil {
		return SpendAlert{}, err
	}
	if _, err := s.activeProject(ctx, projectID); err != nil {
		return SpendAlert{}, err
	}
	old, err := s.GetSpendAlert(ctx, projectID, id)
	if err != nil {
		return SpendAlert{}, err
	}
	sa.ID, sa.ProjectID, sa.CreatedAt = old.ID, old.ProjectID, old.CreatedAt
	return sa, s.store.PutSpendAlert(ctx, sa, s.spendAlertAudit(actor, "spend_alert.updated", sa))
}

// GetSpendAlert returns a project's spend alert.
func (s *Service) GetSpendAlert(ctx context.Context, projectID, id string) (SpendAlert, error) {
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return SpendAlert{}, err
	}
	sa, err := s.store.SpendAlert(ctx, projectID, id)
	return sa, notFound(err, "spend alert", id)
}

// ListSpendAlerts lists a project's spend alerts, oldest first.
func (s *Service) ListSpendAlerts(ctx context.Context, projectID string, page Page) ([]SpendAlert, bool, error) {
	page, err := CheckPage(page)
	if err != nil {
		return nil, false, err
	}
	if _, err := s.GetProject(ctx, projectID); err != nil {
		return nil, false, err
	}
	return s.store.SpendAlerts(ctx, projectID, page)
}

// DeleteSpendAlert removes a project's spend alert.
func (s *Service) DeleteSpendAlert(ctx context.Context, actor, projectID, id string) error {
	sa, err := s.GetSpendAlert(ctx, projectID, id)
	if err != nil {
		return err
	}
	return notFound(s.store.DeleteSpendAlert(ctx, projectID, id, s.spendAlertAudit(actor, "spend_alert.deleted", sa)), "spend alert", id)
}

// Alerter defaults.
const (
	// DefaultAlertEvery is how often an Alerter reads the month's spend.
	DefaultAlertEvery = 10 * time.Second
	// webhookTimeout bounds one webhook POST.
	webhookTimeout = 5 * time.Second
	// webhookAttempts is how many times a webhook is tried.
	webhookAttempts = 3
	// webhookQueue bounds the deliveries waiting: more are dropped (and
	// logged) rather than held.
	webhookQueue = 64
)

// AlerterOptions configure an Alerter.
type AlerterOptions struct {
	Store Store
	// Usage is where spend is read from, priced by its price history.
	Usage accounting.CostSource
	// Pricing returns the configuration's current prices.
	Pricing func() map[string]config.Pricing
	// Metrics registers tollgate_spend_alerts_fired_total. Nil registers
	// nothing.
	Metrics prometheus.Registerer
	// Log receives the alert's line. Nil means no logging.
	Log *zap.Logger
	// Every paces the checks. Zero means DefaultAlertEvery.
	Every time.Duration
	// Client posts the webhooks. Nil means a client of its own.
	Client *http.Client
	// RetryWait is the pause between webhook attempts. Zero means 1s.
	RetryWait time.Duration
}

// Alerter fires the projects' spend alerts, off the request path: Run
// reads the month's spend of the projects with alerts, priced as costs
// are, and fires each alert whose threshold the spend reached, once per
// month and threshold across replicas (the store records the firing).
// Webhooks are posted by a goroutine of Run's own, so that a slow or
// failing webhook delays no check.
type Alerter struct {
	opts  AlerterOptions
	fired *prometheus.CounterVec
	queue chan webhookPost
}

// webhookPost is one alert to post.
type webhookPost struct {
	url  string
	body []byte
}

// NewAlerter returns an Alerter; it does nothing until Run.
func NewAlerter(opts AlerterOptions) (*Alerter, error) {
	if opts.Every <= 0 {
		opts.Every = DefaultAlertEvery
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: webhookTimeout}
	}
	if opts.RetryWait <= 0 {
		opts.RetryWait = time.Second
	}
	a := &Alerter{opts: opts, queue: make(chan webhookPost, webhookQueue),
		fired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_spend_alerts_fired_total",
			Help: "Spend alerts fired, by project (Admin API project id)."}, []string{"project"})}
	if opts.Metrics != nil {
		if err := opts.Metrics.Register(a.fired); err != nil {
			return nil, fmt.Errorf("spend alerts metric: %w", err)
		}
	}
	return a, nil
}

// Run checks every Every until ctx ends, and returns once its webhook
// deliveries have stopped.
func (a *Alerter) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.deliver(ctx)
	}()
	t := time.NewTicker(a.opts.Every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			<-done
			return
		case <-t.C:
		}
		err := a.Check(ctx, time.Now())
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			failing = true
			a.opts.Log.Error("checking spend alerts failed; they are checked again at the next tick", zap.Error(err))
		case err == nil && failing:
			failing = false
			a.opts.Log.Info("checking spend alerts works again")
		}
	}
}

// monthStart is the start of now's month, UTC: spend limits' and alerts'
// interval.
func monthStart(now time.Time) time.Time {
	y, m, _ := now.UTC().Date()
	return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
}

// Check fires the alerts whose threshold the month's spend reached at now
// and that have not fired this month at that threshold.
func (a *Alerter) Check(ctx context.Context, now time.Time) error {
	alerts, err := a.opts.Store.ActiveSpendAlerts(ctx)
	if err != nil || len(alerts) == 0 {
		return err
	}
	teams := make([]string, 0, len(alerts))
	for _, sa := range alerts {
		teams = append(teams, sa.ProjectID)
	}
	since := monthStart(now)
	spent, err := monthSpend(ctx, a.opts.Usage, a.opts.Pricing(), since, teams)
	if err != nil {
		return err
	}
	for _, sa := range alerts {
		usd := spent[sa.ProjectID]
		if accounting.NanoUSD(usd) < sa.ThresholdCents*accounting.NanoUSDPerCent {
			continue
		}
		first, err := a.opts.Store.ClaimSpendAlert(ctx, sa.ID, sa.ThresholdCents, since.Unix(), now.Unix())
		if err != nil {
			return err
		}
		if first {
			a.fire(sa, usd, since, now)
		}
	}
	return nil
}

// fire reports one alert: a log line, the metric, and the webhook queued.
func (a *Alerter) fire(sa SpendAlert, usd float64, since, now time.Time) {
	a.opts.Log.Warn("spend alert fired: the project's spend this month reached the alert's threshold",
		zap.String("project", sa.ProjectID), zap.String("alert", sa.ID),
		zap.Int64("threshold_cents", sa.ThresholdCents), zap.Float64("spend_usd", usd))
	a.fired.WithLabelValues(sa.ProjectID).Inc()
	if sa.WebhookURL == "" {
		return
	}
	body, err := json.Marshal(AlertPayload{Object: "project.spend_alert.fired", AlertID: sa.ID, ProjectID: sa.ProjectID,
		ThresholdAmount: sa.ThresholdCents, Currency: "USD", Interval: "month", IntervalStart: since.Unix(),
		Spend: AlertSpend{Value: usd, Currency: "usd"}, FiredAt: now.Unix(), Recipients: sa.Recipients, SubjectPrefix: sa.SubjectPrefix})
	if err != nil {
		a.opts.Log.Error("encoding a spend alert's webhook failed", zap.Error(err))
		return
	}
	select {
	case a.queue <- webhookPost{url: sa.WebhookURL, body: body}:
	default:
		a.opts.Log.Error("spend alert webhook dropped: too many deliveries waiting", zap.String("alert", sa.ID))
	}
}

// AlertPayload is what a spend alert's webhook receives.
type AlertPayload struct {
	Object    string `json:"object"`
	AlertID   string `json:"alert_id"`
	ProjectID string `json:"project_id"`
	// ThresholdAmount is in cents, as the alert's.
	ThresholdAmount int64  `json:"threshold_amount"`
	Currency        string `json:"currency"`
	Interval        string `json:"interval"`
	IntervalStart   int64  `json:"interval_start"`
	// Spend is the month's spend when it fired, in dollars as costs are.
	Spend         AlertSpend `json:"spend"`
	FiredAt       int64      `json:"fired_at"`
	Recipients    []string   `json:"recipients"`
	SubjectPrefix string     `json:"subject_prefix,omitempty"`
}

// AlertSpend is an amount in dollars.
type AlertSpend struct {
	Value    float64 `json:"value"`
	Currency string  `json:"currency"`
}

// deliver posts queued webhooks until ctx ends: each up to
// webhookAttempts times, each attempt bounded by the client's timeout.
func (a *Alerter) deliver(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-a.queue:
			var err error
			for attempt := range webhookAttempts {
				if attempt > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(a.opts.RetryWait << (attempt - 1)):
					}
				}
				if err = a.post(ctx, p); err == nil {
					break
				}
			}
			if err != nil {
				a.opts.Log.Error("spend alert webhook failed", zap.String("url", redactURL(p.url)), zap.Error(err))
			}
		}
	}
}

func (a *Alerter) post(ctx context.Context, p webhookPost) error {
	ctx, cancel := context.WithTimeout(ctx, webhookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(p.body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.opts.Client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("webhook answered %d", resp.StatusCode)
	}
	return nil
}

// redactURL drops a URL's query and credentials, which may hold a token,
// from what is logged.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	return u.Scheme + "://" + u.Host + u.Path
}
