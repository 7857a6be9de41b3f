package node

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestNodeProxyProtocolFromConfig: the listener keys reach the node's
// listeners: a v1 header (written from the spec, haproxy.org proxy-protocol
// 2.1) from the allowed balancer address is served on the http listener,
// the same header from another address is refused, and trusted_proxies
// and client_address_header are handed to the server.
func TestNodeProxyProtocolFromConfig(t *testing.T) {
	cfg, err := configs.Default()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listeners.HTTP, cfg.Listeners.HTTPS.Addr, cfg.Listeners.Admin = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Listeners.HTTPProxyProtocol = listen.ProxyProtocol{Enabled: true, AllowedCIDRs: []string{"127.0.0.2"}}
	cfg.Listeners.HTTPS.ProxyProtocol = cfg.Listeners.HTTPProxyProtocol
	cfg.Listeners.TrustedProxies, cfg.Listeners.ClientAddressHeader = []string{"192.0.2.0/24"}, listen.HeaderForwarded
	n := startTestNode(t, cfg)
	s := n.Server()
	if len(s.TrustedProxies) != 1 || s.TrustedProxies[0].String() != "192.0.2.0/24" || s.ClientHeader != listen.HeaderForwarded ||
		!s.HTTPSProxyProtocol.Enabled {
		t.Fatalf("server trusted proxies %v, header %q, https proxy protocol %+v", s.TrustedProxies, s.ClientHeader, s.HTTPSProxyProtocol)
	}
	models := func(from string) (int, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", s.Addr(listen.ListenerHTTP))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Write([]byte("PROXY TCP4 203.0.113.7 198.51.100.1 40000 8080\r\n" +
			"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + demoKey + "\r\n\r\n"))
		if err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := models("127.0.0.2"); err != nil || code != 200 {
		t.Fatalf("from the balancer: %d, %v; want 200", code, err)
	}
	if code, err := models("127.0.0.1"); err == nil {
		t.Fatalf("from outside allowed_cidrs: %d; want the connection refused", code)
	}
	if !strings.HasPrefix(s.Addr(listen.ListenerHTTPS), "127.0.0.1:") {
		t.Fatal("no https listener")
	}
}
