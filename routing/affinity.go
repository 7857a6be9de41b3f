package routing

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// PolicyPrefixAware picks the backend most likely to hold the request's
// prompt prefix in its KV cache, traded against its load (see
// AffinityConfig).
const PolicyPrefixAware = "prefix_aware"

// AffinityConfig configures prefix-cache affinity (policy prefix_aware)
// and session affinity (any policy) of a pool.
//
// prefix_aware scores every candidate backend c as
//
//	cost(c) = load_weight × score(c) + kv_weight × kv(c) − prefix_weight × saved(c) / 1000
//
// and picks the lowest: score is least_queued's load score ((running +
// waiting + waiting) per batch slot), kv the engine's KV-cache usage (0
// when unknown), saved(c) the prompt tokens c is
// expected to find cached (the leading prompt blocks this node, or the
// fleet through Redis, last sent to c, at about four bytes a token). A
// backend whose score exceeds the least loaded candidate's by more than
// max_imbalance gets no prefix (or session) credit, so affinity never
// piles requests on a hot backend.
type AffinityConfig struct {
	// BlockBytes is the size of a prompt block, in bytes of the raw
	// prompt JSON. Default 256 (about 64 tokens).
	BlockBytes int `yaml:"block_bytes"`
	// MaxBlocks is how many leading blocks of a prompt are hashed.
	// Default 256 (64 KiB of prompt).
	MaxBlocks int `yaml:"max_blocks"`
	// TableSize bounds the block hashes remembered per pool (least
	// recently used evicted first; about 60 bytes each). Default 262144.
	TableSize int `yaml:"table_size"`
	// PrefixWeight is the load-score units one thousand cached prompt
	// tokens are worth. Default 1.
	PrefixWeight float64 `yaml:"prefix_weight"`
	// LoadWeight scales the load score. Default 1.
	LoadWeight float64 `yaml:"load_weight"`
	// KVWeight scales the engine's KV-cache usage (0 to 1): a backend
	// whose cache is nearly full evicts the prefixes it holds and admits
	// new sequences late. Default 0.5.
	KVWeight float64 `yaml:"kv_weight"`
	// MaxImbalance is the load-score margin over the least loaded
	// candidate beyond which a backend gets no affinity credit. Default 1
	// (one batch's worth of requests per slot; with max_batch unknown, one
	// request: set it higher there).
	MaxImbalance float64 `yaml:"max_imbalance"`
	// SessionHeader names the request header whose value (with the
	// tenant) pins a session to a backend by rendezvous hashing. Empty
	// turns session affinity off; policy prefix_aware defaults it to
	// "x-session-id".
	SessionHeader string `yaml:"session_header"`
	// Share shares the prefix table across the edge nodes through the
	// node's Redis (the redis section must be set); see SharedAffinity.
	// Default false: the table is per node.
	Share bool `yaml:"share"`
	// ShareTimeout bounds the Redis lookup a pick may wait for. Default
	// 5ms.
	ShareTimeout time.Duration `yaml:"share_timeout"`
	// ShareTTL is how long the fleet remembers a block after its last
	// use. Default 10m.
	ShareTTL time.Duration `yaml:"share_ttl"`
}

// Defaults of AffinityConfig.
const (
	DefaultBlockBytes    = 256
	DefaultMaxBlocks     = 256
	DefaultTableSize     = 1 << 18
	DefaultSessionHeader = "x-session-id"
)

// WithDefaults returns c with zero fields set to their defaults; policy is
// the pool's.
func (c AffinityConfig) WithDefaults(policy string) AffinityConfig {
	if c.BlockBytes == 0 {
		c.BlockBytes = DefaultBlockBytes
	}
	if c.MaxBlocks == 0 {
		c.MaxBlocks = DefaultMaxBlocks
	}
	if c.TableSize == 0 {
		c.TableSize = DefaultTableSize
	}
	if c.PrefixWeight == 0 {
		c.PrefixWeight = 1
	}
	if c.LoadWeight == 0 {
		c.LoadWeight = 1
	}
	if c.KVWeight == 0 {
		c.KVWeight = 0.5
	}
	if c.MaxImbalance == 0 {
		c.MaxImbalance = 1
	}
	if c.ShareTimeout == 0 {
		c.ShareTimeout = 5 * time.Millisecond
	}
	if c.ShareTTL == 0 {
		c.ShareTTL = 10 * time.Minute
	}
	if c.SessionHeader == "" && policy == PolicyPrefixAware {
		c.SessionHeader = DefaultSessionHeader
	}
	return c
}

func (c AffinityConfig) validate() []FieldError {
	var errs []FieldError
	bad := func(key, msg string) {
		errs = append(errs, FieldError{Key: "affinity." + key, Msg: "affinity." + key + " " + msg})
	}
	if c.BlockBytes < 16 || c.BlockBytes > 1<<16 {
		bad("block_bytes", "must be from 16 to 65536")
	}
	if c.MaxBlocks < 1 || c.MaxBlocks > 1<<14 {
		bad("max_blocks", "must be from 1 to 16384")
	}
	if c.TableSize < 16 || c.TableSize > 1<<26 {
		bad("table_size", "must be from 16 to 67108864")
	}
	if c.ShareTimeout < 0 || c.ShareTimeout > time.Second {
		bad("share_timeout", "must be from 0 to 1s (a pick waits for it)")
	}
	if c.ShareTTL < time.Second {
		bad("share_ttl", "must be at least 1s")
	}
	for _, w := range []struct {
		k string
		v float64
	}{{"prefix_weight", c.PrefixWeight}, {"load_weight", c.LoadWeight}, {"kv_weight", c.KVWeight}, {"max_imbalance", c.MaxImbalance}} {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			bad(w.k, "must be a finite number, not negative")
		}
	}
	return errs
}

// affinity is a pool's affinity state: the prefix table (prefix_aware
// only) and the counters of its metrics.
type affinity struct {
	cfg    AffinityConfig
	prefix bool // policy prefix_aware
	table  *prefixTable
	shared *sharedTable // the fleet's table through Redis; nil: per node
	blocks sync.Pool    // *[]uint64 scratch

	lookups, hits               atomic.Int64 // prefix picks with a prompt; those on a backend with cached blocks
	blocksAsked, blocksHit      atomic.Int64 // prompt blocks; of them expected cached on the chosen backend
	sessionPinned, sessionMoved atomic.Int64
}

func newAffinity(cfg PoolConfig) *affinity {
	a := &affinity{cfg: cfg.Affinity, prefix: cfg.Policy == PolicyPrefixAware}
	if a.prefix || cfg.Policy == PolicyPredictedTTFT { // predicted_ttft: for the expected cached tokens
		a.table = newPrefixTable(a.cfg.TableSize)
	}
	n := a.cfg.MaxBlocks
	a.blocks.New = func() any { s := make([]uint64, 0, n); return &s }
	return a
}

// SessionHeader is the request header that carries the session key for
// session affinity, "" when it is off.
func (p *Pool) SessionHeader() string { return p.aff.cfg.SessionHeader }

// InheritAffinity makes p use old's prefix table when both pools are
// prefix_aware with the same block size, so that the affinity learned
// survives a config reload that rebuilds the pool (backends that remain
// keep their entries; removed ones never match again). Call it before p
// serves requests.
func (p *Pool) InheritAffinity(old *Pool) {
	if old == nil || p.aff.table == nil || old.aff.table == nil || old.aff.cfg.BlockBytes != p.aff.cfg.BlockBytes {
		return
	}
	p.aff.table = old.aff.table
	p.bindAffinity()
}

// bindAffinity gives every backend its id in the prefix table and its
// rendezvous hash.
func (p *Pool) bindAffinity() {
	for _, b := range p.backends {
		b.hrw = hashString(b.label)
		if p.aff.table != nil {
			b.affID = p.aff.table.id(b.label)
		}
	}
}

// choose picks among cands (healthy, under cap, untried, two or more):
// the session's backend when the request has a session and it is not
// overloaded (under every policy, predicted_ttft too); else, under
// predicted_ttft the lowest predicted TTFT, under prefix_aware with a
// prompt the lowest cost
// (see AffinityConfig); else the pool's selector. The chosen backend is
// recorded for the prompt's blocks.
func (p *Pool) choose(cands []*Backend, now time.Time, want *Want) *Backend {
	a := p.aff
	if want != nil && p.cfg.Policy == PolicyPredictedTTFT && want.Session == "" {
		return p.chooseTTFT(cands, now, want)
	}
	if want == nil || (want.Session == "" && (!a.prefix || len(want.Prompt) == 0)) {
		return p.sel.Select(cands, now)
	}
	var scores, kvs [16]float64
	sc, kv := scores[:0], kvs[:0]
	if len(cands) > len(scores) {
		sc, kv = make([]float64, 0, len(cands)), make([]float64, 0, len(cands))
	}
	least := math.Inf(1)
	for _, c := range cands {
		l := c.Load(now)
		s := l.score(c)
		sc, kv = append(sc, s), append(kv, max(l.KVCache, 0))
		least = min(least, s)
	}
	limit := least + a.cfg.MaxImbalance
	if want.Session != "" {
		// The session's backend is the first of its rendezvous order
		// among the candidates: its own while that one is available, else
		// the same second choice on every node.
		if b, i := sessionBackend(cands, want.Session); b != nil && sc[i] <= limit {
			if top, _ := sessionBackend(p.backends, want.Session); top == b {
				a.sessionPinned.Add(1)
			} else {
				a.sessionMoved.Add(1)
			}
			return b
		}
		a.sessionMoved.Add(1)
	}
	if p.cfg.Policy == PolicyPredictedTTFT { // a session that could not stay
		return p.chooseTTFT(cands, now, want)
	}
	if !a.prefix || len(want.Prompt) == 0 {
		return p.sel.Select(cands, now)
	}
	bp := a.blocks.Get().(*[]uint64)
	defer a.blocks.Put(bp)
	blocks := hashBlocks((*bp)[:0], want.Prompt, a.cfg.BlockBytes, a.cfg.MaxBlocks)
	*bp = blocks
	var matched [16]int
	m := matched[:0]
	if len(cands) > len(matched) {
		m = make([]int, 0, len(cands))
	}
	m = m[:len(cands)]
	table := a.table
	var front [256]uint16 // the most recent backend of each known block (the first 256)
	known := a.matchBlocks(blocks, cands, m, &front)
	if a.shared != nil {
		a.shared.lookup(table, cands, blocks, known, m)
	}
	tokensPerBlock := float64(a.cfg.BlockBytes) / 4
	best, bestCost := -1, math.Inf(1)
	off := rand.IntN(len(cands)) // ties go to a random candidate, then the fewest in flight
	for j := range cands {
		i := (j + off) % len(cands)
		saved := 0.0
		if sc[i] <= limit {
			saved = float64(m[i]) * tokensPerBlock
		}
		cost := a.cfg.LoadWeight*sc[i] + a.cfg.KVWeight*kv[i] - a.cfg.PrefixWeight*saved/1000
		if cost < bestCost || (cost == bestCost && cands[i].InFlight() < cands[best].InFlight()) {
			best, bestCost = i, cost
		}
	}
	b := cands[best]
	a.lookups.Add(1)
	a.blocksAsked.Add(int64(len(blocks)))
	if m[best] > 0 && sc[best] <= limit {
		a.hits.Add(1)
		a.blocksHit.Add(int64(m[best]))
	}
	a.recordBlocks(blocks, known, &front, b)
	if a.shared != nil {
		a.shared.publish(b, blocks[m[best]:]) // what the fleet may not know yet
	}
	return b
}

// matchBlocks looks the prompt's blocks up in the table, in order until
// one is unknown (a later block was never sent anywhere either): m[i] is
// how many leading blocks cands[i] recently served, front[k] the most
// recent backend of block k (the first 256). It returns how many leading
// blocks the table knows.
func (a *affinity) matchBlocks(blocks []uint64, cands []*Backend, m []int, front *[256]uint16) (known int) {
	for k, h := range blocks {
		who, ok := a.table.lookup(h)
		if !ok {
			break
		}
		known = k + 1
		if k < len(front) {
			front[k] = who[0]
		}
		for _, id := range who {
			if id == 0 {
				break
			}
			for i, c := range cands {
				if c.affID == id {
					m[i] = k + 1
				}
			}
		}
	}
	return known
}

// recordBlocks records b as the most recent backend of every block but
// the known ones already b's first (matchBlocks touched those).
func (a *affinity) recordBlocks(blocks []uint64, known int, front *[256]uint16, b *Backend) {
	for k, h := range blocks {
		if k < known && k < len(front) && front[k] == b.affID && front[k] != 0 {
			continue
		}
		a.table.record(h, b.affID)
	}
}

// ExpectedCachedTokens estimates how many of prompt's tokens b holds in
// its prefix cache, by this pool's prefix table (0 without prefix_aware).
// It is the hook for a TTFT prediction: prefill(prompt − expected cached).
func (p *Pool) ExpectedCachedTokens(b *Backend, prompt []byte) int {
	a := p.aff
	if a.table == nil || b.affID == 0 {
		return 0
	}
	bp := a.blocks.Get().(*[]uint64)
	defer a.blocks.Put(bp)
	blocks := hashBlocks((*bp)[:0], prompt, a.cfg.BlockBytes, a.cfg.MaxBlocks)
	*bp = blocks
	n := 0
	for k, h := range blocks {
		who, ok := a.table.lookup(h)
		if !ok {
			break
		}
		for _, id := range who {
			if id == b.affID {
				n = k + 1
			}
		}
	}
	return n * a.cfg.BlockBytes / 4
}
