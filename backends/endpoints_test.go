package backends

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/config"
)

func TestEndpointRequests(t *testing.T) {
	cfg, err := config.Parse([]byte(`
auth: {keys: [{name: k, key: sk-test-0001}]}
backends: [{name: b, url: "http://127.0.0.1:1/v1/", api_key: sk-upstream}]
models:
  - {name: all, backends: [b]}
  - {name: embed, backends: [b], endpoints: [embeddings]}
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reg, err := NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()

	all, embed := reg.Route([]byte("all")), reg.Route([]byte("embed"))
	for e := range numEndpoints {
		if !all.Serves(e) {
			t.Errorf("model all does not serve %s; no endpoints listed means all", e.Path())
		}
		if got := embed.Serves(e); got != (e == EndpointEmbeddings) {
			t.Errorf("model embed serves %s: %v", e.Path(), got)
		}
	}

	b := reg.Backends()[0]
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	for e, want := range map[Endpoint]string{
		EndpointChat:        "http://127.0.0.1:1/v1/chat/completions",
		EndpointCompletions: "http://127.0.0.1:1/v1/completions",
		EndpointEmbeddings:  "http://127.0.0.1:1/v1/embeddings",
		EndpointResponses:   "http://127.0.0.1:1/v1/responses",
	} {
		req.Header.Set(fasthttp.HeaderAuthorization, "Bearer client-key")
		b.Prepare(req, e)
		if got := req.URI().String(); got != want || !req.Header.IsPost() {
			t.Errorf("%s: %s %s, want POST %s", e.Path(), req.Header.Method(), got, want)
		}
		if got := string(req.Header.Peek(fasthttp.HeaderAuthorization)); got != "Bearer sk-upstream" {
			t.Errorf("%s: Authorization %q, want the backend's key", e.Path(), got)
		}
	}
	b.PrepareResponse(req, fasthttp.MethodDelete, "resp_1", "")
	if got := req.URI().String(); got != "http://127.0.0.1:1/v1/responses/resp_1" || string(req.Header.Method()) != fasthttp.MethodDelete {
		t.Errorf("stored response: %s %s", req.Header.Method(), got)
	}
	b.PrepareResponse(req, fasthttp.MethodPost, "resp_1", "/cancel")
	if got := req.URI().String(); got != "http://127.0.0.1:1/v1/responses/resp_1/cancel" {
		t.Errorf("cancel: %s", got)
	}
}
