package routing

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/gpusim"
)

// gauged is a real HTTP backend whose /metrics reports gauges the test
// sets, in vLLM's names, and whose /health can be made to fail or hang.
// Model endpoints are served by a real simulator.
type gauged struct {
	srv *httptest.Server
	sim *gpusim.Sim

	mu               sync.Mutex
	waiting, running float64
	metricsStatus    int  // 0: 200
	hang             bool // /health and /metrics never answer
	release          chan struct{}
}

func startGauged(t testing.TB) *gauged {
	t.Helper()
	g := &gauged{sim: gpusim.New(gpusim.Config{StepBase: 5 * time.Millisecond, PrefillBase: -1, DefaultMaxTokens: 4}),
		release: make(chan struct{})}
	g.srv = httptest.NewServer(g)
	t.Cleanup(func() {
		g.set(func(g *gauged) { g.hang = false })
		close(g.release)
		g.srv.Close()
		g.sim.Close()
	})
	return g
}

func (g *gauged) set(f func(*gauged)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f(g)
}

func (g *gauged) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	hang, status, wt, rn := g.hang, g.metricsStatus, g.waiting, g.running
	g.mu.Unlock()
	if hang {
		select {
		case <-r.Context().Done():
		case <-g.release:
		}
		return
	}
	if r.URL.Path != "/metrics" {
		g.sim.ServeHTTP(w, r)
		return
	}
	if status != 0 {
		w.WriteHeader(status)
		return
	}
	fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} %v\n"+
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} %v\n", wt, rn)
}

// startPool builds and starts a pool; it is closed when the test ends.
func startPool(t testing.TB, cfg PoolConfig) *Pool {
	t.Helper()
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.Start(t.Context())
	t.Cleanup(func() { p.Close() })
	return p
}

// quiet is a pool config without scrapes or probes.
func quiet(urls ...string) PoolConfig {
	pc := PoolConfig{Name: "p", Dialect: DialectNone, Health: HealthConfig{Disable: true}}
	for _, u := range urls {
		pc.Backends = append(pc.Backends, BackendConfig{URL: u})
	}
	return pc
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond) // poll: samples, health and queues expose no event to wait on
	}
}

// closedURL is a loopback URL where nothing listens.
func closedURL(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// setSample stores a scraped sample on b as if read at at.
func setSample(b *Backend, waiting, running float64, at time.Time) {
	s := Sample{At: at, Waiting: waiting, Running: running, KVCache: -1, Source: SourceScrape,
		Dialect: DialectVLLM, inflight: b.inflight.Load()}
	b.scraped.Store(&s)
	b.pool.queue.signal()
}
