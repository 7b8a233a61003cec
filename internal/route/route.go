// Package route describes the HTTP routes the binary serves. Each module
// that serves routes lists its own as Routes (proxy, admin), cmd/tollgate
// adds those it serves itself (the usage API, budgets, /metrics, the
// dashboard) and assembles the one table of every route, which tests and
// the README's endpoint table are checked against. Dispatch stays in each
// module, over its own part of the table.
package route

import "strings"

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
}

// Match reports whether path matches pattern, and the values of its
// "{name}" segments by name (nil when it has none).
func Match(pattern, path string) (map[string]string, bool) {
	open := strings.IndexByte(pattern, '{')
	if open < 0 {
		return nil, pattern == path
	}
	if !strings.HasPrefix(path, pattern[:open]) {
		return nil, false
	}
	pat := strings.Split(pattern, "/")
	segs := strings.Split(path, "/")
	params := make(map[string]string, 3)
	for i, p := range pat {
		if i >= len(segs) {
			return nil, false
		}
		name, isParam := strings.CutPrefix(p, "{")
		if !isParam {
			if p != segs[i] {
				return nil, false
			}
			continue
		}
		name = strings.TrimSuffix(name, "}")
		if rest, ok := strings.CutSuffix(name, "..."); ok {
			value := strings.Join(segs[i:], "/")
			if value == "" {
				return nil, false
			}
			params[rest] = value
			return params, true
		}
		if segs[i] == "" {
			return nil, false
		}
		params[name] = segs[i]
	}
	if len(segs) != len(pat) {
		return nil, false
	}
	return params, true
}
