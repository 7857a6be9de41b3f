package node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

const (
	key1 = "sk-test-one"
	key2 = "sk-test-two"
)

// testSim is a fast simulator's settings, flow style.
func testSim(name, model string, seed int) string {
	return fmt.Sprintf(`  - {name: %s, model: %s, max_batch: 64, step_base: 5ms, step_per_seq: 0s, prefill_base: 1ms, prefill_per_token: 0s, seed: %d}
`, name, model, seed)
}

// baseConfig is a node on free loopback ports with two simulators, one
// pool and one route; extra is appended (more pools, routes, simulators
// go in their own sections through the %s markers).
type nodeConfig struct {
	Node       string // extra node keys, flow style: "drain_delay: 1s"
	Tenants    string // the tenants section's items
	TenantsRaw string // replaces the tenants section (e.g. tenants_file)
	Sims       string
	Pools      string
	Routes     string
}

func (c nodeConfig) String() string {
	var b strings.Builder
	if !strings.Contains(c.Node, "drain_timeout") {
		c.Node = strings.TrimPrefix(c.Node+", drain_timeout: 5s", ", ")
	}
	fmt.Fprintf(&b, "node: {name: test%s}\n", prefixComma(c.Node))
	b.WriteString("listeners:\n  http: 127.0.0.1:0\n  admin: 127.0.0.1:0\n")
	if c.TenantsRaw != "" {
		b.WriteString(c.TenantsRaw)
	} else {
		b.WriteString("tenants:\n")
		if c.Tenants == "" {
			c.Tenants = tenant("t1", "max_concurrency: 100", key1)
		}
		b.WriteString(c.Tenants)
	}
	if c.Sims == "" {
		c.Sims = testSim("gpu-a", "sim-small", 1) + testSim("gpu-b", "sim-small", 2)
	}
	b.WriteString("simulators:\n" + c.Sims)
	if c.Pools == "" {
		c.Pools = "  - {name: p, backends: [{url: \"sim://gpu-a\"}]}\n"
	}
	b.WriteString("pools:\n" + c.Pools)
	if c.Routes == "" {
		c.Routes = "  - {name: main, path: /v1/, models: [sim-small], pool: p}\n"
	}
	b.WriteString("routes:\n" + c.Routes)
	return b.String()
}

func prefixComma(s string) string {
	if s == "" {
		return ""
	}
	return ", " + s
}

// tenant is a tenants list item with limits (flow style) and keys.
func tenant(id, limits string, keys ...string) string {
	hashes := make([]string, len(keys))
	for i, k := range keys {
		hashes[i] = proxy.HashKey(k)
	}
	return fmt.Sprintf("  - id: %s\n    keys: [%s]\n    limits: {%s}\n", id, strings.Join(hashes, ", "), limits)
}

// testNode is a node started from a config file in a temporary directory.
type testNode struct {
	t     testing.TB
	n     *Node
	dir   string
	file  string
	base  string // http://host:port of the proxy listener
	admin string // http://host:port of the admin listener
	logs  *logBuffer
}

func startFileNode(t testing.TB, cfg string, files ...string) *testNode {
	t.Helper()
	tn := &testNode{t: t, dir: t.TempDir(), logs: &logBuffer{}}
	tn.file = filepath.Join(tn.dir, "sluice.yaml")
	for i := 0; i+1 < len(files); i += 2 {
		tn.write(files[i], files[i+1])
	}
	tn.write("sluice.yaml", cfg)
	c, err := configs.Load(tn.file)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(tn.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n, err := Start(context.Background(), c, Options{Log: log, AccessLog: observe.NewAccessLog(tn.logs, "text")})
	if err != nil {
		t.Fatal(err)
	}
	tn.n = n
	t.Cleanup(func() {
		n.Shutdown()
		n.Close()
	})
	tn.base = "http://" + n.server.Addr(listen.ListenerHTTP)
	tn.admin = "http://" + n.server.Addr(listen.ListenerAdmin)
	return tn
}

// write replaces a file the way editors do: a new file renamed over it.
func (tn *testNode) write(name, text string) {
	tn.t.Helper()
	tmp := filepath.Join(tn.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		tn.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(tn.dir, name)); err != nil {
		tn.t.Fatal(err)
	}
}

// postReload asks the admin listener to reload.
func (tn *testNode) postReload() (int, Result) {
	tn.t.Helper()
	resp, err := http.Post(tn.admin+"/-/reload", "", nil)
	if err != nil {
		tn.t.Fatal(err)
	}
	defer resp.Body.Close()
	var res Result
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		tn.t.Fatalf("reload answer: %v", err)
	}
	return resp.StatusCode, res
}

func (tn *testNode) debugConfig() configStatus {
	tn.t.Helper()
	var cs configStatus
	body := tn.get(tn.admin + "/debug/config")
	if err := json.Unmarshal([]byte(body), &cs); err != nil {
		tn.t.Fatalf("/debug/config: %v: %s", err, body)
	}
	return cs
}

func (tn *testNode) get(url string) string {
	tn.t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tn.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		tn.t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	return string(b)
}

// streamResult is how one streamed request ended.
type streamResult struct {
	status int
	done   bool   // ended with [DONE]
	last   string // the last event's data (an error event's body)
	header http.Header
	err    error
}

// stream posts a streamed chat request and reads it to the end.
func stream(ctx context.Context, base, key, model string, maxTokens int) streamResult {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}`, model, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return streamResult{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return streamResult{err: err}
	}
	defer resp.Body.Close()
	r := streamResult{status: resp.StatusCode, header: resp.Header}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			if data == "[DONE]" {
				r.done = true
			} else {
				r.last = data
			}
		}
		if err != nil {
			if err != io.EOF {
				r.err = err
			}
			return r
		}
	}
}

// startStream starts a stream and returns once its headers arrived, with
// a channel for its end.
func startStream(t *testing.T, base, key string, maxTokens int) <-chan streamResult {
	t.Helper()
	out := make(chan streamResult, 1)
	go func() { out <- stream(context.Background(), base, key, "sim-small", maxTokens) }()
	return out
}

// waitFor checks cond every 10ms until it holds or d passes: for states
// that have no event to wait on (streams in flight, goroutines ended). It
// asserts nothing about the time taken.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

// logBuffer collects a node's log.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func configsVersion(text string) string { return configs.Version([]byte(text)) }

// simRunning is how many sequences a running simulator decodes now.
func (n *Node) simRunning(name string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s, ok := n.sims[name]; ok {
		return s.sim.Stats().Running
	}
	return 0
}

// pool is the active pool named name, as an opaque value for identity.
func (n *Node) pool(name string) any {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pools.pools[name]
}

// attempts returns a channel that receives every reload attempt from now
// on (whatever triggered it), for waiting on the file watcher.
func (tn *testNode) attempts() <-chan Result {
	ch := make(chan Result, 64)
	s := &tn.n.status
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onAttempt = func(r Result) {
		select {
		case ch <- r:
		default: // the test stopped listening
		}
	}
	return ch
}

// waitAttempt waits up to 10s for an attempt that matches want.
func waitAttempt(t *testing.T, ch <-chan Result, what string, want func(Result) bool) Result {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case r := <-ch:
			if want(r) {
				return r
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
