package routing

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// SharedAffinity shares a prefix_aware pool's table across edge nodes
// through Redis: every node writes, for the prompt blocks it sends, which
// backend got them (key PREFIX{POOL}:HASH, value the backend's label, with
// a TTL), and a node whose own table does not know a prompt's deepest
// blocks asks Redis for them in one MGET, bounded by Timeout. Writes are
// batched by a background goroutine from a bounded queue and dropped when
// it is full: Redis never slows a pick beyond Timeout, and a Redis that is
// down only makes the table per node again.
type SharedAffinity struct {
	// Client is the Redis (or Redis Cluster) client. The keys of one pool
	// share a hash tag ({pool}), so one MGET reaches one node. It must
	// honour context deadlines (go-redis ContextTimeoutEnabled), or a
	// hung Redis delays a pick by the client's read timeout instead of
	// Timeout.
	Client redis.UniversalClient
	// Prefix starts every key. Default "sluice:affinity:".
	Prefix string
	// TTL is the life of a key: how long the fleet remembers a block
	// after its last write. Default 10m.
	TTL time.Duration
	// Timeout bounds the lookup a pick may wait for. Default 5ms.
	Timeout time.Duration
}

// sharedTable is a pool's link to the fleet's table.
type sharedTable struct {
	cfg    SharedAffinity
	tag    string // Prefix + "{" + pool + "}:"
	writes chan sharedWrite
	done   chan struct{}
	stop   context.CancelFunc

	lookups, found, failed, dropped atomic.Int64
}

type sharedWrite struct {
	label  string
	blocks []uint64
}

// sharedQueue bounds the writes waiting for the writer.
const sharedQueue = 1024

// ShareAffinity links the pool's prefix table to the fleet's through
// Redis (see SharedAffinity); it does nothing unless the policy is
// prefix_aware. It starts a writer goroutine that Close stops. Call it
// before the pool serves requests.
func (p *Pool) ShareAffinity(s SharedAffinity) {
	if p.aff.table == nil || s.Client == nil {
		return
	}
	if s.Prefix == "" {
		s.Prefix = "sluice:affinity:"
	}
	if s.TTL <= 0 {
		s.TTL = 10 * time.Minute
	}
	if s.Timeout <= 0 {
		s.Timeout = 5 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &sharedTable{cfg: s, tag: s.Prefix + "{" + p.cfg.Name + "}:", writes: make(chan sharedWrite, sharedQueue),
		done: make(chan struct{}), stop: cancel}
	go st.writer(ctx)
	p.aff.shared = st
}

func (st *sharedTable) key(h uint64) string {
	return st.tag + strconv.FormatUint(h, 16)
}

// lookup asks Redis which backends got blocks[from:], and returns, for
// each candidate, the depth (block count) of the deepest block Redis
// assigns to it, merged into m; it records what it learned in the local
// table.
func (st *sharedTable) lookup(t *prefixTable, cands []*Backend, blocks []uint64, from int, m []int) {
	if from >= len(blocks) {
		return
	}
	st.lookups.Add(1)
	keys := make([]string, 0, len(blocks)-from)
	for _, h := range blocks[from:] {
		keys = append(keys, st.key(h))
	}
	ctx, cancel := context.WithTimeout(context.Background(), st.cfg.Timeout)
	defer cancel()
	vals, err := st.cfg.Client.MGet(ctx, keys...).Result()
	if err != nil {
		st.failed.Add(1)
		return
	}
	hit := false
	for j, v := range vals {
		label, ok := v.(string)
		if !ok {
			continue
		}
		for i, c := range cands {
			if c.label == label {
				m[i] = max(m[i], from+j+1)
				t.record(blocks[from+j], c.affID)
				hit = true
			}
		}
	}
	if hit {
		st.found.Add(1)
	}
}

// publish queues the write of blocks (copied) as sent to b; dropped when
// the queue is full.
func (st *sharedTable) publish(b *Backend, blocks []uint64) {
	if len(blocks) == 0 {
		return
	}
	w := sharedWrite{label: b.label, blocks: append([]uint64(nil), blocks...)}
	select {
	case st.writes <- w:
	default:
		st.dropped.Add(1)
	}
}

// writer sends the queued writes in pipelines until ctx ends.
func (st *sharedTable) writer(ctx context.Context) {
	defer close(st.done)
	for {
		var w sharedWrite
		select {
		case <-ctx.Done():
			return
		case w = <-st.writes:
		}
		pipe := st.cfg.Client.Pipeline()
		n := 0
		for {
			for _, h := range w.blocks {
				pipe.Set(ctx, st.key(h), w.label, st.cfg.TTL)
			}
			n++
			if n == 64 {
				break
			}
			select {
			case w = <-st.writes:
				continue
			default:
			}
			break
		}
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		if _, err := pipe.Exec(wctx); err != nil {
			st.failed.Add(1)
		}
		cancel()
	}
}

// close stops the writer and waits for it.
func (st *sharedTable) close() {
	st.stop()
	<-st.done
}
