package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/tls/certs"
)

// The embedded default serves HTTP/3 beside TCP; the banner says so and
// prints the dev certificate's pin, which the certificate presented on
// TCP and on QUIC matches.
func TestDefaultNodeHTTP3(t *testing.T) {
	n := startDefaultNode(t)
	var banner bytes.Buffer
	printBanner(&banner, n, true)
	h3addr := n.server.Addr(listen.ListenerHTTP3)
	if h3addr == "" || h3addr != n.server.Addr(listen.ListenerHTTPS) {
		t.Fatalf("http3 on %q, https on %q; want the same port number", h3addr, n.server.Addr(listen.ListenerHTTPS))
	}
	if !strings.Contains(banner.String(), "http3  https://"+h3addr) || !strings.Contains(banner.String(), "HTTP/3") {
		t.Fatalf("banner does not mention HTTP/3 on %s:\n%s", h3addr, banner.String())
	}
	m := regexp.MustCompile(`SPKI pin sha256//(\S+)`).FindStringSubmatch(banner.String())
	if m == nil {
		t.Fatalf("banner has no pin:\n%s", banner.String())
	}
	pin := m[1]
	// A client that trusts nothing but the printed pin.
	pinned := &tls.Config{InsecureSkipVerify: true, VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
		c, err := x509.ParseCertificate(raw[0])
		if err != nil || certs.SPKIPin(c) != pin {
			return errBadPin
		}
		return nil
	}}
	h3 := &http3.Transport{TLSClientConfig: pinned}
	defer h3.Close()
	var p http.Protocols
	p.SetHTTP2(true)
	h2 := &http.Transport{TLSClientConfig: pinned.Clone(), Protocols: &p}
	defer h2.CloseIdleConnections()
	for name, rt := range map[string]http.RoundTripper{"h3": h3, "h2": h2} {
		resp := demoRequest(t, rt, "https://"+h3addr)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Fatalf("%s: got %d %q", name, resp.StatusCode, body)
		}
		wantAltSvc := map[string]string{"h3": "", "h2": `h3=":` + port(h3addr) + `"; ma=86400`}[name]
		if got := resp.Header.Get("Alt-Svc"); got != wantAltSvc {
			t.Fatalf("%s: Alt-Svc %q; want %q", name, got, wantAltSvc)
		}
	}
}

var errBadPin = errors.New("the certificate does not match the printed pin")

// Certificate rotation through the running node: rewriting the files makes
// new TCP and QUIC handshakes see the new certificate while an HTTP/2
// stream opened before keeps running to its end; a broken file afterwards
// leaves the new certificate serving.
func TestNodeCertRotation(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	certFile, keyFile := filepath.Join(dir, "edge.crt"), filepath.Join(dir, "edge.key")
	ca.writeLeaf(t, certFile, keyFile, "v1")
	cfgFile := filepath.Join(dir, "sluice.yaml")
	writeFile(t, cfgFile, []byte(`listeners:
  https:
    addr: 127.0.0.1:0
    poll_interval: 100ms
    certificates:
      - cert_file: `+certFile+`
        key_file: `+keyFile+`
  admin: 127.0.0.1:0
tenants:
  - id: demo
    keys: [sha256:1c590839af894cf25f9a5fe06929af05b377f60efbe55508ef93d251887b9213]
simulators:
  - name: gpu
    model: sim-small
    step_base: 15ms
    prefill_base: 1ms
pools:
  - name: sim
    backends: [{url: "sim://gpu"}]
routes:
  - pool: sim
`))
	cfg, err := configs.Load(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	n := startTestNode(t, cfg)
	addr := n.server.Addr(listen.ListenerHTTPS)
	trust := &tls.Config{RootCAs: ca.pool, ServerName: "localhost"}
	if got := tcpCert(t, addr, trust); got != "v1" {
		t.Fatalf("before rotation: TCP certificate %q; want v1", got)
	}

	// A long stream over HTTP/2, opened before the rotation.
	var p http.Protocols
	p.SetHTTP2(true)
	h2 := &http.Transport{TLSClientConfig: trust.Clone(), Protocols: &p}
	defer h2.CloseIdleConnections()
	resp := demoRequestTokens(t, h2, "https://"+addr, 100)
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.TLS.PeerCertificates[0].Subject.CommonName != "v1" {
		t.Fatalf("stream: %s with certificate %q; want HTTP/2 with v1", resp.Proto, resp.TLS.PeerCertificates[0].Subject.CommonName)
	}
	br := bufio.NewReader(resp.Body)
	readLine(t, br, "data: {")

	ca.writeLeaf(t, certFile, keyFile, "v2")
	waitUntil(t, 5*time.Second, "a new TCP handshake to see v2", func() bool { return tcpCert(t, addr, trust) == "v2" })
	waitUntil(t, 5*time.Second, "a new QUIC handshake to see v2", func() bool { return quicCert(t, addr, trust) == "v2" })

	// The stream opened before the rotation runs on to its end.
	events := 0
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: {") {
			events++
		}
		if line == "data: [DONE]\n" {
			break
		}
		if err != nil {
			t.Fatalf("the HTTP/2 stream broke after the rotation (%d more events): %v", events, err)
		}
	}
	if events < 10 {
		t.Fatalf("only %d events after the rotation; want the stream to have kept running", events)
	}

	// A broken file: the reload fails (counted), v2 keeps serving.
	writeFile(t, certFile, []byte("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n"))
	admin := "http://" + n.server.Addr(listen.ListenerAdmin) + "/metrics"
	waitUntil(t, 5*time.Second, "the failed reload to be counted", func() bool {
		return strings.Contains(get(t, admin), `sluice_tls_reload_errors_total{file="`+certFile+`"}`)
	})
	if got, q := tcpCert(t, addr, trust), quicCert(t, addr, trust); got != "v2" || q != "v2" {
		t.Fatalf("after a broken file: TCP %q, QUIC %q; want v2 on both", got, q)
	}
}

// A UDP port already in use stops "sluice serve" with an error naming it.
func TestServeUDPPortInUse(t *testing.T) {
	busy := takeUDPOnly(t)
	defer busy.Close()
	addr := busy.LocalAddr().String()
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "sluice.yaml")
	writeFile(t, cfgFile, []byte("listeners:\n  https:\n    addr: "+addr+"\n    dev_cert: true\n"+
		"pools:\n  - name: p\n    backends: [{url: \"http://127.0.0.1:1\"}]\nroutes:\n  - pool: p\n"))
	code, _, errs := runCmd(t, "", "serve", "-c", cfgFile, "-log-level", "error")
	if code != 1 || !strings.Contains(errs, "udp "+addr+" (http3)") || !strings.Contains(errs, "address already in use") {
		t.Fatalf("code %d, stderr %q; want 1 and an error naming udp %s", code, errs, addr)
	}
}

// takeUDPOnly binds a loopback UDP port whose TCP twin is free (it was
// bound a moment ago to find the number).
func takeUDPOnly(t *testing.T) net.PacketConn {
	t.Helper()
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		pc, err := net.ListenPacket("udp", ln.Addr().String())
		ln.Close()
		if err == nil {
			return pc
		}
	}
	t.Fatal("no port free on both TCP and UDP")
	return nil
}

func TestParseCurlVersion(t *testing.T) {
	for _, tc := range []struct {
		out, version string
		ok           bool
	}{
		{"curl 7.88.1 (x86_64-pc-linux-gnu) libcurl/7.88.1\nFeatures: alt-svc AsynchDNS HTTP2 HTTPS-proxy\n", "curl 7.88.1", false},
		{"curl 8.11.0 (x86_64-pc-linux-gnu) libcurl/8.11.0 quiche/0.22\nFeatures: alt-svc HTTP2 HTTP3 HTTPS-proxy\n", "curl 8.11.0", true},
		{"", "", false},
	} {
		v, ok := parseCurlVersion(tc.out)
		if v != tc.version || ok != tc.ok {
			t.Errorf("parseCurlVersion(%q) = %q, %v; want %q, %v", tc.out, v, ok, tc.version, tc.ok)
		}
	}
}

func startTestNode(t *testing.T, cfg *configs.Config) *node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n, err := startNode(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.shutdown(); cancel(); n.close() })
	return n
}

// startDefaultNode starts the embedded default with every listener on a
// free loopback port.
func startDefaultNode(t *testing.T) *node {
	t.Helper()
	cfg, err := configs.Default()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listeners.HTTP, cfg.Listeners.HTTPS.Addr, cfg.Listeners.Admin = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	return startTestNode(t, cfg)
}

func demoRequest(t *testing.T, rt http.RoundTripper, base string) *http.Response {
	return demoRequestTokens(t, rt, base, 5)
}

func demoRequestTokens(t *testing.T, rt http.RoundTripper, base string, tokens int) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(
		`{"model":"sim-small","stream":true,"max_tokens":`+strconv.Itoa(tokens)+`,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+demoKey)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// tcpCert and quicCert make a new handshake and return the common name of
// the certificate the node presented.
func tcpCert(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, cfg.Clone())
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

func quicCert(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	c := cfg.Clone()
	c.NextProtos = []string{http3.NextProtoH3}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := quic.DialAddr(ctx, addr, c, nil)
	if err != nil {
		return "error: " + err.Error()
	}
	defer conn.CloseWithError(0, "")
	return conn.ConnectionState().TLS.PeerCertificates[0].Subject.CommonName
}

func readLine(t *testing.T, br *bufio.Reader, prefix string) {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, prefix) {
			return
		}
		if err != nil {
			t.Fatalf("no line starting %q: %v", prefix, err)
		}
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	// Write beside and rename, as certificate tools do, so that a reader
	// never sees half a file.
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}

// testCA signs leaf certificates for localhost and 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

var leafSerial int64 = 100

// writeLeaf writes a new leaf named cn and its key (key first, then the
// certificate, each renamed into place).
func (ca *testCA) writeLeaf(t *testing.T, certFile, keyFile, cn string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafSerial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(leafSerial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
