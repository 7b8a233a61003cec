package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// usageCmdConfig writes a configuration file for the store cfg and
// returns its path.
func usageCmdConfig(t *testing.T, cfg config.Store) string {
	t.Helper()
	storeLine := fmt.Sprintf("store: {path: %q}", cfg.Path)
	if cfg.Driver == storetest.Postgres {
		storeLine = fmt.Sprintf("store: {driver: postgres, dsn: %q}", cfg.DSN)
	}
	yaml := `auth:
  keys:
    - {name: admin, key: "sk-usage-cmd-test", admin: true}
backends:
  - name: sim
    simulated: {tokens: 4}
models:
  - name: demo
    backends: [sim]
` + storeLine + "\n"
	path := filepath.Join(t.TempDir(), "tollgate.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// usageTable runs `tollgate usage` with args and returns its table rows,
// each split into fields, without the title lines.
func usageTable(t *testing.T, args ...string) [][]string {
	t.Helper()
	var out bytes.Buffer
	if err := runUsage(args, &out); err != nil {
		t.Fatalf("tollgate usage %v: %v", args, err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "Usage from ") {
		t.Fatalf("output:\n%s", out.String())
	}
	var rows [][]string
	for _, l := range lines[2:] {
		rows = append(rows, strings.Fields(l))
	}
	return rows
}

// seedUsage stores recs in the store cfg and returns the path of a
// configuration file for it.
func seedUsage(t *testing.T, cfg config.Store, recs ...accounting.Record) string {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = db.InsertRecords(ctx, recs)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	return usageCmdConfig(t, cfg)
}

// usageRecord is a request call of model demo on backend sim by key admin
// for acme/bot, an hour ago, that answered 200 with in prompt and out
// completion tokens; tests change the fields they vary.
func usageRecord(call string, in, out int64) accounting.Record {
	at := time.Now().Add(-time.Hour)
	return accounting.Record{
		RequestID: call, CallID: call, TraceID: call, KeyName: "admin", Team: "acme", Project: "bot",
		Model: "demo", Backend: "sim", Status: 200,
		PromptTokens: in, CompletionTokens: out, TotalTokens: in + out, Started: at, Ended: at,
	}
}

// checkTable compares the rows usageTable returned with want.
func checkTable(t *testing.T, got, want [][]string) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("table\n%v\nwant\n%v", got, want)
	}
}

func TestUsageCommandByEndpoint(t *testing.T) {
	storetest.ForEachConfig(t, func(t *testing.T, cfg config.Store) {
		rec := func(call, endpoint string, in, out, cached int64) accounting.Record {
			r := usageRecord(call, in, out)
			r.Endpoint, r.CachedTokens = endpoint, cached
			return r
		}
		messages := rec("m1", "messages", 90, 5, 30)
		messages.CacheWriteTokens = 50
		path := seedUsage(t, cfg,
			rec("c1", "chat.completions", 10, 5, 2),
			rec("c2", "", 1, 1, 0),
			rec("t1", "completions", 7, 3, 0),
			rec("e1", "embeddings", 40, 0, 0),
			rec("e2", "embeddings", 60, 0, 0),
			rec("r1", "responses", 20, 30, 4),
			// Anthropic's Messages API: a message whose input counts its
			// cache reads and writes, and a count_tokens a native backend
			// answered, a request of no tokens.
			messages,
			rec("n1", "messages.count_tokens", 0, 0, 0),
		)
		got := usageTable(t, "-config", path, "-by", "endpoint")
		want := [][]string{
			{"ENDPOINT", "REQUESTS", "INPUT", "CACHED", "OUTPUT", "TOTAL", "COST"},
			{"embeddings", "2", "100", "0", "0", "100", "0.000000"},
			{"messages", "1", "90", "30", "5", "95", "0.000000"},
			{"responses", "1", "20", "4", "30", "50", "0.000000"},
			{"chat.completions", "2", "11", "2", "6", "17", "0.000000"},
			{"completions", "1", "7", "0", "3", "10", "0.000000"},
			{"messages.count_tokens", "1", "0", "0", "0", "0", "0.000000"},
			{"TOTAL", "8", "228", "36", "44", "272", "0.000000"},
		}
		checkTable(t, got, want)
	})
}

// TestUsageCommandSaturates prints usage over records a backend
// over-reported: the table shows 2^63-1 where sums saturate, and a
// negative count adds nothing.
func TestUsageCommandSaturates(t *testing.T) {
	storetest.ForEachConfig(t, func(t *testing.T, cfg config.Store) {
		rec := func(call, project string, in, out int64) accounting.Record {
			r := usageRecord(call, in, out)
			r.Project = project
			return r
		}
		path := seedUsage(t, cfg,
			rec("a1", "huge", 1<<62, 1<<62),
			rec("a2", "huge", 1<<62, 0),
			rec("m1", "max", math.MaxInt64, 2),
			rec("n1", "small", -50, 9),
		)
		const maxInt = "9223372036854775807"
		got := usageTable(t, "-config", path, "-by", "project")
		want := [][]string{
			{"PROJECT", "REQUESTS", "INPUT", "CACHED", "OUTPUT", "TOTAL", "COST"},
			{"acme/huge", "2", maxInt, "0", "4611686018427387904", maxInt, "0.000000"},
			{"acme/max", "1", maxInt, "0", "2", maxInt, "0.000000"},
			{"acme/small", "1", "0", "0", "9", "9", "0.000000"},
			{"TOTAL", "4", maxInt, "0", "4611686018427387915", maxInt, "0.000000"},
		}
		checkTable(t, got, want)
	})
}

// TestUsageCommandByStatus prints usage by outcome: aborted streams (by
// the client or the backend) apart from complete requests and errors, with
// what they streamed, and refusals counted although no backend served them.
func TestUsageCommandByStatus(t *testing.T) {
	storetest.ForEachConfig(t, func(t *testing.T, cfg config.Store) {
		rec := func(call string, status int, errText string, incomplete bool, backend string, in, out int64) accounting.Record {
			r := usageRecord(call, in, out)
			r.Backend, r.Status, r.Error, r.Stream, r.Incomplete = backend, status, errText, incomplete, incomplete
			return r
		}
		path := seedUsage(t, cfg,
			rec("ok-1", 200, "", false, "sim", 10, 20),
			rec("ok-2", 200, "", false, "sim", 10, 20),
			rec("aborted", 200, "client closed the stream: broken pipe", true, "sim", 8, 5),
			rec("broken", 200, "upstream stream broken: unexpected EOF", true, "sim", 8, 2),
			rec("limited", 429, "rate limit", false, "", 0, 0),
			rec("failed", 502, "backend sim: status 500", false, "sim", 0, 0),
		)
		got := usageTable(t, "-config", path, "-by", "status")
		want := [][]string{
			{"STATUS", "REQUESTS", "INPUT", "CACHED", "OUTPUT", "TOTAL", "COST"},
			{"complete", "2", "20", "0", "40", "60", "0.000000"},
			{"client_closed", "1", "8", "0", "5", "13", "0.000000"},
			{"stream_broken", "1", "8", "0", "2", "10", "0.000000"},
			{"client_error", "1", "0", "0", "0", "0", "0.000000"},
			{"server_error", "1", "0", "0", "0", "0", "0.000000"},
			{"TOTAL", "6", "36", "0", "47", "83", "0.000000"},
		}
		checkTable(t, got, want)
	})
}

// TestUsageCommandCosts prices usage as the costs API does: each record at
// the price in force when it started, from the store's price history,
// however the configuration prices the model now.
func TestUsageCommandCosts(t *testing.T) {
	storetest.ForEachConfig(t, func(t *testing.T, cfg config.Store) {
		ctx := context.Background()
		at := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
		rec := func(call, model string, started time.Time, in, out, cached int64) accounting.Record {
			r := usageRecord(call, in, out)
			r.Model, r.Started, r.Ended, r.CachedTokens = model, started, started, cached
			return r
		}
		path := seedUsage(t, cfg,
			rec("old", "demo", at.Add(10*time.Minute), 1_000_000, 100_000, 200_000),
			rec("new", "demo", at.Add(90*time.Minute), 1_000_000, 0, 0),
			rec("other", "other", at.Add(30*time.Minute), 500_000, 500_000, 0),
		)
		db, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// demo: $1 in, $2 out, $0.5 cached; from an hour later $3 in.
		// other has no history: the configuration's price (none) applies.
		errs := errors.Join(
			db.RecordPrices(ctx, map[string]config.Pricing{"demo": {PromptPerMTok: 1, CompletionPerMTok: 2, CachedPromptPerMTok: 0.5}}, at),
			db.RecordPrices(ctx, map[string]config.Pricing{"demo": {PromptPerMTok: 3, CompletionPerMTok: 2, CachedPromptPerMTok: 0.5}}, at.Add(time.Hour)),
		)
		db.Close()
		if errs != nil {
			t.Fatal(errs)
		}
		got := usageTable(t, "-config", path, "-by", "model", "-since", "3h")
		want := [][]string{
			{"MODEL", "REQUESTS", "INPUT", "CACHED", "OUTPUT", "TOTAL", "COST"},
			// 0.8 + 0.1 + 0.2 at the first price, 3 at the second.
			{"demo", "2", "2000000", "200000", "100000", "2100000", "4.100000"},
			{"other", "1", "500000", "0", "500000", "1000000", "0.000000"},
			{"TOTAL", "3", "2500000", "200000", "600000", "3100000", "4.100000"},
		}
		checkTable(t, got, want)
	})
}
