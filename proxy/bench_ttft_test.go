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
// TTFT at 64 streams": an op is a burst of 64 streams (3 tokens 1 ms
// apart, so each goes on after its first token and Sluice hands it to an
// event loop, as target 1's do) directly to the backend, directly on a
// new connection per stream, and through Sluice (every per-request
// feature on). It reports the client-observed TTFT P50 of each case and
// the differences: "added-ttft-p50-µs" (Sluice − direct) and
// "newconn-p50-µs" (direct on a new connection − direct: what a client
// pays when its connection is not kept alive, as after a stream the loop
// relayed, which answers Connection: close). Then the P50 of each stage of
// Sluice's Server-Timing header (see docs/TIMING.md): auth, recv, route,
// limit, queue, upstream (backend picked → backend headers: the dial when
// no idle connection waits), prefill (the header hold: headers → first
// event), ttft (as the edge measures it, from reading the request head)
// and edge (Sluice's own share of its TTFT), and "network" (client TTFT −
// the edge's ttft, per request: connecting, the request's way in, the
// first write's way out).
//
//	go test -run '^$' -bench BenchmarkFirstToken64 -benchtime 20x ./proxy/
func BenchmarkFirstToken64(b *testing.B) {
	srv := httptest.NewServer(stampBackend{})
	defer srv.Close()
	e := fullEdge(b, poolOf(srv.URL))
	const streams = 64
	stages := []string{"auth", "recv", "route", "limit", "queue", "upstream", "prefill", "ttft", "edge", "network"}
	type kase struct {
		name, url string
		client    *http.Client
		ttft      []time.Duration
		stage     map[string][]float64 // ms
	}
	cases := []*kase{{name: "direct", url: srv.URL}, {name: "direct-newconn", url: srv.URL}, {name: "sluice", url: e.http}}
	burst := func(c *kase, record bool) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range streams {
			wg.Go(func() {
				start := time.Now()
				resp := post(b, c.client, c.url+"/v1/chat/completions?n=3&every=1ms", chatBody(""))
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
						if name == "ttft" {
							c.stage["network"] = append(c.stage["network"], float64(d.Microseconds())/1000-ms)
						}
					}
				}
			})
		}
		wg.Wait()
	}
	for _, c := range cases {
		c.client, c.stage = h1Pool(), map[string][]float64{}
		if c.name == "direct-newconn" {
			c.client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		}
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
	d, n, s := p50(cases[0]), p50(cases[1]), p50(cases[2])
	b.ReportMetric(float64(d.Microseconds()), "direct-ttft-p50-µs")
	b.ReportMetric(float64(s.Microseconds()), "sluice-ttft-p50-µs")
	b.ReportMetric(float64((s - d).Microseconds()), "added-ttft-p50-µs")
	b.ReportMetric(float64((n - d).Microseconds()), "newconn-p50-µs")
	for _, name := range stages {
		v := cases[2].stage[name]
		if len(v) == 0 {
			b.Fatalf("no %s stage in Sluice's Server-Timing", name)
		}
		slices.Sort(v)
		b.ReportMetric(v[len(v)/2]*1000, name+"-p50-µs")
	}
	b.ReportMetric(0, "ns/op")
}
