package limiter

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// exactnessConcurrency hammers one tenant from nodes limiters (separate
// clients, as separate edge nodes) × goroutines each and samples the
// in-flight count: it must never exceed max_concurrency, and must reach it.
func exactnessConcurrency(t *testing.T, nodes []Limiter, tenant string) {
	const maxConc, perNode, dur = 6, 8, 1500 * time.Millisecond
	lim := Limits{MaxConcurrency: maxConc}
	var inflight, peak, admitted, refused atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	// Sample the store's own count of leases too.
	var samples, storePeak atomic.Int64
	if sn, ok := nodes[0].(snapshotter); ok {
		wg.Go(func() {
			for ctx.Err() == nil {
				if st, err := sn.Snapshot(context.Background(), tenant, lim); err == nil && !st.Degraded {
					samples.Add(1)
					if st.InFlight > storePeak.Load() {
						storePeak.Store(st.InFlight)
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	for _, l := range nodes {
		for g := 0; g < perNode; g++ {
			wg.Go(func() {
				for ctx.Err() == nil {
					d, err := l.Admit(context.Background(), Request{ID: nextID(), Tenant: tenant, Limits: lim})
					if err != nil {
						t.Errorf("Admit: %v", err)
						return
					}
					if !d.Allowed {
						refused.Add(1)
						time.Sleep(time.Millisecond)
						continue
					}
					admitted.Add(1)
					n := inflight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(time.Duration(2+rand.IntN(6)) * time.Millisecond)
					inflight.Add(-1)
					if err := l.Settle(context.Background(), d.Ticket, Usage{}); err != nil {
						t.Errorf("Settle: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	t.Logf("concurrency: admitted %d refused %d peak in-flight %d of %d (store: peak %d in %d samples)",
		admitted.Load(), refused.Load(), peak.Load(), maxConc, storePeak.Load(), samples.Load())
	if storePeak.Load() > maxConc {
		t.Errorf("store reported %d leases > max_concurrency %d", storePeak.Load(), maxConc)
	}
	if peak.Load() > maxConc {
		t.Errorf("peak in-flight %d > max_concurrency %d", peak.Load(), maxConc)
	}
	if peak.Load() < maxConc {
		t.Errorf("peak in-flight %d never reached max_concurrency %d", peak.Load(), maxConc)
	}
	if refused.Load() == 0 {
		t.Error("no refusal: the load did not press on the limit")
	}
}

// exactnessTokens checks that tokens admitted over the run stay within
// burst + rate·T + one estimate, and not far below.
func exactnessTokens(t *testing.T, nodes []Limiter, tenant string) {
	const tpm, burst, est, perNode = 60000, 2000, 200, 8 // 1000 tokens/s
	dur := 2 * time.Second
	lim := Limits{TokensPerMinute: tpm, Burst: burst}
	var tokens atomic.Int64
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(dur))
	defer cancel()
	var wg sync.WaitGroup
	for _, l := range nodes {
		for g := 0; g < perNode; g++ {
			wg.Go(func() {
				for ctx.Err() == nil {
					d, err := l.Admit(context.Background(), Request{ID: nextID(), Tenant: tenant, Limits: lim,
						InputTokens: est / 2, OutputTokens: est / 2})
					if err != nil {
						t.Errorf("Admit: %v", err)
						return
					}
					if time.Now().After(start.Add(dur)) {
						if d.Allowed {
							_ = l.Settle(context.Background(), d.Ticket, Usage{InputTokens: est / 2, OutputTokens: est / 2})
						}
						return // decided after the window: not counted
					}
					if !d.Allowed {
						time.Sleep(time.Millisecond)
						continue
					}
					tokens.Add(d.Ticket.ChargedInput + d.Ticket.ChargedOutput)
					if err := l.Settle(context.Background(), d.Ticket, Usage{InputTokens: est / 2, OutputTokens: est / 2}); err != nil {
						t.Errorf("Settle: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	upper := int64(burst + tpm/60*elapsed.Seconds() + est)
	lower := int64(0.85 * (burst + tpm/60*dur.Seconds() - est))
	t.Logf("tokens: admitted %d over %v; bound [%d, %d]", tokens.Load(), elapsed, lower, upper)
	within(t, "tokens admitted", tokens.Load(), lower, upper)
}

func TestExactnessRedis(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	var nodes []Limiter
	for i := 0; i < 4; i++ {
		nodes = append(nodes, newRedis(t, srv.Addr(), RedisOptions{}))
	}
	t.Run("concurrency", func(t *testing.T) { exactnessConcurrency(t, nodes, "exact-c") })
	t.Run("tokens", func(t *testing.T) { exactnessTokens(t, nodes, "exact-t") })
}

// TestExactnessShared runs the exactness test through the Shared wrapper
// (deny cache and local ceiling in front of Redis) on four nodes.
func TestExactnessShared(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	var nodes []Limiter
	for i := 0; i < 4; i++ {
		// A generous timeout: degraded decisions would not be exact.
		nodes = append(nodes, newShared(t, srv.Addr(), RedisOptions{}, SharedOptions{AdmissionTimeout: 2 * time.Second}))
	}
	t.Run("concurrency", func(t *testing.T) { exactnessConcurrency(t, nodes, "sh-exact-c") })
	t.Run("tokens", func(t *testing.T) { exactnessTokens(t, nodes, "sh-exact-t") })
}
