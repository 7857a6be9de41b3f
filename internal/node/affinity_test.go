package node

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
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
// simulator served it and the cached tokens it reported.
func (tn *testNode) askTurn(t *testing.T, c, turns int) (string, int) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"model":"sim-small","max_tokens":1,"messages":[{"role":"system","content":"Be brief."}`)
	for k := range turns {
		fmt.Fprintf(&b, `,{"role":"user","content":"conversation %d turn %d %s"}`, c, k, strings.Repeat("some history ", 40))
	}
	b.WriteString("]}")
	before := map[string]int{}
	for _, s := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		before[s] = tn.n.simTotal(s)
	}
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
	for _, s := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		if tn.n.simTotal(s) > before[s] {
			return s, out.Usage.Details.Cached
		}
	}
	t.Fatal("no simulator served the request")
	return "", 0
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
	home := map[int]string{}
	for c := range 12 {
		home[c], _ = tn.askTurn(t, c, 1)
	}
	for c := range 12 {
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
	for c := range 12 {
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
		t.Errorf("kept %d, moved %d: the 12 conversations did not cover all three backends", kept, moved)
	}
}
