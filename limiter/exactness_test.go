package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// exactnessMaxRun bounds a hammering loop that waits for the limit to be
// reached: on a starved CPU it takes longer than the nominal duration.
const exactnessMaxRun = 15 * time.Second

// exactnessConcurrency hammers one tenant from nodes limiters (separate
// clients, as separate edge nodes) × goroutines each and samples the
// in-flight count: it must never exceed max_concurrency, and must reach it.
// It runs for dur, and on past it (up to exactnessMaxRun) until the count
// has reached the limit and been refused, which a starved CPU may delay.
func exactnessConcurrency(t *testing.T, nodes []Limiter, tenant string) {
	const maxConc, perNode, dur = 6, 8, 1500 * time.Millisecond
	lim := Limits{MaxConcurrency: maxConc}
	var inflight, peak, admitted, refused atomic.Int64
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), exactnessMaxRun)
	defer cancel()
	done := func() bool {
		return ctx.Err() != nil ||
			time.Since(start) >= dur && peak.Load() >= maxConc && refused.Load() > 0
	}
	var wg sync.WaitGroup
	// Sample the store's own count of leases too.
	var samples, storePeak atomic.Int64
	if sn, ok := nodes[0].(snapshotter); ok {
		wg.Go(func() {
			for !done() {
				if st, err := sn.Snapshot(ctx, tenant, lim); err == nil && !st.Degraded {
					samples.Add(1)
					if st.InFlight > storePeak.Load() {
						storePeak.Store(st.InFlight)
					}
				}
				time.Sleep(5 * time.Millisecond) // sampling pace, not a wait for anything
			}
		})
	}
	for _, l := range nodes {
		for g := 0; g < perNode; g++ {
			wg.Go(func() {
				for !done() {
					d, err := l.Admit(context.Background(), Request{ID: nextID(), Tenant: tenant, Limits: lim})
					if err != nil {
						t.Errorf("Admit: %v", err)
						return
					}
					if d.Degraded {
						t.Errorf("degraded decision %+v on a healthy store", d)
					}
					if !d.Allowed {
						refused.Add(1)
						time.Sleep(time.Millisecond) // load: back off after a refusal
						continue
					}
					admitted.Add(1)
					n := inflight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					// Load: hold the lease a random while to vary the interleavings.
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
	t.Logf("concurrency: admitted %d refused %d peak in-flight %d of %d in %v (store: peak %d in %d samples)",
		admitted.Load(), refused.Load(), peak.Load(), maxConc, time.Since(start).Round(time.Millisecond),
		storePeak.Load(), samples.Load())
	if storePeak.Load() > maxConc {
		t.Errorf("store reported %d leases > max_concurrency %d", storePeak.Load(), maxConc)
	}
	if peak.Load() > maxConc {
		t.Errorf("peak in-flight %d > max_concurrency %d", peak.Load(), maxConc)
	}
	if peak.Load() < maxConc {
		t.Errorf("peak in-flight %d never reached max_concurrency %d in %v", peak.Load(), maxConc, exactnessMaxRun)
	}
	if refused.Load() == 0 {
		t.Error("no refusal: the load did not press on the limit")
	}
}

// attempt is one admission as the test saw it: the store decided it at
// some instant between start and end.
type attempt struct {
	start, end time.Time
	allowed    bool
	tokens     int64
}

// exactnessTokens hammers one token bucket (1000 tokens/s, burst 2000) with
// requests of est tokens for 2s from every node, then checks the tokens
// admitted against bounds computed from when the attempts really happened
// (the CPU may be starved for part of the run):
//
//   - at most burst + rate·(end of the last admission − start): the bucket
//     was full at start and refills at rate;
//   - every refusal justified: by the time of each refusal, enough was
//     admitted to empty the bucket (see checkRefusals).
func exactnessTokens(t *testing.T, nodes []Limiter, tenant string) {
	const tpm, burst, est = 60000, 2000, 200 // 1000 tokens/s
	lim := Limits{TokensPerMinute: tpm, Burst: burst}
	start := time.Now()
	all := hammerTokens(t, nodes, Request{Tenant: tenant, Limits: lim, InputTokens: est / 2, OutputTokens: est / 2})
	var tokens, refusals int64
	lastAdmit := start
	for _, a := range all {
		if a.allowed {
			tokens += a.tokens
			if a.end.After(lastAdmit) {
				lastAdmit = a.end
			}
		} else {
			refusals++
		}
	}
	// 20 tokens (20 ms) of slack: Redis decides on its own clock.
	upper := int64(burst+tpm/60*lastAdmit.Sub(start).Seconds()) + 20
	t.Logf("tokens: admitted %d (at most %d) in %d attempts, %d refused, over %v",
		tokens, upper, len(all), refusals, time.Since(start).Round(time.Millisecond))
	if refusals == 0 {
		t.Fatal("no refusal: the load did not press on the limit")
	}
	within(t, "tokens admitted", tokens, 0, upper)
	checkRefusals(t, all, burst, tpm/60, est)
}

// hammerTokens sends req (a new ID each time) from 8 goroutines per node
// for 2s, settling admissions at their charge, and returns every attempt.
func hammerTokens(t *testing.T, nodes []Limiter, req Request) []attempt {
	const perNode, dur = 8, 2 * time.Second
	start := time.Now()
	var mu sync.Mutex
	var all []attempt
	var wg sync.WaitGroup
	for _, l := range nodes {
		for g := 0; g < perNode; g++ {
			wg.Go(func() {
				var mine []attempt
				defer func() { mu.Lock(); all = append(all, mine...); mu.Unlock() }()
				for time.Since(start) < dur {
					req := req
					req.ID = nextID()
					a := attempt{start: time.Now()}
					d, err := l.Admit(context.Background(), req)
					a.end = time.Now()
					if err != nil {
						t.Errorf("Admit: %v", err)
						return
					}
					if d.Degraded {
						t.Errorf("degraded decision %+v on a healthy store", d)
					}
					a.allowed = d.Allowed
					if !d.Allowed {
						mine = append(mine, a)
						time.Sleep(time.Millisecond) // load: back off after a refusal
						continue
					}
					a.tokens = d.Ticket.ChargedInput + d.Ticket.ChargedOutput
					mine = append(mine, a)
					u := Usage{InputTokens: req.InputTokens, OutputTokens: req.OutputTokens}
					if err := l.Settle(context.Background(), d.Ticket, u); err != nil {
						t.Errorf("Settle: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	return all
}

// checkRefusals fails the test if a refusal in all was not justified: the
// bucket (full at first, refilling at rate per second) must have held less
// than est, the cost of every request, when the refusal was decided.
//
// The store decided each attempt at an unknown instant D within [start,
// end]. Take r1, the refusal that ended first, and any refusal r decided
// after it:
//
//   - by D(r1) at least burst − est was admitted (the bucket went from full
//     to under est);
//   - from D(r1) to D(r) the bucket gained rate·(D(r)−D(r1)), lost what
//     overflowed while it was full, and again held under est: at least
//     rate·(D(r)−D(r1)) − est − overflow more was admitted;
//   - it overflows only while full, which it cannot be before
//     (burst−est)/rate after D(r1), so overflow ≤ rate·(D(r)−D(r1) − (burst−est)/rate).
//
// D(r)−D(r1) is taken at its least for the gain and at its most for the
// overflow. What was admitted by D(r) is at most the admissions that
// started before r ended. Refusals by a deny cache or a local ceiling must
// be justified the same way: they claim the store would refuse.
func checkRefusals(t *testing.T, all []attempt, burst, rate, est float64) {
	t.Helper()
	var refused, admitted []attempt
	for _, a := range all {
		if a.allowed {
			admitted = append(admitted, a)
		} else {
			refused = append(refused, a)
		}
	}
	slices.SortFunc(admitted, func(a, b attempt) int { return a.start.Compare(b.start) })
	slices.SortFunc(refused, func(a, b attempt) int { return a.start.Compare(b.start) })
	cum := make([]int64, len(admitted)+1) // cum[i]: tokens of admitted[:i]
	for i, a := range admitted {
		cum[i+1] = cum[i] + a.tokens
	}
	first := slices.MinFunc(refused, func(a, b attempt) int { return a.end.Compare(b.end) })
	fill := (burst - est) / rate // seconds from under est to full
	var bad int
	var last, worst string
	for _, r := range refused {
		need := burst - est
		if gain := r.start.Sub(first.end).Seconds(); gain > 0 {
			overflow := max(0, r.end.Sub(first.start).Seconds()-fill)
			need += max(0, rate*gain-est-rate*overflow)
		}
		n, _ := slices.BinarySearchFunc(admitted, r.end, func(a attempt, t time.Time) int { return a.start.Compare(t) })
		msg := fmt.Sprintf("refused %v after the first refusal: at most %d tokens admitted by then; at least %d due",
			r.start.Sub(first.start).Round(time.Millisecond), cum[n], int64(need))
		if r.start.Equal(refused[len(refused)-1].start) {
			last = msg
		}
		if float64(cum[n]) < need {
			bad++
			worst = msg
		}
	}
	t.Logf("last refusal: %s", last)
	if bad > 0 {
		t.Errorf("%d of %d refusals while the bucket held a request's tokens; e.g. %s", bad, len(refused), worst)
	}
}

// exactnessNode makes the limiter of one edge node of an exactness test.
type exactnessNode func(t *testing.T) Limiter

// runExactness runs both exactness tests on four nodes made by node.
func runExactness(t *testing.T, node exactnessNode, prefix string) {
	var nodes []Limiter
	for i := 0; i < 4; i++ {
		nodes = append(nodes, node(t))
	}
	t.Run("concurrency", func(t *testing.T) { exactnessConcurrency(t, nodes, prefix+"-c") })
	t.Run("tokens", func(t *testing.T) { exactnessTokens(t, nodes, prefix+"-t") })
}

func TestExactnessRedis(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	runExactness(t, func(t *testing.T) Limiter { return newRedis(t, srv.Addr(), RedisOptions{}) }, "exact")
}

// TestExactnessShared runs the exactness test through the Shared wrapper
// (deny cache and local ceiling in front of Redis) on four nodes.
func TestExactnessShared(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	runExactness(t, func(t *testing.T) Limiter {
		// newShared's generous timeouts: a degraded decision would not be
		// exact, and a settle left to a heartbeat (none runs here) would
		// hold its lease; a starved CPU must cause neither.
		return newShared(t, srv.Addr(), RedisOptions{}, SharedOptions{})
	}, "sh-exact")
}
