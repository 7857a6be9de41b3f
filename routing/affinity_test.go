package routing

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func prefixPool(t testing.TB, urls ...string) *Pool {
	t.Helper()
	pc := quiet(urls...)
	pc.Policy = PolicyPrefixAware
	if errs := pc.WithDefaults().Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	p, err := NewPool(pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// chat is the raw messages JSON of conversation c after turns turns, each
// turn about 600 bytes: turn k+1's JSON starts with turn k's bytes minus
// the closing bracket, as a client that appends to its history sends it.
func chat(c, turns int) []byte {
	var b strings.Builder
	b.WriteString(`[{"role":"system","content":"You are a helpful assistant."}`)
	for k := range turns {
		fmt.Fprintf(&b, `,{"role":"user","content":"conversation %d turn %d %s"}`, c, k, strings.Repeat("lorem ipsum ", 50))
	}
	b.WriteString("]")
	return []byte(b.String())
}

// pickFor acquires for prompt and ends at once, as a short request does.
func acquire(t testing.TB, p *Pool, w Want) *Backend {
	t.Helper()
	a, err := p.Acquire(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	a.End(Finished)
	return a.Backend()
}

// Under prefix_aware every turn of a conversation goes where its earlier
// turns went, while different conversations spread over the backends.
func TestPrefixAwareFollowsConversation(t *testing.T) {
	p := prefixPool(t, "http://a:1", "http://b:1", "http://c:1", "http://d:1")
	home := map[int]*Backend{}
	used := map[*Backend]bool{}
	for turn := 1; turn <= 6; turn++ {
		for c := range 40 {
			b := acquire(t, p, Want{Prompt: chat(c, turn)})
			if turn == 1 {
				home[c] = b
				used[b] = true
				continue
			}
			if b != home[c] {
				t.Fatalf("conversation %d turn %d went to %s, its earlier turns to %s", c, turn, b.label, home[c].label)
			}
		}
	}
	if len(used) != 4 {
		t.Errorf("40 conversations used %d of 4 backends", len(used))
	}
	if hits, n := p.aff.hits.Load(), p.aff.lookups.Load(); n != 240 || hits != 200 {
		t.Errorf("hits %d of %d picks; want 200 of 240 (every turn after the first)", hits, n)
	}
	if got := p.ExpectedCachedTokens(home[3], chat(3, 7)); got < 6*600/4-DefaultBlockBytes/4 {
		t.Errorf("expected cached tokens %d for turn 7; want about the 6 turns before it", got)
	}
}

// A backend whose load exceeds the least loaded one's by more than
// max_imbalance loses its affinity credit: the conversation moves rather
// than pile onto a hot backend; with the load gone it is preferred again
// (the other backend has only the newest turn, which holds the whole
// history too, so either is a hit from then on).
func TestAttackPrefixAwareDoesNotOverloadHotBackend(t *testing.T) {
	p := prefixPool(t, "http://a:1", "http://b:1")
	home := acquire(t, p, Want{Prompt: chat(1, 3)})
	// Many requests of one hot prompt pinned on home, as an attacker
	// repeating one long prompt would.
	var holds []*Attempt
	for range 3 {
		a, err := p.Acquire(context.Background(), Want{Prompt: chat(1, 3)})
		if err != nil {
			t.Fatal(err)
		}
		holds = append(holds, a)
	}
	loaded := 0
	for _, h := range holds {
		if h.Backend() == home {
			loaded++
		}
	}
	if loaded > 2 {
		t.Fatalf("%d of 3 concurrent requests on the hot backend; max_imbalance 1 allows 2", loaded)
	}
	for _, h := range holds {
		h.End(Finished)
	}
}

// The prefix table never holds more than table_size entries, with one
// million distinct prefixes recorded, and its heap stays within a bound.
func TestPrefixTableBoundedWith1MPrefixes(t *testing.T) {
	const size = 1 << 16
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	tb := newPrefixTable(size)
	id := tb.id("a:1")
	start := time.Now()
	for i := range 1_000_000 {
		tb.record(mix(uint64(i)+1), id)
	}
	elapsed := time.Since(start)
	if n := tb.len(); n > size || n < size*9/10 {
		t.Fatalf("table holds %d entries; bound %d", n, size)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if grown > 12<<20 { // ~40 B a node + map: a few MiB for 64 Ki entries
		t.Errorf("heap grew %d bytes for %d entries", grown, size)
	}
	runtime.KeepAlive(tb)
	// The most recent survive, the oldest are gone.
	if _, ok := tb.lookup(mix(1_000_000)); !ok {
		t.Error("the newest entry was evicted")
	}
	if _, ok := tb.lookup(mix(1)); ok {
		t.Error("the oldest entry survived 1M insertions")
	}
	t.Logf("1M records in %v, heap +%d KiB", elapsed, grown>>10)
}

// Affinity survives a backend's removal and a config reload: a pool
// rebuilt without one backend, inheriting the old pool's table, sends the
// conversations of the remaining backends to the same backends, and
// those of the removed one elsewhere.
func TestPrefixAffinitySurvivesRemovalAndReload(t *testing.T) {
	old := prefixPool(t, "http://a:1", "http://b:1", "http://c:1", "http://d:1")
	home := map[int]string{}
	for c := range 40 {
		home[c] = acquire(t, old, Want{Prompt: chat(c, 2)}).label
	}
	p := prefixPool(t, "http://a:1", "http://b:1", "http://d:1") // c removed, by a reload
	p.InheritAffinity(old)
	for c := range 40 {
		got := acquire(t, p, Want{Prompt: chat(c, 3)}).label
		if home[c] != "c:1" && got != home[c] {
			t.Errorf("conversation %d moved from %s to %s after the reload", c, home[c], got)
		}
	}
	// Every conversation whose backend stayed is a hit. (How many lived
	// on c:1 is up to the first placements' tie-breaks: a fixed floor
	// such as 25 of 40 failed about once in fifty runs.)
	stayed := 0
	for _, b := range home {
		if b != "c:1" {
			stayed++
		}
	}
	if h := p.aff.hits.Load(); h < int64(stayed) || stayed < 10 {
		t.Errorf("%d hits of 40 after the reload; %d conversations stayed on their backend", h, stayed)
	}
	// Without inheriting, a rebuilt pool starts cold.
	cold := prefixPool(t, "http://a:1", "http://b:1", "http://d:1")
	acquire(t, cold, Want{Prompt: chat(0, 3)})
	if cold.aff.hits.Load() != 0 {
		t.Error("a new pool had hits without inheriting a table")
	}
}

// The prefix metrics export hit and miss counts.
func TestPrefixMetrics(t *testing.T) {
	p := prefixPool(t, "http://a:1", "http://b:1")
	acquire(t, p, Want{Prompt: chat(1, 1)})
	acquire(t, p, Want{Prompt: chat(1, 2)})
	acquire(t, p, Want{Session: "t\x00s1"})
	reg := prometheus.NewRegistry()
	if err := RegisterMetrics(reg, func() []*Pool { return []*Pool{p} }); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					key += "/" + l.GetValue()
				}
			}
			got[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{"sluice_prefix_picks_total/hit": 1, "sluice_prefix_picks_total/miss": 1,
		"sluice_session_picks_total/pinned": 1, "sluice_session_picks_total/moved": 0}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v; want %v", k, got[k], v)
		}
	}
	if got["sluice_prefix_blocks_total/hit"] < 1 || got["sluice_prefix_table_entries"] < 2 {
		t.Errorf("blocks %v, entries %v", got["sluice_prefix_blocks_total/hit"], got["sluice_prefix_table_entries"])
	}
}

func TestAffinityConfigValidate(t *testing.T) {
	pc := quiet("http://a:1")
	pc.Policy = PolicyPrefixAware
	pc.Affinity = AffinityConfig{BlockBytes: 3, MaxBlocks: -1, TableSize: 1 << 30, PrefixWeight: -1}
	errs := pc.WithDefaults().Validate()
	keys := map[string]bool{}
	for _, e := range errs {
		keys[e.Key] = true
	}
	for _, k := range []string{"affinity.block_bytes", "affinity.max_blocks", "affinity.table_size", "affinity.prefix_weight"} {
		if !keys[k] {
			t.Errorf("no error for %s in %v", k, errs)
		}
	}
	if h := (PoolConfig{Policy: PolicyPrefixAware}).WithDefaults().Affinity.SessionHeader; h != "x-session-id" {
		t.Errorf("prefix_aware session header %q", h)
	}
	if h := (PoolConfig{}).WithDefaults().Affinity.SessionHeader; h != "" {
		t.Errorf("least_queued session header %q; want off", h)
	}
}

// BenchmarkPrefixAwarePick is the cost of an Acquire with a ~6 KB prompt
// (24 blocks) and a 64 KiB one (256 blocks, max_blocks) under
// prefix_aware, against least_queued's.
func BenchmarkPrefixAwarePick(b *testing.B) {
	for _, policy := range []string{PolicyLeastQueued, PolicyPrefixAware, PolicyPredictedTTFT} {
		for _, turns := range []int{10, 110} {
			prompt := chat(1, turns)
			b.Run(fmt.Sprintf("%s/%dKB", policy, len(prompt)>>10), func(b *testing.B) {
				pc := quiet("http://a:1", "http://b:1", "http://c:1", "http://d:1")
				pc.Policy = policy
				p, err := NewPool(pc)
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				b.ReportAllocs()
				for b.Loop() {
					a, _ := p.Acquire(context.Background(), Want{Prompt: prompt})
					a.End(Finished)
				}
			})
		}
	}
}

// With equal load and no prefix known, prefix_aware prefers the backend
// whose KV cache is emptier; a prefix it holds outweighs a fuller cache.
func TestPrefixAwareWeighsKVCacheUsage(t *testing.T) {
	p := prefixPool(t, "http://a:1", "http://b:1")
	a, b := p.Backends()[0], p.Backends()[1]
	now := time.Now()
	for _, s := range []struct {
		b  *Backend
		kv float64
	}{{a, 0.9}, {b, 0.1}} {
		smp := Sample{At: now, KVCache: s.kv, Source: SourceScrape, Dialect: DialectVLLM}
		s.b.scraped.Store(&smp)
	}
	for c := range 20 {
		if got := acquire(t, p, Want{Prompt: chat(c, 1)}); got != b {
			t.Fatalf("new prompt %d went to the backend with 90%% KV-cache usage", c)
		}
	}
	// A 6-turn history (~900 tokens) held by a outweighs 0.5 × 0.8.
	for _, h := range hashBlocks(nil, chat(99, 6), DefaultBlockBytes, DefaultMaxBlocks) {
		p.aff.table.record(h, a.affID)
	}
	if got := acquire(t, p, Want{Prompt: chat(99, 7)}); got != a {
		t.Error("a long cached prefix lost to a fuller KV cache")
	}
}
