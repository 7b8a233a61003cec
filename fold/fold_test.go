package fold

import (
	"slices"
	"testing"
	"time"
)

func TestCompletionOf(t *testing.T) {
	tests := []struct {
		name   string
		output string
		want   Completion
		ok     bool
	}{
		{"chat completion", `{"id":"chatcmpl-1","object":"chat.completion","created":17}`, Completion{"chatcmpl-1", 17}, true},
		{"chat chunk reduction", `{"object":"chat.completion.chunk","id":"c2","created":5}`, Completion{"c2", 5}, true},
		{"text completion without date", `{"id":"cmpl-3","object":"text_completion"}`, Completion{"cmpl-3", 0}, true},
		{"response dates by created_at", `{"id":"resp_4","object":"response","created":1,"created_at":9}`, Completion{"resp_4", 9}, true},
		{"one streamed response", `{"responses":[{"id":"resp_5","object":"response","created_at":3}]}`, Completion{"resp_5", 3}, true},
		{"two streamed responses are not one completion", `{"responses":[{"id":"a","object":"response"},{"id":"b","object":"response"}]}`, Completion{}, false},
		{"responses member of a completion is ignored", `{"id":"c6","object":"chat.completion","responses":[]}`, Completion{"c6", 0}, true},
		{"anthropic message has no date", `{"id":"msg_7","type":"message","role":"assistant","created":5}`, Completion{"msg_7", 0}, true},
		{"anthropic error is no completion", `{"type":"error","error":{"type":"api_error"}}`, Completion{}, false},
		{"other objects", `{"id":"emb","object":"list"}`, Completion{}, false},
		{"id not a string", `{"id":7,"object":"chat.completion"}`, Completion{}, false},
		{"empty id", `{"id":"","object":"chat.completion"}`, Completion{}, false},
		{"not an object", `["chat.completion"]`, Completion{}, false},
		{"empty", ``, Completion{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := CompletionOf([]byte(tt.output))
			if got != tt.want || ok != tt.ok {
				t.Fatalf("CompletionOf(%s) = %+v, %v; want %+v, %v", tt.output, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestEitherOrderFolds checks the rule's promise: whichever writer comes
// first, the gateway's call ends folded into the SDK call exactly once.
func TestEitherOrderFolds(t *testing.T) {
	tests := []struct {
		name   string
		holder Holder
		sdk    Action
		gw     Action
	}{
		{"first writer links", Nobody, Link, Link},
		{"SDK after the gateway folds it", Gateway, FoldGateway, Link},
		{"gateway after the SDK folds into it", SDK, Keep, FoldGateway},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := OnSDKEnd(tt.holder); got != tt.sdk {
				t.Errorf("OnSDKEnd(%d) = %d, want %d", tt.holder, got, tt.sdk)
			}
			if got := OnGatewayRecord(tt.holder); got != tt.gw {
				t.Errorf("OnGatewayRecord(%d) = %d, want %d", tt.holder, got, tt.gw)
			}
		})
	}
}

func TestAttributes(t *testing.T) {
	sdk := `{"weave":{"source":"js-sdk"},"gateway":{"stale":1},"x":1}`
	gw := `{"team":"t","completion_id":"c1"}`
	got, err := Attributes([]byte(sdk), []byte(gw), "gw-call")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"weave":{"source":"js-sdk"},"gateway":{"stale":1,"team":"t","completion_id":"c1","call_id":"gw-call"},"x":1}`
	if string(got) != want {
		t.Fatalf("Attributes = %s\nwant %s", got, want)
	}
	if !IsClientCall(got) || IsClientCall([]byte(gw)) {
		t.Fatal("IsClientCall misreads weave.source")
	}
}

func TestSpanDates(t *testing.T) {
	t0 := time.Unix(1795255200, 400_000_000)
	for _, tt := range []struct {
		name        string
		created     int64
		start, end  time.Time
		first, last int64
		claim       []int64
	}{
		{"date known", 1795255201, t0, t0.Add(time.Second), 1795255201, 1795255201, []int64{1795255201}},
		{"short span", 0, t0, t0.Add(time.Second), 1795255200, 1795255201, []int64{1795255200, 1795255201}},
		{"long span claims its first seconds", 0, t0, t0.Add(time.Minute), 1795255200, 1795255260,
			[]int64{1795255200, 1795255201, 1795255202, 1795255203}},
		{"end before start", 0, t0, t0.Add(-time.Minute), 1795255200, 1795255200, []int64{1795255200}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			first, last, claim := SpanDates(tt.created, tt.start, tt.end)
			if first != tt.first || last != tt.last || !slices.Equal(claim, tt.claim) {
				t.Fatalf("SpanDates = %d %d %v, want %d %d %v", first, last, claim, tt.first, tt.last, tt.claim)
			}
		})
	}
}

func TestSummaryHoldsChild(t *testing.T) {
	for _, tt := range []struct {
		parent, child string
		want          bool
	}{
		{"js-sdk", "python-sdk", true},
		{"js-sdk", "", false},
		{"js-sdk", OTelSource, false},
		{OTelSource, OTelSource, true},
		{OTelSource, "", true},
		{"", OTelSource, false},
	} {
		if got := SummaryHoldsChild(tt.parent, tt.child); got != tt.want {
			t.Errorf("SummaryHoldsChild(%q, %q) = %v, want %v", tt.parent, tt.child, got, tt.want)
		}
	}
}
