package proxy_test

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkFirstToken64 measures where the first-token path spends its
// time with 64 streams starting at once, the shape of the issue's "added
// TTFT at 64 streams": an op is a burst of 64 one-token streams directly
// to the backend and 64 through Sluice (every per-request feature on). It
// reports the client-observed TTFT P50 of each case and their difference
// ("added-ttft-p50-µs"), and the P50 of each stage of Sluice's
// Server-Timing header (see docs/TIMING.md): auth, recv, route, limit,
// queue, upstream (backend picked → backend headers), prefill, ttft (as
// the edge measures it, from reading the request head) and edge
// (Sluice's own share of its TTFT).
//
//	go test -run '^$' -bench BenchmarkFirstToken64 -benchtime 20x ./proxy/
func BenchmarkFirstToken64(b *testing.B) {
	srv := httptest.NewServer(stampBackend{})
	defer srv.Close()
	e := fullEdge(b, poolOf(srv.URL))
	const streams = 64
	stages := []string{"auth", "recv", "route", "limit", "queue", "upstream", "prefill", "ttft", "edge"}
	type kase struct {
		name, url string
		client    *http.Client
		ttft      []time.Duration
		stage     map[string][]float64 // ms
	}
	cases := []*kase{{name: "direct", url: srv.URL}, {name: "sluice", url: e.http}}
	burst := func(c *kase, record bool) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range streams {
			wg.Go(func() {
				start := time.Now()
				resp := post(b, c.client, c.url+"/v1/chat/completions?n=1", chatBody(""))
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				if _, err := br.ReadSlice('\n'); err != nil {
					b.Error(err)
					return
				}
				d := time.Since(start)
				io.Copy(io.Discard, br)
				if !record {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				c.ttft = append(c.ttft, d)
				for _, part := range strings.Split(resp.Header.Get("Server-Timing"), ",") {
					name, dur, ok := strings.Cut(strings.TrimSpace(part), ";dur=")
					if ms, err := strconv.ParseFloat(dur, 64); ok && err == nil {
						c.stage[name] = append(c.stage[name], ms)
					}
				}
			})
		}
		wg.Wait()
	}
	for _, c := range cases {
		c.client, c.stage = h1Pool(), map[string][]float64{}
		burst(c, false) // open the connections and warm up
	}
	b.ResetTimer()
	for range b.N {
		for _, c := range cases {
			burst(c, true)
		}
	}
	b.StopTimer()
	p50 := func(c *kase) time.Duration { slices.Sort(c.ttft); return c.ttft[len(c.ttft)/2] }
	d, s := p50(cases[0]), p50(cases[1])
	b.ReportMetric(float64(d.Microseconds()), "direct-ttft-p50-µs")
	b.ReportMetric(float64(s.Microseconds()), "sluice-ttft-p50-µs")
	b.ReportMetric(float64((s - d).Microseconds()), "added-ttft-p50-µs")
	for _, name := range stages {
		v := cases[1].stage[name]
		if len(v) == 0 {
			b.Fatalf("no %s stage in Sluice's Server-Timing", name)
		}
		slices.Sort(v)
		b.ReportMetric(v[len(v)/2]*1000, name+"-p50-µs")
	}
	b.ReportMetric(0, "ns/op")
}
