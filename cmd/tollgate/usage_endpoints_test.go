package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/store/storetest"
)

// endpointBackend is an OpenAI-compatible backend answering each endpoint
// with fixed usage, in the shape that endpoint reports it.
func endpointBackend(t *testing.T) *httptest.Server {
	t.Helper()
	replies := map[string]string{
		"/v1/chat/completions": `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14,"prompt_tokens_details":{"cached_tokens":2}}}`,
		"/v1/completions":      `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"hi","finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12}}`,
		"/v1/embeddings":       `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"m","usage":{"prompt_tokens":9,"total_tokens":9}}`,
		"/v1/responses":        `{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"m","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"hi","annotations":[]}]}],"usage":{"input_tokens":13,"input_tokens_details":{"cached_tokens":4},"output_tokens":6,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":19}}`,
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","created":1,"owned_by":"test"}]}`)
			return
		}
		reply, ok := replies[r.URL.Path]
		if !ok || r.Method != http.MethodPost {
			http.Error(w, `{"error":{"message":"not found","type":"invalid_request_error"}}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, reply)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestUsageByEndpointThroughGateway sends requests to every endpoint
// through the gateway, on each store engine, and checks that the usage API
// counts each endpoint exactly: by endpoint on the completions path with
// every endpoint chosen, the text-generation endpoints alone by default,
// and embeddings alone on the embeddings path.
func TestUsageByEndpointThroughGateway(t *testing.T) {
	storetest.ForEachConfig(t, func(t *testing.T, st config.Store) {
		backend := endpointBackend(t)
		storeLine := fmt.Sprintf("store: {path: %q}", st.Path)
		if st.Driver == storetest.Postgres {
			storeLine = fmt.Sprintf("store: {driver: postgres, dsn: %q}", st.DSN)
		}
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
listen: "127.0.0.1:0"
log: {level: error}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: fixed
    url: %q
models:
  - name: demo
    backends: [fixed]
%s
usage: {flush_interval: 50ms}
`, adminKey, backend.URL+"/v1", storeLine)), "test.yaml")
		if err != nil {
			t.Fatalf("config: %v", err)
		}
		g := start(t, cfg)
		began := time.Now().Add(-time.Minute)

		sends := []struct {
			path, body string
			times      int
		}{
			{"/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"hi"}]}`, 3},
			{"/v1/completions", `{"model":"demo","prompt":"hi"}`, 2},
			{"/v1/embeddings", `{"model":"demo","input":"hi"}`, 4},
			{"/v1/responses", `{"model":"demo","input":"hi"}`, 1},
		}
		for _, s := range sends {
			for range s.times {
				if code, body := g.do(t, "POST", s.path, adminKey, s.body, "Compat-Project: acme/endpoints"); code != http.StatusOK {
					t.Fatalf("POST %s: %d %s", s.path, code, body)
				}
			}
		}

		type totals struct{ Input, Output, Cached, Requests int64 }
		read := func(path string, params url.Values) map[string]totals {
			t.Helper()
			params.Set("start_time", strconv.FormatInt(began.Unix(), 10))
			params.Set("bucket_width", "1d")
			code, body := g.do(t, "GET", path+"?"+params.Encode(), adminKey, "")
			if code != http.StatusOK {
				t.Fatalf("GET %s: %d %s", path, code, body)
			}
			out := map[string]totals{}
			for _, r := range gjson.Get(body, "data.#.results|@flatten").Array() {
				name := r.Get("endpoint").String()
				s := out[name]
				s.Input += r.Get("input_tokens").Int()
				s.Output += r.Get("output_tokens").Int()
				s.Cached += r.Get("input_cached_tokens").Int()
				s.Requests += r.Get("num_model_requests").Int()
				out[name] = s
			}
			return out
		}

		want := map[string]totals{
			"chat.completions": {Input: 33, Output: 9, Cached: 6, Requests: 3},
			"completions":      {Input: 14, Output: 10, Requests: 2},
			"embeddings":       {Input: 36, Requests: 4},
			"responses":        {Input: 13, Output: 6, Cached: 4, Requests: 1},
		}
		all := url.Values{"group_by": {"endpoint"}, "endpoints": {"chat.completions,completions,embeddings,responses"}}
		var got map[string]totals
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			got = read("/v1/organization/usage/completions", all)
			if reflect.DeepEqual(got, want) || time.Now().After(deadline) {
				break
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("by endpoint = %+v, want %+v", got, want)
		}
		if got := read("/v1/organization/usage/completions", url.Values{}); !reflect.DeepEqual(got, map[string]totals{"": {Input: 60, Output: 25, Cached: 10, Requests: 6}}) {
			t.Errorf("completions path = %+v, want the three text-generation endpoints together", got)
		}
		if got := read("/v1/organization/usage/embeddings", url.Values{}); !reflect.DeepEqual(got, map[string]totals{"": {Input: 36, Requests: 4}}) {
			t.Errorf("embeddings path = %+v, want the embeddings alone", got)
		}

		// Each request's call is recorded under its endpoint's op.
		code, body := g.do(t, "POST", "/calls/stream_query", adminKey, `{"project_id":"acme/endpoints"}`)
		if code != http.StatusOK {
			t.Fatalf("calls: %d %s", code, body)
		}
		ops := map[string]int{}
		for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
			ops[gjson.Get(line, "op_name").String()]++
		}
		wantOps := map[string]int{"openai.chat.completions.create": 3, "openai.completions.create": 2, "openai.embeddings.create": 4, "openai.responses.create": 1}
		if !reflect.DeepEqual(ops, wantOps) {
			t.Errorf("calls by op = %v, want %v", ops, wantOps)
		}
	})
}

// TestUsageCommandMessagesThroughGateway sends Anthropic Messages API
// requests through the gateway to a chat backend, which the gateway
// translates for, and reads them back with `tollgate usage -by endpoint`:
// messages with the tokens the chat usage reported, and count_tokens
// charged the chat request that counted the prompt.
func TestUsageCommandMessagesThroughGateway(t *testing.T) {
	storetest.ForEachConfig(t, func(t *testing.T, st config.Store) {
		backend := endpointBackend(t)
		storeLine := fmt.Sprintf("store: {path: %q}", st.Path)
		if st.Driver == storetest.Postgres {
			storeLine = fmt.Sprintf("store: {driver: postgres, dsn: %q}", st.DSN)
		}
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
listen: "127.0.0.1:0"
log: {level: error}
auth:
  keys:
    - {name: admin, key: %q, teams: ["*"], default_team: acme, admin: true}
backends:
  - name: fixed
    url: %q
models:
  - name: demo
    backends: [fixed]
%s
usage: {flush_interval: 50ms}
`, adminKey, backend.URL+"/v1", storeLine)), "test.yaml")
		if err != nil {
			t.Fatalf("config: %v", err)
		}
		g := start(t, cfg)
		for _, s := range []struct{ path, body string }{
			{"/v1/messages", `{"model":"demo","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`},
			{"/v1/messages", `{"model":"demo","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`},
			{"/v1/messages/count_tokens", `{"model":"demo","messages":[{"role":"user","content":"hi"}]}`},
		} {
			if code, body := g.do(t, "POST", s.path, adminKey, s.body); code != http.StatusOK {
				t.Fatalf("POST %s: %d %s", s.path, code, body)
			}
		}
		// The chat reply's usage: 11 prompt tokens (2 cached), 3
		// completion tokens, for each request.
		want := [][]string{
			{"ENDPOINT", "REQUESTS", "INPUT", "CACHED", "OUTPUT", "TOTAL", "COST"},
			{"messages", "2", "22", "4", "6", "28", "0.000000"},
			{"messages.count_tokens", "1", "11", "2", "3", "14", "0.000000"},
			{"TOTAL", "3", "33", "6", "9", "42", "0.000000"},
		}
		path := usageCmdConfig(t, st)
		var got [][]string
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			got = usageTable(t, "-config", path, "-by", "endpoint")
			if reflect.DeepEqual(got, want) || time.Now().After(deadline) {
				break
			}
		}
		checkTable(t, got, want)
	})
}
