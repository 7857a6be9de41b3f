package configs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePair writes a self-signed certificate for names and its key into
// dir and returns the paths.
func writePair(t *testing.T, dir, base string, names ...string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: base},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: names, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	certFile, keyFile = filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	write(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	write(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	return certFile, keyFile
}

func write(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// wantErrors parses y and checks that the errors are exactly want (each a
// "line:col: substring" of one error).
func wantErrors(t *testing.T, y string, want ...string) {
	t.Helper()
	_, err := Parse("t.yaml", []byte(y))
	if err == nil {
		if len(want) > 0 {
			t.Fatalf("no error; want %q", want)
		}
		return
	}
	var lines []string
	for _, e := range Errors(err) {
		lines = append(lines, e.Error())
	}
	got := strings.Join(lines, "\n")
	for _, w := range want {
		if !strings.Contains(got, "t.yaml:"+w) {
			t.Errorf("errors:\n%s\nwant one containing %q", got, "t.yaml:"+w)
		}
	}
	if len(lines) != len(want) {
		t.Errorf("got %d errors; want %d:\n%s", len(lines), len(want), got)
	}
}

func TestHTTP3Config(t *testing.T) {
	c, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	h := c.Listeners.HTTPS.HTTP3
	if !h.On() || h.Addr != "" || h.MaxIncomingStreams != 100 || h.IdleTimeout != 2*time.Minute ||
		h.KeepAlive != 15*time.Second || h.Allow0RTT {
		t.Fatalf("embedded default http3 %+v; want on, same port, 100 streams, 2m idle, 15s keep-alive, no 0-RTT", h)
	}
	y := `listeners:
  https:
    addr: 127.0.0.1:8443
    dev_cert: true
    http3:
      enabled: false
      addr: 127.0.0.1:9443
      max_incoming_streams: 50
      idle_timeout: 30s
      keep_alive: 5s
      allow_0rtt: true
` + strings.TrimPrefix(valid, "listeners:\n  http: 127.0.0.1:8080\n")
	c, err = Parse("h3.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	h = c.Listeners.HTTPS.HTTP3
	if h.On() || h.Addr != "127.0.0.1:9443" || h.MaxIncomingStreams != 50 || h.IdleTimeout != 30*time.Second ||
		h.KeepAlive != 5*time.Second || !h.Allow0RTT {
		t.Fatalf("decoded http3 %+v", h)
	}
}

func TestHTTP3ConfigErrors(t *testing.T) {
	head := "listeners:\n  https:\n    addr: 127.0.0.1:8443\n    dev_cert: true\n    http3:\n"
	rest := strings.TrimPrefix(valid, "listeners:\n  http: 127.0.0.1:8080\n")
	wantErrors(t, head+"      addr: nowhere\n"+rest, `6:13: listeners.https.http3.addr: bad listen address "nowhere"`)
	wantErrors(t, head+"      max_incoming_streams: -1\n"+rest, `6:29: listeners.https.http3.max_incoming_streams: -1 is out of range`)
	wantErrors(t, head+"      idle_timeout: 100ms\n"+rest, `6:21: listeners.https.http3.idle_timeout: 100ms is too short`)
	wantErrors(t, head+"      alow_0rtt: true\n"+rest, `6:7: unknown key "alow_0rtt" in listeners.https.http3 (did you mean "allow_0rtt"?)`)
}

func TestUpstreamTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	certA, keyA := writePair(t, dir, "a", "a.test")
	_, keyB := writePair(t, dir, "b", "b.test")
	junk := filepath.Join(dir, "junk.pem")
	write(t, junk, []byte("not PEM"))
	pool := func(url, extra string) string {
		return "listeners:\n  http: 127.0.0.1:8080\npools:\n  - name: p\n    backends:\n      - url: " + url + "\n" + extra +
			"routes:\n  - pool: p\n"
	}
	// A good pool: CA, client certificate, HTTP/2 on.
	wantErrors(t, pool("https://10.0.0.1", "    http2: on\n    tls:\n      ca_file: "+certA+"\n      cert_file: "+certA+"\n      key_file: "+keyA+"\n"))
	wantErrors(t, pool("https://10.0.0.1", "    tls:\n      ca_file: "+filepath.Join(dir, "missing.pem")+"\n"),
		`8:16: pool "p": ca file: open `)
	wantErrors(t, pool("https://10.0.0.1", "    tls:\n      ca_file: "+junk+"\n"), `8:16: pool "p": ca file "`+junk+`": no PEM certificates`)
	wantErrors(t, pool("https://10.0.0.1", "    tls:\n      cert_file: "+certA+"\n      key_file: "+keyB+"\n"),
		`8:18: pool "p": client certificate: `)
	wantErrors(t, pool("https://10.0.0.1", "    tls:\n      cert_file: "+certA+"\n"), `8:18: pool "p": tls.cert_file needs tls.key_file`)
	wantErrors(t, pool("http://10.0.0.1", "    tls:\n      server_name: x\n"), `8:7: pool "p": tls is set but no backend url is https://`)
	wantErrors(t, pool("https://10.0.0.1", "    http2: maybe\n"), `7:12: pool "p": http2 "maybe" must be auto, on or off`)
	wantErrors(t, pool("http://10.0.0.1", "    http2: off\n    h2c: true\n"), `8:10: pool "p": h2c needs http2 auto or on`)
	wantErrors(t, pool("http://10.0.0.1", "    http1_client: net_http\n"))
	wantErrors(t, pool("http://10.0.0.1", "    http1_client: curl\n"), `7:19: pool "p": http1_client "curl" must be own or net_http`)
}

// A route host that no certificate of the HTTPS listener covers is an
// error at the route; the development certificate turns the check off.
func TestRouteHostCoverage(t *testing.T) {
	dir := t.TempDir()
	cert, key := writePair(t, dir, "api", "api.example.com", "*.eu.example.com")
	cfg := func(certs, host string) string {
		return "listeners:\n  https:\n    addr: 127.0.0.1:8443\n" + certs +
			"pools:\n  - name: p\n    backends:\n      - url: http://10.0.0.1\nroutes:\n  - pool: p\n    host: " + host + "\n"
	}
	files := "    certificates:\n      - cert_file: " + cert + "\n        key_file: " + key + "\n"
	wantErrors(t, cfg(files, "api.example.com"))
	wantErrors(t, cfg(files, "x.eu.example.com"))
	wantErrors(t, cfg(files, "other.example.com"), `13:11: routes[0]: no certificate of listeners.https covers host "other.example.com"`)
	wantErrors(t, cfg("    dev_cert: true\n", "other.example.com"))
}
