package certs

import (
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// sniFixture is a Store serving four pairs behind a real TLS listener.
type sniFixture struct {
	ca    *testCA
	store *Store
	addr  string
}

func newSNIFixture(t *testing.T) *sniFixture {
	t.Helper()
	ca := newTestCA(t)
	dir := t.TempDir()
	var pairs []Pair
	for _, spec := range []leafSpec{
		{cn: "default", dns: []string{"default.test"}},
		// The wildcard comes before the exact name: exact must still win.
		{cn: "wildcard", dns: []string{"*.example.com"}},
		{cn: "exact", dns: []string{"api.example.com"}},
		{cn: "ip", ips: []net.IP{net.IPv4(127, 0, 0, 1)}},
	} {
		c, k := ca.issue(t, spec)
		pairs = append(pairs, writePair(t, dir, spec.cn, c, k))
	}
	s, err := New(Config{Certificates: pairs}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &sniFixture{ca: ca, store: s, addr: serveTLS(t, s.TLSConfig())}
}

func TestSNISelection(t *testing.T) {
	f := newSNIFixture(t)
	for _, tc := range []struct{ sni, want string }{
		{"api.example.com", "exact"},
		{"API.Example.COM", "exact"},
		{"foo.example.com", "wildcard"},
		{"a.b.example.com", "default"}, // a wildcard covers one label only
		{"example.com", "default"},
		{"unknown.test", "default"},
		{"default.test", "default"},
		{"", "ip"}, // no SNI: the IP SAN of the dialled address
	} {
		name := tc.sni
		if name == "" {
			name = "no SNI"
		}
		t.Run(name, func(t *testing.T) {
			if got := peerCN(t, f.addr, tc.sni); got != tc.want {
				t.Errorf("SNI %q: got certificate %q; want %q", tc.sni, got, tc.want)
			}
		})
	}
}

func TestSNIVerifiesAgainstCA(t *testing.T) {
	f := newSNIFixture(t)
	for _, name := range []string{"api.example.com", "x.example.com", "default.test", ""} {
		c, err := dial(f.addr, name, f.ca.pool, nil)
		if err != nil {
			t.Errorf("verified handshake for %q: %v", name, err)
			continue
		}
		c.Close()
	}
	if _, err := dial(f.addr, "a.b.example.com", f.ca.pool, nil); err == nil {
		t.Error("verified handshake for a.b.example.com succeeded; want a name mismatch")
	}
}

func TestSNIPrefersSupportedKeyType(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	rc, rk := ca.issue(t, leafSpec{cn: "rsa", dns: []string{"dual.test"}, rsa: true})
	ec, ek := ca.issue(t, leafSpec{cn: "ecdsa", dns: []string{"dual.test"}})
	s, err := New(Config{Certificates: []Pair{
		writePair(t, dir, "rsa", rc, rk), writePair(t, dir, "ecdsa", ec, ek),
	}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, s.TLSConfig())
	only := func(suite uint16) func(*tls.Config) {
		return func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12; c.CipherSuites = []uint16{suite} }
	}
	for suite, want := range map[uint16]string{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256: "ecdsa",
		tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256:   "rsa",
	} {
		c, err := dial(addr, "dual.test", ca.pool, only(suite))
		if err != nil {
			t.Fatalf("suite %s: %v", tls.CipherSuiteName(suite), err)
		}
		if got := c.ConnectionState().PeerCertificates[0].Subject.CommonName; got != want {
			t.Errorf("suite %s: got %q; want %q", tls.CipherSuiteName(suite), got, want)
		}
		c.Close()
	}
}

func TestALPN(t *testing.T) {
	f := newSNIFixture(t)
	for _, tc := range []struct {
		offer []string
		want  string
	}{
		{[]string{"h2", "http/1.1"}, "h2"},
		{[]string{"http/1.1", "h2"}, "h2"}, // the server's preference wins
		{[]string{"http/1.1"}, "http/1.1"},
		{[]string{"h2"}, "h2"},
	} {
		c, err := dial(f.addr, "api.example.com", f.ca.pool, func(c *tls.Config) { c.NextProtos = tc.offer })
		if err != nil {
			t.Fatalf("offer %v: %v", tc.offer, err)
		}
		if got := c.ConnectionState().NegotiatedProtocol; got != tc.want {
			t.Errorf("offer %v: got %q; want %q", tc.offer, got, tc.want)
		}
		c.Close()
	}
	h3 := func(c *tls.Config) { c.NextProtos = []string{"h3"} }
	if _, err := dial(f.addr, "api.example.com", f.ca.pool, h3); !remoteErr(err, "no application protocol") {
		t.Errorf("TCP handshake offering only h3: got %v; want no application protocol", err)
	}
}

func TestVersionsAndSuites(t *testing.T) {
	f := newSNIFixture(t)
	tls11 := func(c *tls.Config) { c.MinVersion, c.MaxVersion = tls.VersionTLS10, tls.VersionTLS11 }
	if _, err := dial(f.addr, "api.example.com", f.ca.pool, tls11); !remoteErr(err, "protocol version not supported") {
		t.Errorf("TLS 1.1 client: got %v; want the server to refuse the version", err)
	}
	tls12 := func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }
	c, err := dial(f.addr, "api.example.com", f.ca.pool, tls12)
	if err != nil {
		t.Fatalf("TLS 1.2 client: %v", err)
	}
	c.Close()
	cbc := func(c *tls.Config) {
		c.MaxVersion = tls.VersionTLS12
		c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}
	}
	if _, err := dial(f.addr, "api.example.com", f.ca.pool, cbc); !remoteErr(err, "handshake failure") {
		t.Errorf("TLS 1.2 CBC suite: got %v; want the server to refuse it (AEAD only)", err)
	}
	c, err = dial(f.addr, "api.example.com", f.ca.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := c.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Errorf("default client negotiated %s; want TLS 1.3", tls.VersionName(v))
	}
	c.Close()
}

func TestMinVersion13(t *testing.T) {
	ca := newTestCA(t)
	cp, kp := ca.issue(t, leafSpec{cn: "only", dns: []string{"only.test"}})
	s, err := New(Config{Certificates: []Pair{writePair(t, t.TempDir(), "only", cp, kp)}, MinVersion: "1.3"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, s.TLSConfig())
	tls12 := func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }
	if _, err := dial(addr, "only.test", ca.pool, tls12); !remoteErr(err, "protocol version not supported") {
		t.Errorf("TLS 1.2 client with min_version 1.3: got %v; want refused by the server", err)
	}
	c, err := dial(addr, "only.test", ca.pool, nil)
	if err != nil {
		t.Fatalf("TLS 1.3 client: %v", err)
	}
	c.Close()
}

func TestNewErrors(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	cp, kp := ca.issue(t, leafSpec{cn: "ok", dns: []string{"ok.test"}})
	good := writePair(t, dir, "ok", cp, kp)
	missing := Pair{CertFile: dir + "/nope.crt", KeyFile: good.KeyFile}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
		is   error
	}{
		{"empty", Config{}, "no certificates", ErrNoCertificates},
		{"version", Config{Certificates: []Pair{good}, MinVersion: "1.1"}, `min_version "1.1"`, nil},
		{"no key name", Config{Certificates: []Pair{{CertFile: good.CertFile}}}, "certificates[0]: key_file is empty", nil},
		{"missing file", Config{Certificates: []Pair{good, missing}}, "nope.crt", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want an error containing %q", err, tc.want)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.is)
			}
		})
	}
}

func TestSharedRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := New(Config{DevCert: true}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{DevCert: true}, nil, reg)
	if err != nil {
		t.Fatalf("second Store on the same registry: %v", err)
	}
	if a.met.reloads != b.met.reloads {
		t.Error("second Store did not reuse the registered counter")
	}
}

// remoteErr reports whether err is an alert sent by the server containing
// text (so the refusal came from the server's configuration).
func remoteErr(err error, text string) bool {
	return err != nil && strings.Contains(err.Error(), "remote error") && strings.Contains(err.Error(), text)
}

func TestGetCertificateWithoutConn(t *testing.T) {
	f := newSNIFixture(t)
	for _, tc := range []struct{ sni, want string }{
		{"127.0.0.1", "ip"}, // an IP literal in SNI (non-conforming clients)
		{"10.0.0.1", "default"},
		{"api.example.com.", "exact"},
		{"", "default"}, // no SNI and no connection to take the address from
		{".", "default"},
		{"123", "default"},
	} {
		c, err := f.store.GetCertificate(&tls.ClientHelloInfo{ServerName: tc.sni})
		if err != nil {
			t.Fatalf("GetCertificate(%q): %v", tc.sni, err)
		}
		if got := c.Leaf.Subject.CommonName; got != tc.want {
			t.Errorf("GetCertificate(%q): got %q; want %q", tc.sni, got, tc.want)
		}
	}
}
