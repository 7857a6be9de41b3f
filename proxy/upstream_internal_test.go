package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluice-proxy/sluice/routing"
)

// Plaintext HTTP/1.1 pools go on the own client (h1up); h2c and http2: on
// keep net/http, and so do https:// requests of any pool.
func TestPoolTransportSelection(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}))
	defer backend.Close()
	for _, tc := range []struct {
		name   string
		http2  string
		h2c    bool
		client string
		own    bool
	}{
		{"auto", "", false, "", true},
		{"off", routing.HTTP2Off, false, routing.HTTP1ClientOwn, true},
		{"on", routing.HTTP2On, false, "", false},
		{"h2c", "", true, "", false},
		{"net_http", "", false, routing.HTTP1ClientNetHTTP, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := routing.PoolConfig{Name: tc.name, HTTP2: tc.http2, H2C: tc.h2c, HTTP1Client: tc.client}
			pt, err := NewPoolTransport(Config{}, pc)
			if err != nil {
				t.Fatal(err)
			}
			defer pt.CloseIdleConnections()
			if got := pt.H1 != nil; got != tc.own {
				t.Fatalf("own client %v; want %v", got, tc.own)
			}
			if !tc.own {
				return
			}
			// The probes' transport is a clone of the net/http side.
			if pt.StdTransport() != pt.Std {
				t.Fatal("StdTransport is not the net/http side")
			}
			req, _ := http.NewRequest(http.MethodGet, backend.URL, nil)
			resp, err := pt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "HTTP/1.1" || pt.H1.IdleConns() != 1 {
				t.Fatalf("backend saw %q, own client holds %d idle; want HTTP/1.1 and 1", b, pt.H1.IdleConns())
			}
		})
	}
}

func TestPoolTransportBadClient(t *testing.T) {
	if _, err := NewPoolTransport(Config{}, routing.PoolConfig{Name: "p", HTTP1Client: "curl"}); err == nil {
		t.Fatal("http1_client curl accepted")
	}
}
