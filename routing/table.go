package routing

import (
	"errors"
	"slices"
	"strings"
)

// Errors a route lookup returns.
var (
	// ErrNoRoute means no route matches the host and path.
	ErrNoRoute = errors.New("no route for this path")
	// ErrUnknownModel means routes match the path but none serves the model.
	ErrUnknownModel = errors.New("no route serves this model")
)

// Route is a matched route with its pool.
type Route struct {
	RouteConfig
	Pool *Pool
}

// Table matches requests to routes. It is immutable after NewTable and safe
// for simultaneous use by multiple goroutines.
type Table struct {
	routes []*Route // most specific first
}

// NewTable builds a table. Routes are ordered most specific first: exact
// host before wildcard host before any host, longer path prefix first, routes
// naming models before catch-all routes; ties keep config order.
func NewTable(routes []*Route) *Table {
	t := &Table{routes: append([]*Route(nil), routes...)}
	sortStable(t.routes, func(a, b *Route) bool { return specificity(a) > specificity(b) })
	return t
}

func specificity(r *Route) int {
	s := len(r.Path) * 4
	switch {
	case r.Host == "":
	case strings.HasPrefix(r.Host, "*."):
		s += 1 << 20
	default:
		s += 2 << 20
	}
	if len(r.Models) > 0 {
		s += 2
	}
	return s
}

func sortStable(rs []*Route, less func(a, b *Route) bool) {
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && less(rs[j], rs[j-1]); j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
}

// Pools returns the pools the routes use, each once, in route order.
func (t *Table) Pools() []*Pool {
	var out []*Pool
	for _, r := range t.routes {
		if r.Pool != nil && !slices.Contains(out, r.Pool) {
			out = append(out, r.Pool)
		}
	}
	return out
}

// Routes returns the routes, most specific first.
func (t *Table) Routes() []*Route { return t.routes }

// Match returns the most specific route for host, path and model. An empty
// model matches routes with or without a model list. It returns
// ErrUnknownModel when routes match the path but not the model.
func (t *Table) Match(host, path, model string) (*Route, error) {
	host = stripPort(host)
	pathMatched := false
	for _, r := range t.routes {
		if !hostMatches(r.Host, host) || !strings.HasPrefix(path, r.Path) {
			continue
		}
		pathMatched = true
		if model == "" || len(r.Models) == 0 || contains(r.Models, model) {
			return r, nil
		}
	}
	if pathMatched {
		return nil, ErrUnknownModel
	}
	return nil, ErrNoRoute
}

// HostRouted reports whether a route with a host pattern (exact or
// wildcard) matches host, whatever its path: whether host selects a
// route of its own.
func (t *Table) HostRouted(host string) bool {
	host = stripPort(host)
	for _, r := range t.routes {
		if r.Host != "" && hostMatches(r.Host, host) {
			return true
		}
	}
	return false
}

// Models lists the model names routes name for a host, in route order.
func (t *Table) Models(host string) []string {
	host = stripPort(host)
	var out []string
	seen := map[string]bool{}
	for _, r := range t.routes {
		if !hostMatches(r.Host, host) {
			continue
		}
		for _, m := range r.Models {
			if !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func stripPort(host string) string {
	if strings.HasPrefix(host, "[") {
		if i := strings.IndexByte(host, ']'); i > 0 {
			return host[1:i]
		}
		return host
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.Count(host, ":") == 1 {
		return host[:i]
	}
	return host
}

// hostMatches reports whether pattern ("", "a.b", "*.b") matches host.
func hostMatches(pattern, host string) bool {
	switch {
	case pattern == "":
		return true
	case strings.HasPrefix(pattern, "*."):
		suffix := pattern[1:] // ".b"
		return len(host) > len(suffix) && strings.EqualFold(host[len(host)-len(suffix):], suffix) &&
			!strings.Contains(host[:len(host)-len(suffix)], ".")
	default:
		return strings.EqualFold(pattern, host)
	}
}
