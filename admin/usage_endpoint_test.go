package admin_test

import (
	"context"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/admin"
	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// endpointUsageResult is a result of either usage path, with every field
// as sent: absent fields stay nil.
type endpointUsageResult struct {
	Object            string  `json:"object"`
	InputTokens       int64   `json:"input_tokens"`
	OutputTokens      *int64  `json:"output_tokens"`
	InputCachedTokens *int64  `json:"input_cached_tokens"`
	NumModelRequests  int64   `json:"num_model_requests"`
	ProjectID         *string `json:"project_id"`
	Model             *string `json:"model"`
	Endpoint          *string `json:"endpoint"`
}

// endpointUsageAPI is the usage API over a real store holding, on usageDay
// at 01:00, one record per endpoint (and one from before endpoints were
// told apart) plus recs.
func endpointUsageAPI(t *testing.T, recs ...accounting.Record) *admin.UsageAPI {
	t.Helper()
	db := storetest.OpenOne(t)
	kr, err := auth.NewKeyring(config.Auth{Keys: []config.Key{{Name: "root", Key: usageRootKey, Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	at := usageDay.Add(time.Hour)
	base := []accounting.Record{
		endpointUsageRec("chat", "chat.completions", "m1", at, 10, 1, 2),
		endpointUsageRec("old", "", "m1", at, 5, 5, 0),
		endpointUsageRec("text", "completions", "m1", at, 20, 2, 0),
		endpointUsageRec("resp", "responses", "m2", at, 30, 3, 4),
		endpointUsageRec("emb-1", "embeddings", "e1", at, 40, 0, 0),
		endpointUsageRec("emb-2", "embeddings", "e1", at, 50, 0, 0),
	}
	if err := db.InsertRecords(context.Background(), append(base, recs...)); err != nil {
		t.Fatal(err)
	}
	return admin.NewUsageAPI(db, kr)
}

func endpointUsageRec(call, endpoint, model string, at time.Time, in, out, cached int64) accounting.Record {
	return accounting.Record{
		RequestID: call, CallID: call, TraceID: call, KeyName: "root", Team: "acme", Project: "bot",
		Model: model, ServedModel: model, Backend: "b", Endpoint: endpoint, Status: 200,
		PromptTokens: in, CompletionTokens: out, TotalTokens: in + out, CachedTokens: cached,
		Started: at, Ended: at.Add(time.Second),
	}
}

// getEndpointUsage GETs path?query and returns the status, the raw body and
// the results of its only bucket.
func getEndpointUsage(t *testing.T, api *admin.UsageAPI, path, query string) (int, string, []endpointUsageResult) {
	t.Helper()
	var req fasthttp.Request
	req.SetRequestURI(path + "?" + query)
	req.Header.Set("Authorization", "Bearer "+usageRootKey)
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil)
	switch path {
	case "/v1/organization/usage/completions":
		api.ServeUsage(&ctx)
	case "/v1/organization/usage/embeddings":
		api.ServeEmbeddingsUsage(&ctx)
	default:
		t.Fatalf("no usage path %s", path)
	}
	raw := string(ctx.Response.Body())
	if ctx.Response.StatusCode() != 200 {
		return ctx.Response.StatusCode(), raw, nil
	}
	var page struct {
		Data []struct {
			Results []endpointUsageResult `json:"results"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ctx.Response.Body(), &page); err != nil {
		t.Fatalf("body %s: %v", raw, err)
	}
	if len(page.Data) != 1 {
		t.Fatalf("%d buckets, want 1: %s", len(page.Data), raw)
	}
	return 200, raw, page.Data[0].Results
}

func TestUsageAPIEndpoints(t *testing.T) {
	api := endpointUsageAPI(t)
	day0 := "start_time=" + usageStart(0) + "&end_time=" + usageStart(24*time.Hour)
	const (
		completionsPath = "/v1/organization/usage/completions"
		embeddingsPath  = "/v1/organization/usage/embeddings"
		completionsObj  = "organization.usage.completions.result"
		embeddingsObj   = "organization.usage.embeddings.result"
	)
	n := func(v int64) *int64 { return &v }
	tests := []struct {
		name  string
		path  string
		query string
		want  []endpointUsageResult
	}{
		{
			name: "completions count every text generation, not embeddings",
			path: completionsPath, query: day0,
			want: []endpointUsageResult{{Object: completionsObj, InputTokens: 65, OutputTokens: n(11), InputCachedTokens: n(6), NumModelRequests: 4}},
		},
		{
			name: "completions by endpoint",
			path: completionsPath, query: day0 + "&group_by=endpoint",
			want: []endpointUsageResult{
				{Object: completionsObj, InputTokens: 15, OutputTokens: n(6), InputCachedTokens: n(2), NumModelRequests: 2, Endpoint: usagePtr("chat.completions")},
				{Object: completionsObj, InputTokens: 20, OutputTokens: n(2), InputCachedTokens: n(0), NumModelRequests: 1, Endpoint: usagePtr("completions")},
				{Object: completionsObj, InputTokens: 30, OutputTokens: n(3), InputCachedTokens: n(4), NumModelRequests: 1, Endpoint: usagePtr("responses")},
			},
		},
		{
			name: "endpoints= chooses, every endpoint at once",
			path: completionsPath, query: day0 + "&group_by=endpoint&endpoints=chat.completions,completions,responses&endpoints[]=embeddings",
			want: []endpointUsageResult{
				{Object: completionsObj, InputTokens: 15, OutputTokens: n(6), InputCachedTokens: n(2), NumModelRequests: 2, Endpoint: usagePtr("chat.completions")},
				{Object: completionsObj, InputTokens: 20, OutputTokens: n(2), InputCachedTokens: n(0), NumModelRequests: 1, Endpoint: usagePtr("completions")},
				{Object: completionsObj, InputTokens: 90, OutputTokens: n(0), InputCachedTokens: n(0), NumModelRequests: 2, Endpoint: usagePtr("embeddings")},
				{Object: completionsObj, InputTokens: 30, OutputTokens: n(3), InputCachedTokens: n(4), NumModelRequests: 1, Endpoint: usagePtr("responses")},
			},
		},
		{
			name: "endpoints= narrows",
			path: completionsPath, query: day0 + "&endpoints=responses",
			want: []endpointUsageResult{{Object: completionsObj, InputTokens: 30, OutputTokens: n(3), InputCachedTokens: n(4), NumModelRequests: 1}},
		},
		{
			name: "embeddings, in OpenAI's embeddings shape",
			path: embeddingsPath, query: day0,
			want: []endpointUsageResult{{Object: embeddingsObj, InputTokens: 90, NumModelRequests: 2}},
		},
		{
			name: "embeddings by model and project",
			path: embeddingsPath, query: day0 + "&group_by=model,project_id",
			want: []endpointUsageResult{{Object: embeddingsObj, InputTokens: 90, NumModelRequests: 2, Model: usagePtr("e1"), ProjectID: usagePtr("acme/bot")}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, raw, got := getEndpointUsage(t, api, tt.path, tt.query)
			if status != 200 {
				t.Fatalf("status %d: %s", status, raw)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("results = %s\nwant %s", usageJSON(got), usageJSON(tt.want))
			}
			// Without group_by=endpoint the answer keeps OpenAI's shape
			// exactly: no endpoint field.
			if grouped := strings.Contains(tt.query, "group_by=endpoint"); strings.Contains(raw, `"endpoint"`) != grouped {
				t.Errorf("grouped by endpoint %v, but body %s", grouped, raw)
			}
		})
	}

	t.Run("embeddings refuse an unknown endpoint too", func(t *testing.T) {
		status, raw, _ := getEndpointUsage(t, api, embeddingsPath, day0+"&endpoints=image")
		if status != 400 || !strings.Contains(raw, `"param":"endpoints"`) {
			t.Errorf("status %d, body %s; want a 400 naming endpoints", status, raw)
		}
	})
}

// TestUsageAPISaturates reads usage over records a backend could have
// reported before counts were checked (2^62 twice, 2^63-1, negative): the
// API answers 200 with sums saturated at 2^63-1, never 500 or a negative
// number.
func TestUsageAPISaturates(t *testing.T) {
	at := usageDay.Add(2 * time.Hour)
	api := endpointUsageAPI(t,
		endpointUsageRec("half-1", "chat.completions", "huge", at, 1<<62, 1<<62, 0),
		endpointUsageRec("half-2", "chat.completions", "huge", at, 1<<62, 1<<62, 0),
		endpointUsageRec("max", "chat.completions", "max", at, math.MaxInt64, 1, math.MaxInt64),
		endpointUsageRec("neg", "chat.completions", "neg", at, -100, -1, -5),
		endpointUsageRec("emb-max", "embeddings", "e1", at, math.MaxInt64, 0, 0),
	)
	day0 := "start_time=" + usageStart(0) + "&end_time=" + usageStart(24*time.Hour)
	n := func(v int64) *int64 { return &v }
	const maxInt = math.MaxInt64
	tests := []struct {
		name  string
		path  string
		query string
		want  []endpointUsageResult
	}{
		{
			name: "by model", path: "/v1/organization/usage/completions", query: day0 + "&group_by=model&models=huge,max,neg",
			want: []endpointUsageResult{
				{Object: "organization.usage.completions.result", InputTokens: maxInt, OutputTokens: n(maxInt), InputCachedTokens: n(0), NumModelRequests: 2, Model: usagePtr("huge")},
				{Object: "organization.usage.completions.result", InputTokens: maxInt, OutputTokens: n(1), InputCachedTokens: n(maxInt), NumModelRequests: 1, Model: usagePtr("max")},
				{Object: "organization.usage.completions.result", InputTokens: 0, OutputTokens: n(0), InputCachedTokens: n(0), NumModelRequests: 1, Model: usagePtr("neg")},
			},
		},
		{
			name: "every record together", path: "/v1/organization/usage/completions", query: day0,
			want: []endpointUsageResult{{Object: "organization.usage.completions.result", InputTokens: maxInt, OutputTokens: n(maxInt), InputCachedTokens: n(maxInt), NumModelRequests: 8}},
		},
		{
			name: "embeddings", path: "/v1/organization/usage/embeddings", query: day0,
			want: []endpointUsageResult{{Object: "organization.usage.embeddings.result", InputTokens: maxInt, NumModelRequests: 3}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, raw, got := getEndpointUsage(t, api, tt.path, tt.query)
			if status != 200 {
				t.Fatalf("status %d: %s", status, raw)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("results = %s\nwant %s", usageJSON(got), usageJSON(tt.want))
			}
		})
	}
}

// TestUsageAPICacheWrites shows the input tokens a Messages API request
// wrote to the prompt cache, part of its input tokens, as
// input_cache_write_tokens, on the results that have some only.
func TestUsageAPICacheWrites(t *testing.T) {
	msg := endpointUsageRec("msg", "messages", "m1", usageDay.Add(time.Hour), 100, 7, 30)
	msg.CacheWriteTokens = 50
	api := endpointUsageAPI(t, msg)
	status, raw, _ := getEndpointUsage(t, api, "/v1/organization/usage/completions",
		"start_time="+usageStart(0)+"&end_time="+usageStart(24*time.Hour)+"&group_by=endpoint")
	if status != 200 {
		t.Fatalf("status %d: %s", status, raw)
	}
	var page struct {
		Data []struct {
			Results []map[string]any `json:"results"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(raw), &page); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, r := range page.Data[0].Results {
		w, has := r["input_cache_write_tokens"]
		switch r["endpoint"] {
		case "messages":
			seen++
			if w != 50.0 || r["input_tokens"] != 100.0 || r["input_cached_tokens"] != 30.0 {
				t.Errorf("messages result %v", r)
			}
		default:
			if has {
				t.Errorf("a result without cache writes has them: %v", r)
			}
		}
	}
	if seen != 1 {
		t.Errorf("no messages result: %s", raw)
	}
}
