package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/tidwall/gjson"
)

// TestReplicasShareAdminAPI runs three gateway processes on one PostgreSQL
// and one Redis: a key created on one replica works on another within a
// second, a spend limit set on one holds across all three under
// concurrent load to within one request's cost, and a key revoked on one
// is refused by every replica within a second.
func TestReplicasShareAdminAPI(t *testing.T) {
	st, redisAddr, prefix := replicaStores(t)
	// A request costs 8 prompt tokens at $1000/MTok and 10 completion
	// tokens at $30000/MTok: 30.8 cents; it reserves its 18 estimated
	// tokens at the higher price, 54 cents.
	config := fmt.Sprintf(`
log: {level: warn}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: sim
    simulated: {tokens: 16}
models:
  - name: demo
    backends: [sim]
    pricing: {prompt_per_mtok: 1000, completion_per_mtok: 30000}
store: {driver: postgres, dsn: %q}
usage: {flush_interval: 100ms}
limits_backend: {driver: redis, addr: %q, prefix: %q, timeout: 5s}
`, adminKey, st.DSN, redisAddr, prefix)
	bin := replicaBinary(t)
	replicas := []*replica{startReplica(t, bin, config), startReplica(t, bin, config), startReplica(t, bin, config)}
	ctx := context.Background()
	admin0 := sdkClient(replicas[0].base, adminKey)
	orgs := admin0.Admin.Organization

	p, err := orgs.Projects.New(ctx, openai.AdminOrganizationProjectNewParams{Name: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := orgs.Projects.ServiceAccounts.New(ctx, p.ID, openai.AdminOrganizationProjectServiceAccountNewParams{Name: "bot"})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	client := &http.Client{Timeout: 10 * time.Second}
	body := chatBody(10, "")
	works := func(r *replica) error {
		code, resp, err := r.post(client, sa.APIKey.Value, "", body)
		if err == nil && code != 200 {
			err = fmt.Errorf("%d %s", code, resp)
		}
		return err
	}
	if err := within(time.Second, func() error { return works(replicas[1]) }); err != nil {
		t.Fatalf("a key created on replica 0 does not work on replica 1 within 1 s: %v", err)
	}
	t.Logf("key created on replica 0 worked on replica 1 after %v", time.Since(created))

	// The spend limit: 1000 cents, with 30.8 cents spent by the request
	// above (its record may not be in the store yet when the limit is
	// read, so it is waited for).
	time.Sleep(300 * time.Millisecond)
	if _, err := orgs.Projects.SpendLimit.Update(ctx, p.ID, openai.AdminOrganizationProjectSpendLimitUpdateParams{
		Currency: "USD", Interval: "month", ThresholdAmount: 1000}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // every replica's poll
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, resp, err := replicas[i%3].post(client, sa.APIKey.Value, "", body)
			switch {
			case err != nil:
				t.Error(err)
			case code == 200:
				admitted.Add(1)
			case code == 429 && gjson.Get(resp, "error.code").String() == "insufficient_quota":
				refused.Add(1)
			default:
				t.Errorf("unexpected %d %s", code, resp)
			}
		}()
	}
	wg.Wait()
	// A burst refuses requests while others hold reservations, so it may
	// stop short of the limit; requests one at a time then take the rest,
	// until the first refusal says the next would cross it.
	for i := 0; ; i++ {
		if i == 40 {
			t.Fatal("40 requests one at a time after the burst were all admitted past a 1000-cent limit")
		}
		code, resp, err := replicas[i%3].post(client, sa.APIKey.Value, "", body)
		if err != nil {
			t.Fatal(err)
		}
		if code != 200 {
			if code != 429 || gjson.Get(resp, "error.code").String() != "insufficient_quota" {
				t.Fatalf("unexpected %d %s", code, resp)
			}
			refused.Add(1)
			break
		}
		admitted.Add(1)
	}
	spent := 30.8 * float64(1+admitted.Load())
	t.Logf("spend limit 1000 cents across 3 replicas: %d admitted, %d refused, %.1f cents spent", admitted.Load(), refused.Load(), spent)
	if spent > 1000 || spent < 1000-54-30.8 {
		t.Errorf("spent %.1f cents against a limit of 1000: want at most the limit, and short of it by less than one request's reservation (54) and cost (30.8)", spent)
	}

	// Revoked on replica 2, refused on every replica within a second.
	admin2 := sdkClient(replicas[2].base, adminKey)
	if _, err := admin2.Admin.Organization.Projects.ServiceAccounts.Delete(ctx, p.ID, sa.ID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	err = within(time.Second, func() error {
		for i, r := range replicas {
			code, _, err := r.post(client, sa.APIKey.Value, "", body)
			if err != nil {
				return err
			}
			if code != http.StatusUnauthorized {
				return fmt.Errorf("replica %d answered %d", i, code)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("a key revoked on replica 2 still works after 1 s: %v", err)
	}
	t.Logf("key revoked on replica 2 refused by all after %v", time.Since(revoked))
}
