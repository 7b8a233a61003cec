package admin_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
)

// TestUsageAPIByStatus checks group_by=status: each result names its
// outcome and counts every request of it in num_requests (refusals that
// reached no backend included), aborted streams keep what they streamed,
// and answers that do not ask for it keep OpenAI's shape, without
// "status" or "num_requests".
func TestUsageAPIByStatus(t *testing.T) {
	at := usageDay.Add(time.Hour)
	outcome := func(call string, status int, errText string, incomplete bool, backend string, in, out int64) accounting.Record {
		r := endpointUsageRec(call, "chat.completions", "m1", at, in, out, 0)
		r.Status, r.Error, r.Incomplete, r.Backend, r.Stream = status, errText, incomplete, backend, incomplete
		return r
	}
	api := endpointUsageAPI(t,
		outcome("aborted", 200, "client closed the stream: broken pipe", true, "b", 9, 4),
		outcome("broken", 200, "upstream stream broken: unexpected EOF", true, "b", 3, 1),
		outcome("unauthorised-model", 403, "model not allowed", false, "", 0, 0),
		outcome("limited", 429, "rate limit", false, "", 0, 0),
		outcome("bad-gateway", 502, "backend b: status 500", false, "b", 0, 0),
	)
	day0 := "start_time=" + usageStart(0) + "&end_time=" + usageStart(24*time.Hour)

	type result struct {
		InputTokens      int64   `json:"input_tokens"`
		OutputTokens     int64   `json:"output_tokens"`
		NumModelRequests int64   `json:"num_model_requests"`
		NumRequests      int64   `json:"num_requests"`
		Status           *string `json:"status"`
		Model            *string `json:"model"`
	}
	decode := func(raw string) []result {
		var page struct {
			Data []struct {
				Results []result `json:"results"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(raw), &page); err != nil || len(page.Data) != 1 {
			t.Fatalf("body %s: %v", raw, err)
		}
		return page.Data[0].Results
	}
	s := func(v string) *string { return &v }

	status, raw, _ := getEndpointUsage(t, api, "/v1/organization/usage/completions", day0+"&group_by=status")
	if status != 200 {
		t.Fatalf("status %d: %s", status, raw)
	}
	// The base records: chat, old, text, resp are complete (embeddings are
	// not counted on this path): 65 input, 11 output, 4 requests.
	want := []result{
		{InputTokens: 9, OutputTokens: 4, NumModelRequests: 1, NumRequests: 1, Status: s("client_closed")},
		{NumModelRequests: 0, NumRequests: 2, Status: s("client_error")},
		{InputTokens: 65, OutputTokens: 11, NumModelRequests: 4, NumRequests: 4, Status: s("complete")},
		{NumModelRequests: 1, NumRequests: 1, Status: s("server_error")},
		{InputTokens: 3, OutputTokens: 1, NumModelRequests: 1, NumRequests: 1, Status: s("stream_broken")},
	}
	if got := decode(raw); !reflect.DeepEqual(got, want) {
		t.Errorf("by status = %s\nwant %s", usageJSON(got), usageJSON(want))
	}

	status, raw, _ = getEndpointUsage(t, api, "/v1/organization/usage/completions", day0+"&group_by=model,status")
	if status != 200 {
		t.Fatalf("status %d: %s", status, raw)
	}
	for _, r := range decode(raw) {
		if r.Model == nil || *r.Model != "m1" && *r.Model != "m2" || r.Status == nil {
			t.Errorf("by model and status: result %s names no model or status", usageJSON(r))
		}
	}

	// Not asked for, neither field appears: the answer is OpenAI's.
	for _, q := range []string{"", "&group_by=model", "&group_by=endpoint"} {
		status, raw, _ := getEndpointUsage(t, api, "/v1/organization/usage/completions", day0+q)
		if status != 200 || strings.Contains(raw, `"status"`) || strings.Contains(raw, `"num_requests"`) {
			t.Errorf("group_by %q: status %d, body %s has status or num_requests", q, status, raw)
		}
	}
}
