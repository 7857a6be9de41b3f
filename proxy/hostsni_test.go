package proxy_test

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/routing"
)

// sniClients are TLS clients of each protocol that send sni as the TLS
// server name ("" sends none: the client dialled an IP address).
func sniClients(t *testing.T, sni string) map[string]*http.Client {
	cfg := func() *tls.Config { return &tls.Config{InsecureSkipVerify: true, ServerName: sni} }
	var h2 http.Protocols
	h2.SetHTTP2(true)
	var h1 http.Protocols
	h1.SetHTTP1(true)
	return map[string]*http.Client{
		"h1": {Transport: &http.Transport{Protocols: &h1, TLSClientConfig: cfg()}},
		"h2": {Transport: &http.Transport{Protocols: &h2, TLSClientConfig: cfg()}},
		"h3": h3ClientTLS(t, cfg()),
	}
}

// postHost posts a chat request with the given Host (:authority) and
// returns the status, the OpenAI error code (if any) and the protocol.
func postHost(t *testing.T, c *http.Client, url, host string) (status int, code, proto string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody("")))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct {
			Type, Code, Message string
		} `json:"error"`
	}
	if resp.StatusCode != http.StatusOK {
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
			t.Fatalf("status %d without an OpenAI error body: %q", resp.StatusCode, body)
		}
	}
	return resp.StatusCode, e.Error.Code, resp.Proto
}

// A Host that the connection's SNI does not allow never picks a route:
// connected as api.example.com (or by IP, without SNI), a client cannot
// reach the internal.example.com host route by naming it in Host or
// :authority, over HTTP/1.1, HTTP/2 or HTTP/3 (issue 16 item 4).
func TestAttackHostRouteWithoutItsSNI(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	on := true
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: limiter.NewLocal(1),
		limits: limiter.Limits{RequestsPerMinute: 1000},
		routes: []testRoute{
			{RouteConfig: routing.RouteConfig{Name: "internal", Host: "internal.example.com", Path: "/v1/", Pool: "p"}, RoutePolicy: proxy.RoutePolicy{EnforceLimits: &on}},
			{RouteConfig: routing.RouteConfig{Name: "any", Path: "/v1/", Pool: "p"}},
		}})
	for _, tc := range []struct {
		sni, host string
		want      int
	}{
		{"api.example.com", "internal.example.com", http.StatusMisdirectedRequest},
		{"api.example.com", "INTERNAL.example.com:443", http.StatusMisdirectedRequest},
		{"", "internal.example.com", http.StatusMisdirectedRequest}, // no SNI: no host route
		{"internal.example.com", "api.example.com", http.StatusOK},  // no host route: open to any connection
		{"internal.example.com", "127.0.0.1", http.StatusOK},
		{"localhost", "internal.example.com", http.StatusMisdirectedRequest},
		{"internal.example.com", "Internal.Example.com:443", http.StatusOK},
		{"internal.example.com", "internal.example.com.", http.StatusOK},
		{"api.example.com", "api.example.com", http.StatusOK},
		{"", "127.0.0.1", http.StatusOK}, // by IP, routes without host serve
	} {
		for proto, c := range sniClients(t, tc.sni) {
			url := e.https
			if proto == "h3" {
				url = e.h3
			}
			status, code, got := postHost(t, c, url, tc.host)
			if status != tc.want {
				t.Errorf("%s SNI %q Host %q: %d %s; want %d", proto, tc.sni, tc.host, status, code, tc.want)
				continue
			}
			if status == http.StatusMisdirectedRequest && code != "misdirected_request" {
				t.Errorf("%s SNI %q Host %q: code %q; want misdirected_request", proto, tc.sni, tc.host, code)
			}
			if want := map[string]string{"h1": "HTTP/1.1", "h2": "HTTP/2.0", "h3": "HTTP/3.0"}[proto]; got != want {
				t.Errorf("%s: served over %s", proto, got)
			}
		}
	}
	// Cleartext has no SNI to check: Host is all there is (documented).
	if status, _, _ := postHost(t, h1Client(), e.http, "internal.example.com"); status != http.StatusOK {
		t.Errorf("cleartext host route: %d; want 200", status)
	}
}

// A shadow route (enforce_limits: false) is no way around a tenant's
// enforced limits: without allow_enforced_tenants the tenant is refused
// with 403 there, and its limits still refuse it on the enforcing route.
func TestAttackShadowRouteUnlimitedUse(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	off := false
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: limiter.NewLocal(1),
		limits: limiter.Limits{RequestsPerMinute: 1},
		routes: []testRoute{
			{RouteConfig: routing.RouteConfig{Name: "beta", Host: "beta.example.com", Path: "/v1/", Pool: "p"}, RoutePolicy: proxy.RoutePolicy{EnforceLimits: &off}},
			{RouteConfig: routing.RouteConfig{Name: "main", Path: "/v1/", Pool: "p"}},
		}})
	c := sniClients(t, "beta.example.com")
	for _, proto := range []string{"h1", "h2", "h3"} {
		url := e.https
		if proto == "h3" {
			url = e.h3
		}
		for i := 0; i < 3; i++ {
			status, code, _ := postHost(t, c[proto], url, "beta.example.com")
			if status != http.StatusForbidden || code != "shadow_route_not_allowed" {
				t.Fatalf("%s request %d on the shadow route: %d %q; want 403 shadow_route_not_allowed", proto, i, status, code)
			}
		}
	}
	status, _, _ := postHost(t, h1Client(), e.http, "api.example.com")
	if status != http.StatusOK {
		t.Fatalf("first request on the enforcing route: %d", status)
	}
	if status, code, _ := postHost(t, h1Client(), e.http, "api.example.com"); status != http.StatusTooManyRequests {
		t.Fatalf("second request on the enforcing route: %d %s; want 429", status, code)
	}
}

// With allow_enforced_tenants the operator opts in: the shadow route
// serves an enforced tenant past its limits, with would-refuse headers.
// A tenant whose own limits are not enforced needs no opt-in.
func TestShadowRouteOptIn(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	off := false
	for _, tc := range []struct {
		name   string
		allow  bool
		limits limiter.Limits
	}{
		{"opt-in", true, limiter.Limits{RequestsPerMinute: 1}},
		{"unenforced tenant", false, limiter.Limits{RequestsPerMinute: 1, Enforce: &off}},
	} {
		e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: limiter.NewLocal(1), limits: tc.limits,
			routes: []testRoute{{RouteConfig: routing.RouteConfig{Name: "beta", Path: "/v1/", Pool: "p"},
				RoutePolicy: proxy.RoutePolicy{EnforceLimits: &off, AllowEnforcedTenants: tc.allow}}}})
		for i := 0; i < 3; i++ {
			if status, code, _ := postHost(t, h1Client(), e.http, "beta.example.com"); status != http.StatusOK {
				t.Fatalf("%s: request %d: %d %s; want 200", tc.name, i, status, code)
			}
		}
	}
}

// The same rule holds for the WebSocket bridge: a socket opened to
// api.example.com with Host internal.example.com is refused at the upgrade
// with 421 (every frame on it would be: frames carry their socket's Host
// and TLS state, and are checked too); opened to internal.example.com, its
// frames are served.
func TestAttackHostRouteWithoutItsSNIBridge(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), routes: []testRoute{
		{RouteConfig: routing.RouteConfig{Name: "internal", Host: "internal.example.com", Path: "/v1/", Pool: "p"}},
		{RouteConfig: routing.RouteConfig{Name: "any", Path: "/v1/", Pool: "p"}},
	}})
	url := "wss" + strings.TrimPrefix(e.https, "https") + "/v1/ws"
	for _, tc := range []struct {
		sni  string
		want int
	}{
		{"api.example.com", http.StatusMisdirectedRequest},
		{"internal.example.com", 0},
	} {
		d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: tc.sni}}
		hdr := keyHeader()
		hdr.Set("Host", "internal.example.com")
		c, resp, err := d.Dial(url, hdr)
		if tc.want != 0 { // the upgrade itself is refused: every frame would be
			if err == nil {
				c.Close()
				t.Fatalf("SNI %q: upgraded; want %d", tc.sni, tc.want)
			}
			if resp == nil || resp.StatusCode != tc.want {
				t.Fatalf("SNI %q: dial %v, response %v; want status %d", tc.sni, err, resp, tc.want)
			}
			continue
		}
		if err != nil {
			t.Fatalf("SNI %q: dial: %v", tc.sni, err)
		}
		sendJSON(t, c, map[string]any{"type": "request", "id": "r1", "path": "/v1/chat/completions", "body": json.RawMessage(chatBody(""))})
		f := readFrame(t, c, 5*time.Second)
		c.Close()
		if f.Type == "error" {
			t.Errorf("SNI %q: first frame %+v; want the stream", tc.sni, f)
		}
	}
}
