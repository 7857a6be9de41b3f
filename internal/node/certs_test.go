package node

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

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
	addr := n.Server().Addr(listen.ListenerHTTPS)
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
	admin := "http://" + n.Server().Addr(listen.ListenerAdmin) + "/metrics"
	waitUntil(t, 5*time.Second, "the failed reload to be counted", func() bool {
		return strings.Contains(get(t, admin), `sluice_tls_reload_errors_total{file="`+certFile+`"}`)
	})
	if got, q := tcpCert(t, addr, trust), quicCert(t, addr, trust); got != "v2" || q != "v2" {
		t.Fatalf("after a broken file: TCP %q, QUIC %q; want v2 on both", got, q)
	}
}

// demoKey is the embedded default's demo tenant key.
const demoKey = "sk-sluice-demo"

func startTestNode(t *testing.T, cfg *configs.Config) *Node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n, err := Start(ctx, cfg, Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown(); cancel(); n.Close() })
	return n
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

// waitUntil checks cond every 20ms until it holds or d passes: for effects
// with no event to wait on (a new handshake seeing a reloaded
// certificate). It asserts nothing about the time taken.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
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
