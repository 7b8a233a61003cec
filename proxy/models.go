package proxy

import (
	"encoding/json"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/backends"
)

// modelEntry is one entry of GET /v1/models in the OpenAI list shape.
type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// buildModelList renders the /v1/models reply once per configuration, so
// serving it costs a copy.
func buildModelList(reg *backends.Registry, created time.Time) []byte {
	list := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list", Data: []modelEntry{}}
	for _, rt := range reg.Routes() {
		list.Data = append(list.Data, modelEntry{ID: rt.Name, Object: "model", Created: created.Unix(), OwnedBy: "tollgate"})
	}
	b, _ := json.Marshal(list) // plain strings and numbers always marshal
	return b
}

// backendState is one backend in the /readyz reply.
type backendState struct {
	Name     string  `json:"name"`
	Healthy  bool    `json:"healthy"`
	State    string  `json:"state"` // healthy, ejected or unhealthy
	InFlight int64   `json:"in_flight"`
	TTFTMs   float64 `json:"ttft_ms"` // moving average; 0 before the first request
}

// appendBackendStates renders whether the gateway is ready and each
// backend's state.
func appendBackendStates(dst []byte, reg *backends.Registry) []byte {
	out := struct {
		Ready    bool           `json:"ready"`
		Backends []backendState `json:"backends"`
	}{Ready: reg.Ready(), Backends: []backendState{}}
	for _, b := range reg.Backends() {
		out.Backends = append(out.Backends, backendState{Name: b.Name, Healthy: b.Healthy(), State: string(b.State()),
			InFlight: b.InFlight(), TTFTMs: float64(b.TTFT().Microseconds()) / 1000})
	}
	b, _ := json.Marshal(out)
	return append(dst, b...)
}

// serveModel answers GET /v1/models/{id}: the model object of a configured
// model, the same as its entry in the list, or 404 model_not_found.
func (s *Server) serveModel(ctx *fasthttp.RequestCtx, id []byte) {
	st := s.state.Load()
	anthropicClient := fromAnthropicClient(ctx)
	if _, e := s.authenticate(ctx, st); e != nil {
		writeErrorTo(ctx, e, anthropicClient)
		return
	}
	rt := st.reg.Route(id)
	if rt == nil {
		writeErrorTo(ctx, modelNotFound(id), anthropicClient)
		return
	}
	var b []byte
	if anthropicClient {
		b, _ = json.Marshal(anthropicModelOf(rt, s.started))
	} else {
		b, _ = json.Marshal(modelEntry{ID: rt.Name, Object: "model", Created: s.started.Unix(), OwnedBy: "tollgate"})
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
