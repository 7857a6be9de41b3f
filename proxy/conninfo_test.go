package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// ConnInfo on each protocol: the right Proto, a handshake time on the
// first request of a TLS or QUIC connection only, and a live RTT estimate.
func TestConnInfo(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ci, ok := listen.ConnInfoFrom(r.Context())
		if n := testing.AllocsPerRun(10, func() { listen.ConnInfoFrom(r.Context()) }); n != 0 {
			ok = false // reported below as a failure
			t.Errorf("ConnInfoFrom allocates %v times per call; want 0", n)
		}
		fmt.Fprintf(w, "%v %s %d %d", ok, ci.Proto, ci.Handshake, ci.RTT())
	})
	srv := &listen.Server{Handler: h, HTTPAddr: "127.0.0.1:0", HTTPSAddr: "127.0.0.1:0", TLSConfig: testTLSConfig(t),
		H2Server: testH2Server}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	defer srv.Close()
	http1, https, h3 := "http://"+srv.Addr(listen.ListenerHTTP), "https://"+srv.Addr(listen.ListenerHTTPS), "https://"+srv.Addr(listen.ListenerHTTP3)
	cases := []struct {
		name, url, proto string
		client           *http.Client
		tls              bool
	}{
		{"h1", http1, "h1", h1Client(), false},
		{"h2c", http1, "h2", h2cClient(), false},
		{"h1-tls", https, "h1", h1Client(), true},
		{"h2-tls", https, "h2", h2Client(), true},
		{"h3", h3, "h3", h3Client(t), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < 3; i++ { // the same connection each time
				resp, err := tc.client.Get(tc.url + "/")
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var ok bool
				var proto string
				var hs, rtt time.Duration
				if _, err := fmt.Sscanf(string(b), "%v %s %d %d", &ok, &proto, &hs, &rtt); err != nil {
					t.Fatalf("request %d: %q: %v", i, b, err)
				}
				if !ok || proto != tc.proto {
					t.Fatalf("request %d: ok=%v proto %q; want true %q", i, ok, proto, tc.proto)
				}
				switch {
				case i == 0 && tc.tls && (hs <= 0 || hs > 5*time.Second):
					t.Fatalf("first request: handshake %v; want a positive duration", hs)
				case (i > 0 || !tc.tls) && hs != 0:
					t.Fatalf("request %d (tls %v): handshake %v; want 0", i, tc.tls, hs)
				}
				if rtt <= 0 || rtt > 5*time.Second {
					t.Fatalf("request %d: rtt %v; want a positive estimate", i, rtt)
				}
			}
		})
	}
}

// Outside a Server, ConnInfoFrom says so and RTT still works.
func TestConnInfoAbsent(t *testing.T) {
	r, _ := http.NewRequest(http.MethodGet, "http://example.com/", nil)
	ci, ok := listen.ConnInfoFrom(r.Context())
	if ok || ci.Proto != "" || ci.RTT() != 0 {
		t.Fatalf("got %+v %v; want zero and false", ci, ok)
	}
}
