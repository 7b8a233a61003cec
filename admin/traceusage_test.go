package admin

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"testing"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/trace"
)

// wireUsage is one model entry of call_usage as clients decode it.
type wireUsage struct {
	Requests                          int64    `json:"requests"`
	PromptTokens                      int64    `json:"prompt_tokens"`
	CompletionTokens                  int64    `json:"completion_tokens"`
	TotalTokens                       int64    `json:"total_tokens"`
	CacheReadInputTokens              int64    `json:"cache_read_input_tokens"`
	CacheCreationInputTokens          int64    `json:"cache_creation_input_tokens"`
	PromptTokensTotalCost             *float64 `json:"prompt_tokens_total_cost"`
	CompletionTokensTotalCost         *float64 `json:"completion_tokens_total_cost"`
	CacheReadInputTokensTotalCost     *float64 `json:"cache_read_input_tokens_total_cost"`
	CacheCreationInputTokensTotalCost *float64 `json:"cache_creation_input_tokens_total_cost"`
}

type wireTraceUsage struct {
	CallUsage         map[string]map[string]wireUsage `json:"call_usage"`
	UnfinishedCallIDs []string                        `json:"unfinished_call_ids"`
}

func rollUp(t testing.TB, calls []trace.UsageCall, pricing map[string]config.Pricing, costs bool) wireTraceUsage {
	t.Helper()
	b := computeTraceUsage(calls, pricing, costs).appendJSON(nil)
	if !json.Valid(b) {
		t.Fatalf("invalid JSON: %s", b)
	}
	var out wireTraceUsage
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return out
}

func tokens(p, c, total int64) wireUsage {
	return wireUsage{PromptTokens: p, CompletionTokens: c, TotalTokens: total}
}

func TestTraceUsageWorkedExample(t *testing.T) {
	// The reference's worked example: root {p5,c5,t10}, child {input 2,
	// output 1}, grandchild {p3,c1,t4} → root p10 c7 t17; child p5 c2 t7.
	calls := []trace.UsageCall{
		{ID: "root", Usage: `{"m":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}`},
		{ID: "child", ParentID: "root", Usage: `{"m":{"input_tokens":2,"output_tokens":1}}`},
		{ID: "grandchild", ParentID: "child", Usage: `{"m":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`},
	}
	got := rollUp(t, calls, nil, false)
	want := map[string]map[string]wireUsage{
		"root":       {"m": tokens(10, 7, 17)},
		"child":      {"m": tokens(5, 2, 7)},
		"grandchild": {"m": tokens(3, 1, 4)},
	}
	if !reflect.DeepEqual(got.CallUsage, want) {
		t.Fatalf("call_usage = %+v\nwant %+v", got.CallUsage, want)
	}
	if len(got.UnfinishedCallIDs) != 0 {
		t.Fatalf("unfinished = %v", got.UnfinishedCallIDs)
	}
}

func TestTraceUsageEdgeCases(t *testing.T) {
	tests := []struct {
		name       string
		calls      []trace.UsageCall
		want       map[string]map[string]wireUsage
		unfinished []string
	}{
		{
			name: "calls without usage are present as {}",
			calls: []trace.UsageCall{
				{ID: "a"}, {ID: "b", ParentID: "a", Usage: `{}`}, {ID: "c", Usage: `null`},
			},
			want: map[string]map[string]wireUsage{"a": {}, "b": {}, "c": {}},
		},
		{
			name: "a parent outside the selection makes the call a root",
			calls: []trace.UsageCall{
				{ID: "x", ParentID: "not-selected", Usage: `{"m":{"prompt_tokens":1,"completion_tokens":2}}`},
				{ID: "y", ParentID: "x", Usage: `{"m":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`},
			},
			want: map[string]map[string]wireUsage{"x": {"m": tokens(2, 3, 5)}, "y": {"m": tokens(1, 1, 2)}},
		},
		{
			name:  "input and output tokens fold into prompt and completion, total filled in",
			calls: []trace.UsageCall{{ID: "a", Usage: `{"m":{"prompt_tokens":1,"input_tokens":2,"completion_tokens":3,"output_tokens":4}}`}},
			want:  map[string]map[string]wireUsage{"a": {"m": tokens(3, 7, 10)}},
		},
		{
			name:  "a given total is kept",
			calls: []trace.UsageCall{{ID: "a", Usage: `{"m":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":9}}`}},
			want:  map[string]map[string]wireUsage{"a": {"m": tokens(1, 1, 9)}},
		},
		{
			name:  "all-zero entries are dropped, requests alone keep an entry",
			calls: []trace.UsageCall{{ID: "a", Usage: `{"zero":{"requests":0,"prompt_tokens":0},"req":{"requests":1}}`}},
			want:  map[string]map[string]wireUsage{"a": {"req": {Requests: 1}}},
		},
		{
			name:  "non-object entries are skipped",
			calls: []trace.UsageCall{{ID: "a", Usage: `{"bad":5,"list":[1],"m":{"prompt_tokens":1}}`}},
			want:  map[string]map[string]wireUsage{"a": {"m": tokens(1, 0, 1)}},
		},
		{
			name:  "usage that is not an object counts nothing",
			calls: []trace.UsageCall{{ID: "a", Usage: `[1,2]`}},
			want:  map[string]map[string]wireUsage{"a": {}},
		},
		{
			name: "cache counts are copied and summed",
			calls: []trace.UsageCall{
				{ID: "r", Usage: `{"m":{"requests":1,"prompt_tokens":10,"cache_read_input_tokens":4,"cache_creation_input_tokens":2}}`},
				{ID: "c", ParentID: "r", Usage: `{"m":{"requests":1,"prompt_tokens":10,"cache_read_input_tokens":6}}`},
			},
			want: map[string]map[string]wireUsage{
				"r": {"m": {Requests: 2, PromptTokens: 20, TotalTokens: 20, CacheReadInputTokens: 10, CacheCreationInputTokens: 2}},
				"c": {"m": {Requests: 1, PromptTokens: 10, TotalTokens: 10, CacheReadInputTokens: 6}},
			},
		},
		{
			name: "a model new to the parent is copied, an existing one summed",
			calls: []trace.UsageCall{
				{ID: "r", Usage: `{"a":{"requests":1,"prompt_tokens":1}}`},
				{ID: "c1", ParentID: "r", Usage: `{"a":{"requests":1,"prompt_tokens":2},"b":{"requests":1,"completion_tokens":3}}`},
				{ID: "c2", ParentID: "r", Usage: `{"b":{"requests":2,"completion_tokens":4}}`},
			},
			want: map[string]map[string]wireUsage{
				"r":  {"a": {Requests: 2, PromptTokens: 3, TotalTokens: 3}, "b": {Requests: 3, CompletionTokens: 7, TotalTokens: 7}},
				"c1": {"a": {Requests: 1, PromptTokens: 2, TotalTokens: 2}, "b": {Requests: 1, CompletionTokens: 3, TotalTokens: 3}},
				"c2": {"b": {Requests: 2, CompletionTokens: 4, TotalTokens: 4}},
			},
		},
		{
			name: "unfinished calls are listed in selection order",
			calls: []trace.UsageCall{
				{ID: "r", Unfinished: true}, {ID: "c", ParentID: "r"}, {ID: "d", ParentID: "r", Unfinished: true},
			},
			want:       map[string]map[string]wireUsage{"r": {}, "c": {}, "d": {}},
			unfinished: []string{"r", "d"},
		},
		{
			name: "a self parent and a cycle end without hanging",
			calls: []trace.UsageCall{
				{ID: "s", ParentID: "s", Usage: `{"m":{"prompt_tokens":1}}`},
				{ID: "p", ParentID: "q", Usage: `{"m":{"prompt_tokens":1}}`},
				{ID: "q", ParentID: "p", Usage: `{"m":{"prompt_tokens":1}}`},
			},
			want: map[string]map[string]wireUsage{
				"s": {"m": tokens(1, 0, 1)}, "p": {"m": tokens(1, 0, 1)}, "q": {"m": tokens(1, 0, 1)},
			},
		},
		{
			name: "a repeated id counts once",
			calls: []trace.UsageCall{
				{ID: "r"},
				{ID: "c", ParentID: "r", Usage: `{"m":{"prompt_tokens":1}}`},
				{ID: "c", ParentID: "r", Usage: `{"m":{"prompt_tokens":5}}`},
			},
			want: map[string]map[string]wireUsage{"r": {"m": tokens(1, 0, 1)}, "c": {"m": tokens(1, 0, 1)}},
		},
		{
			name:  "model names with dots, quotes and non-ASCII survive",
			calls: []trace.UsageCall{{ID: "i\"d", Usage: `{"gpt-4.1 \"x\" é":{"prompt_tokens":1}}`}},
			want:  map[string]map[string]wireUsage{"i\"d": {"gpt-4.1 \"x\" é": tokens(1, 0, 1)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := rollUp(t, tt.calls, nil, false)
			if !reflect.DeepEqual(got.CallUsage, tt.want) {
				t.Fatalf("call_usage = %+v\nwant %+v", got.CallUsage, tt.want)
			}
			if len(got.UnfinishedCallIDs) != len(tt.unfinished) ||
				(len(tt.unfinished) > 0 && !reflect.DeepEqual(got.UnfinishedCallIDs, tt.unfinished)) {
				t.Fatalf("unfinished = %v, want %v", got.UnfinishedCallIDs, tt.unfinished)
			}
			if got.UnfinishedCallIDs == nil {
				t.Fatal("unfinished_call_ids must be a list, not null")
			}
		})
	}
}

func TestTraceUsageCosts(t *testing.T) {
	pricing := map[string]config.Pricing{
		"priced":  {PromptPerMTok: 2, CompletionPerMTok: 10, CachedPromptPerMTok: 1},
		"nocache": {PromptPerMTok: 3, CompletionPerMTok: 6},
		"writes":  {PromptPerMTok: 3, CompletionPerMTok: 15, CachedPromptPerMTok: 0.3, CacheWritePerMTok: 3.75},
	}
	calls := []trace.UsageCall{
		{ID: "r", Usage: `{"priced":{"requests":1,"prompt_tokens":1000000,"completion_tokens":500000,"cache_read_input_tokens":400000}}`},
		{ID: "c", ParentID: "r", Usage: `{"nocache":{"requests":1,"prompt_tokens":1000000,"completion_tokens":1000000,"cache_read_input_tokens":500000},"free":{"requests":1,"prompt_tokens":7}}`},
		{ID: "w", Usage: `{"writes":{"requests":1,"prompt_tokens":1000000,"completion_tokens":0,"cache_read_input_tokens":200000,"cache_creation_input_tokens":500000},` +
			`"nocache":{"requests":1,"prompt_tokens":100,"cache_creation_input_tokens":40}}`},
	}
	t.Run("without include_costs the costs are null", func(t *testing.T) {
		got := rollUp(t, calls, pricing, false)
		for id, models := range got.CallUsage {
			for m, u := range models {
				if u.PromptTokensTotalCost != nil || u.CompletionTokensTotalCost != nil ||
					u.CacheReadInputTokensTotalCost != nil || u.CacheCreationInputTokensTotalCost != nil {
					t.Fatalf("%s/%s has costs without include_costs: %+v", id, m, u)
				}
			}
		}
	})
	t.Run("with include_costs", func(t *testing.T) {
		got := rollUp(t, calls, pricing, true)
		check := func(id, model string, prompt, completion, cacheRead, cacheCreation float64) {
			t.Helper()
			u := got.CallUsage[id][model]
			for _, c := range []struct {
				name string
				got  *float64
				want float64
			}{
				{"prompt", u.PromptTokensTotalCost, prompt},
				{"completion", u.CompletionTokensTotalCost, completion},
				{"cache_read", u.CacheReadInputTokensTotalCost, cacheRead},
				{"cache_creation", u.CacheCreationInputTokensTotalCost, cacheCreation},
			} {
				if c.got == nil || math.Abs(*c.got-c.want) > 1e-9 {
					t.Errorf("%s/%s %s cost = %v, want %v", id, model, c.name, c.got, c.want)
				}
			}
		}
		// 600k uncached at 2 + 400k cached at 1; 500k completion at 10.
		check("r", "priced", 1.2+0.4, 5, 0.4, 0)
		// No cached price: cached tokens at the prompt price.
		check("c", "nocache", 3, 6, 1.5, 0)
		check("r", "nocache", 3, 6, 1.5, 0)
		// A model without a price costs 0, not null.
		check("c", "free", 0, 0, 0, 0)
		// Cache writes, part of the prompt, at their own price: 300k
		// uncached at 3, 200k cached at 0.3, 500k written at 3.75.
		check("w", "writes", 0.9+0.06+1.875, 0, 0.06, 1.875)
		// No cache write price: the prompt's.
		check("w", "nocache", 100*3/1e6, 0, 0, 40*3/1e6)
	})
}

// syntheticTrace builds n calls in one trace: a tree with fan-out 8, each
// call with one or two models of usage.
func syntheticTrace(n int) []trace.UsageCall {
	calls := make([]trace.UsageCall, n)
	for i := range calls {
		c := trace.UsageCall{ID: "call-" + strconv.Itoa(i), Unfinished: i%97 == 0}
		if i > 0 {
			c.ParentID = "call-" + strconv.Itoa((i-1)/8)
		}
		if i%2 == 0 {
			c.Usage = fmt.Sprintf(`{"model-%d":{"requests":1,"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"cache_read_input_tokens":3}}`,
				i%3, i, i+1, 2*i+1)
		} else {
			c.Usage = (`{"model-a":{"requests":1,"input_tokens":10,"output_tokens":5},"model-b":{"requests":1,"prompt_tokens":7}}`)
		}
		calls[i] = c
	}
	return calls
}

func TestTraceUsageSyntheticTotals(t *testing.T) {
	calls := syntheticTrace(1000)
	got := rollUp(t, calls, nil, false)
	if len(got.CallUsage) != 1000 {
		t.Fatalf("got %d calls", len(got.CallUsage))
	}
	// The root holds everything: one request per model entry.
	var rootRequests, wantRequests int64
	for _, u := range got.CallUsage["call-0"] {
		rootRequests += u.Requests
	}
	for i := range calls {
		if i%2 == 0 {
			wantRequests++
		} else {
			wantRequests += 2
		}
	}
	if rootRequests != wantRequests {
		t.Fatalf("root requests = %d, want %d", rootRequests, wantRequests)
	}
}

func BenchmarkTraceUsage10k(b *testing.B) {
	calls := syntheticTrace(10000)
	pricing := map[string]config.Pricing{"model-0": {PromptPerMTok: 1, CompletionPerMTok: 2}}
	b.ReportAllocs()
	b.ResetTimer()
	var buf []byte
	for b.Loop() {
		buf = computeTraceUsage(calls, pricing, true).appendJSON(buf[:0])
	}
}
