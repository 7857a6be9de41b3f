package routing

import (
	"encoding/binary"
	"math/bits"
	"sync"
)

// Prefix hashing follows vLLM v0.11's automatic prefix caching
// (vllm/v1/core/kv_cache_utils.py, hash_block_tokens): the prompt is cut
// into full blocks, and block k's hash is the hash of (block k-1's hash,
// block k's contents), so it stands for blocks 0..k and two prompts share
// block k's hash only when they share their first k+1 blocks. The edge has
// no tokenizer: its blocks are BlockBytes bytes of the request's raw
// prompt JSON (the messages, prompt or input value as the client sent it),
// which for a conversation that grows turn by turn is a growing byte
// prefix. A partial last block is not hashed, as in vLLM. The hash is a
// fixed 64-bit function (no per-process seed), so that every node of a
// fleet computes the same hashes and can share a table through Redis.

// hashBlocks appends to dst the chained hashes of prompt's full blocks of
// size bytes, at most max of them, and returns it.
func hashBlocks(dst []uint64, prompt []byte, size, limit int) []uint64 {
	if size <= 0 {
		return dst
	}
	parent := uint64(0x9e3779b97f4a7c15) // the first block's parent (vLLM's NONE_HASH)
	for at := 0; at+size <= len(prompt) && len(dst) < limit; at += size {
		h := parent ^ uint64(size)*0xbf58476d1ce4e5b9
		b := prompt[at : at+size]
		for len(b) >= 8 {
			h = mix(h ^ binary.LittleEndian.Uint64(b))
			b = b[8:]
		}
		for _, c := range b {
			h = mix(h ^ uint64(c))
		}
		parent = mix(h ^ parent)
		dst = append(dst, parent)
	}
	return dst
}

// mix is a 64-bit mixing step (multiply, rotate, xor-shift).
func mix(h uint64) uint64 {
	h *= 0x94d049bb133111eb
	h = bits.RotateLeft64(h, 31)
	return h ^ h>>29
}

// prefixTable remembers, for recently seen block hashes, which backends
// served a prompt containing that block (at most tableWays of them, most
// recent first). It is bounded: at most size entries, the least recently
// used evicted first, in tableShards shards with a lock each. Backends
// are known by a small id interned from their label (host and path), so a
// table outlives a config reload that rebuilds the pool, and an entry for
// a removed backend simply never matches. Safe for simultaneous use.
type prefixTable struct {
	shards [tableShards]tableShard

	idMu sync.Mutex
	ids  map[string]uint16
}

const (
	tableShards = 16
	tableWays   = 4
	// maxBackendIDs bounds the interned backend labels.
	maxBackendIDs = 1<<16 - 1
)

// tableShard is an LRU of entries in a preallocated-on-demand slice,
// linked by index (no pointers for the collector to scan).
type tableShard struct {
	mu         sync.Mutex
	index      map[uint64]int32
	nodes      []tableNode
	cap        int
	head, tail int32 // most and least recently used; -1 when empty
}

type tableNode struct {
	key        uint64
	who        [tableWays]uint16 // backend ids, most recent first; 0 empty
	prev, next int32
}

func newPrefixTable(size int) *prefixTable {
	t := &prefixTable{ids: map[string]uint16{}}
	per := max((size+tableShards-1)/tableShards, 1)
	for i := range t.shards {
		s := &t.shards[i]
		s.cap, s.head, s.tail = per, -1, -1
		s.index = make(map[uint64]int32, min(per, 1024))
	}
	return t
}

// id interns a backend label; 0 when the table has seen too many.
func (t *prefixTable) id(label string) uint16 {
	t.idMu.Lock()
	defer t.idMu.Unlock()
	if id, ok := t.ids[label]; ok {
		return id
	}
	if len(t.ids) >= maxBackendIDs {
		return 0
	}
	id := uint16(len(t.ids) + 1)
	t.ids[label] = id
	return id
}

func (t *prefixTable) shard(h uint64) *tableShard { return &t.shards[h>>60] }

// lookup returns the backends recorded for h (zeros for none) and marks
// the entry recently used.
func (t *prefixTable) lookup(h uint64) (who [tableWays]uint16, ok bool) {
	s := t.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.index[h]
	if !ok {
		return who, false
	}
	s.touch(i)
	return s.nodes[i].who, true
}

// record notes that backend id served a prompt with block hash h.
func (t *prefixTable) record(h uint64, id uint16) {
	if id == 0 {
		return
	}
	s := t.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.index[h]
	if !ok {
		i = s.alloc(h)
	} else {
		s.touch(i)
	}
	w := &s.nodes[i].who
	j := 0
	for j < tableWays-1 && w[j] != id && w[j] != 0 {
		j++
	}
	copy(w[1:j+1], w[:j]) // id moves (or comes) to the front
	w[0] = id
}

// len is the number of entries.
func (t *prefixTable) len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.index)
		s.mu.Unlock()
	}
	return n
}

// alloc makes an entry for h at the front, evicting the least recently
// used when the shard is full.
func (s *tableShard) alloc(h uint64) int32 {
	var i int32
	if len(s.nodes) < s.cap {
		s.nodes = append(s.nodes, tableNode{})
		i = int32(len(s.nodes) - 1)
	} else {
		i = s.tail
		s.unlink(i)
		delete(s.index, s.nodes[i].key)
	}
	s.nodes[i] = tableNode{key: h, prev: -1, next: -1}
	s.index[h] = i
	s.pushFront(i)
	return i
}

func (s *tableShard) touch(i int32) {
	if s.head == i {
		return
	}
	s.unlink(i)
	s.pushFront(i)
}

func (s *tableShard) unlink(i int32) {
	n := &s.nodes[i]
	if n.prev >= 0 {
		s.nodes[n.prev].next = n.next
	} else {
		s.head = n.next
	}
	if n.next >= 0 {
		s.nodes[n.next].prev = n.prev
	} else {
		s.tail = n.prev
	}
	n.prev, n.next = -1, -1
}

func (s *tableShard) pushFront(i int32) {
	n := &s.nodes[i]
	n.prev, n.next = -1, s.head
	if s.head >= 0 {
		s.nodes[s.head].prev = i
	}
	s.head = i
	if s.tail < 0 {
		s.tail = i
	}
}
