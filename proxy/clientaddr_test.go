package proxy_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/ws"
	"github.com/sluice-proxy/sluice/routing"
)

// PROXY protocol headers as a load balancer writes them, from the spec
// (haproxy.org/download/2.x/doc/proxy-protocol.txt 2.1 and 2.2), not from
// Sluice's parser: v1 "PROXY TCP4 src dst sport dport\r\n"; v2 the 12-byte
// signature, 0x21 (v2, PROXY), 0x11 (AF_INET, STREAM), length, addresses,
// ports.
func ppV1(src, dst netip.AddrPort) []byte {
	return fmt.Appendf(nil, "PROXY TCP4 %s %s %d %d\r\n", src.Addr(), dst.Addr(), src.Port(), dst.Port())
}

func ppV2(src, dst netip.AddrPort) []byte {
	b := []byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c")
	s, d := src.Addr().As4(), dst.Addr().As4()
	b = append(append(b, s[:]...), d[:]...)
	b = binary.BigEndian.AppendUint16(b, src.Port())
	return binary.BigEndian.AppendUint16(b, dst.Port())
}

// proxiedClient is an HTTP client whose connections come from the
// balancer's loopback address and start with hdr.
func proxiedClient(lbIP string, hdr []byte) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(lbIP)}}
			c, err := d.DialContext(ctx, network, addr)
			if err == nil {
				_, err = c.Write(hdr)
			}
			return c, err
		},
	}}
}

// accessClient waits for the access log line of request id and returns
// its client field's line.
func accessLine(t *testing.T, e *testEdge, id string) string {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if l := e.log.lines(`"msg":"request"`, id); len(l) == 1 {
			return l[0]
		}
	}
	t.Fatalf("no access log line for %s", id)
	return ""
}

// TestProxyProtocolRealClientEverywhere: through the PROXY listeners (h1
// with a v1 header, TLS h2 with a v2 header) the access log's client and
// the X-Forwarded-For the backend gets are the client's address, not the
// balancer's (127.0.0.2). Fails without the PROXY listener (the header is
// a bad request, and the address would be the balancer's).
func TestProxyProtocolRealClientEverywhere(t *testing.T) {
	be := &recordingBackend{body: "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"}
	srv := httptest.NewServer(be)
	defer srv.Close()
	e := startEdge(t, edgeOpts{pool: poolOf(srv.URL), server: func(s *listen.Server) {
		pp := listen.ProxyProtocol{Enabled: true, AllowedCIDRs: []string{"127.0.0.2/32"}}
		s.HTTPProxyProtocol, s.HTTPSProxyProtocol = pp, pp
	}})
	dst := netip.MustParseAddrPort("198.51.100.1:443")
	for _, c := range []struct {
		name, url, client string
		hdr               func(src, dst netip.AddrPort) []byte
		major             int
	}{
		{"h1 v1", e.http, "203.0.113.7", ppV1, 1},
		{"h2 v2", e.https, "203.0.113.8", ppV2, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := proxiedClient("127.0.0.2", c.hdr(netip.AddrPortFrom(netip.MustParseAddr(c.client), 50000), dst))
			resp := post(t, cl, c.url+"/v1/chat/completions", chatBody(""), "X-Forwarded-For", "6.6.6.6")
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.ProtoMajor != c.major || !strings.Contains(string(body), "[DONE]") {
				t.Fatalf("status %d over %s: %q", resp.StatusCode, resp.Proto, body)
			}
			if got := be.last().Header.Get("X-Forwarded-For"); got != c.client {
				t.Errorf("backend X-Forwarded-For %q; want %s", got, c.client)
			}
			if l := accessLine(t, e, resp.Header.Get("X-Request-Id")); !strings.Contains(l, `"client":"`+c.client+`"`) {
				t.Errorf("access log %s; want client %s", l, c.client)
			}
		})
	}
}

// TestAttackSpoofedForwardedFor: a client that is not a trusted proxy
// sends X-Forwarded-For and Forwarded naming another address; both are
// ignored (the backend's X-Forwarded-For and the access log name the
// peer). Behind a trusted proxy, the client's own entries left of the
// proxy's hop are not believed either: the rightmost untrusted hop is the
// client.
func TestAttackSpoofedForwardedFor(t *testing.T) {
	be := &recordingBackend{body: "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"}
	srv := httptest.NewServer(be)
	defer srv.Close()
	for _, c := range []struct {
		name, trusted, xff, want string
	}{
		{"untrusted peer", "10.0.0.0/8", "6.6.6.6", "127.0.0.1"},
		{"trusted peer, spoofed hop left of the real one", "127.0.0.0/8", "6.6.6.6, 203.0.113.9, 127.0.0.9", "203.0.113.9"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := startEdge(t, edgeOpts{pool: poolOf(srv.URL), server: func(s *listen.Server) {
				s.TrustedProxies, _ = listen.ParsePrefixes([]string{c.trusted})
			}})
			resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""),
				"X-Forwarded-For", c.xff, "Forwarded", "for=6.6.6.6", "X-Real-Ip", "6.6.6.6")
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := be.last().Header
			if got.Get("X-Forwarded-For") != c.want || got.Get("Forwarded") != "" || got.Get("X-Real-Ip") != "" {
				t.Errorf("backend got X-Forwarded-For %q, Forwarded %q, X-Real-Ip %q; want %s and none",
					got.Get("X-Forwarded-For"), got.Get("Forwarded"), got.Get("X-Real-Ip"), c.want)
			}
			if l := accessLine(t, e, resp.Header.Get("X-Request-Id")); !strings.Contains(l, `"client":"`+c.want+`"`) {
				t.Errorf("access log %s; want client %s", l, c.want)
			}
		})
	}
}

// TestWebSocketsPerAddrCountProxiedClients: through a PROXY listener the
// WebSocket per-address cap (1) counts the clients the headers name: a
// second socket of client A is refused with 429 while client B, through
// the same balancer address, is upgraded. Fails when the cap counts the
// balancer's address.
func TestWebSocketsPerAddrCountProxiedClients(t *testing.T) {
	_, beURL := newWSBackend(t)
	e := startEdge(t, edgeOpts{pool: poolOf(beURL), routes: []testRoute{
		{RouteConfig: routing.RouteConfig{Path: "/v1/realtime", Pool: "p"}, RoutePolicy: proxy.RoutePolicy{Kind: proxy.KindWebSocket}},
	}, server: func(s *listen.Server) {
		s.HTTPProxyProtocol = listen.ProxyProtocol{Enabled: true, AllowedCIDRs: []string{"127.0.0.2/32"}}
	}})
	setWS(e, func(c *ws.Config) { c.MaxSocketsPerAddr = 1 }, nil)
	dst := netip.MustParseAddrPort("198.51.100.1:80")
	via := func(client string, v2 bool) *websocket.Dialer {
		src := netip.AddrPortFrom(netip.MustParseAddr(client), 40000)
		hdr := ppV1(src, dst)
		if v2 {
			hdr = ppV2(src, dst)
		}
		nd := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
		return &websocket.Dialer{HandshakeTimeout: 5 * time.Second,
			NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := nd.DialContext(ctx, network, addr)
				if err == nil {
					_, err = c.Write(hdr)
				}
				return c, err
			}}
	}
	a, _, err := via("203.0.113.7", false).Dial(rtURL(e), keyHeader())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	refusedWith(t, via("203.0.113.7", true), rtURL(e), http.StatusTooManyRequests, "too_many_websockets")
	b, _, err := via("203.0.113.8", true).Dial(rtURL(e), keyHeader())
	if err != nil {
		t.Fatalf("client B, through the same balancer, was refused: %v", err)
	}
	b.Close()
}
