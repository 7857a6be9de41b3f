package proxy_test

import (
	"github.com/sluice-proxy/sluice/proxy"
	"os"

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
// through Sluice ("shared": the sockets left under their net.Conns; the
// "dup" case, taken out of Go's netpoller at the hand-off and rebuilt at
// the end, was removed: docs/ARCHITECTURE.md, "Designs weighed and
// removed"), and so
// without the request path's help to the loops ("shared-nohelp",
// evloop.Group.Help); an op is one round of each, in turn. It reports the process CPU per stream of
// each case and Sluice's part of it (the case minus direct).
func BenchmarkStreamStarts(b *testing.B) {
	srv := httptest.NewServer(stampBackend{})
	defer srv.Close()
	e := fullEdge(b, poolOf(srv.URL))
	const clients, per, n, every = 16, 8, 3, time.Millisecond
	cases := []struct {
		c    protoCase
		help bool
	}{{protoCase{"direct", srv.URL, h1Pool()}, true},
		{protoCase{"shared", e.http, h1Pool()}, true}, {protoCase{"shared-nohelp", e.http, h1Pool()}, false}}
	defer proxy.SetLoopHelp(true)
	round := func(i int) time.Duration {
		proxy.SetLoopHelp(cases[i].help)
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

// SLUICE_TEST_NOHELP=1 turns the loops' help off for every test and
// benchmark of the package (to compare, say, BenchmarkStreamCost both
// ways).
func init() {
	if os.Getenv("SLUICE_TEST_NOHELP") == "1" {
		proxy.SetLoopHelp(false)
	}
}
