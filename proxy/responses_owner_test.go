package proxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// storedResponseRequest is one request a client can make about a stored
// response.
type storedResponseRequest struct{ method, path, body string }

// storedResponseRequests are the requests about stored response id:
// retrieve it (and replay it), list its input items, cancel it, delete it,
// and continue it.
func storedResponseRequests(id string) []storedResponseRequest {
	return []storedResponseRequest{
		{http.MethodGet, "/v1/responses/" + id, ""},
		{http.MethodGet, "/v1/responses/" + id + "?stream=true", ""},
		{http.MethodGet, "/v1/responses/" + id + "/input_items", ""},
		{http.MethodPost, "/v1/responses/" + id + "/cancel", ""},
		{http.MethodDelete, "/v1/responses/" + id, ""},
		{http.MethodPost, "/v1/responses", `{"model":"demo","input":"more","previous_response_id":"` + id + `"}`},
	}
}

// wantAsUnknown sends req, about response id, with key, and the same
// request about an id no backend has: both must get OpenAI's 404 for a
// response that does not exist, the same but for the id, so that the
// answer tells nothing of whether id exists.
func wantAsUnknown(t *testing.T, s *surface, key string, req storedResponseRequest, id string) {
	t.Helper()
	const unknownID = "resp_zz9unknown"
	got := s.doAs(key, req.method, req.path, req.body)
	unknown := s.doAs(key, req.method, strings.ReplaceAll(req.path, id, unknownID), strings.ReplaceAll(req.body, id, unknownID))
	param := "response_id"
	if req.path == "/v1/responses" {
		param = "previous_response_id"
	}
	wantResponseNotFound(t, unknown, unknownID, param)
	wantResponseNotFound(t, got, id, param)
	if g, w := strings.ReplaceAll(string(got.body), id, "ID"), strings.ReplaceAll(string(unknown.body), unknownID, "ID"); g != w {
		t.Errorf("%s %s: %s differs from the unknown id's %s", req.method, req.path, g, w)
	}
}

// wantResponseNotFound fails unless r is OpenAI's 404 for stored response
// id, named by param.
func wantResponseNotFound(t *testing.T, r response, id, param string) {
	t.Helper()
	wantOpenAIError(t, r, 404, "response_not_found")
	e := r.json("error")
	if msg, typ, p := e.Get("message").String(), e.Get("type").String(), e.Get("param").String(); msg != "No response found with id '"+id+"'." ||
		typ != "invalid_request_error" || p != param {
		t.Errorf("404 %s, want OpenAI's message for %s, invalid_request_error, param %s", r.body, id, param)
	}
}

// TestStoredResponseNotFoundText checks the answer for a stored response
// no backend has, asked by a key of every team (so every backend is asked,
// and each answers its own 404): OpenAI's, not the backend's text nor a
// word on the configured model.
func TestStoredResponseNotFoundText(t *testing.T) {
	s := newSurface(t)
	for _, req := range storedResponseRequests("resp_nowhere") {
		t.Run(req.method+" "+req.path, func(t *testing.T) {
			param := "response_id"
			if req.path == "/v1/responses" {
				param = "previous_response_id"
			}
			r := s.doAs(opsKey, req.method, req.path, req.body)
			wantResponseNotFound(t, r, "resp_nowhere", param)
			if strings.Contains(string(r.body), "configured model") {
				t.Errorf("a missing response is answered as a missing model: %s", r.body)
			}
		})
	}
}

// TestStoredResponseRequestIDTakeover is team rival, which knows team
// acme's response id, sending its own requests with that id as request_id
// (vLLM names a response after it), stored and not: none of them gives
// rival any use of the response, and acme's response is intact afterwards.
func TestStoredResponseRequestIDTakeover(t *testing.T) {
	s := newSurface(t)
	made := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"acme's secret"}`)
	if made.status != 200 {
		t.Fatalf("reply %d %s", made.status, made.body)
	}
	id := made.json("id").String()
	owner := map[string]*fakeUpstream{"a": s.a, "b": s.b}[s.recorder.wait(t, 1).Backend]

	for _, store := range []string{"false", "true"} {
		t.Run("store "+store, func(t *testing.T) {
			r := s.doAs(rivalKey, http.MethodPost, "/v1/responses",
				`{"model":"demo","input":"rival's","request_id":"`+id+`","store":`+store+`}`)
			// Refused before any backend hears of it (checked without
			// stopping, so that what rival could do otherwise shows too).
			if r.status != 400 || r.json("error.code").String() != "request_id_in_use" || r.json("error.param").String() != "request_id" {
				t.Errorf("rival's request with acme's id as request_id: %d %s, want a 400 on request_id", r.status, r.body)
			}
			for _, req := range storedResponseRequests(id) {
				wantAsUnknown(t, s, rivalKey, req, id)
			}
		})
	}
	if got := owner.input(id); got != "acme's secret" {
		t.Fatalf("the backend holds %q under acme's id, want acme's response", got)
	}
	r := s.do(http.MethodGet, "/v1/responses/"+id, "")
	if r.status != 200 || r.json("input").String() != "acme's secret" {
		t.Fatalf("acme reads its response after rival's attempts: %d %s", r.status, r.body)
	}
	// A retry by acme with its own response's id goes through.
	if r := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"again","request_id":"`+id+`","store":false}`); r.status != 200 {
		t.Errorf("acme's own request_id refused: %d %s", r.status, r.body)
	}
}

// TestStoredResponseReplyIDTaken is a backend answering team rival with
// the id of team acme's response (a backend naming its responses as it
// likes, or a race the request_id check cannot see): rival gets its reply,
// and is charged for it, but no use of acme's response.
func TestStoredResponseReplyIDTaken(t *testing.T) {
	s := newSurface(t)
	made := s.do(http.MethodPost, "/v1/responses", `{"model":"demo","input":"acme's secret"}`)
	id := made.json("id").String()
	s.recorder.wait(t, 1)

	r := s.doAs(rivalKey, http.MethodPost, "/v1/responses", `{"model":"demo","input":"rival's","metadata":{"reply_id":"`+id+`"}}`)
	if r.status != 200 || r.json("id").String() != id {
		t.Fatalf("rival's reply %d %s", r.status, r.body)
	}
	if rec := s.recorder.wait(t, 2); rec.Team != "rival" || rec.TotalTokens == 0 {
		t.Errorf("rival's request recorded as %+v, want charged to rival", rec)
	}
	for _, req := range storedResponseRequests(id) {
		wantAsUnknown(t, s, rivalKey, req, id)
	}
	if r := s.do(http.MethodGet, "/v1/responses/"+id, ""); r.status != 200 || r.json("input").String() != "acme's secret" {
		t.Fatalf("acme reads its response after rival's reply: %d %s", r.status, r.body)
	}
}
