package listen_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// The load balancer's address in these tests; 127.0.0.1 plays a source
// outside allowed_cidrs. Both are loopback (Linux routes 127/8 to lo).
const lbIP = "127.0.0.2"

var (
	clientA = netip.MustParseAddrPort("203.0.113.7:51234")
	clientB = netip.MustParseAddrPort("[2001:db8::42]:40000")
	lbDst   = netip.MustParseAddrPort("198.51.100.1:443")
	lbDst6  = netip.MustParseAddrPort("[2001:db8::1]:443")
)

// echoAddr answers with the request's RemoteAddr and protocol, and the
// connection's RTT estimate in X-RTT.
var echoAddr = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if ci, ok := listen.ConnInfoFrom(r.Context()); ok {
		w.Header().Set("X-RTT", ci.RTT().String())
	}
	io.WriteString(w, r.RemoteAddr+" "+r.Proto)
})

// startProxied serves echoAddr on cleartext and TLS listeners that take the
// PROXY protocol from lbIP.
func startProxied(t *testing.T, edit func(*listen.Server)) *listen.Server {
	return startTLS(t, func(s *listen.Server) {
		s.Handler = echoAddr
		off := false
		s.HTTP3.Enabled = &off
		pp := listen.ProxyProtocol{Enabled: true, AllowedCIDRs: []string{lbIP + "/32"}}
		s.HTTPProxyProtocol, s.HTTPSProxyProtocol = pp, pp
		if edit != nil {
			edit(s)
		}
	})
}

// dialFrom opens a TCP connection to addr from the loopback address ip.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends one HTTP/1.1 request on c (after whatever was written) and
// returns the body, or "" and the error.
func get(c net.Conn) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestProxyProtocolH1BothVersions: a v1 and a v2 header (IPv4 and IPv6
// clients) written before the HTTP/1.1 bytes; the handler sees the
// clients' addresses. Fails without the PROXY listener: the header is a
// malformed request (400) and RemoteAddr is the balancer.
func TestProxyProtocolH1BothVersions(t *testing.T) {
	s := startProxied(t, nil)
	addr := s.Addr(listen.ListenerHTTP)
	for _, c := range []struct {
		name string
		hdr  []byte
		want string
	}{
		{"v1 TCP4", listen.ProxyV1Header(clientA, lbDst), clientA.String()},
		{"v1 TCP6", listen.ProxyV1Header(clientB, lbDst6), clientB.String()},
		{"v2 AF_INET", listen.ProxyV2Header(clientA, lbDst, []byte("tlv")), clientA.String()},
		{"v2 AF_INET6", listen.ProxyV2Header(clientB, lbDst6), clientB.String()},
		{"v2 LOCAL keeps the balancer", listen.ProxyV2Header(netip.AddrPort{}, netip.AddrPort{}), lbIP + ":"},
		{"v1 UNKNOWN keeps the balancer", listen.ProxyV1Header(netip.AddrPort{}, netip.AddrPort{}), lbIP + ":"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := dialFrom(t, lbIP, addr)
			conn.Write(c.hdr)
			body, err := get(conn)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(body, c.want) || !strings.HasSuffix(body, "HTTP/1.1") {
				t.Fatalf("handler saw %q; want %s over HTTP/1.1", body, c.want)
			}
		})
	}
}

// TestProxyProtocolTLSH2BothVersions: the header comes before the TLS
// ClientHello; HTTP/2 over TLS then sees the client's address.
func TestProxyProtocolTLSH2BothVersions(t *testing.T) {
	s := startProxied(t, nil)
	addr := s.Addr(listen.ListenerHTTPS)
	for _, c := range []struct {
		name string
		hdr  []byte
		want string
	}{
		{"v1", listen.ProxyV1Header(clientA, lbDst), clientA.String()},
		{"v2", listen.ProxyV2Header(clientB, lbDst6), clientB.String()},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := &http.Transport{
				TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
				ForceAttemptHTTP2: true,
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					conn := dialFrom(t, lbIP, addr)
					_, err := conn.Write(c.hdr)
					return conn, err
				},
			}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.ProtoMajor != 2 || string(b) != c.want+" HTTP/2.0" {
				t.Fatalf("handler saw %q over %s; want %s over HTTP/2.0", b, resp.Proto, c.want)
			}
			// The RTT is still read (TCP_INFO) from the balancer's socket
			// under the PROXY connection.
			if rtt, err := time.ParseDuration(resp.Header.Get("X-RTT")); err != nil || rtt <= 0 {
				t.Fatalf("RTT %q; want a positive TCP_INFO estimate", resp.Header.Get("X-RTT"))
			}
		})
	}
}

// TestAttackProxyHeaderFromUntrustedSource: a client outside
// allowed_cidrs connects directly and sends a header claiming another
// address; the connection is closed without a response, on both
// listeners, and so is one from there that sends no header at all.
func TestAttackProxyHeaderFromUntrustedSource(t *testing.T) {
	s := startProxied(t, nil)
	for _, kind := range []string{listen.ListenerHTTP, listen.ListenerHTTPS} {
		for _, hdr := range [][]byte{listen.ProxyV1Header(clientA, lbDst), listen.ProxyV2Header(clientA, lbDst), nil} {
			conn := dialFrom(t, "127.0.0.1", s.Addr(kind))
			conn.Write(hdr)
			if body, err := get(conn); err == nil {
				t.Fatalf("%s: untrusted source served (header %q): %q", kind, hdr, body)
			}
		}
	}
}

// TestProxyProtocolRefusesMissingOrMalformedHeader: from the balancer's
// address, a request without a header, a malformed header, and a
// connection that sends nothing are all closed (the last within the
// first-request timeout).
func TestProxyProtocolRefusesMissingOrMalformedHeader(t *testing.T) {
	s := startProxied(t, func(s *listen.Server) { s.FirstRequestTimeout = 300 * time.Millisecond })
	addr := s.Addr(listen.ListenerHTTP)
	for _, hdr := range []string{"", "PROXY TCP4 203.0.113.7 nonsense 1 2\r\n", "PROXY TCP4 " + strings.Repeat("9", 120)} {
		conn := dialFrom(t, lbIP, addr)
		conn.Write([]byte(hdr))
		if body, err := get(conn); err == nil {
			t.Fatalf("header %q: served %q", hdr, body)
		}
	}
	start := time.Now() // before the accept the timeout counts from
	conn := dialFrom(t, lbIP, addr)
	if !closedWithin(conn, 3*time.Second) {
		t.Fatal("a silent connection from the balancer was kept past 3s")
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("closed after %v, before the header timeout", d)
	}
}

// TestProxyProtocolCapCountsRealClients: the per-address cap (2 here)
// counts the clients the headers name: client A's third connection is
// refused while client B, through the same balancer address, is served.
// Without the PROXY listener before the cap, the balancer's address
// would be one client and B refused.
func TestProxyProtocolCapCountsRealClients(t *testing.T) {
	s := startProxied(t, func(s *listen.Server) { s.MaxConnsPerAddr = 2 })
	addr := s.Addr(listen.ListenerHTTP)
	for i := range 2 {
		conn := dialFrom(t, lbIP, addr)
		conn.Write(listen.ProxyV2Header(clientA, lbDst))
		if _, err := get(conn); err != nil { // kept open (keep-alive), counted
			t.Fatalf("client A's connection %d: %v", i+1, err)
		}
	}
	conn := dialFrom(t, lbIP, addr)
	conn.Write(listen.ProxyV1Header(clientA, lbDst))
	if body, err := get(conn); err == nil {
		t.Fatalf("client A's third connection served past the cap: %q", body)
	}
	for i := range 2 {
		conn := dialFrom(t, lbIP, addr)
		conn.Write(listen.ProxyV1Header(clientB, lbDst6))
		if body, err := get(conn); err != nil || !strings.HasPrefix(body, clientB.String()) {
			t.Fatalf("client B's connection %d (the balancer holds %d): %q, %v", i+1, 3+i, body, err)
		}
	}
}

// TestTrustedProxiesPickRightmostUntrustedHop: behind trusted L7 proxies
// (127.0.0.0/8 and 10.0.0.0/8 here), the client is the rightmost hop of
// the configured header that is not a trusted proxy; hops left of it (the
// client's own claims) and a peer outside the list are ignored.
func TestTrustedProxiesPickRightmostUntrustedHop(t *testing.T) {
	for _, c := range []struct {
		name, header string
		trusted      []string
		values       []string
		want         string
	}{
		{"xff rightmost untrusted", listen.HeaderXForwardedFor, []string{"127.0.0.0/8", "10.0.0.0/8"},
			[]string{"6.6.6.6, 203.0.113.7", "10.1.2.3"}, "203.0.113.7:0"},
		{"xff all trusted: leftmost", listen.HeaderXForwardedFor, []string{"127.0.0.0/8", "10.0.0.0/8"},
			[]string{"10.9.9.9,10.1.2.3"}, "10.9.9.9:0"},
		{"xff garbage stops the walk", listen.HeaderXForwardedFor, []string{"127.0.0.0/8", "10.0.0.0/8"},
			[]string{"6.6.6.6, unknown, 10.1.2.3"}, "10.1.2.3:0"},
		{"xff ipv6 with port", listen.HeaderXForwardedFor, []string{"127.0.0.0/8"},
			[]string{"[2001:db8::42]:4711"}, "[2001:db8::42]:0"},
		{"forwarded for=", listen.HeaderForwarded, []string{"127.0.0.0/8", "10.0.0.0/8"},
			[]string{`for=6.6.6.6, for="[2001:db8::42]:4711";proto=https`, "For=10.1.2.3;by=10.0.0.1"}, "[2001:db8::42]:0"},
		{"forwarded mode ignores xff", listen.HeaderForwarded, []string{"127.0.0.0/8"},
			nil, "127.0.0.1:"},
		{"untrusted peer: headers ignored", listen.HeaderXForwardedFor, []string{"10.0.0.0/8"},
			[]string{"6.6.6.6"}, "127.0.0.1:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startTLS(t, func(s *listen.Server) {
				s.Handler = echoAddr
				s.TrustedProxies, _ = listen.ParsePrefixes(c.trusted)
				s.ClientHeader = c.header
			})
			req, _ := http.NewRequest("GET", "http://"+s.Addr(listen.ListenerHTTP)+"/", nil)
			name := "X-Forwarded-For"
			if c.header == listen.HeaderForwarded {
				name = "Forwarded"
			} else {
				req.Header.Set("Forwarded", "for=6.6.6.6")
			}
			for _, v := range c.values {
				req.Header.Add(name, v)
			}
			if c.values == nil {
				req.Header.Set("X-Forwarded-For", "6.6.6.6")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.HasPrefix(string(b), c.want) {
				t.Fatalf("client %q; want %s", b, c.want)
			}
		})
	}
}

// TestTrustedProxyConnectionsNotCapped: a trusted L7 proxy carries many
// clients, so its connections are not counted against the per-address
// cap (1 here), while any other address still is. Fails when the cap
// counts the proxy as one client.
func TestTrustedProxyConnectionsNotCapped(t *testing.T) {
	s := startTLS(t, func(s *listen.Server) {
		s.Handler, s.MaxConnsPerAddr = echoAddr, 1
		s.TrustedProxies, _ = listen.ParsePrefixes([]string{lbIP})
	})
	addr := s.Addr(listen.ListenerHTTP)
	for i := range 3 {
		if _, err := get(dialFrom(t, lbIP, addr)); err != nil {
			t.Fatalf("trusted proxy's connection %d: %v", i+1, err)
		}
	}
	if _, err := get(dialFrom(t, "127.0.0.1", addr)); err != nil {
		t.Fatal(err)
	}
	if body, err := get(dialFrom(t, "127.0.0.1", addr)); err == nil {
		t.Fatalf("an untrusted address's second connection served past the cap: %q", body)
	}
}

// TestProxyProtocolFirstRequestTimeoutCountsFromAccept: the header and
// the first request share one first-request timeout (1s), counted from
// the TCP accept: a balancer connection whose header comes after 700ms and
// no request is closed about 1s after it was accepted, not 1s after the
// header. Fails when the timer restarts after the header (closed at 1.7s).
func TestProxyProtocolFirstRequestTimeoutCountsFromAccept(t *testing.T) {
	s := startProxied(t, func(s *listen.Server) { s.FirstRequestTimeout = time.Second })
	start := time.Now() // before the accept the timeout counts from
	conn := dialFrom(t, lbIP, s.Addr(listen.ListenerHTTP))
	time.Sleep(700 * time.Millisecond)
	conn.Write(listen.ProxyV1Header(clientA, lbDst))
	conn.Write([]byte("GET / HT")) // a request begun, never finished
	if !closedWithin(conn, 3*time.Second) {
		t.Fatal("connection kept past 3.7s")
	}
	if d := time.Since(start); d > 1500*time.Millisecond || d < 900*time.Millisecond {
		t.Fatalf("closed %v after accept; want about 1s", d)
	}
}
