package proxy_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/tls/certs"
)

// startCertEdge serves a plain handler on TLS and QUIC listeners whose
// certificates come from a certs.Store.
func startCertEdge(t *testing.T, cfg certs.Config) (*certs.Store, *listen.Server) {
	t.Helper()
	store, err := certs.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := &listen.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto) }),
		HTTPSAddr: "127.0.0.1:0", TLSConfig: store.TLSConfig(), QUICTLSConfig: store.QUICConfig(),
		H2Server: testH2Server,
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close() })
	return store, srv
}

// peerCert makes one request and returns the certificate the server
// presented (verified with cfg).
func peerCert(t *testing.T, c *http.Client, url string) *x509.Certificate {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
		t.Fatalf("%s: no peer certificate", url)
	}
	return resp.TLS.PeerCertificates[0]
}

// tcpClient speaks HTTP/2 over TLS with cfg.
func tcpClient(cfg *tls.Config) *http.Client {
	var p http.Protocols
	p.SetHTTP2(true)
	p.SetHTTP1(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: cfg}}
}

// SNI picks the certificate on QUIC as on TCP, and each verifies.
func TestSNIOverHTTP3(t *testing.T) {
	ca := newTestCA(t, "sni CA")
	dir := t.TempDir()
	aCert, aKey := ca.issueFiles(t, dir, "a", false, "a.test")
	bCert, bKey := ca.issueFiles(t, dir, "b", false, "b.test", "*.b.test")
	_, srv := startCertEdge(t, certs.Config{Certificates: []certs.Pair{
		{CertFile: aCert, KeyFile: aKey}, {CertFile: bCert, KeyFile: bKey},
	}})
	for _, tc := range []struct{ sni, cn string }{{"a.test", "a"}, {"b.test", "b"}, {"x.b.test", "b"}} {
		cfg := &tls.Config{RootCAs: ca.pool, ServerName: tc.sni}
		if got := peerCert(t, h3ClientTLS(t, cfg), "https://"+srv.Addr(listen.ListenerHTTP3)+"/").Subject.CommonName; got != tc.cn {
			t.Errorf("h3 SNI %s: certificate %q; want %q", tc.sni, got, tc.cn)
		}
		if got := peerCert(t, tcpClient(cfg.Clone()), "https://"+srv.Addr(listen.ListenerHTTPS)+"/").Subject.CommonName; got != tc.cn {
			t.Errorf("tcp SNI %s: certificate %q; want %q", tc.sni, got, tc.cn)
		}
	}
}

// The development certificate matches its SPKI pin and verifies as its
// own trust anchor, on TCP and QUIC.
func TestDevCertPinOverHTTP3(t *testing.T) {
	store, srv := startCertEdge(t, certs.Config{DevCert: true})
	pins := store.Pins()
	if len(pins) != 1 {
		t.Fatalf("pins %v; want one", pins)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(store.DevCertPEM()) {
		t.Fatal("DevCertPEM is not a certificate")
	}
	cfg := &tls.Config{RootCAs: roots, ServerName: "localhost"}
	for name, c := range map[string]*http.Client{"h3": h3ClientTLS(t, cfg), "tcp": tcpClient(cfg.Clone())} {
		resp, err := c.Get("https://" + srv.Addr(listen.ListenerHTTPS) + "/") // the same port on UDP and TCP
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := map[string]string{"h3": "HTTP/3.0", "tcp": "HTTP/2.0"}[name]; string(body) != want {
			t.Fatalf("%s: served over %s; want %s", name, body, want)
		}
		if got := certs.SPKIPin(resp.TLS.PeerCertificates[0]); got != pins[0] {
			t.Errorf("%s: presented SPKI pin %s; want the printed %s", name, got, pins[0])
		}
	}
}
