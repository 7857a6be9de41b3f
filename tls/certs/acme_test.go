package certs

import (
	"crypto/tls"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// acmeStore is a Store with a file pair for files.test and ACME for
// acme.test (never started: no CA is contacted).
func acmeStore(t *testing.T, challenges ...string) *Store {
	t.Helper()
	dir := t.TempDir()
	ca := newTestCA(t)
	certPEM, keyPEM := ca.issue(t, leafSpec{cn: "files", dns: []string{"files.test"}})
	s, err := New(Config{
		Certificates: []Pair{writePair(t, dir, "files", certPEM, keyPEM)},
		ACME:         &ACMEConfig{Domains: []string{"acme.test"}, Storage: t.TempDir(), Challenges: challenges, CA: "https://127.0.0.1:1/dir"},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// The TLS listener offers acme-tls/1 (after h2 and http/1.1) only when
// TLS-ALPN-01 may be used; QUIC never offers it.
func TestACMEALPNOfferedOnlyForTLSALPN01(t *testing.T) {
	if got := acmeStore(t).TLSConfig().NextProtos; !slices.Equal(got, []string{"h2", "http/1.1", ALPNACME}) {
		t.Fatalf("ALPN with both challenges %q; want h2, http/1.1, acme-tls/1", got)
	}
	if got := acmeStore(t, ChallengeHTTP).TLSConfig().NextProtos; slices.Contains(got, ALPNACME) {
		t.Fatalf("ALPN with http-01 only %q; want no acme-tls/1", got)
	}
	if got := acmeStore(t).QUICConfig().NextProtos; slices.Contains(got, ALPNACME) {
		t.Fatalf("QUIC ALPN %q; want no acme-tls/1", got)
	}
}

// Names of https.acme go to the ACME side, other names and handshakes
// without SNI to the file certificates, as before.
func TestACMEGetCertificateRouting(t *testing.T) {
	s := acmeStore(t)
	addr := serveTLS(t, s.TLSConfig())
	if cn := peerCN(t, addr, "files.test"); cn != "files" {
		t.Fatalf("SNI files.test: %q; want the file certificate", cn)
	}
	if cn := peerCN(t, addr, ""); cn != "files" {
		t.Fatalf("no SNI: %q; want the file certificate", cn)
	}
	served := make(chan error, 1)
	getCert := s.GetCertificate
	cfg := s.TLSConfig()
	cfg.GetCertificate = func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, err := getCert(h)
		served <- err
		return c, err
	}
	addr = serveTLS(t, cfg)
	if c, err := dial(addr, "ACME.test", nil, nil); err == nil {
		c.Close()
		t.Fatal("SNI ACME.test before any certificate was obtained: handshake succeeded")
	}
	if err := <-served; err == nil || !strings.Contains(err.Error(), "acme.test") {
		t.Fatalf("SNI ACME.test: GetCertificate said %v; want certmagic's no certificate for acme.test", err)
	}
}

// ACME alone is a certificate source; without any source New fails.
func TestACMEIsACertificateSource(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := New(Config{}, log, nil); err == nil {
		t.Fatal("New without any source: no error")
	}
	s, err := New(Config{ACME: &ACMEConfig{Domains: []string{"acme.test"}, Storage: t.TempDir()}}, log, nil)
	if err != nil {
		t.Fatalf("New with ACME only: %v", err)
	}
	s.Close()
	if _, err := New(Config{ACME: &ACMEConfig{Domains: []string{"*.acme.test"}}}, log, nil); err == nil ||
		!strings.Contains(err.Error(), "wildcard") || !strings.Contains(err.Error(), "storage") {
		t.Fatalf("New with a wildcard and no storage: %v; want both reported", err)
	}
}
