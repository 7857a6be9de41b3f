package gpusim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// conversation renders a chat body of turns user/assistant messages of
// size characters each, the same for a given turn count (a conversation
// that grows turn by turn).
func conversation(turns, size int, stream bool) string {
	var msgs []map[string]string
	for i := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": strings.Repeat(string(rune('a'+i%26)), size)})
	}
	body := map[string]any{"model": "sim-small", "messages": msgs, "max_tokens": 2, "stream": stream}
	if stream {
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	return string(b)
}

type usageOut struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func askUsage(t *testing.T, url, body string) (usageOut, time.Duration) {
	t.Helper()
	start := time.Now()
	resp := post(t, context.Background(), url, "/v1/chat/completions", body)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var out struct {
		Usage usageOut `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out.Usage, time.Since(start)
}

// A growing conversation's earlier turns come from the prefix cache: the
// second request reports them as cached_tokens (whole blocks only), its
// prefill is shorter by their cost, and vllm:prefix_cache_queries_total /
// vllm:prefix_cache_hits_total count the tokens.
func TestPrefixCacheSkipsCachedBlocks(t *testing.T) {
	cfg := fast()
	cfg.PrefillPerToken = 200 * time.Microsecond
	cfg.PrefixCacheBlocks = 1000
	s, url := startSim(t, cfg)

	first, d1 := askUsage(t, url, conversation(4, 400, false))
	if first.PromptTokensDetails == nil || first.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first request: details %+v, want cached_tokens 0", first.PromptTokensDetails)
	}
	second, d2 := askUsage(t, url, conversation(6, 400, false))
	c := second.PromptTokensDetails.CachedTokens
	if c < first.PromptTokens-2*cfg.PrefixBlockTokens || c > first.PromptTokens || c%16 != 0 {
		t.Fatalf("second request cached %d tokens; the first had %d prompt tokens (blocks of 16)", c, first.PromptTokens)
	}
	// The second prompt is 1.5× longer but most of it is cached.
	if d2 >= d1 {
		t.Errorf("cached request took %v, uncached %v", d2, d1)
	}
	q := counterValue(t, s.metrics.prefixQueries)
	h := counterValue(t, s.metrics.prefixHits)
	if q != float64(first.PromptTokens+second.PromptTokens) || h != float64(c) {
		t.Errorf("queries %v hits %v, want %d and %d", q, h, first.PromptTokens+second.PromptTokens, c)
	}
	resp := post(t, context.Background(), url, "/metrics", "")
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"} {
		if !strings.Contains(string(text), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// The streamed usage chunk carries cached_tokens too, in the pacer mode as
// in the batch scheduler; without a prefix cache there are no details.
func TestPrefixCacheStreamUsage(t *testing.T) {
	for _, pace := range []time.Duration{0, time.Millisecond} {
		cfg := fast()
		cfg.Pace = pace
		cfg.PrefixCacheBlocks = 100
		_, url := startSim(t, cfg)
		for i, want := range []bool{false, true} {
			resp := post(t, context.Background(), url, "/v1/chat/completions", conversation(2, 200, true))
			evs, done, err := readEvents(t, resp.Body)
			resp.Body.Close()
			if err != nil || !done {
				t.Fatalf("pace %v: stream ended early: %v", pace, err)
			}
			last := evs[len(evs)-1].data
			if got := strings.Contains(last, `"prompt_tokens_details":{"cached_tokens":96}`); got != want {
				t.Errorf("pace %v request %d: usage chunk %s", pace, i, last)
			}
		}
	}
	_, url := startSim(t, fast())
	u, _ := askUsage(t, url, conversation(2, 200, false))
	if u.PromptTokensDetails != nil {
		t.Errorf("no prefix cache: details %+v", u.PromptTokensDetails)
	}
}

// The cache holds at most PrefixCacheBlocks blocks, evicting the least
// recently used.
func TestPrefixCacheBounded(t *testing.T) {
	c := newPrefixCache(64)
	for i := range 10000 {
		c.admit([]uint64{uint64(i), uint64(i) << 20})
	}
	if c.len() != 64 {
		t.Fatalf("cache holds %d blocks, capacity 64", c.len())
	}
	hot := []uint64{1 << 40, 2 << 40}
	c.admit(hot)
	for i := range 31 {
		c.admit([]uint64{uint64(i + 1<<30)})
		if c.admit(hot) != 2 { // touched each time: never evicted
			t.Fatal("recently used blocks evicted")
		}
	}
	// Chained hashes: a different first block changes every later hash.
	a := blockHashes(strings.Repeat("x", 128)+strings.Repeat("y", 64), 64)
	b := blockHashes(strings.Repeat("z", 64)+strings.Repeat("x", 64)+strings.Repeat("y", 64), 64)
	if len(a) != 3 || a[2] == b[2] || a[1] == b[1] {
		t.Errorf("block hashes do not chain: %x %x", a, b)
	}
}
