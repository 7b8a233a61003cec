package proxy

import "github.com/tollgate-dev/tollgate/internal/route"

// Routes lists the routes the proxy serves itself, for the binary's table
// of every route. The /v1/ paths of its table that it hands to
// Options.Next are not among them: what serves them lists them.
func (s *Server) Routes() []route.Route {
	out := make([]route.Route, 0, len(s.table))
	for _, r := range s.table {
		if r.serve != nil {
			out = append(out, route.Route{Method: r.method, Pattern: r.pattern, Module: "proxy"})
		}
	}
	return out
}
