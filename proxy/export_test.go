package proxy

import (
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/route"
)

// SetBackgroundCapacity bounds the background responses s waits on, so
// that a test can fill the set.
func SetBackgroundCapacity(s *Server, n int) {
	s.background.mu.Lock()
	defer s.background.mu.Unlock()
	s.background.capacity = n
}

// OwnRouter routes the proxy's rows alone, refusing in its shape; a
// non-nil notFound answers every other path instead, standing in for the
// binary's other modules.
func OwnRouter(s *Server, notFound fasthttp.RequestHandler) fasthttp.RequestHandler {
	if notFound == nil {
		notFound = NotFound
	}
	r, err := route.New(s.Routes(), notFound, MethodNotAllowed)
	if err != nil {
		panic(err)
	}
	return r.Serve
}
