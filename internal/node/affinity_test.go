package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/internal/gpusim"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// affinitySims are three fast simulators with prefix caches.
func affinitySims() string {
	var b strings.Builder
	for i, name := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		fmt.Fprintf(&b, "  - {name: %s, model: sim-small, max_batch: 64, step_base: 2ms, step_per_seq: 0s, prefill_base: 1ms, prefill_per_token: 0s, seed: %d, prefix_cache_blocks: 100000}\n", name, i+1)
	}
	return b.String()
}

// askTurn sends conversation c's turn (non-streamed) and returns which
// of the node's simulators served it and the cached tokens it reported.
func (tn *testNode) askTurn(t *testing.T, c, turns int) (string, int) {
	t.Helper()
	before := map[string]int{}
	for _, s := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		before[s] = tn.n.simTotal(s)
	}
	cached := tn.askTurnAny(t, c, turns)
	for _, s := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		if tn.n.simTotal(s) > before[s] {
			return s, cached
		}
	}
	t.Fatal("no simulator served the request")
	return "", 0
}

// askTurnAny sends conversation c's turn (non-streamed) and returns the
// cached tokens the backend reported.
func (tn *testNode) askTurnAny(t *testing.T, c, turns int) int {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"model":"sim-small","max_tokens":1,"messages":[{"role":"system","content":"Be brief."}`)
	for k := range turns {
		fmt.Fprintf(&b, `,{"role":"user","content":"conversation %d turn %d %s"}`, c, k, strings.Repeat("some history ", 40))
	}
	b.WriteString("]}")
	req, _ := http.NewRequest(http.MethodPost, tn.base+"/v1/chat/completions", strings.NewReader(b.String()))
	req.Header.Set("Authorization", "Bearer "+key1)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out.Usage.Details.Cached
}

func (n *Node) simTotal(name string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s, ok := n.sims[name]; ok {
		return s.sim.Stats().Total
	}
	return 0
}

// prefix_aware affinity survives a config reload that removes a backend
// (the pool is rebuilt and inherits the prefix table): every conversation
// whose backend remains goes back to it and finds its history cached
// there; those of the removed backend move.
func TestPrefixAffinitySurvivesReloadRemovingBackend(t *testing.T) {
	pools := func(backends ...string) string {
		var urls []string
		for _, b := range backends {
			urls = append(urls, fmt.Sprintf("{url: \"sim://%s\"}", b))
		}
		return fmt.Sprintf("  - {name: p, policy: prefix_aware, dialect: none, backends: [%s]}\n", strings.Join(urls, ", "))
	}
	cfg := nodeConfig{Sims: affinitySims(), Pools: pools("gpu-a", "gpu-b", "gpu-c")}
	tn := startFileNode(t, cfg.String())
	// A new conversation's first turn finds no prefix anywhere: the three
	// idle backends tie and a random one serves it. Twelve fixed
	// conversations all missed gpu-c about once in 130 runs ((2/3)^12),
	// leaving nothing to move; so conversations are started until at
	// least one lives on gpu-c and at least 12 elsewhere (bounded: 64
	// miss gpu-c with probability (2/3)^64, about 5e-12).
	home := map[int]string{}
	onC, convs := 0, 0
	for convs < 64 && (onC == 0 || convs-onC < 12) {
		home[convs], _ = tn.askTurn(t, convs, 1)
		if home[convs] == "gpu-c" {
			onC++
		}
		convs++
	}
	for c := range convs {
		if s, cached := tn.askTurn(t, c, 2); s != home[c] || cached == 0 {
			t.Fatalf("conversation %d turn 2 on %s (cached %d); turn 1 on %s", c, s, cached, home[c])
		}
	}
	oldPool := tn.n.pool("p")
	cfg.Pools = pools("gpu-a", "gpu-b")
	tn.write("sluice.yaml", cfg.String())
	if code, res := tn.postReload(); code != http.StatusOK {
		t.Fatalf("reload: %d %+v", code, res)
	}
	if tn.n.pool("p") == oldPool {
		t.Fatal("the reload kept the pool; it must rebuild it without gpu-c")
	}
	kept, moved := 0, 0
	for c := range convs {
		s, cached := tn.askTurn(t, c, 3)
		switch {
		case home[c] == "gpu-c":
			moved++
			if s == "gpu-c" {
				t.Fatalf("conversation %d still sent to the removed backend", c)
			}
		case s != home[c] || cached == 0:
			t.Errorf("conversation %d moved from %s to %s after the reload (cached %d)", c, home[c], s, cached)
		default:
			kept++
		}
	}
	if kept == 0 || moved == 0 {
		t.Errorf("kept %d, moved %d: the %d conversations did not cover all three backends", kept, moved, convs)
	}
}

// Two edge nodes with affinity.share and the same real Redis: the
// conversations node A served go, from node B, to the same backends (B's
// own table never saw them), where the engines find their histories
// cached. A pool with affinity.share and no redis section is refused.
func TestPrefixAffinitySharedAcrossNodes(t *testing.T) {
	srv := redistest.Start(t)
	var sims []*gpusim.Sim
	var urls []string
	for i := range 3 {
		sim := gpusim.New(gpusim.Config{MaxBatch: 64, StepBase: 2 * time.Millisecond, StepPerSeq: -1,
			PrefillBase: time.Millisecond, PrefillPerToken: -1, Seed: int64(i + 1), PrefixCacheBlocks: 100000})
		hs := httptest.NewServer(sim)
		t.Cleanup(func() { hs.Close(); sim.Close() })
		sims, urls = append(sims, sim), append(urls, fmt.Sprintf("{url: %q}", hs.URL))
	}
	cfg := nodeConfig{Pools: fmt.Sprintf("  - {name: p, policy: prefix_aware, dialect: none, affinity: {share: true, share_timeout: 100ms}, backends: [%s]}\n",
		strings.Join(urls, ", "))}.String()
	if _, err := Start(context.Background(), mustParse(t, cfg), Options{}); err == nil || !strings.Contains(err.Error(), "affinity.share needs the redis section") {
		t.Fatalf("a shared pool without redis started: %v", err)
	}
	cfg += fmt.Sprintf("redis:\n  addrs: [%q]\n", srv.Addr())
	a, b := startFileNode(t, cfg), startFileNode(t, cfg)
	served := func() []int {
		var out []int
		for _, s := range sims {
			out = append(out, s.Stats().Total)
		}
		return out
	}
	which := func(before []int) int {
		for i, n := range served() {
			if n > before[i] {
				return i
			}
		}
		t.Fatal("no backend served the request")
		return -1
	}
	home := map[int]int{}
	for c := range 12 {
		before := served()
		a.askTurnAny(t, c, 2)
		home[c] = which(before)
	}
	// A's writes to Redis are asynchronous (batched): wait for them.
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rc.Close()
	waitFor(t, 5*time.Second, "node A's writes in Redis", func() bool {
		keys, err := rc.Keys(context.Background(), "sluice:affinity:{p}:*").Result()
		return err == nil && len(keys) >= 12*2 // at least the 2 blocks of each turn 1
	})
	for c := range 12 {
		before := served()
		cached := b.askTurnAny(t, c, 3)
		if got := which(before); got != home[c] || cached == 0 {
			t.Errorf("conversation %d: node B sent turn 3 to backend %d (cached %d), node A turn 2 to %d", c, got, cached, home[c])
		}
	}
}

func mustParse(t *testing.T, text string) *configs.Config {
	t.Helper()
	c, err := configs.Parse("sluice.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
