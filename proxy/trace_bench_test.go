package proxy_test

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/otlptest"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy/tracing"
)

// BenchmarkTracingSmallRequests is BenchmarkSmallRequests' load (small
// non-streamed requests from 8 keep-alive clients, the whole pipeline on)
// through two edges in the same process: tracing off, and tracing on at
// sampler ratio 1.0 exporting over OTLP/HTTP to an in-process receiver,
// with stage events (the default), stage spans, stage_events: false, and
// at ratio 0 (sampled-out: every request gets a trace id and sends its
// backend a traceparent, nothing is recorded or exported).
// An op is a round of 400 requests through each, alternating. It reports
// per case the process CPU per request and the allocations per request,
// and "tracing-cpu-µs/req", the difference: what tracing every request
// costs. The receiver (in this process too) only counts the spans in the
// protobuf, cheaply: "spans/req" is what it got per traced request (the batch processor drops spans
// when its queue is full: fewer would mean the cost is understated).
//
//	go test -run '^$' -bench BenchmarkTracingSmallRequests -benchtime 20x -count 5 ./proxy/
func BenchmarkTracingSmallRequests(b *testing.B) {
	for _, mode := range []string{"stage-events", "stage-spans", "no-stage-events", "sampled-out"} {
		b.Run(mode, func(b *testing.B) { benchTracing(b, mode) })
	}
}

func benchTracing(b *testing.B, mode string) {
	srv, _ := countingServer(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, smallAnswer)
	}), false)
	url, spans := otlptest.StartCounting(b)
	ratio, events := 1.0, mode != "no-stage-events"
	if mode == "sampled-out" { // tracing on, nothing recorded: what remains is the trace context (ids, headers, log)
		ratio = 0
	}
	tr, err := tracing.New(context.Background(), tracing.Config{Enabled: true, Endpoint: url, SamplerRatio: &ratio,
		StageSpans: mode == "stage-spans", StageEvents: &events}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Shutdown(context.Background())
	edge := func(traced bool) *testEdge {
		o := edgeOpts{
			pool: poolOf(srv.URL), limiter: limiter.NewLocal(1), log: io.Discard, promMetrics: true,
			limits: limiter.Limits{MaxConcurrency: 1 << 20, TokensPerMinute: 1 << 50, RequestsPerMinute: 1 << 50},
		}
		if traced {
			o.tracer = tr
		}
		return startEdge(b, o)
	}
	const workers, perRound = 8, 400
	body := `{"model":"sim-small","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	type kase struct {
		name, url string
		client    *http.Client
		cpu       time.Duration
		allocs    uint64
	}
	cases := []*kase{{name: "off", url: edge(false).http}, {name: "traced", url: edge(true).http}}
	round := func(c *kase) {
		var wg sync.WaitGroup
		var next atomic.Int64
		for range workers {
			wg.Go(func() {
				for next.Add(1) <= perRound {
					req, _ := http.NewRequest(http.MethodPost, c.url+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+testKey)
					resp, err := c.client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("%s: status %d", c.name, resp.StatusCode)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	for _, c := range cases {
		c.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
		round(c)
	}
	tr.ForceFlush(context.Background())
	spans0 := spans.Load()
	b.ResetTimer()
	for range b.N {
		for _, c := range cases {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			cpu0, m0 := cpuTime(b), ms.Mallocs
			round(c)
			if c.name == "traced" {
				tr.ForceFlush(context.Background()) // the export's cost is counted in the traced round
			}
			c.cpu += cpuTime(b) - cpu0
			runtime.ReadMemStats(&ms)
			c.allocs += ms.Mallocs - m0
		}
	}
	b.StopTimer()
	n := float64(b.N * perRound)
	for _, c := range cases {
		b.ReportMetric(float64(c.cpu.Microseconds())/n, c.name+"-cpu-µs/req")
		b.ReportMetric(float64(c.allocs)/n, c.name+"-allocs/req")
	}
	b.ReportMetric(float64((cases[1].cpu-cases[0].cpu).Microseconds())/n, "tracing-cpu-µs/req")
	b.ReportMetric(float64(spans.Load()-spans0)/n, "spans/req")
	b.ReportMetric(0, "ns/op")
}
