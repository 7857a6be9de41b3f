package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/quic-go/quic-go/http3"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/internal/node"
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
	h3addr := n.Server().Addr(listen.ListenerHTTP3)
	if h3addr == "" || h3addr != n.Server().Addr(listen.ListenerHTTPS) {
		t.Fatalf("http3 on %q, https on %q; want the same port number", h3addr, n.Server().Addr(listen.ListenerHTTPS))
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

func startTestNode(t *testing.T, cfg *configs.Config) *node.Node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n, err := node.Start(ctx, cfg, node.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown(); cancel(); n.Close() })
	return n
}

// startDefaultNode starts the embedded default with every listener on a
// free loopback port.
func startDefaultNode(t *testing.T) *node.Node {
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
