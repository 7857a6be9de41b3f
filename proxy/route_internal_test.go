package proxy

import (
	"crypto/tls"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

func TestRoutePolicyDefaults(t *testing.T) {
	p := RoutePolicy{}.WithDefaults()
	if p.Kind != KindOpenAI || p.AllowQueryKey || p.FirstTokenTimeout != 0 || p.Retries != nil ||
		!p.LimitsEnforced() || p.HedgeAfter != 0 || p.TimingComment {
		t.Errorf("defaults %+v", p)
	}
	if p := (RoutePolicy{Kind: KindSSE}).WithDefaults(); p.Kind != KindSSE {
		t.Errorf("kind %q; want sse kept", p.Kind)
	}
	on, off := true, false
	if !(RoutePolicy{EnforceLimits: &on}).LimitsEnforced() || (RoutePolicy{EnforceLimits: &off}).LimitsEnforced() {
		t.Error("LimitsEnforced does not follow EnforceLimits")
	}
}

func TestRoutePolicyValidate(t *testing.T) {
	cfg := Config{}.WithDefaults() // first-token timeout 1m
	neg, zero := -1, 0
	cases := []struct {
		name string
		p    RoutePolicy
		want []routing.FieldError
	}{
		{"defaults", RoutePolicy{}.WithDefaults(), nil},
		{"every kind", RoutePolicy{Kind: KindWebSocket, Retries: &zero, HedgeAfter: 59 * time.Second}, nil},
		{"bad kind", RoutePolicy{Kind: "grpc"}, []routing.FieldError{{Key: "kind", Msg: `kind "grpc" must be openai, sse or websocket`}}},
		{"negative retries", RoutePolicy{Kind: KindSSE, Retries: &neg}, []routing.FieldError{{Key: "retries", Msg: "retries must not be negative"}}},
		{"hedge after the proxy's timeout", RoutePolicy{Kind: KindOpenAI, HedgeAfter: time.Minute},
			[]routing.FieldError{{Key: "hedge_after", Msg: "hedge_after 1m0s must be shorter than the first-token timeout 1m0s"}}},
		{"hedge after the route's timeout", RoutePolicy{Kind: KindOpenAI, HedgeAfter: 3 * time.Second, FirstTokenTimeout: 2 * time.Second},
			[]routing.FieldError{{Key: "hedge_after", Msg: "hedge_after 3s must be shorter than the first-token timeout 2s"}}},
		{"all, in key order", RoutePolicy{Kind: "x", Retries: &neg, HedgeAfter: time.Hour}, []routing.FieldError{
			{Key: "kind", Msg: `kind "x" must be openai, sse or websocket`},
			{Key: "retries", Msg: "retries must not be negative"},
			{Key: "hedge_after", Msg: "hedge_after 1h0m0s must be shorter than the first-token timeout 1m0s"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Validate(cfg); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v; want %+v", got, tc.want)
			}
		})
	}
}

// The handler resolves a route's policy from the matched *routing.Route:
// the State's entry, else the defaults, and never an allocation.
func TestStatePolicyLookup(t *testing.T) {
	a := &routing.Route{RouteConfig: routing.RouteConfig{Name: "a"}}
	b := &routing.Route{RouteConfig: routing.RouteConfig{Name: "b"}}
	pa := RoutePolicy{Kind: KindSSE, TimingComment: true}
	st := &State{Policies: map[*routing.Route]*RoutePolicy{a: &pa}}
	if got := st.policy(a); got != &pa {
		t.Errorf("policy(a) = %+v; want its entry", got)
	}
	for _, rt := range []*routing.Route{b, nil} {
		if got := st.policy(rt); !reflect.DeepEqual(*got, RoutePolicy{}.WithDefaults()) {
			t.Errorf("policy(%v) = %+v; want the defaults", rt, got)
		}
	}
	if got := (&State{}).policy(a); got.Kind != KindOpenAI {
		t.Errorf("no policies: kind %q; want openai", got.Kind)
	}
	var sink *RoutePolicy
	if n := testing.AllocsPerRun(100, func() { sink = st.policy(a); sink = st.policy(b) }); n != 0 {
		t.Errorf("lookup allocates %v times; want 0", n)
	}
	_ = sink
}

func BenchmarkStatePolicyLookup(b *testing.B) {
	routes := make([]*routing.Route, 16)
	st := &State{Policies: map[*routing.Route]*RoutePolicy{}}
	for i := range routes {
		routes[i] = &routing.Route{}
		st.Policies[routes[i]] = &RoutePolicy{Kind: KindOpenAI}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		_ = st.policy(routes[i&15])
		i++
	}
}

// The Host vs SNI check runs on every TLS request: it allocates nothing
// when the request passes.
func TestCheckAuthorityNoAllocs(t *testing.T) {
	st := &State{Routes: routing.NewTable([]*routing.Route{
		{RouteConfig: routing.RouteConfig{Host: "internal.example.com", Path: "/v1/"}},
		{RouteConfig: routing.RouteConfig{Host: "*.beta.example.com", Path: "/v1/"}},
		{RouteConfig: routing.RouteConfig{Path: "/v1/"}},
	})}
	for _, tc := range []struct {
		sni, host string
		ok        bool
	}{
		{"internal.example.com", "Internal.example.com:443", true},
		{"a.beta.example.com", "a.beta.example.com", true},
		{"api.example.com", "api.example.com", true},
		{"", "127.0.0.1:443", true},
		{"api.example.com", "internal.example.com", false},
		{"", "x.beta.example.com", false},
		{"[::1]", "[::1]:443", true},
	} {
		r := &http.Request{Host: tc.host, TLS: &tls.ConnectionState{ServerName: tc.sni}}
		if err := st.checkAuthority(r); (err == nil) != tc.ok {
			t.Errorf("SNI %q Host %q: %v; want ok %v", tc.sni, tc.host, err, tc.ok)
		}
		if tc.ok {
			if n := testing.AllocsPerRun(100, func() { st.checkAuthority(r) }); n != 0 {
				t.Errorf("SNI %q Host %q: %v allocations; want 0", tc.sni, tc.host, n)
			}
		}
	}
}
