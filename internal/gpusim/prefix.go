package gpusim

import (
	"container/list"
	"sync"
)

// The simulated prefix cache follows vLLM v0.11's automatic prefix caching
// (vllm/v1/core/kv_cache_utils.py, hash_block_tokens; block_pool.py): the
// prompt is cut into full blocks of PrefixBlockTokens tokens, block k's
// hash covers blocks 0..k (it chains the previous block's hash, as vLLM's
// hash of (parent_block_hash, block token ids)), a partial last block is
// never cached, and freed blocks are evicted least recently used first.
// A request's cached prefix is its leading run of blocks found in the
// cache; its prefill costs only the tokens after that run (at least one
// token is always computed, as vLLM recomputes the last prompt token).
// The simulator tokenizes at about four characters a token, so a block is
// 4 × PrefixBlockTokens characters of the prompt text.

// blockHashes returns the chained hashes of text's full blocks of
// blockChars bytes (FNV-1a 64 over the parent hash and the block's bytes).
func blockHashes(text string, blockChars int) []uint64 {
	if blockChars <= 0 || len(text) < blockChars {
		return nil
	}
	out := make([]uint64, 0, len(text)/blockChars)
	parent := uint64(0) // the first block's parent (vLLM's NONE_HASH)
	for at := 0; at+blockChars <= len(text); at += blockChars {
		h := uint64(14695981039346656037)
		for i := range 8 { // the parent's hash first
			h ^= (parent >> (8 * i)) & 0xff
			h *= 1099511628211
		}
		for i := at; i < at+blockChars; i++ {
			h ^= uint64(text[i])
			h *= 1099511628211
		}
		out = append(out, h)
		parent = h
	}
	return out
}

// prefixCache is one Sim's cache of prompt blocks: an LRU of at most
// capacity block hashes. It is safe for simultaneous use.
type prefixCache struct {
	mu       sync.Mutex
	capacity int
	lru      *list.List // of uint64, most recent at the front
	index    map[uint64]*list.Element
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, lru: list.New(), index: make(map[uint64]*list.Element, capacity)}
}

// admit looks up blocks (a prompt's chained block hashes) and returns how
// many leading ones were cached; then it caches all of them as the most
// recently used, evicting the least recently used beyond capacity.
func (c *prefixCache) admit(blocks []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	hits, run := 0, true
	for _, h := range blocks {
		if e, ok := c.index[h]; ok {
			if run {
				hits++
			}
			c.lru.MoveToFront(e)
			continue
		}
		run = false
		c.index[h] = c.lru.PushFront(h)
	}
	for c.lru.Len() > c.capacity {
		e := c.lru.Back()
		c.lru.Remove(e)
		delete(c.index, e.Value.(uint64))
	}
	return hits
}

// len is the number of cached blocks.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// cachedTokens runs the prefix cache for a prompt of prompt tokens whose
// blocks are blocks, counts vLLM's prefix cache queries and hits (in
// tokens, as vLLM does) and returns the tokens whose prefill is skipped.
// Without a cache it returns 0.
func (s *Sim) cachedTokens(prompt int, blocks []uint64) int {
	if s.prefix == nil {
		return 0
	}
	hit := s.prefix.admit(blocks) * s.cfg.PrefixBlockTokens
	hit = max(min(hit, prompt-1), 0)
	s.metrics.prefixQueries.Add(float64(prompt))
	s.metrics.prefixHits.Add(float64(hit))
	return hit
}
