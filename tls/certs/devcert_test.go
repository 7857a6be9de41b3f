package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"testing"
	"time"
)

func TestDevCertPinMatchesHandshake(t *testing.T) {
	s, err := New(Config{DevCert: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pins := s.Pins()
	if len(pins) != 1 {
		t.Fatalf("Pins() = %v; want one pin", pins)
	}
	addr := serveTLS(t, s.TLSConfig())
	// Verify like curl --pinnedpubkey: accept the peer only by its pin.
	var peerPin string
	pinOnly := func(c *tls.Config) {
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			peerPin = SPKIPin(cs.PeerCertificates[0])
			return nil
		}
	}
	c, err := dial(addr, "localhost", nil, pinOnly)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if peerPin != pins[0] {
		t.Errorf("peer SPKI pin %q; Pins() printed %q", peerPin, pins[0])
	}
}

func TestDevCertPEMIsTrustAnchor(t *testing.T) {
	s, err := New(Config{DevCert: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.DevCertPEM()) {
		t.Fatalf("DevCertPEM() is not a PEM certificate: %q", s.DevCertPEM())
	}
	addr := serveTLS(t, s.TLSConfig())
	for _, name := range []string{"localhost", ""} { // "" verifies 127.0.0.1, sends no SNI
		c, err := dial(addr, name, roots, nil)
		if err != nil {
			t.Errorf("verified handshake for %q with DevCertPEM as root: %v", name, err)
			continue
		}
		c.Close()
	}
	if _, err := dial(addr, "example.com", roots, nil); err == nil {
		t.Error("dev certificate verified for example.com")
	}
}

func TestDevCertContents(t *testing.T) {
	s, err := New(Config{DevCert: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(s.DevCertPEM())
	if block == nil {
		t.Fatal("no PEM block")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("key %T; want ECDSA P-256", leaf.PublicKey)
	}
	for _, name := range []string{"localhost", "127.0.0.1", "::1"} {
		if err := leaf.VerifyHostname(name); err != nil {
			t.Errorf("dev certificate does not cover %s: %v", name, err)
		}
	}
	if d := leaf.NotAfter.Sub(time.Now()); d < 29*24*time.Hour || d > 31*24*time.Hour {
		t.Errorf("dev certificate valid for %v more; want about 30 days", d)
	}
	if !leaf.NotBefore.Before(time.Now()) {
		t.Errorf("NotBefore %v is not in the past", leaf.NotBefore)
	}
	if SPKIPin(leaf) != s.Pins()[0] {
		t.Error("SPKIPin(DevCertPEM leaf) differs from Pins()[0]")
	}
}

func TestDevCertAfterFiles(t *testing.T) {
	ca := newTestCA(t)
	c, k := ca.issue(t, leafSpec{cn: "file", dns: []string{"file.test"}})
	s, err := New(Config{Certificates: []Pair{writePair(t, t.TempDir(), "f", c, k)}, DevCert: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.Pins()); n != 2 {
		t.Fatalf("Pins(): %d; want 2", n)
	}
	addr := serveTLS(t, s.TLSConfig())
	if cn := peerCN(t, addr, "unknown.test"); cn != "file" {
		t.Errorf("default certificate %q; want the file pair", cn)
	}
	if cn := peerCN(t, addr, "localhost"); cn != "localhost" {
		t.Errorf("localhost got %q; want the dev certificate", cn)
	}
}

func TestNoDevCertPEM(t *testing.T) {
	ca := newTestCA(t)
	c, k := ca.issue(t, leafSpec{cn: "file", dns: []string{"file.test"}, ips: []net.IP{net.IPv4(127, 0, 0, 1)}})
	s, err := New(Config{Certificates: []Pair{writePair(t, t.TempDir(), "f", c, k)}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := s.DevCertPEM(); p != nil {
		t.Errorf("DevCertPEM() without dev_cert = %q; want nil", p)
	}
}
