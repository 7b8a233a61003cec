package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate-dev/tollgate/config"
)

// orgConfig is a gateway with two simulated models whose prices make one
// request cost cents: demo costs 8 prompt tokens at $1000/MTok and 16
// completion tokens at $30000/MTok, 48.8 cents.
func orgConfig(t *testing.T, dir, extra string) *config.Config {
	t.Helper()
	yaml := fmt.Sprintf(`
listen: "127.0.0.1:0"
log: {level: error}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: sim
    simulated: {inter_token: 1ms, tokens: 16}
models:
  - name: demo
    backends: [sim]
    pricing: {prompt_per_mtok: 1000, completion_per_mtok: 30000}
  - name: demo-2
    backends: [sim]
    pricing: {prompt_per_mtok: 2000, completion_per_mtok: 60000}
store: {path: %q}
usage: {flush_interval: 50ms}
%s
`, adminKey, filepath.Join(dir, "tollgate.db"), extra)
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// sdkClient is an openai-go client of the gateway at base with key, which
// does not retry, so that each call is one request.
func sdkClient(base, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(key), option.WithAdminAPIKey(key),
		option.WithMaxRetries(0))
}

// complete makes one chat completion of model with max_tokens 16.
func complete(cl openai.Client, model string) (*openai.ChatCompletion, error) {
	return cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("say hello to me")},
		MaxTokens: openai.Int(16),
	})
}

// sdkError is err as the SDK's API error, failing the test otherwise.
func sdkError(t *testing.T, err error, status int, code string) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v, want an API error %d %s", err, status, code)
	}
	if e.StatusCode != status || e.Code != code || e.Message == "" {
		t.Fatalf("error %d code %q type %q message %q; want %d %q", e.StatusCode, e.Code, e.Type, e.Message, status, code)
	}
	return e
}

// within retries try every 50 ms until it returns nil or d has passed,
// and returns its last error.
func within(d time.Duration, try func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := try()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// settleAfterChange waits out the enforcer's poll, so that a change made
// through the Admin API applies before the next request.
func settleAfterChange() { time.Sleep(time.Second) }

// awayFromMinuteEnd waits for a new UTC minute when fewer than 10 s are
// left of this one, so that requests counted against a per-minute limit
// fall in one window.
func awayFromMinuteEnd() {
	if left := time.Minute - time.Duration(time.Now().Second())*time.Second; left < 10*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
}

// TestAdminAPIEnforcedWithSDK runs the Admin API's flow with openai-go's
// admin client against the whole gateway: a service account's key
// authenticates completions charged to its project's team, model
// permissions, a per-model rate limit and a spend limit are enforced, and
// deleting the account revokes its key.
func TestAdminAPIEnforcedWithSDK(t *testing.T) {
	cfg := orgConfig(t, t.TempDir(), "")
	r := start(t, cfg)
	ctx := context.Background()
	orgs := sdkClient(r.base, adminKey).Admin.Organization

	p, err := orgs.Projects.New(ctx, openai.AdminOrganizationProjectNewParams{Name: "research"})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := orgs.Projects.ServiceAccounts.New(ctx, p.ID, openai.AdminOrganizationProjectServiceAccountNewParams{Name: "bot"})
	if err != nil {
		t.Fatal(err)
	}
	bot := sdkClient(r.base, sa.APIKey.Value)
	succeeded := 0
	// The key works once the enforcer has read it (a poll at most).
	if err := within(2*time.Second, func() error { _, err := complete(bot, "demo"); return err }); err != nil {
		t.Fatalf("the service account's key does not work: %v", err)
	}
	succeeded++

	t.Run("model permissions", func(t *testing.T) {
		if _, err := orgs.Projects.ModelPermissions.Update(ctx, p.ID, openai.AdminOrganizationProjectModelPermissionUpdateParams{
			Mode: "allow_list", ModelIDs: []string{"demo"}}); err != nil {
			t.Fatal(err)
		}
		err := within(2*time.Second, func() error {
			if _, err := complete(bot, "demo-2"); err == nil {
				succeeded++
				return errors.New("demo-2 still allowed")
			} else {
				return nil
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		_, err = complete(bot, "demo-2")
		e := sdkError(t, err, http.StatusForbidden, "model_not_found")
		if e.Message != "Project `"+p.ID+"` does not have access to model `demo-2`" {
			t.Fatalf("message %q", e.Message)
		}
		if _, err := complete(bot, "demo"); err != nil {
			t.Fatalf("the allowed model is refused: %v", err)
		}
		succeeded++
	})

	t.Run("rate limit", func(t *testing.T) {
		if _, err := orgs.Projects.RateLimits.UpdateRateLimit(ctx, p.ID, "rl-demo",
			openai.AdminOrganizationProjectRateLimitUpdateRateLimitParams{MaxRequestsPer1Minute: openai.Int(3)}); err != nil {
			t.Fatal(err)
		}
		settleAfterChange()
		awayFromMinuteEnd()
		for i := 0; i < 3; i++ {
			if _, err := complete(bot, "demo"); err != nil {
				t.Fatalf("request %d under the limit: %v", i+1, err)
			}
			succeeded++
		}
		_, err := complete(bot, "demo")
		e := sdkError(t, err, http.StatusTooManyRequests, "rate_limit_exceeded")
		if e.Type != "requests" || e.Response.Header.Get("Retry-After") == "" || e.Response.Header.Get("X-Should-Retry") == "false" {
			t.Fatalf("rate limit error type %q headers %v", e.Type, e.Response.Header)
		}
		// Another model of the project has no limit.
		if _, err := orgs.Projects.ModelPermissions.Delete(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := orgs.Projects.RateLimits.UpdateRateLimit(ctx, p.ID, "rl-demo",
			openai.AdminOrganizationProjectRateLimitUpdateRateLimitParams{MaxRequestsPer1Minute: openai.Int(0)}); err != nil {
			t.Fatal(err)
		}
		settleAfterChange()
		if _, err := complete(bot, "demo"); err != nil {
			t.Fatalf("the lifted rate limit still refuses: %v", err)
		}
		succeeded++
	})

	t.Run("spend limit", func(t *testing.T) {
		// A project of its own, so that its spend is what this test makes.
		q, err := orgs.Projects.New(ctx, openai.AdminOrganizationProjectNewParams{Name: "spender"})
		if err != nil {
			t.Fatal(err)
		}
		qa, err := orgs.Projects.ServiceAccounts.New(ctx, q.ID, openai.AdminOrganizationProjectServiceAccountNewParams{Name: "bot"})
		if err != nil {
			t.Fatal(err)
		}
		// A request costs 48.8 cents and reserves up to 72 (24 tokens at
		// the highest price): 150 cents admit two, refuse the third.
		if _, err := orgs.Projects.SpendLimit.Update(ctx, q.ID, openai.AdminOrganizationProjectSpendLimitUpdateParams{
			Currency: "USD", Interval: "month", ThresholdAmount: 150}); err != nil {
			t.Fatal(err)
		}
		settleAfterChange()
		spender := sdkClient(r.base, qa.APIKey.Value)
		for i := 0; i < 2; i++ {
			if _, err := complete(spender, "demo"); err != nil {
				t.Fatalf("request %d within the spend limit: %v", i+1, err)
			}
		}
		_, err = complete(spender, "demo")
		e := sdkError(t, err, http.StatusTooManyRequests, "insufficient_quota")
		if e.Type != "insufficient_quota" || e.Response.Header.Get("X-Should-Retry") != "false" ||
			e.Message[:len("You exceeded your current quota")] != "You exceeded your current quota" {
			t.Fatalf("quota error type %q message %q headers %v", e.Type, e.Message, e.Response.Header)
		}
		if _, err := orgs.Projects.SpendLimit.Delete(ctx, q.ID); err != nil {
			t.Fatal(err)
		}
		if err := within(2*time.Second, func() error { _, err := complete(spender, "demo"); return err }); err != nil {
			t.Fatalf("deleting the spend limit does not admit again: %v", err)
		}
	})

	t.Run("revoked key", func(t *testing.T) {
		if _, err := orgs.Projects.ServiceAccounts.Delete(ctx, p.ID, sa.ID); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		err := within(2*time.Second, func() error {
			if _, err := complete(bot, "demo"); err == nil {
				succeeded++
				return errors.New("still admitted")
			}
			return nil
		})
		if err != nil {
			t.Fatalf("the deleted account's key still works %v after: %v", time.Since(deleted), err)
		}
		_, err = complete(bot, "demo")
		sdkError(t, err, http.StatusUnauthorized, "invalid_api_key")
	})

	r.stop(t)
	use := usageByProject(t, cfg)[p.ID+"/"+cfg.Usage.DefaultProject]
	if use.Requests != int64(succeeded) || use.OutputTokens != int64(16*succeeded) {
		t.Fatalf("usage of %s = %+v, want %d requests of 16 output tokens", p.ID, use, succeeded)
	}
}
