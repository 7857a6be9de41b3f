package proxy_test

import (
	"net/http/httptest"
	"strconv"
	"testing"
)

// BenchmarkRelayProtocols measures relaying one SSE event of a stream the
// backend floods, over each client-facing protocol: an op is one event. It
// reports allocations per event and the process's CPU time per event
// ("cpu-µs/event": backend, Sluice and client, all in this process), with
// the direct connection (HTTP/1.1 to the backend) as the baseline: the
// difference is Sluice's cost per event on that protocol, the client's own
// included. A flood lets the client read several events at once, so the
// figures are lower than for paced tokens (BenchmarkProtocols/cpu); what
// they show is allocation per event and the relative cost of the framing.
//
//	go test -run '^$' -bench BenchmarkRelayProtocols -benchtime 20000x -count 3 ./proxy/
func BenchmarkRelayProtocols(b *testing.B) {
	srv := httptest.NewServer(floodBackend{})
	defer srv.Close()
	e := startEdge(b, edgeOpts{pool: poolOf(srv.URL)})
	cases := []protoCase{
		{"direct", srv.URL, h1Client()},
		{"h1", e.http, h1Client()},
		{"h1-tls", e.https, h1Pool()},
		{"h2", e.https, h2Client()},
		{"h3", e.h3, h3Client(b)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			url := c.url + "/v1/chat/completions?n="
			if got := readStream(b, post(b, c.client, url+"10", chatBody(""))); got != 10 {
				b.Fatalf("warm-up: got %d events; want 10", got) // connect first
			}
			b.ReportAllocs()
			start := cpuTime(b)
			b.ResetTimer()
			resp := post(b, c.client, url+strconv.Itoa(b.N), chatBody(""))
			if got := readStream(b, resp); got != b.N {
				b.Fatalf("got %d events; want %d", got, b.N)
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime(b)-start).Nanoseconds())/1e3/float64(b.N), "cpu-µs/event")
		})
	}
}
