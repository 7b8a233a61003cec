package store

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
)

// hostileStrings are values a model, key name, backend or request id may
// hold that JSON must escape (jsonstr's tests hold the full table).
var hostileStrings = []string{
	"", "gpt-4o", `say "hi"`, "a\x00b\x01c\x1f", "<script>&amp;</script>",
	"line\u2028para\u2029end", "\xff\xfe", "héllo wörld ☃ 🦫",
}

// The shapes json.Marshal wrote a gateway call's attributes and summary
// in, before they were appended: the stored calls must not change.
type marshaledGatewayAttributes struct {
	RequestID    string `json:"request_id"`
	KeyName      string `json:"key_name"`
	Backend      string `json:"backend"`
	Status       int    `json:"status"`
	Stream       bool   `json:"stream"`
	Incomplete   bool   `json:"incomplete"`
	ServedModel  string `json:"served_model"`
	CompletionID string `json:"completion_id,omitempty"`
}

type marshaledModelUsage struct {
	Requests             int64 `json:"requests"`
	PromptTokens         int64 `json:"prompt_tokens"`
	CompletionTokens     int64 `json:"completion_tokens"`
	TotalTokens          int64 `json:"total_tokens"`
	CacheReadInputTokens int64 `json:"cache_read_input_tokens"`
}

func TestGatewayCallJSONMatchesEncodingJSON(t *testing.T) {
	for k, s := range hostileStrings {
		t.Run(s, func(t *testing.T) {
			rec := accounting.Record{
				RequestID: s, KeyName: "key " + s, Backend: s + " backend", Status: 200 + k, Stream: k%2 == 0,
				Incomplete: k%3 == 0, ServedModel: s, CompletionID: s, Model: s,
				PromptTokens: int64(k) * 1000, CompletionTokens: -int64(k), TotalTokens: 1 << 40, CachedTokens: int64(k),
			}
			want, err := json.Marshal(marshaledGatewayAttributes{
				RequestID: rec.RequestID, KeyName: rec.KeyName, Backend: rec.Backend, Status: rec.Status,
				Stream: rec.Stream, Incomplete: rec.Incomplete, ServedModel: rec.ServedModel, CompletionID: rec.CompletionID,
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := appendGatewayAttributes(nil, &rec); string(got) != string(want) {
				t.Errorf("attributes = %s, want %s", got, want)
			}
			model, err := json.Marshal(rec.Model)
			if err != nil {
				t.Fatal(err)
			}
			usage, err := json.Marshal(marshaledModelUsage{
				Requests: 1, PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens,
				TotalTokens: rec.TotalTokens, CacheReadInputTokens: rec.CachedTokens,
			})
			if err != nil {
				t.Fatal(err)
			}
			wantSummary := `{"usage":{` + string(model) + ":" + string(usage) + "}}"
			if got := appendGatewaySummary(nil, &rec); string(got) != wantSummary {
				t.Errorf("summary = %s, want %s", got, wantSummary)
			}
		})
	}
}

func TestGatewayCallRowsText(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 22, 40, 0, 123456789, time.FixedZone("x", 3600))
	recs := []accounting.Record{
		{CallID: "c1", Model: "m<1>", KeyName: "k", Started: t0, Ended: t0.Add(1500 * time.Microsecond), CompletionID: "x"},
		{CallID: "c2", Model: "m\u2028", Team: "t", Project: "p", Started: t0},
	}
	projects := map[[2]string]*gatewayProject{
		{fallbackTeam, fallbackProject}: {team: fallbackTeam, id: 1},
		{"t", "p"}:                      {team: "t", id: 2},
	}
	rows, text := gatewayCallRows(recs, projects)
	for i := range recs {
		rec, row := &recs[i], &rows[i]
		ended := rec.Ended
		if ended.IsZero() {
			ended = rec.Started
		}
		want := []string{formatTraceTime(rec.Started), formatTraceTime(ended),
			string(appendGatewayAttributes(nil, rec)), string(appendGatewaySummary(nil, rec))}
		for k, w := range want {
			if got := text[row.text[k]:row.text[k+1]]; got != w {
				t.Errorf("record %d text %d = %q, want %q", i, k, got, w)
			}
		}
		if row.project != projects[recordProject(rec)] || row.callID != rec.CallID {
			t.Errorf("record %d: project %+v, call id %v", i, row.project, row.callID)
		}
	}
}

func TestAppendGatewayCallJSONAllocs(t *testing.T) {
	rec := accounting.Record{RequestID: "r", KeyName: "k", Backend: "b", ServedModel: "m", CompletionID: "c", Model: "m"}
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() {
		buf = appendGatewaySummary(appendGatewayAttributes(buf[:0], &rec), &rec)
	}); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}
