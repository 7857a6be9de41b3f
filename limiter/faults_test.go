package limiter

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// The fault harness (issue 20): several Shared nodes in one process, each
// with its own go-redis client and the production defaults (no test
// timeouts), sharing one private redis-server. Each case asserts the
// guarantee docs/SCALING.md states.

// prodNode returns a Shared with the production defaults of NewFromConfig's
// client (read/write timeouts 500ms, dial 1s) and SharedOptions.
func prodNode(t testing.TB, addr string, ropt RedisOptions, sopt SharedOptions) *Shared {
	t.Helper()
	cfg := RedisConfig{Addrs: []string{addr}}.WithDefaults()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true,
		DialTimeout: cfg.DialTimeout, ReadTimeout: cfg.ReadTimeout, WriteTimeout: cfg.WriteTimeout})
	t.Cleanup(func() { c.Close() })
	if sopt.Logger == nil {
		sopt.Logger = slog.New(slog.DiscardHandler)
	}
	if sopt.AdmissionTimeout == 0 {
		sopt.AdmissionTimeout = cfg.AdmissionTimeout
	}
	return NewShared(NewRedis(c, ropt), sopt)
}

// leases is the number of live leases Redis holds for tenant.
func leases(t testing.TB, srv *redistest.Server, tenant string) int {
	t.Helper()
	now := strconv.FormatInt(time.Now().UnixMicro(), 10)
	v, err := srv.Do("ZCOUNT", scopePrefix(tenant, "", false)+":c", "("+now, "+inf")
	if err != nil {
		t.Fatalf("ZCOUNT: %v", err)
	}
	n, _ := strconv.Atoi(v)
	return n
}

// burst sends n admissions at once, spread over nodes, and returns the
// admitted tickets (with the node that issued each).
func burst(t *testing.T, nodes []*Shared, n int, req Request) (admitted []*Ticket, by []*Shared, degraded int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		node := nodes[i%len(nodes)]
		wg.Go(func() {
			<-start
			r := req
			r.ID = nextID()
			d, err := node.Admit(context.Background(), r)
			if err != nil {
				t.Errorf("Admit: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if d.Degraded {
				degraded++
			}
			if d.Allowed {
				admitted = append(admitted, d.Ticket)
				by = append(by, node)
			}
		})
	}
	close(start)
	wg.Wait()
	return admitted, by, degraded
}

// TestFaultsBurstNoOvershoot: bursts on cold nodes (fresh clients, no
// connection yet) and on warm ones never admit more than the limit,
// whatever the Redis latency under the burst. FAULTS_FULL=1 runs the full
// 20 bursts of 300 of issue 20.
func TestFaultsBurstNoOvershoot(t *testing.T) {
	srv := startRedis(t)
	bursts, size := 4, 300
	if os.Getenv("FAULTS_FULL") != "" {
		bursts = 20
	}
	lim := Limits{MaxConcurrency: 10}
	var warm []*Shared
	for i := 0; i < 3; i++ {
		warm = append(warm, prodNode(t, srv.Addr(), RedisOptions{}, SharedOptions{Nodes: 3}))
	}
	peak, deg := 0, 0
	for b := 0; b < bursts; b++ {
		nodes := warm
		if b%2 == 0 { // cold: new clients, new nodes
			nodes = nil
			for i := 0; i < 3; i++ {
				nodes = append(nodes, prodNode(t, srv.Addr(), RedisOptions{}, SharedOptions{Nodes: 3}))
			}
		}
		tenant := "burst-" + strconv.Itoa(b)
		got, by, d := burst(t, nodes, size, Request{Tenant: tenant, Limits: lim})
		deg += d
		peak = max(peak, len(got))
		if len(got) > lim.MaxConcurrency {
			t.Errorf("burst %d (cold %v): %d admitted on a limit of %d (%d degraded)",
				b, b%2 == 0, len(got), lim.MaxConcurrency, d)
		}
		if l := leases(t, srv, tenant); l > lim.MaxConcurrency {
			t.Errorf("burst %d: %d leases in Redis on a limit of %d", b, l, lim.MaxConcurrency)
		}
		for i, tk := range got {
			settle(t, by[i], tk, Usage{})
		}
	}
	t.Logf("%d bursts of %d on 3 nodes, limit %d: peak %d admitted, %d degraded decisions",
		bursts, size, lim.MaxConcurrency, peak, deg)
}
