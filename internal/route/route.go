// Package route is the binary's one routing table and its dispatcher.
// Each module hands its rows, with their handlers (proxy, the trace
// service); cmd/tollgate adds those it serves itself (the usage API,
// budgets, the Admin API, /metrics, the dashboard) and builds one Router
// per listener over them. A module knows only its own paths.
package route

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// MaxParams is the most "{name}" segments a pattern may have.
const MaxParams = 4

// Params are the values of a matched pattern's "{name}" segments: slices
// of the request's path, valid only while the handler runs.
type Params struct {
	names  []string
	values [MaxParams][]byte
}

// Get returns the value of the segment name, or nil when the pattern has
// no such segment.
func (p *Params) Get(name string) []byte {
	for i, n := range p.names {
		if n == name {
			return p.values[i]
		}
	}
	return nil
}

// Handler serves a request the table routed, with its path's parameters.
type Handler func(ctx *fasthttp.RequestCtx, p Params)

// Route is one path the binary serves, with one method.
type Route struct {
	// Method is the HTTP method served; "" serves every method.
	Method string
	// Pattern is the path: exact, or with "{name}" segments that each
	// stand for one non-empty segment, or a last "{name...}" segment that
	// stands for the rest of the path, slashes included.
	Pattern string
	// Module names what serves the route: "proxy", "trace service",
	// "usage API", "budgets", "admin API", "metrics" or "dashboard".
	Module string
	// Handler serves the route.
	Handler Handler
	// OrSlash also matches the path with one trailing slash, as clients
	// built on FastAPI's redirects send it (the trace service's routes).
	OrSlash bool
}

// segment is one "/"-separated part of a pattern with parameters.
type segment struct {
	literal string
	param   bool // "{name}"
	rest    bool // "{name...}", the last segment
}

// entry is a Route compiled for matching without allocating.
type entry struct {
	Route
	// prefix is the pattern up to its first "{": a path without it is
	// passed over before the segments are walked.
	prefix string
	// segs are the pattern's segments after its leading "/"; nil for an
	// exact pattern.
	segs  []segment
	names []string
}

// Router dispatches a request to the first row of its table that matches
// its path and method. A path that some row matches with another method
// gets notAllowed with the methods it takes; any other path, notFound.
// Those two write the refusal in the client's wire shape.
type Router struct {
	table      []entry
	notFound   fasthttp.RequestHandler
	notAllowed func(ctx *fasthttp.RequestCtx, allow string)
}

// New builds a Router over routes, matched in their order: the hot path's
// row comes first, since the scan stops at the first match. It refuses a
// table that lists a method and pattern twice, or a malformed pattern.
func New(routes []Route, notFound fasthttp.RequestHandler, notAllowed func(ctx *fasthttp.RequestCtx, allow string)) (*Router, error) {
	r := &Router{table: make([]entry, 0, len(routes)), notFound: notFound, notAllowed: notAllowed}
	seen := make(map[string]string, len(routes))
	for _, rt := range routes {
		key := rt.Method + " " + rt.Pattern
		if module, dup := seen[key]; dup {
			return nil, fmt.Errorf("route: %s %q is listed twice (by %s and %s)", methodName(rt.Method), rt.Pattern, module, rt.Module)
		}
		seen[key] = rt.Module
		e, err := compile(rt)
		if err != nil {
			return nil, err
		}
		r.table = append(r.table, e)
	}
	return r, nil
}

func methodName(m string) string {
	if m == "" {
		return "any method"
	}
	return m
}

// compile checks rt's pattern and splits it into segments.
func compile(rt Route) (entry, error) {
	e := entry{Route: rt}
	if rt.Handler == nil {
		return e, fmt.Errorf("route: %q has no handler", rt.Pattern)
	}
	if !strings.HasPrefix(rt.Pattern, "/") {
		return e, fmt.Errorf("route: %q does not start with /", rt.Pattern)
	}
	open := strings.IndexByte(rt.Pattern, '{')
	if open < 0 {
		return e, nil
	}
	e.prefix = rt.Pattern[:open]
	parts := strings.Split(rt.Pattern[1:], "/")
	for i, p := range parts {
		name, isParam := strings.CutPrefix(p, "{")
		if !isParam {
			e.segs = append(e.segs, segment{literal: p})
			continue
		}
		name, closed := strings.CutSuffix(name, "}")
		if !closed || name == "" || len(e.names) == MaxParams {
			return e, fmt.Errorf("route: %q: bad parameter %q", rt.Pattern, p)
		}
		name, rest := strings.CutSuffix(name, "...")
		if rest && i != len(parts)-1 {
			return e, fmt.Errorf("route: %q: %q must be the last segment", rt.Pattern, p)
		}
		e.names = append(e.names, name)
		e.segs = append(e.segs, segment{param: !rest, rest: rest})
	}
	return e, nil
}

// match reports whether path matches e's pattern, filling p's values.
func (e *entry) match(path []byte, p *Params) bool {
	if e.segs == nil {
		return bytesconv.String(path) == e.Pattern
	}
	if len(path) < len(e.prefix) || bytesconv.String(path[:len(e.prefix)]) != e.prefix {
		return false
	}
	// left is what follows the segments taken so far; nil once the path
	// has no "/" left, so that "a" and "a/" differ.
	left := path[1:]
	n := 0
	for _, s := range e.segs {
		if s.rest {
			if len(left) == 0 {
				return false
			}
			p.values[n] = left
			p.names = e.names
			return true
		}
		if left == nil {
			return false
		}
		var seg []byte
		if i := bytes.IndexByte(left, '/'); i >= 0 {
			seg, left = left[:i], left[i+1:]
		} else {
			seg, left = left, nil
		}
		switch {
		case s.param && len(seg) == 0:
			return false
		case s.param:
			p.values[n] = seg
			n++
		case bytesconv.String(seg) != s.literal:
			return false
		}
	}
	p.names = e.names
	return left == nil
}

// Serve routes ctx.
func (r *Router) Serve(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	var trimmed []byte
	if len(path) > 1 && path[len(path)-1] == '/' {
		trimmed = path[:len(path)-1]
	}
	method := bytesconv.String(ctx.Method())
	var allowed [8]string
	nAllowed := 0
	for i := range r.table {
		e := &r.table[i]
		var p Params
		if !e.match(path, &p) && (!e.OrSlash || trimmed == nil || !e.match(trimmed, &p)) {
			continue
		}
		if e.Method != "" && e.Method != method {
			if nAllowed < len(allowed) {
				allowed[nAllowed] = e.Method
				nAllowed++
			}
			continue
		}
		e.Handler(ctx, p)
		return
	}
	if nAllowed > 0 {
		r.notAllowed(ctx, strings.Join(allowed[:nAllowed], ", "))
		return
	}
	r.notFound(ctx)
}

// Routes returns the table's rows, in order, for listings and tests.
func (r *Router) Routes() []Route {
	out := make([]Route, len(r.table))
	for i := range r.table {
		out[i] = r.table[i].Route
	}
	return out
}

// Match reports whether path matches pattern, as a Router would match it
// (without OrSlash).
func Match(pattern, path string) bool {
	e, err := compile(Route{Pattern: pattern, Handler: func(*fasthttp.RequestCtx, Params) {}})
	var p Params
	return err == nil && e.match([]byte(path), &p)
}
