package proxy

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

// Route kinds (RoutePolicy.Kind): how the proxy treats a route's traffic.
const (
	// KindOpenAI is the OpenAI-compatible API: JSON bodies, SSE streams
	// that Sluice parses (usage, tokens, first token).
	KindOpenAI = "openai"
	// KindSSE is any event stream, relayed byte for byte and flushed on
	// arrival.
	KindSSE = "sse"
	// KindWebSocket relays a WebSocket to a backend WebSocket endpoint.
	KindWebSocket = "websocket"
)

// RoutePolicy is how the pipeline treats the requests of one route: the
// route's keys that routing does not match on. In the config file they sit
// beside the routing keys on each entry of routes.
type RoutePolicy struct {
	// Kind is "openai" (default), "sse" or "websocket".
	Kind string `yaml:"kind"`
	// AllowQueryKey accepts the API key as the query parameter "api_key"
	// (for browsers' EventSource, which cannot set headers). Default false.
	// The parameter is removed before forwarding and redacted in logs.
	AllowQueryKey bool `yaml:"allow_query_key"`
	// FirstTokenTimeout bounds the wait for the first event (or the whole
	// body of a non-streamed response) from one backend. Zero means the
	// proxy's default (Config.FirstTokenTimeout).
	FirstTokenTimeout time.Duration `yaml:"first_token_timeout"`
	// Retries is how many other backends are tried when one fails before
	// the first token. Nil means the proxy's default (Config.Retries, 1).
	Retries *int `yaml:"retries"`
	// EnforceLimits, when false, puts every tenant on this route in shadow
	// mode: limits are computed, charged and reported (rate-limit headers,
	// metrics, access log) but never refuse a request. Nil means true.
	EnforceLimits *bool `yaml:"enforce_limits"`
	// AllowEnforcedTenants lets a shadow route (EnforceLimits false) serve,
	// unenforced, tenants whose own limits are enforced. Default false:
	// such a tenant is refused on a shadow route with 403
	// shadow_route_not_allowed, so that a route meant to try limits out
	// never becomes a way around them for every tenant. It has no effect
	// on an enforcing route.
	AllowEnforcedTenants bool `yaml:"allow_enforced_tenants"`
	// HedgeAfter, when positive, hedges a request that has no first token
	// after this long: the same request goes to a second backend, the
	// first to produce a token wins and the other is cancelled. Zero (the
	// default) means no hedging.
	HedgeAfter time.Duration `yaml:"hedge_after"`
	// TimingComment ends every stream with a ": server-timing …" SSE
	// comment carrying the final timing (clients may also ask for it with
	// "X-Sluice-Timing: comment"). Default false.
	TimingComment bool `yaml:"timing_comment"`
}

// defaultPolicy is the policy of a route State.Policies has no entry for.
var defaultPolicy = RoutePolicy{}.WithDefaults()

// WithDefaults returns p with zero fields set to their defaults.
func (p RoutePolicy) WithDefaults() RoutePolicy {
	if p.Kind == "" {
		p.Kind = KindOpenAI
	}
	return p
}

// LimitsEnforced reports whether the route enforces tenants' limits
// (false: shadow mode for every tenant on it).
func (p RoutePolicy) LimitsEnforced() bool { return p.EnforceLimits == nil || *p.EnforceLimits }

// shadowAllowed returns nil when tenant t may be served unenforced on a
// route with policy p: the route enforces limits, or t's own limits for
// model are not enforced anyway, or the route allows enforced tenants
// explicitly. Otherwise it returns the 403 to answer.
func (p *RoutePolicy) shadowAllowed(t *Tenant, model string) error {
	if p.LimitsEnforced() || p.AllowEnforcedTenants {
		return nil
	}
	if own, _ := t.Limits.Effective(model); !own.Enforced() {
		return nil
	}
	return &APIError{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "shadow_route_not_allowed",
		Message: "this route does not enforce limits and is not open to tenants whose limits are enforced; use the enforcing route for this API"}
}

// checkAuthority refuses with 421 a request that arrived over TLS (h1,
// h2, h3) with a Host (or :authority) that names a host route its
// connection's SNI does not allow, before any route or tenant is looked
// at. A Host that a host route matches (exact or wildcard, any path) must
// equal the SNI name (case-insensitive, port and a trailing dot ignored);
// a connection without SNI (the client dialled an IP address) reaches no
// host route. A Host that no host route matches only reaches the routes
// without host, which any connection may use, so it is not checked (a
// client may dial 127.0.0.1 with another server name for verification).
// A client that reuses a connection for another name (HTTP/2 coalescing)
// gets 421 and retries on a new connection (RFC 9110 section 15.5.20).
//
// Cleartext requests (h1, h2c) are not checked: there the Host header is
// all there is, so host routes that matter belong on the TLS listener.
func (st *State) checkAuthority(r *http.Request) error {
	if r.TLS == nil || st.Routes == nil {
		return nil
	}
	host := normalHost(r.Host)
	if !st.Routes.HostRouted(host) {
		return nil
	}
	switch sni := r.TLS.ServerName; {
	case sni == "":
		return misdirected(host, "a connection without TLS server name (SNI)")
	case !strings.EqualFold(host, strings.TrimSuffix(sni, ".")):
		return misdirected(host, "a connection to "+strconv.Quote(sni)+" (TLS server name)")
	}
	return nil
}

// CheckAuthority is checkAuthority for the WebSocket bridge's upgrade: a
// socket whose Host is a host route's and not its SNI would only carry
// refused frames, so the upgrade itself is refused (421).
func (st *State) CheckAuthority(r *http.Request) error { return st.checkAuthority(r) }

func misdirected(host, conn string) *APIError {
	return &APIError{Status: http.StatusMisdirectedRequest, Type: "invalid_request_error", Code: "misdirected_request",
		Message: "the host " + strconv.Quote(host) + " is not served on " + conn + "; open a connection to that host name"}
}

// normalHost is host without port, brackets or trailing dot. It does not
// allocate (net.SplitHostPort does, for a host without port).
func normalHost(host string) string {
	if strings.HasPrefix(host, "[") {
		if i := strings.IndexByte(host, ']'); i > 0 {
			host = host[1:i]
		}
	} else if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.IndexByte(host, ':') == i {
		host = host[:i]
	}
	return strings.TrimSuffix(host, ".")
}

// Validate reports the problems of a route policy (with defaults applied),
// each naming the offending key relative to the route ("hedge_after"). c is
// the proxy's config with defaults applied: the route's hedge must come
// before its first-token timeout, which may be c's.
func (p RoutePolicy) Validate(c Config) []routing.FieldError {
	var errs []routing.FieldError
	bad := func(key, format string, args ...any) {
		errs = append(errs, routing.FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	switch p.Kind {
	case KindOpenAI, KindSSE, KindWebSocket:
	default:
		bad("kind", "kind %q must be openai, sse or websocket", p.Kind)
	}
	if p.AllowEnforcedTenants && p.LimitsEnforced() {
		bad("allow_enforced_tenants", "allow_enforced_tenants applies only to a shadow route (enforce_limits: false)")
	}
	if p.Retries != nil && *p.Retries < 0 {
		bad("retries", "retries must not be negative")
	}
	ftt := c.FirstTokenTimeout
	if p.FirstTokenTimeout > 0 {
		ftt = p.FirstTokenTimeout
	}
	if p.HedgeAfter > 0 && p.HedgeAfter >= ftt {
		bad("hedge_after", "hedge_after %v must be shorter than the first-token timeout %v", p.HedgeAfter, ftt)
	}
	return errs
}

// policy returns the policy of rt: its entry in st.Policies, or the
// default policy when it has none (rt nil included). It does not allocate.
func (st *State) policy(rt *routing.Route) *RoutePolicy {
	if p := st.Policies[rt]; p != nil {
		return p
	}
	return &defaultPolicy
}
