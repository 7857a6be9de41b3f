package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/routing"
)

// The cost benchmarks measure Sluice with its whole pipeline on: auth, the
// local limiter, routing, timing (Server-Timing), Prometheus metrics,
// /debug/stats and a JSON access log (written to io.Discard). Backend,
// Sluice and client all run in this process, so each case is compared
// with the same backend and client reached directly, in the same run: the
// difference is Sluice's cost.
//
//	go test -run '^$' -bench 'BenchmarkSmallRequests|BenchmarkStreamCost|BenchmarkHeldStreams' -benchtime 3x -count 3 ./proxy/

// fullEdge is a Sluice edge with every per-request feature on.
func fullEdge(b *testing.B, pc routing.PoolConfig) *testEdge {
	b.Helper()
	return startEdge(b, edgeOpts{
		pool:        pc,
		limiter:     limiter.NewLocal(1),
		limits:      limiter.Limits{MaxConcurrency: 1 << 20, TokensPerMinute: 1 << 50, RequestsPerMinute: 1 << 50},
		log:         io.Discard,
		promMetrics: true,
	})
}

// smallAnswer is a small non-streamed chat completion.
const smallAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"sim-small",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`

// countingServer is an httptest server that counts the connections it
// accepted (to check that keep-alive works).
func countingServer(b testing.TB, h http.Handler, h2c bool) (*httptest.Server, *atomic.Int64) {
	srv := httptest.NewUnstartedServer(h)
	conns := &atomic.Int64{}
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	if h2c {
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		srv.Config.Protocols = &p
	}
	srv.Start()
	b.Cleanup(srv.Close)
	return srv, conns
}

// warmGate holds the requests that reach a backend until n have arrived
// (at most 10 s), so that n connections are open to it at once.
type warmGate struct {
	n, in int
	mu    sync.Mutex
	all   chan struct{}
}

func newWarmGate(n int) *warmGate { return &warmGate{n: n, all: make(chan struct{})} }

func (g *warmGate) arrive() {
	g.mu.Lock()
	g.in++
	if g.in == g.n {
		close(g.all)
	}
	g.mu.Unlock()
	select {
	case <-g.all:
	case <-time.After(10 * time.Second):
	}
}

// BenchmarkSmallRequests sends small non-streamed requests from 8
// concurrent keep-alive clients: an op is a round of 400 requests directly
// to the backend and 400 through Sluice. It reports, per case, requests/s
// and the process CPU time per request; "proxy-cpu-µs/req" is the
// difference (Sluice's own CPU per request), "rps-x" Sluice's requests/s as
// a share of direct, "allocs/req" the heap allocations per request, and
// "new-conns" the connections Sluice opened to the backend after the
// warm-up (keep-alive works: 0). "direct-new-conns" are the direct
// client's: net/http's Transport does not reuse a connection whose
// request write its write loop has not reported 50 ms after the response
// ended (maxWriteWaitBeforeConnReuse), which a loaded machine's scheduler
// sometimes causes, and dials anew.
func BenchmarkSmallRequests(b *testing.B) {
	const workers, perRound = 8, 400
	var warm atomic.Pointer[warmGate]
	srv, conns := countingServer(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if g := warm.Load(); g != nil {
			g.arrive()
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, smallAnswer)
	}), false)
	e := fullEdge(b, poolOf(srv.URL))
	body := `{"model":"sim-small","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	type kase struct {
		name, url string
		client    *http.Client
		cpu, wall time.Duration
		allocs    uint64
	}
	cases := []*kase{
		{name: "direct", url: srv.URL},
		{name: "sluice", url: e.http},
	}
	round := func(c *kase) {
		postN(b, c.client, c.url, c.name, body, "application/json", workers, perRound)
	}
	var directDials atomic.Int64
	for _, c := range cases {
		tr := &http.Transport{MaxIdleConnsPerHost: workers}
		if c.name == "direct" {
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				directDials.Add(1)
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}
		}
		c.client = &http.Client{Transport: tr}
		// Connect: the backend holds the first requests until all the
		// workers' are in, so that both the client's and the edge's pools
		// have a connection per worker before the count starts. Without
		// it a loaded machine could finish one request before the last
		// worker's first arrived: the edge then had 7 backend connections
		// and dialed the 8th in a measured round ("new-conns 1").
		warm.Store(newWarmGate(workers))
		postN(b, c.client, c.url, c.name, body, "application/json", workers, workers)
		warm.Store(nil)
		round(c) // warm up
	}
	before, directBefore := conns.Load(), directDials.Load()
	b.ResetTimer()
	for range b.N {
		for _, c := range cases {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			cpu0, t0, m0 := cpuTime(b), time.Now(), ms.Mallocs
			round(c)
			c.cpu += cpuTime(b) - cpu0
			c.wall += time.Since(t0)
			runtime.ReadMemStats(&ms)
			c.allocs += ms.Mallocs - m0
		}
	}
	b.StopTimer()
	n := float64(b.N * perRound)
	for _, c := range cases {
		b.ReportMetric(float64(c.cpu.Microseconds())/n, c.name+"-cpu-µs/req")
		b.ReportMetric(n/c.wall.Seconds(), c.name+"-req/s")
		b.ReportMetric(float64(c.allocs)/n, c.name+"-allocs/req")
	}
	b.ReportMetric(float64((cases[1].cpu-cases[0].cpu).Microseconds())/n, "proxy-cpu-µs/req")
	b.ReportMetric(cases[0].wall.Seconds()/cases[1].wall.Seconds(), "rps-x")
	direct := directDials.Load() - directBefore
	b.ReportMetric(float64(conns.Load()-before-direct), "new-conns")
	b.ReportMetric(float64(direct), "direct-new-conns")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkStreamCost runs 64 concurrent streams of 200 tokens paced at
// 10 ms over HTTP/1.1, directly and through Sluice: an op is one such
// round per case. It reports the process CPU per 1,000 tokens per case and
// their difference ("proxy-cpu-ms/1k"), and the P50/P99 delay from the
// backend writing a token to the client reading it, per case and as
// Sluice minus direct ("added-p50-µs").
func BenchmarkStreamCost(b *testing.B) {
	srv := httptest.NewServer(stampBackend{})
	defer srv.Close()
	e := fullEdge(b, poolOf(srv.URL))
	cases := []protoCase{{"direct", srv.URL, h1Pool()}, {"sluice", e.http, h1Pool()}}
	const streams, n, every = 64, 200, 10 * time.Millisecond
	cpu := make([]time.Duration, len(cases))
	delays := make([][]time.Duration, len(cases))
	for _, c := range cases {
		c.benchCase().streams(b, streams, 5, 0) // open the connections and warm up
	}
	b.ResetTimer()
	for range b.N {
		for i, c := range cases {
			var mu sync.Mutex
			var wg sync.WaitGroup
			start := cpuTime(b)
			for range streams {
				wg.Go(func() {
					d := c.stream(b, n, every, make([]time.Duration, 0, n))
					mu.Lock()
					delays[i] = append(delays[i], d...)
					mu.Unlock()
				})
			}
			wg.Wait()
			cpu[i] += cpuTime(b) - start
		}
	}
	b.StopTimer()
	tokens := float64(b.N * streams * n)
	var p50, p99 [2]time.Duration
	for i, c := range cases {
		slices.Sort(delays[i])
		p50[i], p99[i] = delays[i][len(delays[i])/2], delays[i][len(delays[i])*99/100]
		b.ReportMetric(float64(cpu[i].Microseconds())/tokens, c.name+"-cpu-ms/1k")
		b.ReportMetric(float64(p50[i].Microseconds()), c.name+"-p50-µs")
		b.ReportMetric(float64(p99[i].Microseconds()), c.name+"-p99-µs")
	}
	b.ReportMetric(float64((cpu[1]-cpu[0]).Microseconds())/tokens, "proxy-cpu-ms/1k")
	b.ReportMetric(float64((p50[1] - p50[0]).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64((p99[1] - p99[0]).Microseconds()), "added-p99-µs")
	b.ReportMetric(0, "ns/op")
}

// holdBackend sends one token and then holds the stream open until the
// request is cancelled.
func holdBackend(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, `data: {"choices":[{"delta":{"content":"t"}}]}`+"\n\n")
	http.NewResponseController(w).Flush()
	<-r.Context().Done()
}

// TestHoldBackendProcess is not a test: BenchmarkHeldStreams runs it (with
// SLUICE_HOLD_BACKEND=1) as a separate process serving holdBackend over
// HTTP/1.1 and h2c, so that the benchmark's memory figures include no
// backend connection. It serves until its standard input is closed.
func TestHoldBackendProcess(t *testing.T) {
	if os.Getenv("SLUICE_HOLD_BACKEND") != "1" {
		t.Skip("helper process of BenchmarkHeldStreams")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: http.HandlerFunc(holdBackend), Protocols: &p}
	go srv.Serve(ln)
	fmt.Println("ADDR", ln.Addr())
	io.Copy(io.Discard, os.Stdin)
	srv.Close()
}

// startHoldBackend runs TestHoldBackendProcess and returns its URL.
func startHoldBackend(b *testing.B) string {
	stdout := startChild(b, "SLUICE_HOLD_BACKEND=1", "-test.run=^TestHoldBackendProcess$", "-test.v")
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			go io.Copy(io.Discard, stdout) // ends when the process does
			return "http://" + addr
		}
	}
	b.Fatal("the backend process did not start")
	return ""
}

// heldMemory is the Go memory in use (heap objects and goroutine stacks)
// after a collection.
func heldMemory() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

// holdStreams opens k streams to url, waits until each has its first
// token, measures the memory in use, then cancels them. It returns the
// memory grown per stream in bytes.
func holdStreams(b *testing.B, name, url string, k int) float64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	goroutines := runtime.NumGoroutine()
	base := heldMemory()
	var ready, done sync.WaitGroup
	var fails atomic.Int64
	ready.Add(k)
	for range k {
		done.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody("")))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				fails.Add(1)
				ready.Done()
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReaderSize(resp.Body, 512)
			line, err := br.ReadString('\n')
			if resp.StatusCode != 200 || err != nil || !strings.HasPrefix(line, "data: {") {
				fails.Add(1)
			}
			ready.Done()
			io.Copy(io.Discard, br) // until cancelled
		})
	}
	ready.Wait()
	held := heldMemory()
	if dir := os.Getenv("SLUICE_HELD_HEAPPROFILE"); dir != "" {
		// The heap while the streams are held (go tool pprof -sample_index=inuse_space).
		f, err := os.Create(filepath.Join(dir, "heap-"+name+".pprof"))
		if err != nil {
			b.Fatal(err)
		}
		pprof.Lookup("heap").WriteTo(f, 0)
		f.Close()
	}
	cancel()
	done.Wait()
	if n := fails.Load(); n > 0 {
		b.Fatalf("%d of %d streams failed", n, k)
	}
	// Let the proxy's side of the streams wind down before the next
	// baseline. No event announces it; a baseline taken anyway after 10s
	// is only noisier, so a timeout is not a failure.
	poll(10*time.Second, func() bool { return runtime.NumGoroutine() <= goroutines+10 })
	return float64(int64(held)-int64(base)) / float64(k)
}

// BenchmarkHeldStreams holds 2,000 idle streams (one token, then silence)
// directly and through Sluice, and reports the Go memory (heap in use plus
// stacks, after a collection) per held stream, per case, and Sluice's own
// share ("<case>-proxy-KiB": the case minus direct). The cases: "loop", an
// HTTP/1.1 upstream through proxy/h1up, whose committed streams the event
// loops relay (cmd/sluice's default); "h1", net/http's Transport (the
// stream stays on its goroutines); "h2c", an h2c upstream. The backend runs
// in a separate process, so the direct case measures the client alone. An
// op is one round of the cases. All streams come from 127.0.0.1, so the
// edges' per-address connection cap is raised above k (at its default,
// 1,024, the streams past it were refused: the failures this benchmark
// used to report). SLUICE_HELD_HEAPPROFILE=DIR writes each case's heap
// profile, taken while its streams are held, to DIR/heap-<case>.pprof.
func BenchmarkHeldStreams(b *testing.B) {
	const k = 2000
	if os.Getenv("SLUICE_HELD_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 1 // every allocation: the profile is the breakdown per stream
	}
	backend := startHoldBackend(b)
	capAbove := func(s *listen.Server) { s.MaxConnsPerAddr = 2 * k }
	loop := startEdge(b, heldEdgeOpts(poolOf(backend), capAbove, true))
	h1 := startEdge(b, heldEdgeOpts(poolOf(backend), capAbove, false))
	pc := poolOf(backend)
	pc.H2C = true
	h2c := startEdge(b, heldEdgeOpts(pc, capAbove, false))
	urls := []struct{ name, url string }{{"direct", backend}, {"loop", loop.http}, {"h1", h1.http}, {"h2c", h2c.http}}
	per := make([]float64, len(urls))
	b.ResetTimer()
	for range b.N {
		for i, u := range urls {
			per[i] += holdStreams(b, u.name, u.url, k)
		}
	}
	b.StopTimer()
	for i, u := range urls {
		b.ReportMetric(per[i]/float64(b.N)/1024, u.name+"-KiB/stream")
		if i > 0 {
			b.ReportMetric((per[i]-per[0])/float64(b.N)/1024, u.name+"-proxy-KiB")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// heldEdgeOpts is fullEdge's configuration with the listeners adjusted by
// server and the HTTP/1.1 upstream through h1up (event loops) or not.
func heldEdgeOpts(pc routing.PoolConfig, server func(*listen.Server), h1up bool) edgeOpts {
	return edgeOpts{
		pool:        pc,
		limiter:     limiter.NewLocal(1),
		limits:      limiter.Limits{MaxConcurrency: 1 << 20, TokensPerMinute: 1 << 50, RequestsPerMinute: 1 << 50},
		log:         io.Discard,
		promMetrics: true,
		server:      server,
		h1up:        h1up,
	}
}

// startChild runs this test binary again with args and env added to the
// environment (one of the Test…Process functions, which serves until its
// stdin closes), and returns its stdout. The process is stopped with the
// benchmark: stdin closed, then killed if it has not exited in 10s.
func startChild(b testing.TB, env string, args ...string) io.Reader {
	b.Helper()
	_, stdout := startChildIO(b, env, args...)
	return stdout
}

// startChildIO is startChild returning the child's stdin too, for
// commands: the benchmark must not close it (its cleanup does).
func startChildIO(b testing.TB, env string, args ...string) (io.Writer, io.Reader) {
	b.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return stdin, stdout
}
