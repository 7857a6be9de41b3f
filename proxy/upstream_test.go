package proxy_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/routing"
)

// echoBackend streams one token naming the protocol the request came over
// and the client certificate it presented.
func echoBackend(w http.ResponseWriter, r *http.Request) {
	who := "-"
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		who = r.TLS.PeerCertificates[0].Subject.CommonName
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"%s %s\"}}]}\n\ndata: [DONE]\n\n", r.Proto, who)
}

// Pools reach https:// backends with their own CA and client certificate
// (mutual TLS), over HTTP/2 unless told otherwise; a wrong CA or a missing
// client certificate fails with 502.
func TestUpstreamTLS(t *testing.T) {
	ca, other := newTestCA(t, "backend CA"), newTestCA(t, "some other CA")
	backend := httptest.NewUnstartedServer(http.HandlerFunc(echoBackend))
	backend.TLS = &tls.Config{
		Certificates: []tls.Certificate{ca.tlsCert(t, "backend", false, "backend.test")},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.pool,
	}
	backend.EnableHTTP2 = true
	backend.Config.ErrorLog = log.New(io.Discard, "", 0) // the failing handshakes are expected
	backend.StartTLS()
	defer backend.Close()

	dir := t.TempDir()
	caFile, otherCA := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "other.pem")
	writeFile(t, caFile, ca.pem)
	writeFile(t, otherCA, other.pem)
	clientCert, clientKey := ca.issueFiles(t, dir, "edge-client", true)
	pool := func(name, caFile, http2 string, withCert bool) routing.PoolConfig {
		pc := poolOf(backend.URL)
		pc.Name, pc.HTTP2, pc.EjectAfter = name, http2, 1000
		pc.TLS = &routing.UpstreamTLS{CAFile: caFile}
		if withCert {
			pc.TLS.CertFile, pc.TLS.KeyFile = clientCert, clientKey
		}
		return pc
	}
	pools := []routing.PoolConfig{
		pool("h2", caFile, "", true), pool("h1", caFile, "off", true),
		pool("wrong-ca", otherCA, "", true), pool("no-cert", caFile, "", false),
	}
	var routes []testRoute
	for _, p := range pools {
		routes = append(routes, testRoute{RouteConfig: routing.RouteConfig{Pool: p.Name, Models: []string{p.Name}}})
	}
	e := startEdge(t, edgeOpts{pool: pools[0], extra: pools[1:], routes: routes})
	cases := []struct {
		model  string
		status int
		token  string
	}{
		{"h2", 200, "HTTP/2.0 edge-client"},
		{"h1", 200, "HTTP/1.1 edge-client"},
		{"wrong-ca", 502, ""},
		{"no-cert", 502, ""},
	}
	for _, tc := range cases {
		t.Run(tc.model, func(t *testing.T) {
			resp := post(t, h1Client(), e.http+"/v1/chat/completions",
				`{"model":"`+tc.model+`","stream":true,"messages":[{"role":"user","content":"x"}]}`)
			events, _ := readEvents(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d; want %d", resp.StatusCode, tc.status)
			}
			if tc.token != "" && (len(events) == 0 || !strings.Contains(events[0].data, `"`+tc.token+`"`)) {
				t.Fatalf("events %v; want the backend to report %q", events, tc.token)
			}
		})
	}
}

// h2c: true speaks cleartext HTTP/2 with prior knowledge to a backend that
// only understands that.
func TestUpstreamH2C(t *testing.T) {
	backend := httptest.NewUnstartedServer(http.HandlerFunc(echoBackend))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	backend.Config.Protocols = &p
	backend.Start()
	defer backend.Close()
	pc := poolOf(backend.URL)
	pc.H2C = true
	e := startEdge(t, edgeOpts{pool: pc})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	events, done := readEvents(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !done || len(events) != 1 || !strings.Contains(events[0].data, "HTTP/2.0") {
		t.Fatalf("got %d %v done=%v; want one token from an HTTP/2 request", resp.StatusCode, events, done)
	}
}
