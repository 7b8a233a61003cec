package store_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/store"
)

// TestUsageByStatus stores a record of every outcome and checks that
// group by status classes each, counts every record (refusals that reached
// no backend included) apart from the requests a backend served, and keeps
// the tokens an aborted stream streamed.
func TestUsageByStatus(t *testing.T) {
	forEachStore(t, func(t *testing.T, d *store.DB) {
		ctx := context.Background()
		rec := func(call string, status int, errText string, incomplete bool, backend string, prompt, completion int64) accounting.Record {
			r := usageRec(call, "acme", "bot", "m", "k", usageT0, prompt, completion, 0)
			r.Status, r.Error, r.Incomplete, r.Backend, r.Stream = status, errText, incomplete, backend, incomplete
			return r
		}
		if err := d.InsertRecords(ctx, []accounting.Record{
			rec("ok-1", 200, "", false, "b1", 10, 5),
			rec("ok-2", 201, "", false, "b1", 1, 1),
			rec("closed-stream", 200, "client closed the stream: broken pipe", true, "b1", 12, 3),
			rec("closed-waiting", 499, "client closed the connection", false, "b1", 0, 0),
			rec("broken", 200, "upstream stream broken: unexpected EOF", true, "b2", 7, 2),
			rec("bad-request", 400, "invalid request", false, "", 0, 0),
			rec("rate-limited", 429, "rate limit", false, "", 0, 0),
			rec("upstream-500", 502, "backend b1: status 500", false, "b1", 0, 0),
			rec("no-backend", 503, "no healthy backend", false, "", 0, 0),
			rec("in-band", 200, "in-band stream error: overloaded", false, "b1", 4, 0),
			// A status outside 2xx-5xx is a gateway failure, not a success.
			rec("odd", 0, "", false, "", 0, 0),
		}); err != nil {
			t.Fatal(err)
		}
		q := accounting.UsageQuery{Start: usageT0, End: usageT0.Add(time.Hour), BucketWidth: time.Hour, GroupByStatus: true}
		got, err := d.UsageBuckets(ctx, q)
		if err != nil {
			t.Fatalf("UsageBuckets: %v", err)
		}
		want := []accounting.UsageRow{
			{BucketStart: usageT0, Status: "client_closed", InputTokens: 12, OutputTokens: 3, Requests: 2, Records: 2},
			{BucketStart: usageT0, Status: "client_error", Requests: 0, Records: 2},
			{BucketStart: usageT0, Status: "complete", InputTokens: 11, OutputTokens: 6, Requests: 2, Records: 2},
			{BucketStart: usageT0, Status: "server_error", InputTokens: 4, Requests: 2, Records: 4},
			{BucketStart: usageT0, Status: "stream_broken", InputTokens: 7, OutputTokens: 2, Requests: 1, Records: 1},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("by status =\n%+v\nwant\n%+v", got, want)
		}
		var names []string
		for _, r := range got {
			names = append(names, r.Status)
		}
		if !reflect.DeepEqual(names, accounting.UsageStatuses()) {
			t.Errorf("statuses %v, want every one of accounting.UsageStatuses %v in its order", names, accounting.UsageStatuses())
		}

		// Combined with another grouping, each group splits by status.
		q.GroupByStatus, q.GroupByProject = true, true
		q.Models = []string{"m"}
		got, err = d.UsageBuckets(ctx, q)
		if err != nil {
			t.Fatalf("UsageBuckets: %v", err)
		}
		if len(got) != len(want) || got[0].Team != "acme" || got[0].Project != "bot" || got[0].Status != "client_closed" {
			t.Errorf("by project and status = %+v", got)
		}
	})
}
