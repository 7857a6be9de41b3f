package configs

import (
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestClientAddressConfig: PROXY protocol per listener and trusted proxies
// decode; the defaults leave both off (the embedded default unchanged).
func TestClientAddressConfig(t *testing.T) {
	c, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if l := c.Listeners; l.HTTPProxyProtocol.Enabled || l.HTTPS.ProxyProtocol.Enabled || len(l.TrustedProxies) != 0 ||
		l.ClientAddressHeader != listen.HeaderXForwardedFor {
		t.Fatalf("embedded default: %+v", l)
	}
	y := `listeners:
  http: 127.0.0.1:8080
  http_proxy_protocol:
    enabled: true
    allowed_cidrs: [10.0.0.0/8, "fd00::/8"]
  trusted_proxies: [192.0.2.10, 198.51.100.0/24]
  client_address_header: forwarded
  https:
    addr: 127.0.0.1:8443
    dev_cert: true
    proxy_protocol: {enabled: true, allowed_cidrs: [10.1.0.0/16]}
` + strings.TrimPrefix(valid, "listeners:\n  http: 127.0.0.1:8080\n")
	c, err = Parse("pp.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	l := c.Listeners
	if !l.HTTPProxyProtocol.Enabled || len(l.HTTPProxyProtocol.AllowedCIDRs) != 2 || !l.HTTPS.ProxyProtocol.Enabled ||
		l.HTTPS.ProxyProtocol.AllowedCIDRs[0] != "10.1.0.0/16" || len(l.TrustedProxies) != 2 || l.ClientAddressHeader != "forwarded" {
		t.Fatalf("decoded %+v", l)
	}
}

func TestClientAddressConfigErrors(t *testing.T) {
	head := "listeners:\n  http: 127.0.0.1:8080\n"
	rest := strings.TrimPrefix(valid, head)
	wantErrors(t, head+"  http_proxy_protocol:\n    enabled: true\n"+rest,
		`4:5: listeners.http_proxy_protocol: enabled needs allowed_cidrs`)
	wantErrors(t, head+"  http_proxy_protocol:\n    enabled: true\n    allowed_cidrs: [10.0.0.0/33]\n"+rest,
		`5:20: listeners.http_proxy_protocol.allowed_cidrs: "10.0.0.0/33" is not a CIDR`)
	wantErrors(t, head+"  trusted_proxies: [lb.example]\n"+rest,
		`3:20: listeners.trusted_proxies: "lb.example" is not a CIDR`)
	wantErrors(t, head+"  client_address_header: x-real-ip\n"+rest,
		`3:26: listeners.client_address_header: "x-real-ip" is not "x-forwarded-for" or "forwarded"`)
	wantErrors(t, head+"  http_server: nginx\n"+rest,
		`3:16: listeners.http_server: "nginx" is not "go" or "sluice"`)
}

func TestHTTPServerSetting(t *testing.T) {
	head := "listeners:\n  http: 127.0.0.1:8080\n"
	rest := strings.TrimPrefix(valid, head)
	for _, name := range []string{"go", "sluice"} {
		c, err := Parse("t.yaml", []byte(head+"  http_server: "+name+"\n"+rest))
		if err != nil {
			t.Fatal(err)
		}
		if c.Listeners.HTTPServer != name {
			t.Fatalf("http_server %q decoded as %q", name, c.Listeners.HTTPServer)
		}
	}
}
