package node

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/limiter"
)

// TestSentinelFailoverThroughEdges: two edges loaded from YAML with a
// redis.sentinel section stream through a Sentinel failover (SENTINEL
// FAILOVER). Every request ends as a client of the API sees it: 200 with
// [DONE], or 429 from the concurrency limit; no 5xx, no cut stream. After
// the last one, no lease is left on the new master (within lease_ttl: a
// settle the old master took after the promotion is lost with it).
func TestSentinelFailoverThroughEdges(t *testing.T) {
	t.Parallel()
	ss := redistest.StartSentinel(t)
	const ttl = 3 * time.Second
	cfg := nodeConfig{Tenants: tenant("t1", "max_concurrency: 4, on_store_failure: local", key1)}.String() +
		fmt.Sprintf("redis:\n  sentinel: {master_name: %s, addrs: [\"%s\"]}\n  lease_ttl: %v\n  nodes: 2\n",
			redistest.MasterName, strings.Join(ss.Addrs(), `", "`), ttl)
	edges := []*testNode{startFileNode(t, cfg), startFileNode(t, cfg)}

	var (
		ok, refused atomic.Int64
		mu          sync.Mutex
		bad         []string
		stop        = make(chan struct{})
		wg          sync.WaitGroup
		count       atomic.Int64
		deadline    = time.Now().Add(60 * time.Second)
	)
	for w := 0; w < 6; w++ {
		base := edges[w%2].base
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if count.Add(1) > 3000 || time.Now().After(deadline) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				r := stream(ctx, base, key1, "sim-small", 8)
				cancel()
				switch {
				case r.err == nil && r.status == http.StatusOK && r.done:
					ok.Add(1)
				case r.err == nil && r.status == http.StatusTooManyRequests:
					refused.Add(1)
					time.Sleep(5 * time.Millisecond)
				default:
					mu.Lock()
					bad = append(bad, fmt.Sprintf("status %d done %v last %q err %v", r.status, r.done, r.last, r.err))
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	if now := ss.Failover(); now != ss.Replica {
		t.Errorf("new master %s; want the replica", now.Addr())
	}
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("through the failover: %d streams ended with [DONE], %d refused (429), %d other", ok.Load(), refused.Load(), len(bad))
	for _, b := range bad[:min(len(bad), 5)] {
		t.Errorf("request: %s; want 200 with [DONE] or 429", b)
	}
	if ok.Load() == 0 {
		t.Fatal("no stream completed")
	}

	c := redis.NewClient(&redis.Options{Addr: ss.Replica.Addr()})
	defer c.Close()
	store := limiter.NewRedis(c, limiter.RedisOptions{})
	waitFor(t, ttl+2*time.Second, "no lease left on the new master", func() bool {
		st, err := store.Snapshot(context.Background(), "t1", limiter.Limits{MaxConcurrency: 4})
		return err == nil && st.InFlight == 0
	})
	// And the edges are shared again on the new master: a stream held
	// there shows as its lease.
	done := startStream(t, edges[0].base, key1, 200)
	waitFor(t, 10*time.Second, "the new stream's lease on the new master", func() bool {
		st, err := store.Snapshot(context.Background(), "t1", limiter.Limits{MaxConcurrency: 4})
		return err == nil && st.InFlight == 1
	})
	if r := <-done; r.status != http.StatusOK || !r.done {
		t.Errorf("stream after the failover: %+v; want 200 with [DONE]", r)
	}
}
