package proxy_test

import (
	"github.com/sluice-proxy/sluice/proxy"

	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// BenchmarkStreamStarts measures what a short stream on the event loops
// costs from its start to its end, the work a wave of stream starts
// brings (docs/BENCHMARKS.md, "sparse4"): 16 keep-alive HTTP/1.1 clients
// each run 8 streams in a row of 3 tokens paced at 1 ms (the first
// written at the hand-off, the others relayed by a loop), directly, then
// through Sluice with the sockets taken out of Go's netpoller at the
// hand-off and rebuilt at the end ("dup"), then with them left under
// their net.Conns ("shared", evloop.Stream.Shared, the default); an op is
// one round of each, in turn. It reports the process CPU per stream of
// each case and Sluice's part of it (the case minus direct).
func BenchmarkStreamStarts(b *testing.B) {
	srv := httptest.NewServer(stampBackend{})
	defer srv.Close()
	e := fullEdge(b, poolOf(srv.URL))
	const clients, per, n, every = 16, 8, 3, time.Millisecond
	cases := []struct {
		c      protoCase
		shared bool
	}{{protoCase{"direct", srv.URL, h1Pool()}, false}, {protoCase{"dup", e.http, h1Pool()}, false},
		{protoCase{"shared", e.http, h1Pool()}, true}}
	defer proxy.SetSharedConns(true)
	round := func(i int) time.Duration {
		proxy.SetSharedConns(cases[i].shared)
		start := cpuTime(b)
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for range per {
					cases[i].c.stream(b, n, every, nil)
				}
			})
		}
		wg.Wait()
		return cpuTime(b) - start
	}
	for i := range cases {
		round(i) // connections open, pools warm
	}
	cpu := make([]time.Duration, len(cases))
	b.ResetTimer()
	for range b.N {
		for i := range cases {
			cpu[i] += round(i)
		}
	}
	b.StopTimer()
	streams := float64(b.N * clients * per)
	for i, c := range cases {
		b.ReportMetric(float64(cpu[i].Microseconds())/streams, c.c.name+"-cpu-µs/stream")
		if i > 0 {
			b.ReportMetric(float64((cpu[i]-cpu[0]).Microseconds())/streams, c.c.name+"-proxy-µs/stream")
		}
	}
	b.ReportMetric(0, "ns/op")
}
