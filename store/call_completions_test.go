package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store"
	"github.com/tollgate-dev/tollgate/trace"
)

// completionCreated is the date the backend gave the completions of these
// tests (their "created").
var completionCreated = callT0.Unix()

// gatewayRecord is a completion the gateway served for team acme, filed
// under the key's default project.
func gatewayRecord(callID, completionID string) accounting.Record {
	return accounting.Record{
		RequestID: "req-" + callID, CallID: callID, TraceID: callID, KeyName: "ci", Team: "acme", Project: "inference",
		Model: "demo", ServedModel: "demo", Backend: "sim-1", Status: 200,
		CompletionID: completionID, CompletionCreated: completionCreated,
		PromptTokens: 7, CompletionTokens: 3, TotalTokens: 10, Started: callT0, Ended: callT0.Add(time.Second),
	}
}

// sdkCall is the start and end of a wrapped OpenAI call as a Weave SDK
// logs it, whose output is the completion the gateway returned.
func sdkCall(projectID int64, id, completionID, source string) (trace.CallStart, trace.CallEnd) {
	return sdkCallOutput(projectID, id, source,
		`{"id":"`+completionID+`","object":"chat.completion","created":`+strconv.FormatInt(completionCreated, 10)+`,"model":"demo","choices":[]}`)
}

// sdkCallOutput is sdkCall with the output given.
func sdkCallOutput(projectID int64, id, source, output string) (trace.CallStart, trace.CallEnd) {
	attrs := `{"weave":{"source":"` + source + `","client_version":"0.11.1"}}`
	if source == "" {
		attrs = `{}`
	}
	return trace.CallStart{
			ProjectID: projectID, ID: id, TraceID: "trace-" + id, OpName: "openai.chat.completions.create",
			StartedAt: callT0, Attributes: json.RawMessage(attrs), Inputs: json.RawMessage(`{"model":"demo"}`),
		}, trace.CallEnd{
			ProjectID: projectID, ID: id, EndedAt: callT0.Add(2 * time.Second),
			Output:  json.RawMessage(output),
			Summary: json.RawMessage(`{"usage":{"demo":{"requests":1,"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}}`),
		}
}

// acmeProjects creates acme's project of SDK calls, app, and of gateway
// calls, inference.
func acmeProjects(t *testing.T, db *store.DB) (app, inference trace.Project) {
	t.Helper()
	ctx := context.Background()
	app, err := db.EnsureProject(ctx, "acme", "app")
	if err != nil {
		t.Fatal(err)
	}
	inference, err = db.EnsureProject(ctx, "acme", "inference")
	if err != nil {
		t.Fatal(err)
	}
	return app, inference
}

// TestCompletionFold: the gateway's call of a completion and the SDK call
// that traced it become one call, the SDK's, with the gateway's
// attributes, whichever is stored first; without an SDK call, or across
// teams, the gateway's call stands alone.
func TestCompletionFold(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		app, inference := acmeProjects(t, db)
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
		if err := db.QueryRow(ctx, `SELECT SUM(records) FROM usage_rollup`).Scan(&records); err != nil || records != 3 {
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
		app, inference := acmeProjects(t, db)
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

// TestCompletionFoldKey: the link is keyed by the completion's id and its
// date, read from the SDK's output as the gateway reads the reply: a
// chat completion's or a stream's reduction's "created", a response's
// "created_at", 0 for none. Each case is stored in both orders.
func TestCompletionFoldKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		app, inference := acmeProjects(t, db)
		for i, tc := range []struct {
			name    string
			created int64 // the gateway's record's
			output  string
			folds   bool
		}{
			{"stream", 1764000001, `{"id":"chatcmpl-%s","object":"chat.completion.chunk","created":1764000001,"model":"demo"}`, true},
			{"text completion", 1764000002, `{"id":"cmpl-%s","object":"text_completion","created":1764000002}`, true},
			{"response", 1764000003, `{"id":"resp_%s","object":"response","created_at":1764000003,"status":"completed"}`, true},
			{"undated", 0, `{"id":"chatcmpl-%s","object":"chat.completion","model":"demo"}`, true},
			{"a response's created is not its date", 1764000004, `{"id":"resp_%s","object":"response","created":1764000004}`, false},
			{"another second", 1764000005, `{"id":"chatcmpl-%s","object":"chat.completion","created":1764000006}`, false},
			// A streamed response, as the Weave JS SDK's reducer logs it.
			{"streamed response", 1764000007, `{"responses":[{"id":"resp_%s","object":"response","created_at":1764000007,"status":"completed","model":"demo",` +
				`"output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":7,"output_tokens":3,"total_tokens":10}}]}`, true},
			{"streamed response of another second", 1764000008, `{"responses":[{"id":"resp_%s","object":"response","created_at":1764000009}]}`, false},
			// An Anthropic message, as the Weave SDK logs a Messages call:
			// it carries no date, and the gateway records it undated.
			{"anthropic message", 0, `{"id":"msg_%s","type":"message","role":"assistant","model":"demo","content":[],"stop_reason":"end_turn"}`, true},
			{"two streamed responses", 1764000010, `{"responses":[{"id":"resp_%s","object":"response","created_at":1764000010},` +
				`{"id":"resp_other","object":"response","created_at":1764000010}]}`, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				for _, sdkFirst := range []bool{false, true} {
					n := strconv.Itoa(2*i + map[bool]int{false: 0, true: 1}[sdkFirst])
					output := fmt.Sprintf(tc.output, n)
					completion := gjson.Get(output, "id").Str
					if completion == "" {
						completion = gjson.Get(output, "responses.0.id").Str
					}
					rec := gatewayRecord("gw-key-"+n, completion)
					rec.CompletionCreated = tc.created
					s, e := sdkCallOutput(app.ID, "sdk-key-"+n, "js-sdk", output)
					if sdkFirst {
						if _, err := db.WriteCalls(ctx, []trace.CallWrite{{Start: &s}, {End: &e}}); err != nil {
							t.Fatal(err)
						}
					}
					if err := db.InsertRecords(ctx, []accounting.Record{rec}); err != nil {
						t.Fatal(err)
					}
					if !sdkFirst {
						if _, err := db.WriteCalls(ctx, []trace.CallWrite{{Start: &s}, {End: &e}}); err != nil {
							t.Fatal(err)
						}
					}
					c, err := db.ReadCall(ctx, app.ID, s.ID)
					if err != nil {
						t.Fatal(err)
					}
					_, gwErr := db.ReadCall(ctx, inference.ID, rec.CallID)
					folded := gjson.GetBytes(c.Attributes, "gateway.call_id").Str == rec.CallID
					if folded != tc.folds || folded != errors.Is(gwErr, trace.ErrNotFound) {
						t.Errorf("SDK first %v: folded %v (gateway call read: %v), want %v; attributes %s",
							sdkFirst, folded, gwErr, tc.folds, c.Attributes)
					}
				}
			})
		}
	})
}

// TestCompletionLinkMigration takes a store back to before links were
// dated (traces version 4) with a gateway call linked the old way, and
// reopens it: the link, kept with created 0, still folds into the SDK
// call of that completion, which is dated.
func TestCompletionLinkMigration(t *testing.T) {
	forEachStoreConfig(t, func(t *testing.T, cfg config.Store) {
		ctx := context.Background()
		d, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		rec := gatewayRecord("gw-old", "chatcmpl-old")
		rec.CompletionID = "" // linked below, the old way
		if err := d.InsertRecords(ctx, []accounting.Record{rec}); err != nil {
			t.Fatal(err)
		}
		inference, err := d.EnsureProject(ctx, "acme", "inference")
		if err != nil {
			t.Fatal(err)
		}
		d = rewindAndReopen(t, d, cfg,
			`DROP TABLE call_completions`,
			`CREATE TABLE call_completions (
				entity        TEXT NOT NULL,
				completion_id TEXT NOT NULL,
				project_id    BIGINT NOT NULL REFERENCES projects (id),
				call_id       TEXT NOT NULL,
				sdk           BOOLEAN NOT NULL,
				PRIMARY KEY (entity, completion_id))`,
			`CREATE INDEX call_completions_call ON call_completions (project_id, call_id)`,
			fmt.Sprintf(`INSERT INTO call_completions (entity, completion_id, project_id, call_id, sdk)
				VALUES ('acme', 'chatcmpl-old', %d, 'gw-old', false)`, inference.ID),
			`ALTER TABLE calls DROP COLUMN completion_created`,
			`DELETE FROM schema_migrations WHERE component = 'traces' AND version IN (4, 5)`,
		)
		defer d.Close()
		app, err := d.EnsureProject(ctx, "acme", "app")
		if err != nil {
			t.Fatal(err)
		}
		s, e := sdkCall(app.ID, "sdk-old", "chatcmpl-old", "js-sdk")
		if _, err := d.WriteCalls(ctx, []trace.CallWrite{{Start: &s}, {End: &e}}); err != nil {
			t.Fatal(err)
		}
		c, err := d.ReadCall(ctx, app.ID, "sdk-old")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.ReadCall(ctx, inference.ID, "gw-old"); !errors.Is(err, trace.ErrNotFound) ||
			gjson.GetBytes(c.Attributes, "gateway.call_id").Str != "gw-old" {
			t.Fatalf("a link from before the migration did not fold: gateway call read %v, SDK attributes %s", err, c.Attributes)
		}
		// Both links now name the SDK call, so that deleting it frees them.
		if _, err := d.DeleteCalls(ctx, app.ID, []string{"sdk-old"}); err != nil {
			t.Fatal(err)
		}
		var links int
		if err := d.QueryRow(ctx, `SELECT COUNT(*) FROM call_completions`).Scan(&links); err != nil || links != 0 {
			t.Fatalf("links left after the SDK call was deleted: %d (%v)", links, err)
		}
	})
}

// TestDeleteCallsFreesGatewayLinks: deleting a gateway call deletes the
// link the usage writer made for it, found by the key the call keeps
// (traces version 5), and no link that names another call, even under the
// same key.
func TestDeleteCallsFreesGatewayLinks(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		_, inference := acmeProjects(t, db)
		links := func() []string {
			t.Helper()
			var ids []string
			for _, id := range []string{"gw-a", "gw-b", "gw-c", "gw-none", "gw-old"} {
				var n int
				if err := db.QueryRow(ctx, `SELECT COUNT(*) FROM call_completions WHERE call_id = ?`, id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				for range n {
					ids = append(ids, id)
				}
			}
			return ids
		}
		// gw-b's completion is gw-a's: its link stays gw-a's. gw-old is
		// made as a gateway call linked before traces version 5 was: the
		// call keeps no key, and its link is not keyed.
		recs := []accounting.Record{
			gatewayRecord("gw-a", "chatcmpl-same"), gatewayRecord("gw-b", "chatcmpl-same"),
			gatewayRecord("gw-c", "chatcmpl-c"), gatewayRecord("gw-none", ""), gatewayRecord("gw-old", "chatcmpl-old"),
		}
		for _, rec := range recs {
			if err := db.InsertRecords(ctx, []accounting.Record{rec}); err != nil {
				t.Fatal(err)
			}
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.TxExec(ctx, tx, `UPDATE calls SET completion_created = NULL WHERE id = ?`, "gw-old"); err != nil {
			t.Fatal(err)
		}
		if err := db.TxExec(ctx, tx, `UPDATE call_completions SET keyed = ? WHERE call_id = ?`, false, "gw-old"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			del  []string
			want []string
		}{
			{del: []string{"gw-b", "gw-none"}, want: []string{"gw-a", "gw-c", "gw-old"}},
			{del: []string{"gw-old"}, want: []string{"gw-a", "gw-c"}},
			{del: []string{"gw-c"}, want: []string{"gw-a"}},
			{del: []string{"gw-a"}, want: nil},
		} {
			if _, err := db.DeleteCalls(ctx, inference.ID, tc.del); err != nil {
				t.Fatal(err)
			}
			if got := links(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("after deleting %v: links of %v, want %v", tc.del, got, tc.want)
			}
		}
	})
}

// TestCompletionFoldBatch writes one batch of 100 gateway records, more
// than one INSERT of links carries (64, then 32 and 4 on SQLite, 36 on
// PostgreSQL), whose completions SDK calls hold already for one in each
// statement: those fold, and every other gateway call stands with its link.
func TestCompletionFoldBatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		app, inference := acmeProjects(t, db)
		const n = 100
		held := map[int]bool{5: true, 70: true, 97: true}
		for i := range held {
			s, e := sdkCall(app.ID, fmt.Sprint("sdk-", i), fmt.Sprintf("chatcmpl-%03d", i), "js-sdk")
			if _, err := db.WriteCalls(ctx, []trace.CallWrite{{Start: &s}, {End: &e}}); err != nil {
				t.Fatal(err)
			}
		}
		recs := make([]accounting.Record, n)
		for i := range recs {
			recs[i] = gatewayRecord(fmt.Sprint("gw-", i), fmt.Sprintf("chatcmpl-%03d", i))
		}
		if err := db.InsertRecords(ctx, recs); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			_, err := db.ReadCall(ctx, inference.ID, fmt.Sprint("gw-", i))
			if err != nil && !errors.Is(err, trace.ErrNotFound) {
				t.Fatal(err)
			}
			if folded := err != nil; folded != held[i] {
				t.Errorf("gw-%d folded %v, want %v", i, folded, held[i])
			}
			var links int
			if err := db.QueryRow(ctx, `SELECT COUNT(*) FROM call_completions WHERE completion_id = ?`,
				fmt.Sprintf("chatcmpl-%03d", i)).Scan(&links); err != nil || links != 1 {
				t.Errorf("chatcmpl-%03d: %d links (%v), want 1", i, links, err)
			}
		}
	})
}

// TestSpanCompletionFold: a call ingested from an OpenTelemetry span that
// reports a completion (gen_ai.response.id) but not its date folds the
// gateway's call of it, stored before or after, when the backend dated
// the completion in the span's first seconds; a span of another team
// does not.
func TestSpanCompletionFold(t *testing.T) {
	forEachStore(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		app, inference := acmeProjects(t, db)
		other, err := db.EnsureProject(ctx, "rival", "app")
		if err != nil {
			t.Fatal(err)
		}
		span := func(projectID int64, id, completion string) []trace.CallWrite {
			s, e := sdkCallOutput(projectID, id, "otel", `null`)
			e.Completion = &trace.SpanCompletion{ID: completion, StartedAt: callT0.Add(-500 * time.Millisecond)}
			return []trace.CallWrite{{Start: &s}, {End: &e}}
		}
		for _, tt := range []struct {
			name         string
			gatewayFirst bool
			projectID    int64
			folds        bool
		}{
			{"gateway first", true, app.ID, true},
			{"span first", false, app.ID, true},
			{"another team's span", true, other.ID, false},
		} {
			t.Run(tt.name, func(t *testing.T) {
				completion := "chatcmpl-span-" + strconv.Itoa(len(tt.name))
				gw := "gw-" + completion
				if tt.gatewayFirst {
					if err := db.InsertRecords(ctx, []accounting.Record{gatewayRecord(gw, completion)}); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := db.WriteCalls(ctx, span(tt.projectID, "span-"+completion, completion)); err != nil {
					t.Fatal(err)
				}
				if !tt.gatewayFirst {
					if err := db.InsertRecords(ctx, []accounting.Record{gatewayRecord(gw, completion)}); err != nil {
						t.Fatal(err)
					}
				}
				_, err := db.ReadCall(ctx, inference.ID, gw)
				if folded := errors.Is(err, trace.ErrNotFound); folded != tt.folds {
					t.Fatalf("gateway call folded %v, want %v (err %v)", folded, tt.folds, err)
				}
				c, err := db.ReadCall(ctx, tt.projectID, "span-"+completion)
				if err != nil {
					t.Fatal(err)
				}
				if got := gjson.GetBytes(c.Attributes, "gateway.call_id").Str; (got == gw) != tt.folds {
					t.Fatalf("span attributes %s", c.Attributes)
				}
			})
		}
	})
}
