package admin

import (
	"context"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
)

// minRequiredWeavePythonVersion is what /server_info tells the Python SDK,
// which refuses to run when it is older than this. tollgate refuses no SDK
// release, as the trace server Weave generates from its interface does: it
// answers the routes it serves and 404s the others.
const minRequiredWeavePythonVersion = "0.0.1"

// health serves GET /health, which the Weave SDKs' login calls to check
// the server and the key: like every service route it needs a valid key,
// so that weave.login reports a wrong key at once. (Probes that carry no
// key use the gateway's own health endpoint.)
func (s *Service) health(_ context.Context, rc *fasthttp.RequestCtx, _ *auth.Key, _ pathParams) *apiError {
	writeJSON(rc, fasthttp.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// serverInfo serves GET /server_info, Weave's ServerInfoRes.
func (s *Service) serverInfo(_ context.Context, rc *fasthttp.RequestCtx, _ *auth.Key, _ pathParams) *apiError {
	writeJSON(rc, fasthttp.StatusOK, map[string]string{
		"min_required_weave_python_version": minRequiredWeavePythonVersion,
	})
	return nil
}
