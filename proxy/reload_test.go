package proxy_test

import (
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/observe"
	"github.com/sluice-proxy/sluice/routing"
)

// A route with enforce_limits: false (and allow_enforced_tenants: true,
// the tenant's own limits being enforced) admits every request, with the usual
// rate-limit headers, a would-refuse header, a metric and an access log
// field; an enforcing route on the same tenant still refuses.
func TestRouteShadowMode(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	off, on := false, true
	var logBuf syncBuffer
	reg := prometheus.NewRegistry()
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: limiter.NewLocal(1),
		limits: limiter.Limits{RequestsPerMinute: 1, Models: map[string]limiter.Limits{"sim-small": {RequestsPerMinute: 1, Enforce: &on}}},
		routes: []testRoute{
			{RouteConfig: routing.RouteConfig{Name: "shadow", Path: "/v1/", Pool: "p"}, RoutePolicy: proxy.RoutePolicy{EnforceLimits: &off, AllowEnforcedTenants: true}},
			{RouteConfig: routing.RouteConfig{Name: "strict", Path: "/strict/v1/", Pool: "p"}},
		},
		log: &logBuf, metrics: observe.NewMetrics(reg, 0)})
	for i := 0; i < 3; i++ {
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("shadow route refused request %d: %d", i, resp.StatusCode)
		}
		if resp.Header.Get("x-ratelimit-limit-requests") != "1" {
			t.Fatalf("request %d: rate-limit headers missing: %v", i, resp.Header)
		}
		if got, want := resp.Header.Get("X-Sluice-Would-Refuse"), map[bool]string{true: "", false: "requests"}[i == 0]; got != want {
			t.Fatalf("request %d: X-Sluice-Would-Refuse %q; want %q", i, got, want)
		}
	}
	want := `sluice_refusals_total{enforced="false",reason="requests",route="shadow"} 2`
	if err := testutil.GatherAndCompare(reg, strings.NewReader("# HELP sluice_refusals_total Requests refused by limits (enforced=false: shadow mode, would have refused).\n# TYPE sluice_refusals_total counter\n"+want+"\n"), "sluice_refusals_total"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "access log lines", func() bool {
		return strings.Count(strings.Join(logBuf.lines(), "\n"), `"would_refuse":"requests"`) == 2
	})

	resp := post(t, h1Client(), e.http+"/strict/v1/chat/completions", chatBody(""))
	resp.Body.Close()
	if resp.StatusCode != 429 {
		t.Fatalf("enforcing route: %d; want 429", resp.StatusCode)
	}
}

// Swap's channel closes only when the requests that used the previous
// state have finished; the stream keeps the pool it started on.
func TestSwapPreviousDone(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	simA, urlA := startSim(t, cfg)
	_, urlB := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(urlA)})

	idle := e.handler.Swap(stateFor(t, urlA))
	select {
	case <-idle:
	case <-time.After(time.Second):
		t.Fatal("swapping an idle state: the previous state's channel did not close")
	}

	resp := post(t, h1Client(), e.http+"/v1/chat/completions",
		`{"model":"sim-small","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"x"}]}`)
	waitFor(t, 2*time.Second, "the stream on backend A", func() bool { return simA.Stats().Running == 1 })
	done := e.handler.Swap(stateFor(t, urlB))
	select {
	case <-done:
		t.Fatal("the previous state was released while a stream still used it")
	default:
	}
	// A new request goes to B while the old stream continues on A.
	r2 := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	io.Copy(io.Discard, r2.Body)
	r2.Body.Close()
	if simA.Stats().Running != 1 {
		t.Fatal("the new request went to the old pool")
	}
	_, finished := readEvents(t, resp.Body)
	resp.Body.Close()
	if !finished {
		t.Fatal("the stream started before the swap did not end with [DONE]")
	}
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("the previous state's channel did not close after its stream ended")
	}
}

// stateFor is a state with one pool of url and the test tenant.
func stateFor(t *testing.T, url string) *proxy.State {
	t.Helper()
	p, err := routing.NewPool(poolOf(url))
	if err != nil {
		t.Fatal(err)
	}
	return &proxy.State{
		Tenants: proxy.NewTenants([]proxy.TenantConfig{{ID: "t1", Keys: []string{proxy.HashKey(testKey)}}}),
		Routes:  routing.NewTable([]*routing.Route{{RouteConfig: routing.RouteConfig{Pool: "p"}.WithDefaults(), Pool: p}}),
	}
}

// Swaps racing with requests: every request is served, and every
// previous state's channel closes.
func TestSwapUnderRequests(t *testing.T) {
	_, url := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(url)})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	fails := make(chan string, 100)
	served := make(chan struct{}, 1) // a request finished since the last swap
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(`"max_tokens":2`))
				_, done := readEvents(t, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !done {
					fails <- resp.Status
				}
				select {
				case served <- struct{}{}:
				default:
				}
			}
		}()
	}
	workersDone := make(chan struct{})
	go func() { wg.Wait(); close(workersDone) }() // exits when the workers have
	var dones []<-chan struct{}
	for i := 0; i < 40; i++ {
		// Each swap follows a served request, so the swaps spread over
		// the requests rather than over a clock.
		select {
		case <-served:
		case <-workersDone:
		}
		dones = append(dones, e.handler.Swap(stateFor(t, url)))
	}
	close(stop)
	<-workersDone
	close(fails)
	for f := range fails {
		t.Errorf("request failed across swaps: %s", f)
	}
	for i, d := range dones {
		select {
		case <-d:
		case <-time.After(2 * time.Second):
			t.Fatalf("state %d never released", i)
		}
	}
}
