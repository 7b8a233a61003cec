package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/trace"
)

// gatewayRecord is a completion the gateway served for team acme, filed
// under the key's default project.
func gatewayRecord(callID, completionID string) accounting.Record {
	return accounting.Record{
		RequestID: "req-" + callID, CallID: callID, TraceID: callID, KeyName: "ci", Team: "acme", Project: "inference",
		Model: "demo", ServedModel: "demo", Backend: "sim-1", Status: 200, CompletionID: completionID,
		PromptTokens: 7, CompletionTokens: 3, TotalTokens: 10, Started: callT0, Ended: callT0.Add(time.Second),
	}
}

// sdkCall is the start and end of a wrapped OpenAI call as a Weave SDK
// logs it, whose output is the completion the gateway returned.
func sdkCall(projectID int64, id, completionID, source string) (trace.CallStart, trace.CallEnd) {
	attrs := `{"weave":{"source":"` + source + `","client_version":"0.11.1"}}`
	if source == "" {
		attrs = `{}`
	}
	return trace.CallStart{
			ProjectID: projectID, ID: id, TraceID: "trace-" + id, OpName: "openai.chat.completions.create",
			StartedAt: callT0, Attributes: json.RawMessage(attrs), Inputs: json.RawMessage(`{"model":"demo"}`),
		}, trace.CallEnd{
			ProjectID: projectID, ID: id, EndedAt: callT0.Add(2 * time.Second),
			Output:  json.RawMessage(`{"id":"` + completionID + `","object":"chat.completion","model":"demo","choices":[]}`),
			Summary: json.RawMessage(`{"usage":{"demo":{"requests":1,"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}}`),
		}
}

// TestCompletionFold: the gateway's call of a completion and the SDK call
// that traced it become one call, the SDK's, with the gateway's
// attributes, whichever is stored first; without an SDK call, or across
// teams, the gateway's call stands alone.
func TestCompletionFold(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		app, err := db.EnsureProject(ctx, "acme", "app")
		if err != nil {
			t.Fatal(err)
		}
		inference, err := db.EnsureProject(ctx, "acme", "inference")
		if err != nil {
			t.Fatal(err)
		}
		write := func(writes ...trace.CallWrite) {
			t.Helper()
			if _, err := db.WriteCalls(ctx, writes); err != nil {
				t.Fatal(err)
			}
		}
		record := func(recs ...accounting.Record) {
			t.Helper()
			if err := db.InsertRecords(ctx, recs); err != nil {
				t.Fatal(err)
			}
		}
		exists := func(projectID int64, id string) bool {
			t.Helper()
			_, err := db.ReadCall(ctx, projectID, id)
			if err != nil && !errors.Is(err, trace.ErrNotFound) {
				t.Fatal(err)
			}
			return err == nil
		}
		// gatewayOf returns the SDK call's attributes.gateway without the
		// ids that differ between the cases.
		gatewayOf := func(id string) map[string]any {
			t.Helper()
			c, err := db.ReadCall(ctx, app.ID, id)
			if err != nil {
				t.Fatal(err)
			}
			if gjson.GetBytes(c.Attributes, "weave.source").Str != "js-sdk" {
				t.Fatalf("%s lost its own attributes: %s", id, c.Attributes)
			}
			var attrs map[string]any
			if err := json.Unmarshal(c.Attributes, &attrs); err != nil {
				t.Fatal(err)
			}
			gw, _ := attrs["gateway"].(map[string]any)
			if gw == nil {
				t.Fatalf("%s has no gateway attributes: %s", id, c.Attributes)
			}
			for _, k := range []string{"call_id", "request_id", "completion_id"} {
				if gw[k] == "" || gw[k] == nil {
					t.Fatalf("%s: gateway.%s missing: %v", id, k, gw)
				}
				delete(gw, k)
			}
			return gw
		}

		// Gateway first, then the SDK's start and end.
		record(gatewayRecord("gw-1", "chatcmpl-1"))
		if !exists(inference.ID, "gw-1") {
			t.Fatal("the gateway's call was not stored")
		}
		s, e := sdkCall(app.ID, "sdk-1", "chatcmpl-1", "js-sdk")
		write(trace.CallWrite{Start: &s}, trace.CallWrite{End: &e})
		if exists(inference.ID, "gw-1") {
			t.Fatal("gateway first: the gateway's call was not folded")
		}

		// SDK first, gateway after.
		s, e = sdkCall(app.ID, "sdk-2", "chatcmpl-2", "js-sdk")
		write(trace.CallWrite{Start: &s}, trace.CallWrite{End: &e})
		record(gatewayRecord("gw-2", "chatcmpl-2"))
		if exists(inference.ID, "gw-2") {
			t.Fatal("SDK first: the gateway's call was stored beside the SDK's")
		}

		// SDK end before its start (one batch), gateway in between.
		s, e = sdkCall(app.ID, "sdk-3", "chatcmpl-3", "python-sdk")
		write(trace.CallWrite{End: &e})
		record(gatewayRecord("gw-3", "chatcmpl-3"))
		write(trace.CallWrite{Start: &s})
		if exists(inference.ID, "gw-3") {
			t.Fatal("early end: the gateway's call was not folded when the start came")
		}

		want := map[string]any{
			"key_name": "ci", "backend": "sim-1", "served_model": "demo", "status": float64(200),
			"stream": false, "incomplete": false,
		}
		for _, id := range []string{"sdk-1", "sdk-2"} {
			if got := gatewayOf(id); !reflect.DeepEqual(got, want) {
				t.Errorf("%s: gateway = %v, want %v", id, got, want)
			}
		}
		c1, _ := db.ReadCall(ctx, app.ID, "sdk-1")
		if g := gjson.GetBytes(c1.Attributes, "gateway"); g.Get("call_id").Str != "gw-1" || g.Get("request_id").Str != "req-gw-1" ||
			g.Get("completion_id").Str != "chatcmpl-1" {
			t.Fatalf("sdk-1 gateway ids = %s", g.Raw)
		}
		// Both orders leave the same call, apart from the ids.
		c2, _ := db.ReadCall(ctx, app.ID, "sdk-2")
		strip := func(c trace.Call) string {
			b, _ := json.Marshal(map[string]any{"summary": json.RawMessage(c.Summary), "op": c.OpName,
				"keys": gjson.GetBytes(c.Attributes, "@keys").Raw, "gwkeys": gjson.GetBytes(c.Attributes, "gateway.@keys").Raw})
			return string(b)
		}
		if strip(c1) != strip(c2) {
			t.Fatalf("orders differ:\n%s\n%s", strip(c1), strip(c2))
		}
		// The SDK call's usage is untouched: the completion counts once,
		// in the SDK's trace, and the usage records stay as they were.
		if string(c1.Summary) != string(e.Summary) {
			t.Fatalf("summary = %s", c1.Summary)
		}
		usage, err := db.TraceUsageCalls(ctx, inference.ID, nil, nil, 100)
		if err != nil || len(usage) != 0 {
			t.Fatalf("the inference project still holds %v (%v)", usage, err)
		}
		var records int
		if err := db.QueryRow(ctx, `SELECT COUNT(*) FROM usage_records`).Scan(&records); err != nil || records != 3 {
			t.Fatalf("usage records = %d, %v", records, err)
		}

		// Retrying the gateway's batch, or the SDK's end, changes nothing.
		record(gatewayRecord("gw-1", "chatcmpl-1"))
		s, e = sdkCall(app.ID, "sdk-1", "chatcmpl-1", "js-sdk")
		write(trace.CallWrite{End: &e})
		if exists(inference.ID, "gw-1") || !reflect.DeepEqual(gatewayOf("sdk-1"), want) {
			t.Fatal("a retry undid the fold")
		}

		// No SDK: the gateway's call stands alone. A call that is not an
		// SDK's, even with the completion as its output, folds nothing.
		record(gatewayRecord("gw-4", "chatcmpl-4"))
		s, e = sdkCall(app.ID, "plain-4", "chatcmpl-4", "")
		write(trace.CallWrite{Start: &s}, trace.CallWrite{End: &e})
		if !exists(inference.ID, "gw-4") {
			t.Fatal("a call without an SDK source folded the gateway's call")
		}
		// Another team's SDK call cannot take acme's completion.
		other, err := db.EnsureProject(ctx, "rival", "app")
		if err != nil {
			t.Fatal(err)
		}
		record(gatewayRecord("gw-5", "chatcmpl-5"))
		s, e = sdkCall(other.ID, "rival-5", "chatcmpl-5", "js-sdk")
		write(trace.CallWrite{Start: &s}, trace.CallWrite{End: &e})
		if !exists(inference.ID, "gw-5") {
			t.Fatal("another team's SDK call folded acme's gateway call")
		}
		if c, _ := db.ReadCall(ctx, other.ID, "rival-5"); gjson.GetBytes(c.Attributes, "gateway").Exists() {
			t.Fatalf("rival-5 got acme's attributes: %s", c.Attributes)
		}
		// Deleting the SDK call frees the completion's link: the
		// gateway's retried record then stands alone.
		if _, err := db.DeleteCalls(ctx, app.ID, []string{"sdk-2"}); err != nil {
			t.Fatal(err)
		}
		record(gatewayRecord("gw-2", "chatcmpl-2"))
		if !exists(inference.ID, "gw-2") {
			t.Fatal("after the SDK call was deleted, the gateway's call was still folded away")
		}
	})
}

// TestCompletionFoldRace: the SDK's end and the gateway's batch racing on
// the same completions still fold every one of them (on PostgreSQL the
// link's primary key makes the later writer wait for the earlier).
func TestCompletionFoldRace(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		app, err := db.EnsureProject(ctx, "acme", "app")
		if err != nil {
			t.Fatal(err)
		}
		inference, err := db.EnsureProject(ctx, "acme", "inference")
		if err != nil {
			t.Fatal(err)
		}
		const n = 40
		var wg sync.WaitGroup
		errs := make(chan error, 2*n)
		// One writer of gateway records, as the usage writer is, against
		// concurrent SDK ingests.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				id := strconv.Itoa(i)
				errs <- db.InsertRecords(ctx, []accounting.Record{gatewayRecord("gw-"+id, "chatcmpl-"+id)})
			}
		}()
		for i := range n {
			id := strconv.Itoa(i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, e := sdkCall(app.ID, "sdk-"+id, "chatcmpl-"+id, "js-sdk")
				_, err := db.WriteCalls(ctx, []trace.CallWrite{{Start: &s}, {End: &e}})
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		left, err := db.TraceUsageCalls(ctx, inference.ID, nil, nil, -1)
		if err != nil || len(left) != 0 {
			t.Fatalf("%d gateway calls left unfolded (%v)", len(left), err)
		}
		for i := range n {
			c, err := db.ReadCall(ctx, app.ID, "sdk-"+strconv.Itoa(i))
			if err != nil || gjson.GetBytes(c.Attributes, "gateway.call_id").Str != "gw-"+strconv.Itoa(i) {
				t.Fatalf("sdk-%d: %s, %v", i, c.Attributes, err)
			}
		}
	})
}
