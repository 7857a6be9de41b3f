package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

// busyBackend streams a token every 10 ms until release is closed, then
// ends with [DONE]. Its health endpoint answers at once, or (slowHealth)
// never within a probe's timeout. It records the paths each connection
// (by client address) carried.
type busyBackend struct {
	release    chan struct{}
	slowHealth atomic.Bool
	probes     atomic.Int64
	mu         sync.Mutex
	paths      map[string]map[string]bool
}

func newBusyBackend() *busyBackend {
	return &busyBackend{release: make(chan struct{}), paths: map[string]map[string]bool{}}
}

func (b *busyBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	if b.paths[r.RemoteAddr] == nil {
		b.paths[r.RemoteAddr] = map[string]bool{}
	}
	b.paths[r.RemoteAddr][r.URL.Path] = true
	b.mu.Unlock()
	if r.URL.Path == "/health" {
		b.probes.Add(1)
		if b.slowHealth.Load() {
			select {
			case <-r.Context().Done():
			case <-time.After(2 * time.Second):
			}
		}
		return
	}
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		io.WriteString(w, `data: {"choices":[{"delta":{"content":"t"}}]}`+"\n\n")
		if rc.Flush() != nil {
			return
		}
		select {
		case <-b.release:
			io.WriteString(w, "data: [DONE]\n\n")
			return
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}

// mixed lists the connections that carried both a probe and a request.
func (b *busyBackend) mixed() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for addr, p := range b.paths {
		if p["/health"] && len(p) > 1 {
			out = append(out, addr)
		}
	}
	return out
}

// holdBusyStreams opens k streams through url and waits until each has
// its first token. wait waits for them to end and returns how many did
// not end with [DONE].
func holdBusyStreams(t *testing.T, url string, k int) (wait func() int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var ready, done sync.WaitGroup
	var bad atomic.Int64
	ready.Add(k)
	for range k {
		done.Go(func() {
			first := true
			defer func() {
				if first {
					ready.Done()
				}
			}()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody("")))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				bad.Add(1)
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			sawDone := false
			for {
				line, err := br.ReadString('\n')
				if first && strings.HasPrefix(line, "data: {") {
					first = false
					ready.Done()
				}
				sawDone = sawDone || strings.HasPrefix(line, "data: [DONE]")
				if err != nil {
					break
				}
			}
			if resp.StatusCode != 200 || !sawDone {
				if bad.Add(1) == 1 {
					t.Logf("first failed stream: status %d, done %v", resp.StatusCode, sawDone)
				}
			}
		})
	}
	ready.Wait()
	return func() int {
		done.Wait()
		cancel()
		return int(bad.Load())
	}
}

// With hundreds of streams held on an h2c pool (one shared connection for
// requests), health probes still go over connections of their own: the
// backend is never taken out and new requests get through. (Whether each
// probe answers within its timeout depends on the machine's load, so the
// test does not count failed probes.) The probe timeout is 1s, not the
// 100ms it was: a timed-out probe is excused only with backend progress
// since one interval (100ms) before it, and the backend, the edge and the
// probes share this process, so ~300ms of CPU starvation (three probes)
// could take the backend out. What the test is about does not need a short
// timeout: a probe queued behind the held streams would not reach the
// backend at all (the probe count below), and mixed() sees the
// connections themselves.
func TestProbesUseOwnConnectionsUnderHeldStreams(t *testing.T) {
	be := newBusyBackend()
	srv, _ := countingServer(t, be, true)
	pc := poolOf(srv.URL)
	pc.H2C = true
	pc.Dialect = routing.DialectNone
	pc.Health = routing.HealthConfig{Interval: 100 * time.Millisecond, Timeout: time.Second, FailAfter: 3}
	e := startEdge(t, edgeOpts{pool: pc, promMetrics: true})
	b := e.pools["p"].Backends()[0]
	wait := holdBusyStreams(t, e.http, 300)
	e.pools["p"].Start(t.Context()) // probes once the streams are held
	from := be.probes.Load()
	waitFor(t, 10*time.Second, "probes during the streams", func() bool { return be.probes.Load() >= from+5 })
	if !b.Healthy(time.Now()) {
		t.Error("the backend was taken out while serving its streams")
	}
	if n := e.metric(t, "sluice_backend_ejections_total", map[string]string{"reason": "probe"}); n != 0 {
		t.Errorf("taken out by probes %v times; want 0", n)
	}
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	resp.Body.Close()
	close(be.release)
	if n := wait(); n > 0 {
		t.Errorf("%d of 300 streams failed", n)
	}
	if resp.StatusCode != 200 {
		t.Errorf("a request during the streams: status %d", resp.StatusCode)
	}
	if m := be.mixed(); len(m) > 0 {
		t.Errorf("%d connections carried both probes and requests (%v)", len(m), m)
	}
}

// A probe that times out while the backend keeps streaming is excused; once
// the streams have ended, the same timeouts take the backend out.
func TestProbeTimeoutExcusedWhileStreaming(t *testing.T) {
	be := newBusyBackend()
	srv, _ := countingServer(t, be, false)
	pc := poolOf(srv.URL)
	pc.Dialect = routing.DialectNone
	pc.Health = routing.HealthConfig{Interval: 40 * time.Millisecond, Timeout: 20 * time.Millisecond, FailAfter: 2}
	e := startEdge(t, edgeOpts{pool: pc, promMetrics: true})
	b := e.pools["p"].Backends()[0]
	wait := holdBusyStreams(t, e.http, 50)
	be.slowHealth.Store(true)
	e.pools["p"].Start(t.Context())
	from := be.probes.Load()
	waitFor(t, 10*time.Second, "timed-out probes during the streams", func() bool { return be.probes.Load() >= from+6 })
	if !b.Healthy(time.Now()) {
		t.Error("probe timeouts took out a backend that is streaming")
	}
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("a request during the streams: status %d", resp.StatusCode)
	}
	if x := e.metric(t, "sluice_backend_probe_timeouts_excused_total", nil); x < 2 {
		t.Errorf("excused probe timeouts %v; want ≥ 2", x)
	}
	close(be.release)
	if n := wait(); n > 0 {
		t.Errorf("%d of 50 streams failed", n)
	}
	waitFor(t, 10*time.Second, "the idle, unresponsive backend to be taken out", func() bool { return !b.Healthy(time.Now()) })
}
