package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
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

const (
	usageRootKey = "usage-root-secret"
	usageAcmeKey = "usage-acme-secret"
)

// usageDay is the first day of the test data, a UTC midnight.
var usageDay = time.Date(2025, 3, 10, 0, 0, 0, 0, time.UTC)

// usageEnv is the usage API over a real store holding:
//
//	day 0 01:00  acme/bot  m1 acme-ci  in 10 out 1 cached 5
//	day 1 02:00  acme/ops  m2 acme-ci  in 20 out 2
//	day 1 03:00  beta/inf  m1 root     in 40 out 4 cached 1
//	day 2 00:30  acme/bot  m1 acme-ci  in 7  out 7
type usageEnv struct {
	api *admin.UsageAPI
	db  *store.DB
}

func newUsageEnv(t *testing.T) *usageEnv {
	t.Helper()
	db := storetest.OpenOne(t)
	t.Cleanup(func() { db.Close() })
	kr, err := auth.NewKeyring(config.Auth{Keys: []config.Key{
		{Name: "root", Key: usageRootKey, Admin: true},
		{Name: "acme-ci", Key: usageAcmeKey, Teams: []string{"acme"}, DefaultTeam: "acme"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	rec := func(call, team, project, model, key string, at time.Duration, in, out, cached int64) accounting.Record {
		return accounting.Record{
			RequestID: call, CallID: call, TraceID: call, KeyName: key, Team: team, Project: project,
			Model: model, ServedModel: model, Backend: "b", Status: 200,
			PromptTokens: in, CompletionTokens: out, TotalTokens: in + out, CachedTokens: cached,
			Started: usageDay.Add(at), Ended: usageDay.Add(at + time.Second),
		}
	}
	const day = 24 * time.Hour
	if err := db.InsertRecords(context.Background(), []accounting.Record{
		rec("r1", "acme", "bot", "m1", "acme-ci", time.Hour, 10, 1, 5),
		rec("r2", "acme", "ops", "m2", "acme-ci", day+2*time.Hour, 20, 2, 0),
		rec("r3", "beta", "inf", "m1", "root", day+3*time.Hour, 40, 4, 1),
		rec("r4", "acme", "bot", "m1", "acme-ci", 2*day+30*time.Minute, 7, 7, 0),
	}); err != nil {
		t.Fatal(err)
	}
	return &usageEnv{api: admin.NewUsageAPI(db, kr), db: db}
}

// usageLogger keeps what the handler logs through the request's logger.
type usageLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *usageLogger) Printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

type usageResponse struct {
	status int
	header *fasthttp.ResponseHeader
	raw    []byte
	body   map[string]any
}

func (e *usageEnv) get(t *testing.T, key, query string) usageResponse {
	t.Helper()
	return e.do(t, fasthttp.MethodGet, key, query, nil)
}

func (e *usageEnv) do(t *testing.T, method, key, query string, log fasthttp.Logger) usageResponse {
	t.Helper()
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI("/v1/organization/usage/completions?" + query)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, log)
	e.api.ServeUsage(&ctx)
	r := usageResponse{status: ctx.Response.StatusCode(), header: &ctx.Response.Header, raw: append([]byte(nil), ctx.Response.Body()...)}
	if ct := string(ctx.Response.Header.ContentType()); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	if err := json.Unmarshal(r.raw, &r.body); err != nil {
		t.Fatalf("body %s: %v", r.raw, err)
	}
	return r
}

func usageStart(d time.Duration) string { return strconv.FormatInt(usageDay.Add(d).Unix(), 10) }

// wantUsageError checks the OpenAI error shape.
func wantUsageError(t *testing.T, r usageResponse, status int, typ string, param, code any) string {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.raw)
	}
	e, ok := r.body["error"].(map[string]any)
	if !ok || len(r.body) != 1 {
		t.Fatalf("body %s is not {\"error\": {...}}", r.raw)
	}
	want := map[string]any{"message": e["message"], "type": typ, "param": param, "code": code}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("error = %v, want %v", e, want)
	}
	msg, _ := e["message"].(string)
	if msg == "" {
		t.Error("empty message")
	}
	return msg
}

func TestUsageAPIAuthentication(t *testing.T) {
	e := newUsageEnv(t)
	for _, key := range []string{"", "wrong"} {
		t.Run("key="+key, func(t *testing.T) {
			r := e.get(t, key, "start_time=0")
			wantUsageError(t, r, 401, "invalid_request_error", nil, "invalid_api_key")
		})
	}
	r := e.do(t, fasthttp.MethodPost, usageRootKey, "start_time=0", nil)
	wantUsageError(t, r, 405, "invalid_request_error", nil, nil)
	if allow := string(r.header.Peek("Allow")); allow != "GET" {
		t.Errorf("Allow = %q", allow)
	}
}

func TestUsageAPIBadParameters(t *testing.T) {
	e := newUsageEnv(t)
	tests := []struct {
		query string
		param string
	}{
		{"", "start_time"},
		{"end_time=10", "start_time"},
		{"start_time=abc", "start_time"},
		{"start_time=-5", "start_time"},
		{"start_time=1.5", "start_time"},
		{"start_time=99999999999999", "start_time"},
		{"start_time=100&end_time=100", "end_time"},
		{"start_time=100&end_time=50", "end_time"},
		{"start_time=100&end_time=x", "end_time"},
		{"start_time=100&bucket_width=1w", "bucket_width"},
		{"start_time=100&limit=0", "limit"},
		{"start_time=100&limit=32", "limit"},
		{"start_time=100&bucket_width=1h&limit=169", "limit"},
		{"start_time=100&bucket_width=1m&limit=1441", "limit"},
		{"start_time=100&limit=seven", "limit"},
		{"start_time=100&group_by=user_id", "group_by"},
		{"start_time=100&group_by=project_id,batch", "group_by"},
		{"start_time=100&project_ids=acme", "project_ids"},
		{"start_time=100&project_ids=acme/", "project_ids"},
		{"start_time=100&project_ids=/bot", "project_ids"},
		{"start_time=100&project_ids=a/b/c", "project_ids"},
		{"start_time=100&endpoints=chat", "endpoints"},
		{"start_time=100&endpoints=embeddings,images", "endpoints"},
		{"start_time=100&page=garbage", "page"},
		{"start_time=100&page=page_MTIz", "page"}, // "123": not a bucket of this range
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			r := e.get(t, usageRootKey, tt.query)
			msg := wantUsageError(t, r, 400, "invalid_request_error", tt.param, nil)
			if !strings.Contains(msg, tt.param) {
				t.Errorf("message %q does not name %s", msg, tt.param)
			}
		})
	}
}

type usageResult struct {
	Object            string  `json:"object"`
	InputTokens       int64   `json:"input_tokens"`
	OutputTokens      int64   `json:"output_tokens"`
	InputCachedTokens int64   `json:"input_cached_tokens"`
	NumModelRequests  int64   `json:"num_model_requests"`
	ProjectID         *string `json:"project_id"`
	APIKeyID          *string `json:"api_key_id"`
	Model             *string `json:"model"`
}

type usageBucket struct {
	Object    string        `json:"object"`
	StartTime int64         `json:"start_time"`
	EndTime   int64         `json:"end_time"`
	Results   []usageResult `json:"results"`
}

type usagePage struct {
	Object   string        `json:"object"`
	Data     []usageBucket `json:"data"`
	HasMore  bool          `json:"has_more"`
	NextPage *string       `json:"next_page"`
}

func decodeUsagePageBody(t *testing.T, r usageResponse) usagePage {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status = %d, body %s", r.status, r.raw)
	}
	var p usagePage
	if err := json.Unmarshal(r.raw, &p); err != nil {
		t.Fatal(err)
	}
	if p.Object != "page" {
		t.Errorf("object = %q", p.Object)
	}
	for _, b := range p.Data {
		if b.Object != "bucket" || b.Results == nil {
			t.Errorf("bucket %+v: want object bucket and results a list", b)
		}
		for _, res := range b.Results {
			if res.Object != "organization.usage.completions.result" {
				t.Errorf("result object = %q", res.Object)
			}
		}
	}
	return p
}

func usagePtr(s string) *string { return &s }

// usageTotals is a bucket's results without their object field, for
// comparing.
func usageTotals(b usageBucket) []usageResult {
	out := make([]usageResult, len(b.Results))
	for i, r := range b.Results {
		r.Object = ""
		out[i] = r
	}
	return out
}

func TestUsageAPIDailyBucketsWithoutGrouping(t *testing.T) {
	e := newUsageEnv(t)
	// start_time inside day 0: buckets snap to UTC midnight and sum whole days.
	r := e.get(t, usageRootKey, "start_time="+usageStart(3*time.Hour)+"&end_time="+usageStart(72*time.Hour))
	p := decodeUsagePageBody(t, r)
	if p.HasMore || p.NextPage != nil {
		t.Errorf("has_more %v next_page %v, want false, null", p.HasMore, p.NextPage)
	}
	want := [][]usageResult{
		{{InputTokens: 10, OutputTokens: 1, InputCachedTokens: 5, NumModelRequests: 1}},
		{{InputTokens: 60, OutputTokens: 6, InputCachedTokens: 1, NumModelRequests: 2}},
		{{InputTokens: 7, OutputTokens: 7, NumModelRequests: 1}},
	}
	if len(p.Data) != len(want) {
		t.Fatalf("%d buckets, want %d: %s", len(p.Data), len(want), r.raw)
	}
	for i, b := range p.Data {
		start := usageDay.Add(time.Duration(i) * 24 * time.Hour).Unix()
		if b.StartTime != start || b.EndTime != start+86400 {
			t.Errorf("bucket %d spans %d-%d, want %d-%d", i, b.StartTime, b.EndTime, start, start+86400)
		}
		if got := usageTotals(b); !reflect.DeepEqual(got, want[i]) {
			t.Errorf("bucket %d = %+v, want %+v", i, got, want[i])
		}
	}
	// Fields not grouped by are present and null, as OpenAI sends them.
	if !strings.Contains(string(r.raw), `"project_id":null,"api_key_id":null,"model":null`) {
		t.Errorf("ungrouped fields are not null: %s", r.raw)
	}
}

func TestUsageAPIGroupingAndFilters(t *testing.T) {
	e := newUsageEnv(t)
	day1 := "start_time=" + usageStart(24*time.Hour) + "&end_time=" + usageStart(48*time.Hour)
	tests := []struct {
		name  string
		key   string
		query string
		want  []usageResult
	}{
		{
			name:  "every group, repeated, comma separated and in brackets",
			key:   usageRootKey,
			query: day1 + "&group_by=project_id,model&group_by[]=api_key_id",
			want: []usageResult{
				{InputTokens: 20, OutputTokens: 2, NumModelRequests: 1, ProjectID: usagePtr("acme/ops"), APIKeyID: usagePtr("acme-ci"), Model: usagePtr("m2")},
				{InputTokens: 40, OutputTokens: 4, InputCachedTokens: 1, NumModelRequests: 1, ProjectID: usagePtr("beta/inf"), APIKeyID: usagePtr("root"), Model: usagePtr("m1")},
			},
		},
		{
			name:  "by model only",
			key:   usageRootKey,
			query: day1 + "&group_by=model",
			want: []usageResult{
				{InputTokens: 40, OutputTokens: 4, InputCachedTokens: 1, NumModelRequests: 1, Model: usagePtr("m1")},
				{InputTokens: 20, OutputTokens: 2, NumModelRequests: 1, Model: usagePtr("m2")},
			},
		},
		{
			name:  "project and model filters",
			key:   usageRootKey,
			query: day1 + "&group_by=project_id&project_ids=acme/ops,beta/inf&models[]=m1",
			want:  []usageResult{{InputTokens: 40, OutputTokens: 4, InputCachedTokens: 1, NumModelRequests: 1, ProjectID: usagePtr("beta/inf")}},
		},
		{
			name:  "a team key sees only its teams",
			key:   usageAcmeKey,
			query: day1 + "&group_by=project_id",
			want:  []usageResult{{InputTokens: 20, OutputTokens: 2, NumModelRequests: 1, ProjectID: usagePtr("acme/ops")}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := decodeUsagePageBody(t, e.get(t, tt.key, tt.query))
			if len(p.Data) != 1 {
				t.Fatalf("%d buckets, want 1", len(p.Data))
			}
			if got := usageTotals(p.Data[0]); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("results = %s, want %s", usageJSON(got), usageJSON(tt.want))
			}
		})
	}

	t.Run("a team key may not name another team", func(t *testing.T) {
		r := e.get(t, usageAcmeKey, day1+"&project_ids=beta/inf")
		wantUsageError(t, r, 403, "permission_denied", "project_ids", nil)
	})
}

func usageJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestUsageAPIPagination(t *testing.T) {
	e := newUsageEnv(t)
	tests := []struct {
		name  string
		query string
		// pages lists, per page, how many buckets it has and the input
		// tokens of each.
		pages [][]int64
	}{
		{
			name:  "hourly, default limit 24",
			query: "bucket_width=1h&start_time=" + usageStart(0) + "&end_time=" + usageStart(28*time.Hour),
			pages: [][]int64{
				{0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
				{0, 0, 20, 40},
			},
		},
		{
			name:  "daily, limit 2",
			query: "limit=2&start_time=" + usageStart(0) + "&end_time=" + usageStart(72*time.Hour),
			pages: [][]int64{{10, 60}, {7}},
		},
		{
			name:  "minutes, unaligned end",
			query: "bucket_width=1m&limit=2&start_time=" + usageStart(time.Hour-time.Minute) + "&end_time=" + usageStart(time.Hour+90*time.Second),
			pages: [][]int64{{0, 10}, {0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			query := tt.query
			var prevEnd int64
			for i, want := range tt.pages {
				p := decodeUsagePageBody(t, e.get(t, usageRootKey, query))
				var got []int64
				for j, b := range p.Data {
					if j == 0 && i > 0 && b.StartTime != prevEnd {
						t.Errorf("page %d starts at %d, previous ended at %d", i, b.StartTime, prevEnd)
					}
					prevEnd = b.EndTime
					var in int64
					for _, r := range b.Results {
						in += r.InputTokens
					}
					got = append(got, in)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("page %d input tokens = %v, want %v", i, got, want)
				}
				last := i == len(tt.pages)-1
				if p.HasMore == last || (p.NextPage == nil) != last {
					t.Fatalf("page %d: has_more %v next_page %v", i, p.HasMore, p.NextPage)
				}
				if !last {
					query = tt.query + "&page=" + *p.NextPage
				}
			}
		})
	}
}

func TestUsageAPIEmptyRanges(t *testing.T) {
	e := newUsageEnv(t)
	t.Run("buckets without usage are listed", func(t *testing.T) {
		p := decodeUsagePageBody(t, e.get(t, usageRootKey, "start_time="+usageStart(-72*time.Hour)+"&end_time="+usageStart(-24*time.Hour)))
		if len(p.Data) != 2 || len(p.Data[0].Results) != 0 || len(p.Data[1].Results) != 0 {
			t.Errorf("data = %+v, want two empty buckets", p.Data)
		}
	})
	t.Run("a start in the future has no buckets", func(t *testing.T) {
		future := strconv.FormatInt(time.Now().Add(72*time.Hour).Unix(), 10)
		r := e.get(t, usageRootKey, "start_time="+future)
		p := decodeUsagePageBody(t, r)
		if len(p.Data) != 0 || p.HasMore || !strings.Contains(string(r.raw), `"data":[]`) {
			t.Errorf("answer %s, want an empty data list", r.raw)
		}
	})
	t.Run("end_time defaults to now", func(t *testing.T) {
		start := time.Now().Add(-time.Hour).Truncate(time.Hour)
		p := decodeUsagePageBody(t, e.get(t, usageRootKey, "bucket_width=1h&start_time="+strconv.FormatInt(start.Unix(), 10)))
		if n := len(p.Data); n < 1 || n > 3 {
			t.Errorf("%d hourly buckets from an hour ago to now, want 1 to 3", n)
		}
	})
}

func TestUsageAPIStoreError(t *testing.T) {
	e := newUsageEnv(t)
	e.db.Close()
	log := &usageLogger{}
	r := e.do(t, fasthttp.MethodGet, usageRootKey, "start_time="+usageStart(0)+"&end_time="+usageStart(time.Hour), log)
	msg := wantUsageError(t, r, 500, "api_error", nil, nil)
	if strings.Contains(msg, "closed") {
		t.Errorf("message %q leaks the store's error", msg)
	}
	if len(log.lines) != 1 || !strings.Contains(log.lines[0], "closed") {
		t.Errorf("logged %q, want the store's error once", log.lines)
	}
}
