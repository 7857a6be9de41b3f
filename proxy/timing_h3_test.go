package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// The network stages of Server-Timing come from the connection: net-rtt on
// every response, tls on the first request of a TLS or QUIC connection
// only; over HTTP/3 the final timing arrives as a trailer when the client
// asked for trailers.
func TestServerTimingNetworkStages(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	for _, tc := range []struct {
		name, base string
		client     *http.Client
	}{
		{"h1-tls", e.https, h1Client()},
		{"h2-tls", e.https, h2Client()},
		{"h3", e.h3, h3Client(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < 2; i++ { // the same connection twice
				resp := post(t, tc.client, tc.base+"/v1/chat/completions", chatBody(""), "TE", "trailers")
				io.ReadAll(resp.Body)
				resp.Body.Close()
				st := resp.Header.Get("Server-Timing")
				if resp.StatusCode != 200 || !strings.Contains(st, "net-rtt;dur=") {
					t.Fatalf("request %d: %d, Server-Timing %q; want net-rtt", i, resp.StatusCode, st)
				}
				if hasTLS := strings.Contains(st, "tls;dur="); hasTLS != (i == 0) {
					t.Fatalf("request %d: Server-Timing %q; want tls on the first request of the connection only", i, st)
				}
				if tc.name == "h3" && !strings.Contains(resp.Trailer.Get("Server-Timing"), "decode;dur=") {
					t.Fatalf("request %d: trailer %v; want the final Server-Timing", i, resp.Trailer)
				}
			}
		})
	}
}
