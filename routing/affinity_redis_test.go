package routing

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

func sharedPool(t *testing.T, client redis.UniversalClient) *Pool {
	t.Helper()
	p := prefixPool(t, "http://a:1", "http://b:1", "http://c:1", "http://d:1")
	p.ShareAffinity(SharedAffinity{Client: client, Timeout: 50 * time.Millisecond})
	return p
}

// Two edge nodes share the prefix table through a real Redis: the
// conversations node A served go, from node B (whose own table is empty),
// to the same backends, and B learns them into its own table.
func TestPrefixTableSharedThroughRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	a, b := sharedPool(t, client), sharedPool(t, client)
	home := map[int]string{}
	for c := range 20 {
		home[c] = acquire(t, a, Want{Prompt: chat(c, 2)}).label
	}
	// A's writes are asynchronous: wait until Redis holds them.
	waitFor(t, 5*time.Second, "the writes in Redis", func() bool {
		keys, err := client.Keys(context.Background(), "sluice:affinity:{p}:*").Result()
		return err == nil && len(keys) >= 20*(len(chat(0, 2))/DefaultBlockBytes)
	})
	for c := range 20 {
		if got := acquire(t, b, Want{Prompt: chat(c, 3)}).label; got != home[c] {
			t.Errorf("conversation %d: node B sent it to %s, node A to %s", c, got, home[c])
		}
	}
	if n := b.aff.shared.found.Load(); n != 20 {
		t.Errorf("node B found %d of 20 conversations in Redis", n)
	}
	// Now B's own table knows them: no more Redis round trip for them.
	before := b.aff.shared.lookups.Load()
	acquire(t, b, Want{Prompt: chat(5, 3)})
	if b.aff.shared.lookups.Load() != before {
		t.Error("node B asked Redis for a prompt its own table knows")
	}
	// The keys expire (TTL 10m by default).
	keys, _ := client.Keys(context.Background(), "sluice:affinity:{p}:*").Result()
	if ttl, err := client.TTL(context.Background(), keys[0]).Result(); err != nil || ttl <= 9*time.Minute || ttl > 10*time.Minute {
		t.Errorf("key TTL %v (%v); want about 10m", ttl, err)
	}
}

// A Redis that hangs delays a pick by the lookup timeout at most, and the
// pick still succeeds (per-node affinity only); writes are dropped, not
// queued without bound.
func TestAttackPrefixSharingWithHungRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	p := sharedPool(t, client)
	acquire(t, p, Want{Prompt: chat(0, 1)}) // connects
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	for c := range 10 {
		acquire(t, p, Want{Prompt: chat(100+c, 2)})
	}
	if d := time.Since(start); d > 10*150*time.Millisecond {
		t.Fatalf("10 picks took %v with Redis hung; the lookup timeout is 50ms", d)
	}
	if p.aff.shared.failed.Load() < 10 {
		t.Errorf("%d failed lookups of 10", p.aff.shared.failed.Load())
	}
	for c := range 3 * sharedQueue {
		p.aff.shared.publish(p.backends[0], []uint64{uint64(c)})
	}
	if len(p.aff.shared.writes) > sharedQueue || p.aff.shared.dropped.Load() == 0 {
		t.Errorf("queue %d, dropped %d: writes not bounded", len(p.aff.shared.writes), p.aff.shared.dropped.Load())
	}
}
