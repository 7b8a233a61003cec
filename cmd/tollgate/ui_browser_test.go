//go:build linux

package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/store"
)

// chromiumPath is where Debian's chromium package installs the browser.
const chromiumPath = "/usr/bin/chromium"

// pageReadyBudget is how long the dashboard may take to show every panel
// after sign-in or a reload before the test calls it broken. The goal is
// under a second, and the test logs the time it measured; the bound is
// ten times the goal because CI may run on a loaded, oversubscribed
// virtual machine under the race detector, where a wall-clock bound near
// the goal would fail for reasons that are not the page's.
const pageReadyBudget = 10 * time.Second

// TestDashboardInBrowser drives the dashboard at /ui/ in headless Chromium
// against a whole gateway that has served real chat completions, and
// checks that the numbers the page shows are the usage API's, /metrics',
// /readyz' and the trace service's. It saves a screenshot to
// $TOLLGATE_UI_SCREENSHOT, or to the test's temporary directory.
func TestDashboardInBrowser(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Skipf("%s not found: install Debian's chromium package (apt-get install -y chromium) to run the dashboard browser test", chromiumPath)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Budgets large enough never to refuse the seeded traffic, one per
	// acme project and one per team.
	budgets := "limits:\n  - {team: acme, project: \"*\", token_budget: 100000, budget_window: day}\n" +
		"  - {team: \"*\", token_budget: 1000000}\n"
	g := start(t, gatewayConfig(t, t.TempDir(), budgets))
	if code, _ := g.do(t, "GET", "/ui/", "", ""); code != http.StatusOK {
		t.Fatalf("GET /ui/: %d; is ui.Handler mounted in adminRoutes?", code)
	}
	traceID, wantCalls := seedTraffic(t, g)
	abortedTrace := seedOutcomes(t, g)
	seedOldErrors(t, g)

	b := startChromium(ctx, t)
	p := b.newPage(ctx, t)
	p.navigate(ctx, t, g.base+"/ui/")
	p.waitFor(ctx, t, `!document.querySelector('[data-testid="sign-in"]').hidden`)

	// A wrong key is refused and not kept.
	p.typeInto(ctx, t, "key-input", "sk-not-a-key")
	p.click(ctx, t, "sign-in-button")
	p.waitFor(ctx, t, `document.querySelector('[data-testid="sign-in-error"]').textContent !== ''`)
	if got := p.evalString(ctx, t, `String(sessionStorage.getItem('tollgate.apiKey'))`); got != "null" {
		t.Errorf("a refused key stays in session storage: %q", got)
	}

	// The admin key sees every team.
	p.typeInto(ctx, t, "key-input", adminKey)
	began := time.Now()
	p.click(ctx, t, "sign-in-button")
	p.waitReady(ctx, t)
	signInTook := time.Since(began)
	if got := p.evalString(ctx, t, `sessionStorage.getItem('tollgate.apiKey')`); got != adminKey {
		t.Errorf("session storage holds %q, want the signed-in key", got)
	}
	if strings.Contains(p.evalString(ctx, t, `location.href`), adminKey) {
		t.Errorf("the key is in the page's URL")
	}
	allProjects := append([]string{"acme/agents"}, bulkProjects()...)
	allProjects = append(allProjects, "acme/chatbot", "acme/search", "acme/streams", "globex/etl")
	checkUsage(ctx, t, g, p, adminKey, "project", allProjects)
	checkTop(ctx, t, g, p, adminKey)
	checkBudgets(ctx, t, g, p, adminKey)
	checkBackends(ctx, t, g, p)
	checkMetrics(ctx, t, g, p)
	// Over 24 hours: the errors of three hours ago count beside today's.
	checkOutcomes(ctx, t, g, p, adminKey, outcomeCounts{clientErrors: 2, serverErrors: 2, clientClosed: 1})
	checkPagingAndSearch(ctx, t, g, p, adminKey, allProjects)

	// The stream the client closed, in its trace: "client closed" with the
	// tokens it was sent, not an error.
	p.typeInto(ctx, t, "trace-project", "acme/streams")
	p.typeInto(ctx, t, "trace-id", abortedTrace)
	p.eval(ctx, t, `document.querySelector('[data-testid="trace-tree"]').dataset.state = 'stale'`)
	p.click(ctx, t, "trace-load")
	p.waitFor(ctx, t, `document.querySelector('[data-testid="trace-tree"]').dataset.state === 'ready'`)
	checkClientClosedCall(ctx, t, g, p, adminKey, "acme/streams", abortedTrace)

	// A project's name lists its recent traces, ours among them.
	p.clickSelector(ctx, t, `[data-testid="top-project"][data-name="acme/agents"] button`)
	p.waitFor(ctx, t, fmt.Sprintf(`document.querySelector('[data-testid="recent-trace"][data-trace-id=%q]')`, traceID))

	// One trace's calls as a tree with their rolled-up usage.
	p.typeInto(ctx, t, "trace-project", "acme/agents")
	p.typeInto(ctx, t, "trace-id", traceID)
	p.eval(ctx, t, `document.querySelector('[data-testid="trace-tree"]').dataset.state = 'stale'`)
	p.click(ctx, t, "trace-load")
	p.waitFor(ctx, t, `document.querySelector('[data-testid="trace-tree"]').dataset.state === 'ready'`)
	checkTrace(ctx, t, g, p, adminKey, "acme/agents", traceID, wantCalls)

	// Opening the page again (the key is in the session) shows everything,
	// the trace included, within the budget.
	p.eval(ctx, t, `document.querySelector('[data-testid="dashboard"]').dataset.state = 'stale'`)
	began = time.Now()
	p.call(ctx, t, "Page.reload", nil)
	p.waitReady(ctx, t)
	p.waitFor(ctx, t, `document.querySelector('[data-testid="trace-tree"]').dataset.state === 'ready'`)
	reloadTook := time.Since(began)
	checkTrace(ctx, t, g, p, adminKey, "acme/agents", traceID, wantCalls)
	t.Logf("dashboard ready %v after sign-in, %v after a reload", signInTook.Round(time.Millisecond), reloadTook.Round(time.Millisecond))
	if signInTook > pageReadyBudget || reloadTook > pageReadyBudget {
		t.Errorf("dashboard took %v after sign-in and %v after a reload, want under %v", signInTook, reloadTook, pageReadyBudget)
	}

	shot := os.Getenv("TOLLGATE_UI_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "dashboard.png")
	}
	p.screenshot(ctx, t, shot)
	t.Logf("screenshot: %s", shot)

	// Stacked by model, over the last hour.
	p.selectOption(ctx, t, "group-select", "model")
	checkUsage(ctx, t, g, p, adminKey, "model", []string{"demo"})
	p.selectOption(ctx, t, "range-select", "1h")
	checkUsage(ctx, t, g, p, adminKey, "model", []string{"demo"})
	// The last hour excludes the errors of three hours ago.
	checkOutcomes(ctx, t, g, p, adminKey, outcomeCounts{clientErrors: 1, serverErrors: 1, clientClosed: 1})
	p.selectOption(ctx, t, "group-select", "endpoint")
	checkUsage(ctx, t, g, p, adminKey, "endpoint", []string{"chat.completions"})

	// A team key sees its own team only, and not another team's trace.
	p.click(ctx, t, "sign-out-button")
	p.waitFor(ctx, t, `!document.querySelector('[data-testid="sign-in"]').hidden`)
	if got := p.evalString(ctx, t, `String(sessionStorage.getItem('tollgate.apiKey'))`); got != "null" {
		t.Errorf("sign-out left the key in session storage: %q", got)
	}
	p.selectOption(ctx, t, "group-select", "project") // hidden, but it sets the view for the next sign-in
	p.typeInto(ctx, t, "key-input", "sk-globex-test-key")
	p.click(ctx, t, "sign-in-button")
	p.waitReady(ctx, t)
	checkUsage(ctx, t, g, p, "sk-globex-test-key", "project", []string{"globex/etl"})
	checkBudgets(ctx, t, g, p, "sk-globex-test-key")
	// /metrics, every team's counts, is for admin keys: a team key's
	// dashboard says so in its panels instead of failing.
	p.waitFor(ctx, t, `document.querySelector('[data-testid="status-counts"]').textContent.includes('need an admin key')`)
	if banner := p.evalString(ctx, t, `document.querySelector('[data-testid="dashboard-error"]').hidden ? '' : document.querySelector('[data-testid="dashboard-error"]').textContent`); strings.Contains(banner, "/metrics") {
		t.Errorf("a team key's dashboard reports /metrics as an error: %q", banner)
	}
	p.waitFor(ctx, t, `document.querySelector('[data-testid="trace-tree"]').dataset.state === 'error'`)
	if msg := p.evalString(ctx, t, `document.querySelector('[data-testid="trace-error"]').textContent`); !strings.Contains(msg, "acme") {
		t.Errorf("globex key reading acme's trace: error %q, want the refusal", msg)
	}

	if errs := b.pageErrors(); len(errs) > 0 {
		t.Errorf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// seedTraffic sends chat completions for three projects of two teams (one
// of them failing), builds a trace of application calls with completions
// under them, and waits until the usage is stored. It returns the trace id
// and the number of calls in the trace.
func seedTraffic(t *testing.T, g *running) (traceID string, calls int) {
	t.Helper()
	send := func(key, project, body string, headers ...string) string {
		t.Helper()
		h := append([]string{"Compat-Project: " + project}, headers...)
		code, resp := g.do(t, "POST", "/v1/chat/completions", key, body, h...)
		if code != http.StatusOK && !slices.Contains(headers, "X-Mock-Status: 500") {
			t.Fatalf("completion for %s: %d %s", project, code, resp)
		}
		return resp
	}
	for i := range 3 {
		send("sk-acme-test-key", "acme/chatbot", chatBody(5+i, ""))
	}
	for range 2 {
		send("sk-acme-test-key", "acme/search", chatBody(7, `,"stream":true,"stream_options":{"include_usage":true}`))
	}
	for range 3 {
		send("sk-globex-test-key", "globex/etl", chatBody(3, ""))
	}
	send("sk-globex-test-key", "globex/etl", chatBody(3, ""), "X-Mock-Status: 500")

	// A trace: agent.run → (2 completions, tool.search → 1 completion).
	now := func() string { return time.Now().UTC().Format(time.RFC3339Nano) }
	startCall := func(op, parent, trace string) (id, traceID string) {
		t.Helper()
		body := fmt.Sprintf(`{"start":{"project_id":"acme/agents","op_name":%q,"started_at":%q,"attributes":{},"inputs":{}`, op, now())
		if parent != "" {
			body += fmt.Sprintf(`,"parent_id":%q,"trace_id":%q`, parent, trace)
		}
		code, resp := g.do(t, "POST", "/call/start", "sk-acme-test-key", body+"}}")
		if code != http.StatusOK {
			t.Fatalf("call start %s: %d %s", op, code, resp)
		}
		return gjson.Get(resp, "id").String(), gjson.Get(resp, "trace_id").String()
	}
	endCall := func(id string) {
		t.Helper()
		code, resp := g.do(t, "POST", "/call/end", "sk-acme-test-key",
			fmt.Sprintf(`{"end":{"project_id":"acme/agents","id":%q,"ended_at":%q,"summary":{}}}`, id, now()))
		if code != http.StatusOK {
			t.Fatalf("call end: %d %s", code, resp)
		}
	}
	root, traceID := startCall("agent.run", "", "")
	tool, _ := startCall("tool.search", root, traceID)
	for i := range 2 {
		send("sk-acme-test-key", "acme/agents", chatBody(4+i, ""), "Compat-Trace-Id: "+traceID, "Compat-Parent-Id: "+root)
	}
	send("sk-acme-test-key", "acme/agents", chatBody(6, `,"stream":true`), "Compat-Trace-Id: "+traceID, "Compat-Parent-Id: "+tool)
	endCall(tool)
	endCall(root)
	const wantCalls, wantRequests = 5, 12

	// Usage records and the completions' calls reach the store within the
	// flush interval.
	deadline := time.Now().Add(10 * time.Second)
	for {
		q := fmt.Sprintf("/v1/organization/usage/completions?start_time=%d&bucket_width=1d", time.Now().Add(-24*time.Hour).Unix())
		_, usage := g.do(t, "GET", q, adminKey, "")
		var requests int64
		for _, v := range gjson.Get(usage, "data.#.results.#.num_model_requests|@flatten").Array() {
			requests += v.Int()
		}
		_, tu := g.do(t, "POST", "/trace/usage", adminKey, fmt.Sprintf(`{"project_id":"acme/agents","filter":{"trace_ids":[%q]}}`, traceID))
		stored := gjson.Get(tu, "call_usage.@keys.#").Int()
		if requests == wantRequests && stored == wantCalls {
			return traceID, wantCalls
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s the store holds %d requests (want %d) and %d calls of the trace (want %d)", requests, wantRequests, stored, wantCalls)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// bulkProjects are more projects than a page of the usage table holds.
func bulkProjects() []string {
	var out []string
	for i := range 25 {
		out = append(out, fmt.Sprintf("acme/bulk-%02d", i))
	}
	return out
}

// seedOutcomes sends, beside seedTraffic's requests, a completion to each
// of bulkProjects, a client error the gateway records (priority on a model
// without priority scheduling: 400), a request for a model that does not
// exist (refused before a model was resolved: counted in /metrics only),
// and a stream the client closes after a few events. It waits until the
// store holds them, and returns the closed stream's trace id.
func seedOutcomes(t *testing.T, g *running) (abortedTrace string) {
	t.Helper()
	for _, project := range bulkProjects() {
		if code, resp := g.do(t, "POST", "/v1/chat/completions", "sk-acme-test-key", chatBody(1, ""), "Compat-Project: "+project); code != http.StatusOK {
			t.Fatalf("completion for %s: %d %s", project, code, resp)
		}
	}
	if code, resp := g.do(t, "POST", "/v1/chat/completions", "sk-acme-test-key", chatBody(3, `,"priority":1`), "Compat-Project: acme/chatbot"); code != http.StatusBadRequest {
		t.Fatalf("priority on a model without priority scheduling: %d %s, want 400", code, resp)
	}
	unknown := `{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`
	if code, resp := g.do(t, "POST", "/v1/chat/completions", "sk-acme-test-key", unknown, "Compat-Project: acme/chatbot"); code != http.StatusNotFound {
		t.Fatalf("unknown model: %d %s, want 404", code, resp)
	}

	// A long stream, abandoned after four events: the gateway records what
	// it streamed until the client left.
	abortedTrace = "dashboard-aborted-stream"
	req, err := http.NewRequest(http.MethodPost, g.base+"/v1/chat/completions", strings.NewReader(chatBody(2000, `,"stream":true`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-acme-test-key")
	req.Header.Set("Compat-Project", "acme/streams")
	req.Header.Set("Compat-Trace-Id", abortedTrace)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for events := 0; events < 4; {
		line, err := br.ReadString('\n')
		if err != nil {
			resp.Body.Close()
			t.Fatalf("reading the stream: %v", err)
		}
		if strings.HasPrefix(line, "data:") {
			events++
		}
	}
	resp.Body.Close()

	const wantRequests = 12 + 25 + 1 // seedTraffic's, the bulk ones, the closed stream
	deadline := time.Now().Add(15 * time.Second)
	for {
		q := fmt.Sprintf("/v1/organization/usage/completions?start_time=%d&bucket_width=1d&group_by=status", time.Now().Add(-24*time.Hour).Unix())
		_, usage := g.do(t, "GET", q, adminKey, "")
		counts := map[string]int64{}
		var requests int64
		for _, r := range gjson.Get(usage, "data.#.results|@flatten").Array() {
			counts[r.Get("status").String()] += r.Get("num_requests").Int()
			requests += r.Get("num_model_requests").Int()
		}
		if requests == wantRequests && counts["client_error"] == 1 && counts["client_closed"] == 1 {
			return abortedTrace
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 15s the store holds %d requests (want %d) and outcomes %v (want a client error and a client-closed stream)", requests, wantRequests, counts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// seedOldErrors stores, three hours back, a client error (a rate-limit
// refusal, which reached no backend) and a gateway error: a range of the
// last hour excludes them, one of the last day includes them. They are
// written to the gateway's store directly, as nothing else can date a
// request in the past.
func seedOldErrors(t *testing.T, g *running) {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, g.cfg.Store)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	at := time.Now().Add(-3 * time.Hour)
	rec := func(call string, status int, backend, errText string) accounting.Record {
		return accounting.Record{
			RequestID: call, CallID: call, TraceID: call, KeyName: "globex-key", Team: "globex", Project: "etl",
			Model: "demo", ServedModel: "demo", Backend: backend, Status: status, Error: errText,
			Started: at, Ended: at.Add(time.Second),
		}
	}
	if err := db.InsertRecords(ctx, []accounting.Record{
		rec("old-client-error", http.StatusTooManyRequests, "", "rate limit reached"),
		rec("old-server-error", http.StatusBadGateway, "sim", "backend sim: status 500"),
	}); err != nil {
		t.Fatal(err)
	}
}

// outcomeCounts are the requests of a range by outcome.
type outcomeCounts struct {
	clientErrors, serverErrors, clientClosed int64
}

// checkOutcomes compares the error and client-closed tiles with the usage
// API's group_by=status for the page's own range, and with want.
func checkOutcomes(ctx context.Context, t *testing.T, g *running, p *page, key string, want outcomeCounts) {
	t.Helper()
	var dom struct {
		Start, Width                                                string
		ErrorRate, ClientErrors, ServerErrors, ClientClosed, Tokens string
	}
	p.evalJSON(ctx, t, `(() => {
		const v = (s) => String(document.querySelector('[data-testid="' + s + '"]').dataset.value);
		const win = document.querySelector('[data-testid="range-window"]');
		return { start: win.dataset.start, width: win.dataset.width, errorRate: v('error-rate'), clientErrors: v('client-errors'),
			serverErrors: v('server-errors'), clientClosed: v('client-closed'), tokens: v('client-closed-tokens') };
	})()`, &dom)
	q := url.Values{"start_time": {dom.Start}, "bucket_width": {dom.Width}, "group_by": {"status"},
		"limit":     {map[string]string{"1m": "1440", "1h": "168", "1d": "31"}[dom.Width]},
		"endpoints": {"chat.completions,completions,embeddings,responses"}}
	code, body := g.do(t, "GET", "/v1/organization/usage/completions?"+q.Encode(), key, "")
	if code != http.StatusOK || gjson.Get(body, "has_more").Bool() {
		t.Fatalf("usage API by status: %d %s", code, body)
	}
	var all, clientErrors, serverErrors, clientClosed, closedTokens int64
	for _, r := range gjson.Get(body, "data.#.results|@flatten").Array() {
		n := r.Get("num_requests").Int()
		all += n
		switch r.Get("status").String() {
		case "client_error":
			clientErrors += n
		case "server_error", "stream_broken":
			serverErrors += n
		case "client_closed":
			clientClosed += n
			closedTokens += r.Get("input_tokens").Int() + r.Get("output_tokens").Int()
		}
	}
	got := outcomeCounts{clientErrors: clientErrors, serverErrors: serverErrors, clientClosed: clientClosed}
	if got != want {
		t.Errorf("range %s buckets from %s: the usage API counts %+v, want %+v", dom.Width, dom.Start, got, want)
	}
	if closedTokens == 0 {
		t.Errorf("the closed stream's record has no tokens: %s", body)
	}
	shown := func(name, s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Errorf("%s tile value %q: %v", name, s, err)
		}
		return n
	}
	if g := (outcomeCounts{clientErrors: shown("client-errors", dom.ClientErrors), serverErrors: shown("server-errors", dom.ServerErrors),
		clientClosed: shown("client-closed", dom.ClientClosed)}); g != got {
		t.Errorf("the tiles show %+v, the usage API %+v", g, got)
	}
	if tokens := shown("client-closed-tokens", dom.Tokens); tokens != closedTokens {
		t.Errorf("client-closed tokens shown %d, the usage API %d", tokens, closedTokens)
	}
	rate, err := strconv.ParseFloat(dom.ErrorRate, 64)
	if wantRate := float64(clientErrors+serverErrors) / float64(all); err != nil || math.Abs(rate-wantRate) > 1e-12 {
		t.Errorf("error rate shown %q, the usage API gives %v", dom.ErrorRate, wantRate)
	}

	// The same per model, in the range.
	q.Set("group_by", "model,status")
	code, body = g.do(t, "GET", "/v1/organization/usage/completions?"+q.Encode(), key, "")
	if code != http.StatusOK {
		t.Fatalf("usage API by model and status: %d %s", code, body)
	}
	type modelOutcomes struct{ Requests, ClientErrors, ServerErrors, ClientClosed int64 }
	wantByModel := map[string]modelOutcomes{}
	for _, r := range gjson.Get(body, "data.#.results|@flatten").Array() {
		m := wantByModel[r.Get("model").String()]
		n := r.Get("num_requests").Int()
		m.Requests += n
		switch r.Get("status").String() {
		case "client_error":
			m.ClientErrors += n
		case "server_error", "stream_broken":
			m.ServerErrors += n
		case "client_closed":
			m.ClientClosed += n
		}
		wantByModel[r.Get("model").String()] = m
	}
	var rows []struct{ Name, Requests, Client, Server, Closed string }
	p.evalJSON(ctx, t, `[...document.querySelectorAll('[data-testid="model-outcome-row"]')].map((r) => {
		const text = (s) => r.querySelector('[data-testid="' + s + '"]').textContent;
		return { name: r.dataset.name, requests: text('model-outcome-requests'), client: text('model-outcome-4xx'),
			server: text('model-outcome-5xx'), closed: text('model-outcome-closed') };
	})`, &rows)
	gotByModel := map[string]modelOutcomes{}
	for _, r := range rows {
		gotByModel[r.Name] = modelOutcomes{shownInt(t, r.Requests), shownInt(t, r.Client), shownInt(t, r.Server), shownInt(t, r.Closed)}
	}
	if !reflect.DeepEqual(gotByModel, wantByModel) || len(wantByModel) == 0 {
		t.Errorf("by model in the range: the page shows %+v, the usage API %+v", gotByModel, wantByModel)
	}
}

// checkPagingAndSearch pages through the usage table (more projects than
// a page) with the mouse, and searches it.
func checkPagingAndSearch(ctx context.Context, t *testing.T, g *running, p *page, key string, projects []string) {
	t.Helper()
	rows := func() []string {
		var names []string
		p.evalJSON(ctx, t, `[...document.querySelectorAll('[data-testid="usage-row"]')].map((r) => r.dataset.group)`, &names)
		return names
	}
	state := func() string {
		return p.evalString(ctx, t, `(() => { const b = document.querySelector('[data-testid="usage-table"]').dataset; return b.page + '/' + b.pages + '/' + b.matched; })()`)
	}
	const pageSize = 20
	first := rows()
	if len(first) != pageSize || state() != fmt.Sprintf("0/2/%d", len(projects)) {
		t.Fatalf("first page: %d rows, state %s; want %d rows of %d projects on 2 pages", len(first), state(), pageSize, len(projects))
	}
	p.click(ctx, t, "usage-next")
	second := rows()
	if len(second) != len(projects)-pageSize || state() != fmt.Sprintf("1/2/%d", len(projects)) {
		t.Fatalf("second page: %d rows, state %s", len(second), state())
	}
	if got := p.evalString(ctx, t, `document.querySelector('[data-testid="usage-page"]').textContent`); got != "page 2 of 2" {
		t.Errorf("pager reads %q", got)
	}
	seen := append(append([]string{}, first...), second...)
	sort.Strings(seen)
	if strings.Join(seen, ",") != strings.Join(projects, ",") {
		t.Errorf("the two pages list %v, want each of %v once", seen, projects)
	}
	if !p.eval(ctx, t, `document.querySelector('[data-testid="usage-next"]').disabled`).Bool() {
		t.Error("next is enabled on the last page")
	}
	p.click(ctx, t, "usage-prev")
	if got := rows(); strings.Join(got, ",") != strings.Join(first, ",") {
		t.Errorf("back on page 1: %v, want %v", got, first)
	}

	// A search keeps the rows whose name contains it, from page 1.
	for _, query := range []string{"bulk-1", "GLOBEX", "nothing-matches"} {
		p.typeInto(ctx, t, "usage-search", query)
		p.eval(ctx, t, `document.querySelector('[data-testid="usage-search"]').dispatchEvent(new Event('input'))`)
		var want []string
		for _, name := range projects {
			if strings.Contains(strings.ToLower(name), strings.ToLower(query)) {
				want = append(want, name)
			}
		}
		got := rows()
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(want, ",") || state() != fmt.Sprintf("0/1/%d", len(want)) {
			t.Errorf("search %q: the page lists %v (state %s), want %v", query, got, state(), want)
		}
	}
	p.typeInto(ctx, t, "usage-search", "")
	p.eval(ctx, t, `document.querySelector('[data-testid="usage-search"]').dispatchEvent(new Event('input'))`)
	if got := rows(); len(got) != pageSize {
		t.Errorf("cleared search: %d rows, want a full page", len(got))
	}
}

// checkClientClosedCall checks the closed stream's call in the trace tree:
// "client closed", no error, and the completion tokens /trace/usage
// counts for it.
func checkClientClosedCall(ctx context.Context, t *testing.T, g *running, p *page, key, project, traceID string) {
	t.Helper()
	var dom []struct{ ID, Status, Error, Streamed, Completion string }
	p.evalJSON(ctx, t, `[...document.querySelectorAll('[data-testid="trace-call"]')].map((c) => {
		const text = (s) => c.querySelector('[data-testid="' + s + '"]')?.textContent ?? '';
		return { id: c.dataset.callId, status: text('trace-call-status'), error: text('trace-call-error'),
			streamed: text('trace-call-streamed'), completion: text('trace-call-completion') };
	})`, &dom)
	if len(dom) != 1 {
		t.Fatalf("the closed stream's trace shows %d calls, want 1: %+v", len(dom), dom)
	}
	c := dom[0]
	_, usage := g.do(t, "POST", "/trace/usage", key, fmt.Sprintf(`{"project_id":%q,"filter":{"trace_ids":[%q]}}`, project, traceID))
	var completion int64
	for _, m := range gjson.Get(usage, "call_usage."+gjson.Escape(c.ID)).Map() {
		completion += m.Get("completion_tokens").Int()
	}
	if c.Status != "client closed" || c.Error != "" {
		t.Errorf("closed stream shown as %q with error %q, want \"client closed\" and no error", c.Status, c.Error)
	}
	if completion == 0 || shownInt(t, c.Completion) != completion || !strings.Contains(c.Streamed, fmt.Sprintf("streamed %d completion tokens", completion)) {
		t.Errorf("closed stream shows %s completion tokens (%q); /trace/usage counts %d", c.Completion, c.Streamed, completion)
	}
}

// usageTotals is one group's usage over a range.
type usageTotals struct {
	Input, Output, Cached, Requests, Total int64
}

// apiUsage reads the usage API as the page does (same start, width and
// grouping) and sums each group over the range.
func apiUsage(t *testing.T, g *running, key, start, width, groupBy string) map[string]usageTotals {
	t.Helper()
	field := map[string]string{"project_id": "project_id", "model": "model", "api_key_id": "api_key_id", "endpoint": "endpoint"}[groupBy]
	out := map[string]usageTotals{}
	page := ""
	for range 100 {
		q := url.Values{"start_time": {start}, "bucket_width": {width}, "group_by": {groupBy},
			"limit":     {map[string]string{"1m": "1440", "1h": "168", "1d": "31"}[width]},
			"endpoints": {"chat.completions,completions,embeddings,responses"}}
		if page != "" {
			q.Set("page", page)
		}
		code, body := g.do(t, "GET", "/v1/organization/usage/completions?"+q.Encode(), key, "")
		if code != http.StatusOK {
			t.Fatalf("usage API: %d %s", code, body)
		}
		for _, r := range gjson.Get(body, "data.#.results|@flatten").Array() {
			name := r.Get(field).String()
			s := out[name]
			s.Input += r.Get("input_tokens").Int()
			s.Output += r.Get("output_tokens").Int()
			s.Cached += r.Get("input_cached_tokens").Int()
			s.Requests += r.Get("num_model_requests").Int()
			s.Total = s.Input + s.Output
			out[name] = s
		}
		if !gjson.Get(body, "has_more").Bool() {
			break
		}
		page = gjson.Get(body, "next_page").String()
	}
	return out
}

// checkUsage compares the usage table and the totals the page shows with
// the usage API's answer for the page's own range and grouping.
func checkUsage(ctx context.Context, t *testing.T, g *running, p *page, key, group string, wantGroups []string) {
	t.Helper()
	var dom struct {
		Start, Width string
		Rows         []struct{ Group, Input, Output, Cached, Total, Requests string }
		Totals       struct{ Total, Input, Output, Cached, Requests string }
	}
	p.evalJSON(ctx, t, `(() => {
		const q = (s, r = document) => r.querySelector('[data-testid="' + s + '"]');
		const text = (s, r) => q(s, r).textContent;
		const win = q('range-window');
		// Every page of the table, from the first, then back to it.
		const prev = q('usage-prev'), next = q('usage-next');
		while (!prev.disabled) prev.click();
		const rows = [];
		for (;;) {
			rows.push(...[...document.querySelectorAll('[data-testid="usage-row"]')].map((r) => ({
				group: r.dataset.group, input: text('usage-input', r), output: text('usage-output', r),
				cached: text('usage-cached', r), total: text('usage-total', r), requests: text('usage-requests', r),
			})));
			if (next.disabled) break;
			next.click();
		}
		while (!prev.disabled) prev.click();
		return {
			start: win.dataset.start, width: win.dataset.width, rows,
			totals: { total: text('total-tokens'), input: text('total-input'), output: text('total-output'),
				cached: text('total-cached'), requests: text('total-requests') },
		};
	})()`, &dom)
	groupBy := map[string]string{"project": "project_id", "model": "model", "key": "api_key_id", "endpoint": "endpoint"}[group]
	want := apiUsage(t, g, key, dom.Start, dom.Width, groupBy)
	var names []string
	for _, r := range dom.Rows {
		names = append(names, r.Group)
		w, ok := want[r.Group]
		if !ok {
			t.Errorf("by %s: the page shows %q, which the usage API does not return", group, r.Group)
			continue
		}
		got := usageTotals{Input: shownInt(t, r.Input), Output: shownInt(t, r.Output), Cached: shownInt(t, r.Cached),
			Requests: shownInt(t, r.Requests), Total: shownInt(t, r.Total)}
		if got != w {
			t.Errorf("by %s, %s: the page shows %+v, the usage API %+v", group, r.Group, got, w)
		}
	}
	sort.Strings(names)
	if strings.Join(names, ",") != strings.Join(wantGroups, ",") || len(want) != len(wantGroups) {
		t.Errorf("by %s: the page lists %v, the usage API has %d groups; want %v", group, names, len(want), wantGroups)
	}
	var sum usageTotals
	for _, w := range want {
		sum.Input += w.Input
		sum.Output += w.Output
		sum.Cached += w.Cached
		sum.Requests += w.Requests
		sum.Total += w.Total
	}
	got := usageTotals{Input: shownInt(t, dom.Totals.Input), Output: shownInt(t, dom.Totals.Output), Cached: shownInt(t, dom.Totals.Cached),
		Requests: shownInt(t, dom.Totals.Requests), Total: shownInt(t, dom.Totals.Total)}
	if got != sum || sum.Total == 0 {
		t.Errorf("by %s: totals shown %+v, the usage API's %+v", group, got, sum)
	}
}

// checkTop compares the top projects and keys with the usage API's.
func checkTop(ctx context.Context, t *testing.T, g *running, p *page, key string) {
	t.Helper()
	for _, c := range []struct{ row, groupBy string }{{"top-project", "project_id"}, {"top-key", "api_key_id"}} {
		var dom struct {
			Start, Width string
			Rows         []struct{ Name, Tokens, Requests string }
		}
		p.evalJSON(ctx, t, fmt.Sprintf(`(() => {
			const win = document.querySelector('[data-testid="range-window"]');
			return { start: win.dataset.start, width: win.dataset.width,
				rows: [...document.querySelectorAll('[data-testid="%[1]s"]')].map((r) => ({ name: r.dataset.name,
					tokens: r.querySelector('[data-testid="%[1]s-tokens"]').textContent,
					requests: r.querySelector('[data-testid="%[1]s-requests"]').textContent })) };
		})()`, c.row), &dom)
		want := apiUsage(t, g, key, dom.Start, dom.Width, c.groupBy)
		const top = 10 // the lists show the ten largest
		if len(dom.Rows) != min(len(want), top) {
			t.Errorf("%s: %d rows shown, the usage API has %d (the list shows %d at most)", c.row, len(dom.Rows), len(want), top)
		}
		last := int64(math.MaxInt64)
		for _, r := range dom.Rows {
			tokens := shownInt(t, r.Tokens)
			if w := want[r.Name]; tokens != w.Total || shownInt(t, r.Requests) != w.Requests {
				t.Errorf("%s %s: shown %d tokens / %s requests, the usage API %+v", c.row, r.Name, tokens, r.Requests, w)
			}
			if tokens > last {
				t.Errorf("%s: not sorted by tokens", c.row)
			}
			last = tokens
		}
	}
}

// checkBudgets compares the budgets shown with the budgets API's, for key.
func checkBudgets(ctx context.Context, t *testing.T, g *running, p *page, key string) {
	t.Helper()
	var rows []struct{ Name, Used, Limit string }
	p.evalJSON(ctx, t, `[...document.querySelectorAll('[data-testid="budget"]')].map((r) => ({ name: r.dataset.name,
		used: r.querySelector('[data-testid="budget-used"]').textContent,
		limit: r.querySelector('[data-testid="budget-limit"]').textContent }))`, &rows)
	code, body := g.do(t, "GET", "/v1/tollgate/budgets", key, "")
	if code != http.StatusOK {
		t.Fatalf("budgets API: %d %s", code, body)
	}
	want := gjson.Get(body, "data").Array()
	if len(rows) != len(want) || len(want) == 0 {
		t.Fatalf("%d budgets shown, the budgets API has %d: %s", len(rows), len(want), body)
	}
	for i, w := range want {
		name := w.Get("team").String()
		if project := w.Get("project").String(); project != "" {
			name += "/" + project
		}
		r := rows[i]
		if r.Name != name || shownInt(t, r.Used) != w.Get("used").Int() || shownInt(t, r.Limit) != w.Get("budget").Int() {
			t.Errorf("budget row %d shown %+v, the budgets API %s", i, r, w.Raw)
		}
		if w.Get("used").Int() == 0 && key == adminKey && w.Get("team").String() != "" {
			t.Errorf("budget %s shows no spend although the seeded traffic charged it", name)
		}
	}
}

// checkBackends compares the backends table with /readyz.
func checkBackends(ctx context.Context, t *testing.T, g *running, p *page) {
	t.Helper()
	_, ready := g.do(t, "GET", "/readyz", "", "")
	var dom []struct{ Name, State, StateCell, TTFT, TTFTText, InFlight string }
	p.evalJSON(ctx, t, `[...document.querySelectorAll('[data-testid="backend-row"]')].map((r) => ({ name: r.dataset.name,
		state: r.querySelector('[data-testid="backend-state"]').textContent,
		stateCell: r.querySelector('[data-testid="backend-state"]').parentElement.textContent,
		ttft: r.querySelector('[data-testid="backend-ttft"]').dataset.value ?? '',
		ttftText: r.querySelector('[data-testid="backend-ttft"]').textContent,
		inFlight: r.querySelector('[data-testid="backend-in-flight"]').textContent }))`, &dom)
	backends := gjson.Get(ready, "backends").Array()
	if len(dom) != len(backends) || len(backends) == 0 {
		t.Fatalf("the page shows %d backends, /readyz %s", len(dom), ready)
	}
	for i, b := range backends {
		want := "ejected"
		if s := b.Get("state").String(); s != "" {
			want = s
		} else if b.Get("healthy").Bool() {
			want = "healthy"
		}
		if dom[i].Name != b.Get("name").String() || dom[i].State != want || shownInt(t, dom[i].InFlight) != b.Get("in_flight").Int() {
			t.Errorf("backend %d: the page shows %+v, /readyz %s", i, dom[i], b.Raw)
		}
		// State and time to first token each have their own column.
		if dom[i].StateCell != want {
			t.Errorf("backend %d: the state cell reads %q, want only %q", i, dom[i].StateCell, want)
		}
		ttft := b.Get("ttft_ms").Float()
		if ttft <= 0 {
			t.Errorf("backend %d: /readyz reports no time to first token after the seeded streams: %s", i, b.Raw)
			continue
		}
		shown, err := strconv.ParseFloat(dom[i].TTFT, 64)
		if err != nil || math.Abs(shown-ttft) > 1e-9*ttft || !strings.HasSuffix(dom[i].TTFTText, " ms") && !strings.HasSuffix(dom[i].TTFTText, " s") {
			t.Errorf("backend %d: the TTFT column shows %q (%q), /readyz %v ms", i, dom[i].TTFT, dom[i].TTFTText, ttft)
		}
	}
}

// checkMetrics compares the by-model table with /metrics (requests refused
// before a model was resolved under "(no model)", never an empty name),
// and the latency and time-to-first-token percentiles with ones computed
// here from /metrics, as PromQL's histogram_quantile computes them.
func checkMetrics(ctx context.Context, t *testing.T, g *running, p *page) {
	t.Helper()
	_, text := g.do(t, "GET", "/metrics", adminKey, "")
	samples := parseExposition(text)
	byModel := map[string]float64{}
	for _, s := range samples["tollgate_requests_total"] {
		name := s.labels["model"]
		if name == "" {
			name = "(no model)"
		}
		byModel[name] += s.value
	}
	if byModel["(no model)"] == 0 {
		t.Fatalf("/metrics counts no request without a model; the seed sends one: %v", byModel)
	}
	var rows []struct{ Name, Model, Requests string }
	p.evalJSON(ctx, t, `[...document.querySelectorAll('[data-testid="model-metrics-row"]')].map((r) => ({ name: r.dataset.name,
		model: r.cells[0].textContent, requests: r.cells[1].textContent }))`, &rows)
	shown := map[string]float64{}
	for _, r := range rows {
		if r.Name == "" || r.Model == "" {
			t.Errorf("a model row has an empty name: %+v", r)
		}
		shown[r.Model] = float64(shownInt(t, r.Requests))
	}
	if !reflect.DeepEqual(shown, byModel) {
		t.Errorf("requests by model shown %v, /metrics %v", shown, byModel)
	}
	want := map[string]float64{}
	for prefix, name := range map[string]string{"latency": "tollgate_request_duration_seconds", "ttft": "tollgate_time_to_first_token_seconds"} {
		buckets := map[float64]float64{}
		for _, s := range samples[name+"_bucket"] {
			le, err := strconv.ParseFloat(s.labels["le"], 64)
			if err != nil {
				t.Fatalf("le %q: %v", s.labels["le"], err)
			}
			buckets[le] += s.value
		}
		for _, q := range []float64{0.5, 0.9, 0.99} {
			want[fmt.Sprintf("%s-p%d", prefix, int(q*100))] = histogramQuantile(q, buckets)
		}
	}
	for id, w := range want {
		got, err := strconv.ParseFloat(p.evalString(ctx, t, fmt.Sprintf(`String(document.querySelector('[data-testid="%s"]').dataset.value)`, id)), 64)
		if err != nil || math.IsNaN(w) || math.Abs(got-w) > 1e-9*math.Max(1, math.Abs(w)) {
			t.Errorf("%s: the page shows %v (%v), /metrics gives %v", id, got, err, w)
		}
	}
}

// sample is one line of the Prometheus text format.
type sample struct {
	labels map[string]string
	value  float64
}

var (
	sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)`)
	labelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// parseExposition reads the samples of the Prometheus text format, by
// metric name. It is independent of the page's parser on purpose.
func parseExposition(text string) map[string][]sample {
	out := map[string][]sample{}
	for line := range strings.SplitSeq(text, "\n") {
		m := sampleLine.FindStringSubmatch(line)
		if m == nil || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		s := sample{labels: map[string]string{}, value: v}
		for _, l := range labelPair.FindAllStringSubmatch(m[2], -1) {
			s.labels[l[1]] = strings.NewReplacer(`\\`, `\`, `\"`, `"`, `\n`, "\n").Replace(l[2])
		}
		out[m[1]] = append(out[m[1]], s)
	}
	return out
}

// histogramQuantile is Prometheus' bucketQuantile on cumulative counts by
// upper bound (+Inf included).
func histogramQuantile(q float64, byLe map[float64]float64) float64 {
	les := make([]float64, 0, len(byLe))
	for le := range byLe {
		les = append(les, le)
	}
	sort.Float64s(les)
	n := len(les)
	if n < 2 || !math.IsInf(les[n-1], 1) || byLe[les[n-1]] == 0 {
		return math.NaN()
	}
	rank := q * byLe[les[n-1]]
	b := sort.Search(n-1, func(i int) bool { return byLe[les[i]] >= rank })
	if b == n-1 {
		return les[n-2]
	}
	if b == 0 && les[0] <= 0 {
		return les[0]
	}
	start, end, count := 0.0, les[b], byLe[les[b]]
	if b > 0 {
		start = les[b-1]
		count -= byLe[les[b-1]]
		rank -= byLe[les[b-1]]
	}
	return start + (end-start)*(rank/count)
}

// checkTrace compares the trace tree with /calls/stream_query and
// /trace/usage.
func checkTrace(ctx context.Context, t *testing.T, g *running, p *page, key, project, traceID string, wantCalls int) {
	t.Helper()
	var dom struct {
		Calls []struct {
			ID, Parent, Requests, Prompt, Completion, Total string
		}
		Total string
	}
	p.evalJSON(ctx, t, `(() => ({
		calls: [...document.querySelectorAll('[data-testid="trace-call"]')].map((c) => {
			const text = (s) => c.querySelector('[data-testid="' + s + '"]').textContent;
			const parentLi = c.parentElement.parentElement.closest('li');
			return { id: c.dataset.callId, parent: parentLi ? parentLi.querySelector(':scope > [data-testid="trace-call"]').dataset.callId : '',
				requests: text('trace-call-requests'), prompt: text('trace-call-prompt'),
				completion: text('trace-call-completion'), total: text('trace-call-total') };
		}),
		total: document.querySelector('[data-testid="trace-total-tokens"]').textContent,
	}))()`, &dom)
	filter := fmt.Sprintf(`{"project_id":%q,"filter":{"trace_ids":[%q]}}`, project, traceID)
	code, lines := g.do(t, "POST", "/calls/stream_query", key, filter, "Accept: application/jsonl")
	if code != http.StatusOK {
		t.Fatalf("stream_query: %d %s", code, lines)
	}
	parents := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(lines), "\n") {
		parents[gjson.Get(line, "id").String()] = gjson.Get(line, "parent_id").String()
	}
	_, usage := g.do(t, "POST", "/trace/usage", key, filter)
	if len(dom.Calls) != wantCalls || len(parents) != wantCalls {
		t.Fatalf("the page shows %d calls, stream_query returns %d; want %d", len(dom.Calls), len(parents), wantCalls)
	}
	var traceTotal int64
	for _, c := range dom.Calls {
		parent, ok := parents[c.ID]
		if !ok {
			t.Errorf("call %s is not in the trace", c.ID)
			continue
		}
		if c.Parent != parent {
			t.Errorf("call %s shown under %q, its parent is %q", c.ID, c.Parent, parent)
		}
		var want [4]int64
		for _, m := range gjson.Get(usage, "call_usage."+gjson.Escape(c.ID)).Map() {
			want[0] += m.Get("requests").Int()
			want[1] += m.Get("prompt_tokens").Int()
			want[2] += m.Get("completion_tokens").Int()
			want[3] += m.Get("total_tokens").Int()
		}
		got := [4]int64{shownInt(t, c.Requests), shownInt(t, c.Prompt), shownInt(t, c.Completion), shownInt(t, c.Total)}
		if got != want {
			t.Errorf("call %s: shown requests/prompt/completion/total %v, /trace/usage %v", c.ID, got, want)
		}
		if parent == "" {
			traceTotal += want[3]
			if want[0] != 3 {
				t.Errorf("root call rolls up %d requests, want the trace's 3", want[0])
			}
		}
	}
	if got := shownInt(t, dom.Total); got != traceTotal || got == 0 {
		t.Errorf("trace total shown %d, /trace/usage roots %d", got, traceTotal)
	}
}

// shownInt reads an integer as the page formats it ("1,234").
func shownInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.ReplaceAll(strings.TrimSpace(s), ",", ""), 10, 64)
	if err != nil {
		t.Errorf("the page shows %q where a number belongs", s)
	}
	return n
}

// browser is a headless Chromium driven over the Chrome DevTools Protocol.
type browser struct {
	conn *cdpConn

	mu     sync.Mutex
	errors []string
}

// startChromium starts Chromium with a fresh profile and connects to its
// DevTools websocket. Cleanup kills its whole process group.
func startChromium(ctx context.Context, t *testing.T) *browser {
	t.Helper()
	profile := t.TempDir()
	cmd := exec.Command(chromiumPath,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--disable-extensions", "--disable-dev-shm-usage", "--disable-crash-reporter",
		"--disable-breakpad", "--mute-audio", "--hide-scrollbars", "--window-size=1400,1000",
		"--user-data-dir="+profile, "--remote-debugging-port=0", "about:blank")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		// The negative pid is the process group: the browser and every
		// renderer, GPU and utility process it started.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})

	wsURL := make(chan string, 1)
	var tail strings.Builder
	var tailMu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if u, ok := strings.CutPrefix(line, "DevTools listening on "); ok {
				wsURL <- strings.TrimSpace(u)
			}
			tailMu.Lock()
			if tail.Len() < 8<<10 {
				tail.WriteString(line + "\n")
			}
			tailMu.Unlock()
		}
	}()
	var ws string
	select {
	case ws = <-wsURL:
	case <-exited:
		tailMu.Lock()
		defer tailMu.Unlock()
		t.Fatalf("chromium exited before listening:\n%s", tail.String())
	case <-time.After(30 * time.Second):
		t.Fatal("chromium did not print its DevTools address within 30s")
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	b := &browser{}
	b.conn, err = dialCDP(ctx, ws, b.event)
	if err != nil {
		t.Fatalf("connect to chromium: %v", err)
	}
	t.Cleanup(func() { b.conn.close() })
	return b
}

// event records the page's errors: uncaught exceptions, console.error,
// and browser log entries such as Content-Security-Policy violations.
// Failed requests (the refused key's 401s) are expected and not recorded.
func (b *browser) event(method string, params json.RawMessage) {
	var msg string
	switch method {
	case "Runtime.exceptionThrown":
		d := gjson.GetBytes(params, "exceptionDetails")
		msg = "exception: " + d.Get("exception.description").String() + " " + d.Get("text").String()
	case "Runtime.consoleAPICalled":
		if gjson.GetBytes(params, "type").String() != "error" {
			return
		}
		msg = "console.error: " + gjson.GetBytes(params, "args.#.value").Raw
	case "Log.entryAdded":
		e := gjson.GetBytes(params, "entry")
		if e.Get("level").String() != "error" || e.Get("source").String() == "network" {
			return
		}
		msg = "log: " + e.Get("source").String() + ": " + e.Get("text").String()
	default:
		return
	}
	b.mu.Lock()
	b.errors = append(b.errors, msg)
	b.mu.Unlock()
}

func (b *browser) pageErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...)
}

// page is one tab, attached as a flattened CDP session.
type page struct {
	b       *browser
	session string
}

func (b *browser) newPage(ctx context.Context, t *testing.T) *page {
	t.Helper()
	res, err := b.conn.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"})
	if err != nil {
		t.Fatalf("create target: %v", err)
	}
	res, err = b.conn.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": gjson.GetBytes(res, "targetId").String(), "flatten": true})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	p := &page{b: b, session: gjson.GetBytes(res, "sessionId").String()}
	for _, m := range []string{"Page.enable", "Runtime.enable", "Log.enable"} {
		p.call(ctx, t, m, nil)
	}
	p.call(ctx, t, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": false})
	return p
}

func (p *page) call(ctx context.Context, t *testing.T, method string, params any) json.RawMessage {
	t.Helper()
	res, err := p.b.conn.call(ctx, p.session, method, params)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return res
}

func (p *page) navigate(ctx context.Context, t *testing.T, u string) {
	t.Helper()
	res := p.call(ctx, t, "Page.navigate", map[string]any{"url": u})
	if e := gjson.GetBytes(res, "errorText").String(); e != "" {
		t.Fatalf("navigate to %s: %s", u, e)
	}
}

// eval evaluates a JavaScript expression in the page, awaiting a promise,
// and returns its value as JSON.
func (p *page) eval(ctx context.Context, t *testing.T, expr string) gjson.Result {
	t.Helper()
	res := p.call(ctx, t, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true})
	if ex := gjson.GetBytes(res, "exceptionDetails"); ex.Exists() {
		t.Fatalf("evaluate %s: %s %s", expr, ex.Get("text").String(), ex.Get("exception.description").String())
	}
	return gjson.GetBytes(res, "result.value")
}

func (p *page) evalString(ctx context.Context, t *testing.T, expr string) string {
	t.Helper()
	return p.eval(ctx, t, expr).String()
}

func (p *page) evalJSON(ctx context.Context, t *testing.T, expr string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(p.eval(ctx, t, expr).Raw), v); err != nil {
		t.Fatalf("decode page data: %v", err)
	}
}

// waitFor polls a JavaScript condition until it holds.
func (p *page) waitFor(ctx context.Context, t *testing.T, cond string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !p.eval(ctx, t, "(() => { try { return !!("+cond+"); } catch { return false; } })()").Bool() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 15s for %s", cond)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady waits until every panel has loaded, and fails on the page's
// own error banner.
func (p *page) waitReady(ctx context.Context, t *testing.T) {
	t.Helper()
	p.waitFor(ctx, t, `['ready', 'error'].includes(document.querySelector('[data-testid="dashboard"]').dataset.state)`)
	if state := p.evalString(ctx, t, `document.querySelector('[data-testid="dashboard"]').dataset.state`); state != "ready" {
		t.Fatalf("dashboard %s: %s", state, p.evalString(ctx, t, `document.querySelector('[data-testid="dashboard-error"]').textContent`))
	}
}

// click clicks the middle of the element with a data-testid with the
// mouse, as a user does.
func (p *page) click(ctx context.Context, t *testing.T, testid string) {
	t.Helper()
	p.clickSelector(ctx, t, `[data-testid="`+testid+`"]`)
}

// clickSelector clicks the first element a CSS selector matches.
func (p *page) clickSelector(ctx context.Context, t *testing.T, selector string) {
	t.Helper()
	box := p.eval(ctx, t, fmt.Sprintf(`(() => { const e = document.querySelector(%q);
		if (!e) return { w: 0 };
		e.scrollIntoView({ block: 'center' }); const r = e.getBoundingClientRect();
		return { x: r.x + r.width / 2, y: r.y + r.height / 2, w: r.width }; })()`, selector))
	if box.Get("w").Float() == 0 {
		t.Fatalf("%s is not visible", selector)
	}
	for _, typ := range []string{"mouseMoved", "mousePressed", "mouseReleased"} {
		p.call(ctx, t, "Input.dispatchMouseEvent", map[string]any{"type": typ, "x": box.Get("x").Float(), "y": box.Get("y").Float(),
			"button": "left", "clickCount": 1})
	}
}

// typeInto replaces an input's text as typing would.
func (p *page) typeInto(ctx context.Context, t *testing.T, testid, text string) {
	t.Helper()
	p.eval(ctx, t, fmt.Sprintf(`(() => { const e = document.querySelector('[data-testid="%s"]'); e.focus(); e.select(); })()`, testid))
	p.call(ctx, t, "Input.insertText", map[string]any{"text": text})
}

// selectOption picks an option of a <select> and, when the dashboard is
// shown, waits for it to reload.
func (p *page) selectOption(ctx context.Context, t *testing.T, testid, value string) {
	t.Helper()
	shown := p.eval(ctx, t, fmt.Sprintf(`(() => { const d = document.querySelector('[data-testid="dashboard"]');
		const s = document.querySelector('[data-testid="%s"]');
		d.dataset.state = 'stale'; s.value = %q; s.dispatchEvent(new Event('change', { bubbles: true }));
		return !d.hidden; })()`, testid, value)).Bool()
	if shown {
		p.waitReady(ctx, t)
	}
}

// screenshot saves the whole page as a PNG.
func (p *page) screenshot(ctx context.Context, t *testing.T, path string) {
	t.Helper()
	size := gjson.ParseBytes(p.call(ctx, t, "Page.getLayoutMetrics", nil)).Get("cssContentSize")
	res := p.call(ctx, t, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true,
		"clip": map[string]any{"x": 0, "y": 0, "width": size.Get("width").Float(), "height": size.Get("height").Float(), "scale": 1}})
	png, err := base64.StdEncoding.DecodeString(gjson.GetBytes(res, "data").String())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// cdpConn is a Chrome DevTools Protocol connection over a minimal
// websocket client (RFC 6455: masked client frames, text messages,
// fragmentation, ping and close), enough to talk to a local browser.
type cdpConn struct {
	conn    net.Conn
	br      *bufio.Reader
	wmu     sync.Mutex
	nextID  atomic.Int64
	onEvent func(method string, params json.RawMessage)

	mu      sync.Mutex
	pending map[int64]chan cdpMessage
	err     error
	done    chan struct{}
}

type cdpMessage struct {
	ID        int64           `json:"id,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// websocketGUID is the constant of the opening handshake (RFC 6455 1.3).
const websocketGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

func dialCDP(ctx context.Context, wsURL string, onEvent func(string, json.RawMessage)) (*cdpConn, error) {
	u, err := url.Parse(wsURL)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	req := "GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: " + key + "\r\nSec-WebSocket-Version: 13\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	sum := sha1.Sum([]byte(key + websocketGUID))
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		conn.Close()
		return nil, fmt.Errorf("websocket handshake: %s", resp.Status)
	}
	c := &cdpConn{conn: conn, br: br, onEvent: onEvent, pending: map[int64]chan cdpMessage{}, done: make(chan struct{})}
	go c.readLoop()
	return c, nil
}

func (c *cdpConn) close() {
	_ = c.conn.Close()
	<-c.done
}

// call sends a command (to a session when session is not empty) and waits
// for its answer.
func (c *cdpConn) call(ctx context.Context, session, method string, params any) (json.RawMessage, error) {
	id := c.nextID.Add(1)
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	reply := make(chan cdpMessage, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.pending[id] = reply
	c.mu.Unlock()
	if err := c.writeFrame(0x1, b); err != nil {
		return nil, err
	}
	select {
	case m := <-reply:
		if m.Error != nil {
			return nil, fmt.Errorf("%s: %d %s", method, m.Error.Code, m.Error.Message)
		}
		return m.Result, nil
	case <-c.done:
		return nil, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *cdpConn) readLoop() {
	var err error
	defer func() {
		c.mu.Lock()
		c.err = fmt.Errorf("devtools connection closed: %w", err)
		c.mu.Unlock()
		close(c.done)
	}()
	for {
		var data []byte
		if data, err = c.readMessage(); err != nil {
			return
		}
		var m cdpMessage
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		if m.ID == 0 {
			if c.onEvent != nil && m.Method != "" {
				c.onEvent(m.Method, m.Params)
			}
			continue
		}
		c.mu.Lock()
		reply := c.pending[m.ID]
		delete(c.pending, m.ID)
		c.mu.Unlock()
		if reply != nil {
			reply <- m
		}
	}
}

// maxMessage bounds one message (a full-page screenshot is the largest).
const maxMessage = 64 << 20

// readMessage reads one whole text or binary message, answering pings.
func (c *cdpConn) readMessage() ([]byte, error) {
	var msg []byte
	for {
		var h [2]byte
		if _, err := io.ReadFull(c.br, h[:]); err != nil {
			return nil, err
		}
		fin, op := h[0]&0x80 != 0, h[0]&0x0f
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			var b [2]byte
			if _, err := io.ReadFull(c.br, b[:]); err != nil {
				return nil, err
			}
			n = uint64(binary.BigEndian.Uint16(b[:]))
		case 127:
			var b [8]byte
			if _, err := io.ReadFull(c.br, b[:]); err != nil {
				return nil, err
			}
			n = binary.BigEndian.Uint64(b[:])
		}
		if n > maxMessage || uint64(len(msg))+n > maxMessage {
			return nil, errors.New("websocket message too large")
		}
		var mask [4]byte
		masked := h[1]&0x80 != 0
		if masked {
			if _, err := io.ReadFull(c.br, mask[:]); err != nil {
				return nil, err
			}
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(c.br, payload); err != nil {
			return nil, err
		}
		if masked {
			for i := range payload {
				payload[i] ^= mask[i%4]
			}
		}
		switch op {
		case 0x8: // close
			return nil, io.EOF
		case 0x9: // ping
			if err := c.writeFrame(0xA, payload); err != nil {
				return nil, err
			}
			continue
		case 0xA: // pong
			continue
		}
		msg = append(msg, payload...)
		if fin {
			return msg, nil
		}
	}
}

// writeFrame writes one masked frame, as a client must.
func (c *cdpConn) writeFrame(op byte, payload []byte) error {
	frame := []byte{0x80 | op}
	switch n := len(payload); {
	case n < 126:
		frame = append(frame, 0x80|byte(n))
	case n < 1<<16:
		frame = append(frame, 0x80|126)
		frame = binary.BigEndian.AppendUint16(frame, uint16(n))
	default:
		frame = append(frame, 0x80|127)
		frame = binary.BigEndian.AppendUint64(frame, uint64(n))
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	frame = append(frame, mask[:]...)
	for i, b := range payload {
		frame = append(frame, b^mask[i%4])
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.conn.Write(frame)
	return err
}
