package certs

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/filewatch"
)

// testCA issues leaf certificates for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// leafSpec describes a test leaf. CN identifies it in assertions.
type leafSpec struct {
	cn        string
	dns       []string
	ips       []net.IP
	notBefore time.Time // zero: an hour ago
	notAfter  time.Time // zero: in a day
	rsa       bool
}

var serials struct {
	sync.Mutex
	n int64
}

func nextSerial() *big.Int {
	serials.Lock()
	defer serials.Unlock()
	serials.n++
	return big.NewInt(1000 + serials.n)
}

// issue returns PEM certificate and key for spec, signed by ca.
func (ca *testCA) issue(t testing.TB, spec leafSpec) (certPEM, keyPEM []byte) {
	t.Helper()
	if spec.notBefore.IsZero() {
		spec.notBefore = time.Now().Add(-time.Hour)
	}
	if spec.notAfter.IsZero() {
		spec.notAfter = time.Now().Add(24 * time.Hour)
	}
	pub, keyDER, keyType := newTestKey(t, spec.rsa)
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: spec.cn},
		NotBefore:    spec.notBefore,
		NotAfter:     spec.notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     spec.dns,
		IPAddresses:  spec.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: keyType, Bytes: keyDER})
	return certPEM, keyPEM
}

func newTestKey(t testing.TB, useRSA bool) (pub any, der []byte, pemType string) {
	t.Helper()
	if useRSA {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		return &k.PublicKey, x509.MarshalPKCS1PrivateKey(k), "RSA PRIVATE KEY"
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err = x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return &k.PublicKey, der, "PRIVATE KEY"
}

// writePair writes dir/name.crt and dir/name.key.
func writePair(t testing.TB, dir, name string, certPEM, keyPEM []byte) Pair {
	t.Helper()
	p := Pair{CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key")}
	writeFile(t, p.CertFile, certPEM)
	writeFile(t, p.KeyFile, keyPEM)
	return p
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// renameInto writes data to a temporary file beside path and renames it
// over path, as atomic deploy tools do.
func renameInto(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// serveTLS runs a TLS echo server on 127.0.0.1 until the test ends and
// returns its address.
func serveTLS(t testing.TB, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { echo(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// echo writes back every line it reads; a failed handshake just ends it.
func echo(c net.Conn) {
	defer c.Close()
	_, _ = io.Copy(c, c)
}

// dial completes a TLS handshake with addr. serverName "" sends no SNI.
// Without roots, the peer is not verified (the caller inspects it).
func dial(addr, serverName string, roots *x509.CertPool, mod func(*tls.Config)) (*tls.Conn, error) {
	cfg := &tls.Config{ServerName: serverName, RootCAs: roots, InsecureSkipVerify: roots == nil}
	if roots != nil && serverName == "" {
		cfg.ServerName = "127.0.0.1" // verify the IP SAN; still no SNI sent
	}
	if mod != nil {
		mod(cfg)
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*tls.Conn), nil
}

// peerCN handshakes and returns the common name of the served leaf.
func peerCN(t testing.TB, addr, serverName string) string {
	t.Helper()
	c, err := dial(addr, serverName, nil, nil)
	if err != nil {
		t.Fatalf("handshake with SNI %q: %v", serverName, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// roundTrip checks that c still carries data.
func roundTrip(c net.Conn, msg string) error {
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading: %w", err)
	}
	if line != msg+"\n" {
		return fmt.Errorf("echo: got %q; want %q", line, msg+"\n")
	}
	return nil
}

// eventually checks cond every 20ms until it holds or 10s pass: for
// effects that have no event to wait on (a file watcher's reload seen by a
// new handshake). It asserts nothing about the time taken.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// runStore runs a file watcher for s until the test ends, as the node does
// (see internal/node); it returns once the directories are watched.
// noWatch disables file events: only the poll reloads.
func runStore(t testing.TB, s *Store, noWatch bool) *filewatch.Watcher {
	t.Helper()
	w := filewatch.New(filewatch.Config{
		Dirs:     s.WatchDirs,
		Check:    func(bool) { _ = s.Check() },
		Poll:     s.PollInterval(),
		NoEvents: noWatch,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		w.Close()
	})
	return w
}
