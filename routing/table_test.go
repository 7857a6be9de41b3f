package routing

import (
	"errors"
	"testing"
)

func testTable(t *testing.T, rcs ...RouteConfig) *Table {
	t.Helper()
	var routes []*Route
	pools := map[string]*Pool{}
	for _, rc := range rcs {
		p := pools[rc.Pool]
		if p == nil {
			var err error
			p, err = NewPool(PoolConfig{Name: rc.Pool, Backends: []BackendConfig{{URL: "http://127.0.0.1:1"}}})
			if err != nil {
				t.Fatal(err)
			}
			pools[rc.Pool] = p
		}
		routes = append(routes, &Route{RouteConfig: rc.WithDefaults(), Pool: p})
	}
	return NewTable(routes)
}

func TestTableMatch(t *testing.T) {
	tbl := testTable(t,
		RouteConfig{Name: "default", Path: "/", Pool: "any"},
		RouteConfig{Name: "v1", Pool: "gpu"},
		RouteConfig{Name: "llama", Models: []string{"llama-70b", "llama-8b"}, Pool: "gpu"},
		RouteConfig{Name: "embed", Path: "/v1/embeddings", Models: []string{"bge"}, Pool: "embed"},
		RouteConfig{Name: "wild", Host: "*.example.com", Pool: "wild"},
		RouteConfig{Name: "exact", Host: "api.example.com", Models: []string{"llama-8b"}, Pool: "exact", Class: ClassBatch},
		RouteConfig{Name: "events", Path: "/events/", Pool: "events"},
	)
	cases := []struct {
		host, path, model string
		want              string
		err               error
	}{
		{"localhost:8080", "/v1/chat/completions", "llama-8b", "llama", nil},
		{"localhost", "/v1/chat/completions", "other", "v1", nil}, // catch-all of the path
		{"localhost", "/v1/chat/completions", "", "llama", nil},   // no model: most specific of the path
		{"localhost", "/v1/embeddings", "bge", "embed", nil},      // longer prefix wins
		{"localhost", "/v1/embeddings", "llama-8b", "llama", nil}, // longer prefix does not serve the model
		{"api.example.com", "/v1/chat/completions", "llama-8b", "exact", nil},
		{"API.Example.com:443", "/v1/chat/completions", "llama-8b", "exact", nil},
		{"api.example.com", "/v1/chat/completions", "gpt", "wild", nil}, // exact host lacks the model
		{"eu.example.com", "/v1/chat/completions", "llama-8b", "wild", nil},
		{"a.b.example.com", "/v1/chat/completions", "llama-8b", "llama", nil}, // wildcard is one label
		{"[::1]:8080", "/events/x", "", "events", nil},
		{"localhost", "/metrics", "", "default", nil}, // the default route
	}
	for _, tc := range cases {
		r, err := tbl.Match(tc.host, tc.path, tc.model)
		if !errors.Is(err, tc.err) || (err == nil && r.Name != tc.want) {
			name := ""
			if r != nil {
				name = r.Name
			}
			t.Errorf("Match(%q, %q, %q) = %q, %v; want %q, %v", tc.host, tc.path, tc.model, name, err, tc.want, tc.err)
		}
	}
	if got := tbl.Pools(); len(got) != 6 {
		t.Errorf("Pools() has %d pools; want 6, each once", len(got))
	}
}

func TestTableErrors(t *testing.T) {
	tbl := testTable(t,
		RouteConfig{Name: "llama", Models: []string{"llama-8b"}, Pool: "gpu"},
		RouteConfig{Name: "internal", Host: "internal.local", Path: "/admin/", Pool: "gpu"},
	)
	cases := []struct {
		host, path, model string
		err               error
	}{
		{"localhost", "/v2/chat", "llama-8b", ErrNoRoute},
		{"localhost", "/admin/x", "", ErrNoRoute}, // host does not match
		{"localhost", "/v1/chat/completions", "gpt-9", ErrUnknownModel},
	}
	for _, tc := range cases {
		if _, err := tbl.Match(tc.host, tc.path, tc.model); !errors.Is(err, tc.err) {
			t.Errorf("Match(%q, %q, %q): %v; want %v", tc.host, tc.path, tc.model, err, tc.err)
		}
	}
}

// Routes of equal specificity keep config order.
func TestTableTiesKeepConfigOrder(t *testing.T) {
	tbl := testTable(t,
		RouteConfig{Name: "first", Pool: "a"},
		RouteConfig{Name: "second", Pool: "b"},
	)
	if r, _ := tbl.Match("h", "/v1/x", ""); r.Name != "first" {
		t.Fatalf("got %q; want the first route in config order", r.Name)
	}
}
