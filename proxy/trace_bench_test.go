package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
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
	edge := smallEdges(b, tr)
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
		postN(b, c.client, c.url, c.name, body, "", workers, perRound)
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

// BenchmarkTracingCPU measures what tracing every request (sampler ratio
// 1.0, stage events: the default) costs the whole pipeline in CPU, in a
// way that holds on a shared, noisy machine: BenchmarkTracingSmallRequests'
// load (small non-streamed requests from 8 keep-alive clients) through two
// edges in this process, one untraced and one traced, sharing the backend,
// in short blocks of 200 requests alternating untraced and traced. The
// backend and the clients run in a child process (tracePeer), so that the
// process measured holds the edges alone: a traced request's extra work
// in the backend (reading the traceparent header) is not Sluice's;
// TRACECPU_INPROC=1 keeps them in this process, as before. An op
// is a pair of blocks (in the order AB, then BA, then AB…, so that a drift
// in the machine's load falls on both alike), each block's process CPU
// (user+sys, getrusage) taken, and the traced block's export flushed
// within it. The OTLP receiver (it only counts spans) runs in a child
// process, as a collector runs elsewhere: what is measured is the
// process of the edges. The
// pair's difference per request is one sample of the cost: slow phases of
// the machine move both blocks of a pair, not their difference, so the
// samples spread far less than the blocks do. Reported over the pairs:
// the median difference ("Δcpu-µs/req"), its quartiles ("Δp25", "Δp75"),
// a distribution-free 95% confidence interval of the median from the
// order statistics ("Δci95-lo", "Δci95-hi"), the share of pairs whose
// difference is over 10 µs, and per case the median CPU and the
// allocations per request. "sampled-out" is the same at ratio 0 (trace
// ids and the backend's traceparent, nothing recorded).
//
//	go test -run '^$' -bench BenchmarkTracingCPU -benchtime 60x ./proxy/
//
// TRACECPU_AA=1 makes the "traced" edge a second untraced one: an A/A
// control of the method, whose difference should be 0.
//
// TRACECPU_ONLY=off or =traced runs only that case's blocks (two per op),
// for a differential profile: -cpuprofile of each, then
// go tool pprof -diff_base off.prof traced.prof.
func BenchmarkTracingCPU(b *testing.B) {
	for _, mode := range []string{"ratio-1", "sampled-out"} {
		b.Run(mode, func(b *testing.B) { benchTracingCPU(b, mode) })
	}
}

func benchTracingCPU(b *testing.B, mode string) {
	url, spans := startReceiverProcess(b)
	ratio := 1.0
	if mode == "sampled-out" {
		ratio = 0
	}
	tr, err := tracing.New(context.Background(), tracing.Config{Enabled: true, Endpoint: url, SamplerRatio: &ratio}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Shutdown(context.Background())
	var edge func(traced bool) *testEdge
	var peer *tracePeer // the backend and the clients, in a child process
	if os.Getenv("TRACECPU_INPROC") == "1" {
		edge = smallEdges(b, tr)
	} else {
		peer = startTracePeer(b)
		edge = smallEdgesTo(b, tr, peer.backend)
	}
	const workers, perBlock = 8, 200
	body := `{"model":"sim-small","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	type kase struct {
		name, url string
		client    *http.Client
		cpu       []float64 // µs per request, per block
		allocs    uint64
		bytes     uint64
		gcs       uint32    // GC cycles ended in its blocks
		goal      []float64 // the heap goal (MemStats.NextGC) at each block's end, MB
		requests  int
	}
	off, on := &kase{name: "off", url: edge(false).http}, &kase{name: "traced", url: edge(true).http}
	if os.Getenv("TRACECPU_AA") == "1" { // a control: "traced" is a second untraced edge (the method's bias)
		on.url = edge(false).http
	}
	block := func(c *kase) {
		if peer != nil {
			peer.post(b, c.url, perBlock)
			return
		}
		postN(b, c.client, c.url, c.name, body, "", workers, perBlock)
	}
	measured := func(c *kase) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		m0, b0, g0 := ms.Mallocs, ms.TotalAlloc, ms.NumGC
		cpu0 := cpuTime(b)
		block(c)
		if c == on {
			tr.ForceFlush(context.Background()) // the export's cost is counted in the traced block
		}
		cpu := cpuTime(b) - cpu0
		runtime.ReadMemStats(&ms)
		c.allocs += ms.Mallocs - m0
		c.bytes += ms.TotalAlloc - b0
		c.gcs += ms.NumGC - g0
		c.goal = append(c.goal, float64(ms.NextGC)/(1<<20))
		c.requests += perBlock
		c.cpu = append(c.cpu, float64(cpu.Nanoseconds())/1e3/perBlock)
	}
	for _, c := range []*kase{off, on} {
		c.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
		for range 3 { // warm: connections, pools, the recorder's records
			block(c)
		}
	}
	tr.ForceFlush(context.Background())
	spans0 := spans()
	b.ResetTimer()
	if only := os.Getenv("TRACECPU_ONLY"); only != "" {
		c := map[string]*kase{"off": off, "traced": on}[only]
		if c == nil {
			b.Fatalf("TRACECPU_ONLY=%q: want off or traced", only)
		}
		for range 2 * b.N {
			measured(c)
		}
		b.ReportMetric(float64(c.allocs)/float64(c.requests), c.name+"-allocs/req")
		slices.Sort(c.cpu)
		b.ReportMetric(c.cpu[len(c.cpu)/2], c.name+"-cpu-µs/req")
		b.ReportMetric(0, "ns/op")
		return
	}
	diffs := make([]float64, 0, b.N)
	for i := range b.N {
		if i%2 == 0 {
			measured(off)
			measured(on)
		} else {
			measured(on)
			measured(off)
		}
		diffs = append(diffs, on.cpu[i]-off.cpu[i])
	}
	b.StopTimer()
	if b.Failed() {
		return
	}
	q := func(xs []float64, p float64) float64 { // the p-quantile, linear between order statistics
		s := slices.Sorted(slices.Values(xs))
		f := p * float64(len(s)-1)
		i := int(f)
		if i+1 >= len(s) {
			return s[len(s)-1]
		}
		return s[i] + (f-float64(i))*(s[i+1]-s[i])
	}
	// A 95% confidence interval of the median: the order statistics of
	// ranks n/2 ∓ 0.98·√n (the normal approximation of the binomial).
	sorted := slices.Sorted(slices.Values(diffs))
	n := float64(len(sorted))
	lo := max(int(math.Floor(n/2-0.98*math.Sqrt(n))), 0)
	hi := min(int(math.Ceil(n/2+0.98*math.Sqrt(n))), len(sorted)-1)
	over := 0
	for _, d := range diffs {
		if d > 10 {
			over++
		}
	}
	b.ReportMetric(q(diffs, 0.5), "Δcpu-µs/req")
	b.ReportMetric(q(diffs, 0.25), "Δp25")
	b.ReportMetric(q(diffs, 0.75), "Δp75")
	b.ReportMetric(sorted[lo], "Δci95-lo")
	b.ReportMetric(sorted[hi], "Δci95-hi")
	b.ReportMetric(float64(over)/n, "share>10µs")
	for _, c := range []*kase{off, on} {
		b.ReportMetric(q(c.cpu, 0.5), c.name+"-cpu-µs/req")
		b.ReportMetric(float64(c.allocs)/float64(c.requests), c.name+"-allocs/req")
		b.ReportMetric(float64(c.bytes)/float64(c.requests), c.name+"-B/req")
		b.ReportMetric(1000*float64(c.gcs)/float64(c.requests), c.name+"-gc/kreq")
		b.ReportMetric(q(c.goal, 0.5), c.name+"-heapgoal-MB")
	}
	b.ReportMetric(float64(spans()-spans0)/float64(on.requests), "spans/req")
	b.ReportMetric(0, "ns/op")
	var all strings.Builder // every pair's difference, to pool runs
	for _, d := range diffs {
		fmt.Fprintf(&all, " %.2f", d)
	}
	b.Logf("pairs' differences, µs/req:%s", all.String())
	b.Logf("%d pairs of %d-request blocks: Δ median %.2f µs/req, IQR %.2f…%.2f, 95%% CI of the median %.2f…%.2f; untraced %.1f µs/req (IQR %.1f…%.1f)",
		len(diffs), perBlock, q(diffs, 0.5), q(diffs, 0.25), q(diffs, 0.75), sorted[lo], sorted[hi], q(off.cpu, 0.5), q(off.cpu, 0.25), q(off.cpu, 0.75))
}

// tracePeer is BenchmarkTracingCPU's backend and load generator in a
// child process (this test binary running TestTracingCPUPeer): the
// measured process holds only the two edges (and the traced one's
// exporter), so that what the blocks' CPU differ by is Sluice's, not the
// backend's reading of the traceparent header nor the clients'.
type tracePeer struct {
	in      io.Writer
	out     *bufio.Reader
	backend string // the backend's URL
}

func startTracePeer(b *testing.B) *tracePeer {
	stdin, stdout := startChildIO(b, "TRACECPU_PEER=1", "-test.run", "^TestTracingCPUPeer$")
	p := &tracePeer{in: stdin, out: bufio.NewReader(stdout)}
	line, err := p.out.ReadString('\n')
	if err != nil {
		b.Fatalf("peer process: %v", err)
	}
	p.backend = strings.TrimSpace(line)
	return p
}

// post has the peer send n small requests to url from 8 keep-alive
// clients, and waits until they were answered.
func (p *tracePeer) post(b *testing.B, url string, n int) {
	if _, err := fmt.Fprintf(p.in, "%s %d\n", url, n); err != nil {
		b.Fatalf("peer process: %v", err)
	}
	line, err := p.out.ReadString('\n')
	if err != nil || line != "ok\n" {
		b.Fatalf("peer process: %q, %v", line, err)
	}
}

// TestTracingCPUPeer is BenchmarkTracingCPU's peer process when
// TRACECPU_PEER=1 (else it returns at once: it tests nothing): it starts
// the backend and prints its URL, then for each line "URL N" of its stdin
// sends N small requests to URL from 8 keep-alive clients and prints "ok"
// (or the first error), until its stdin closes.
func TestTracingCPUPeer(t *testing.T) {
	if os.Getenv("TRACECPU_PEER") != "1" {
		return
	}
	srv := httptest.NewServer(smallBackend())
	defer srv.Close()
	fmt.Println(srv.URL)
	const workers = 8
	body := `{"model":"sim-small","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	clients := map[string]*http.Client{}
	for sc := bufio.NewScanner(os.Stdin); sc.Scan(); {
		var url string
		var n int
		if _, err := fmt.Sscan(sc.Text(), &url, &n); err != nil {
			fmt.Println("bad command:", err)
			continue
		}
		c := clients[url]
		if c == nil {
			c = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 30 * time.Second}
			clients[url] = c
		}
		var wg sync.WaitGroup
		var next atomic.Int64
		var first atomic.Pointer[string]
		for range workers {
			wg.Go(func() {
				for next.Add(1) <= int64(n) {
					req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+testKey)
					resp, err := c.Do(req)
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 {
							err = fmt.Errorf("status %d", resp.StatusCode)
						}
					}
					if err != nil {
						msg := err.Error()
						first.CompareAndSwap(nil, &msg)
						return
					}
				}
			})
		}
		wg.Wait()
		if msg := first.Load(); msg != nil {
			fmt.Println("error:", *msg)
		} else {
			fmt.Println("ok")
		}
	}
}

// startReceiverProcess starts otlptest's counting OTLP receiver in a child
// process (this test binary running TestTracingCPUReceiver) and returns
// its URL and a function that asks it how many spans it has counted. The
// child ends when its stdin closes, at b's cleanup.
func startReceiverProcess(b *testing.B) (url string, spans func() int64) {
	stdout := startChild(b, "TRACECPU_RECEIVER=1", "-test.run", "^TestTracingCPUReceiver$")
	var countURL string
	if _, err := fmt.Fscanln(stdout, &url, &countURL); err != nil {
		b.Fatalf("receiver process: %v", err)
	}
	return url, func() int64 {
		resp, err := http.Get(countURL)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		var n int64
		if _, err := fmt.Fscan(resp.Body, &n); err != nil {
			b.Fatal(err)
		}
		return n
	}
}

// TestTracingCPUReceiver is BenchmarkTracingCPU's receiver process when
// TRACECPU_RECEIVER=1 (else it returns at once: it tests nothing). It
// prints the receiver's URL and that of its span count, and serves them
// until its stdin closes.
func TestTracingCPUReceiver(t *testing.T) {
	if os.Getenv("TRACECPU_RECEIVER") != "1" {
		return
	}
	url, spans := otlptest.StartCounting(t)
	count := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, spans.Load())
	}))
	defer count.Close()
	fmt.Println(url, count.URL)
	io.Copy(io.Discard, os.Stdin)
}

// smallEdges returns a function starting an edge (local limiter, limits
// out of the way, metrics on) in front of a backend answering smallAnswer,
// traced by tr or not.
func smallEdges(b *testing.B, tr *tracing.Tracer) func(traced bool) *testEdge {
	srv, _ := countingServer(b, smallBackend(), false)
	return smallEdgesTo(b, tr, srv.URL)
}

// smallBackend answers smallAnswer.
func smallBackend() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, smallAnswer)
	})
}

// smallEdgesTo is smallEdges in front of the backend at backendURL.
func smallEdgesTo(b *testing.B, tr *tracing.Tracer, backendURL string) func(traced bool) *testEdge {
	return func(traced bool) *testEdge {
		o := edgeOpts{
			pool: poolOf(backendURL), limiter: limiter.NewLocal(1), log: io.Discard, promMetrics: true,
			limits: limiter.Limits{MaxConcurrency: 1 << 20, TokensPerMinute: 1 << 50, RequestsPerMinute: 1 << 50},
		}
		if traced {
			o.tracer = tr
		}
		return startEdge(b, o)
	}
}
