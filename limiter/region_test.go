package limiter

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/netdelay"
)

// The regions harness: a global store (one redis-server) and, per region,
// a regional redis-server, nodes (Region over Shared over the regional
// Redis) and a delaying TCP relay between the region and the global store
// (netdelay: the wide-area path, cut on demand). Every admission goes to
// the regional Redis only; the rebalancer talks to the global store through
// the relay.

// regionDelays are the one-way delays from each region to the global
// store (a home region near it, two across oceans).
var regionDelays = []time.Duration{40 * time.Millisecond, 80 * time.Millisecond, 120 * time.Millisecond}

type regionNode struct {
	*Region
	region int
}

type regionFleet struct {
	t      *testing.T
	names  []string
	relays []*netdelay.Relay
	nodes  []*regionNode
	opt    RegionOptions
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startFleet starts n regions of perRegion nodes each; opt gives the
// timing (Name, Regions and NodeID are set per node).
func startFleet(t *testing.T, n, perRegion int, opt RegionOptions) *regionFleet {
	t.Helper()
	global := startRedis(t)
	f := &regionFleet{t: t, opt: opt}
	for i := range n {
		f.names = append(f.names, fmt.Sprintf("r%d", i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for i := range n {
		relay, err := netdelay.Start(global.Addr(), regionDelays[i%len(regionDelays)])
		if err != nil {
			t.Fatal(err)
		}
		f.relays = append(f.relays, relay)
		regional := startRedis(t)
		gc := newClient(t, relay.Addr())
		for j := range perRegion {
			o := opt
			o.Name, o.Regions, o.NodeID = f.names[i], f.names, fmt.Sprintf("%s-n%d", f.names[i], j)
			o.Logger = discardSlog()
			inner := NewShared(newRedis(t, regional.Addr(), RedisOptions{}), SharedOptions{AdmissionTimeout: storeTimeout})
			rg, err := NewRegion(inner, gc, o)
			if err != nil {
				t.Fatal(err)
			}
			f.nodes = append(f.nodes, &regionNode{Region: rg, region: i})
			f.wg.Add(1)
			go func() { defer f.wg.Done(); _ = rg.Run(ctx) }()
		}
	}
	t.Cleanup(f.stop)
	return f
}

func (f *regionFleet) stop() {
	f.cancel()
	f.wg.Wait()
	for _, r := range f.relays {
		r.Close()
	}
}

// shares returns, per region, the largest share any of its nodes enforces
// now for tenant (what the region's buckets may be charged under).
func (f *regionFleet) shares(tenant string) []float64 {
	out := make([]float64, len(f.names))
	for _, nd := range f.nodes {
		s := nd.floor
		if v, ok := nd.tenants.Load(tenant); ok {
			s = nd.shareAt(v.(*regionTenant), nd.now())
		}
		out[nd.region] = max(out[nd.region], s)
	}
	return out
}

// raised is the sum of the share increases granted to all nodes.
func (f *regionFleet) raised() float64 {
	s := 0.0
	for _, nd := range f.nodes {
		s += nd.Raised()
	}
	return s
}

// watchShares samples the regions' shares every 10ms until stop is closed
// and records the largest sum seen: the no-double-grant invariant is that
// it never exceeds 1.
type shareWatch struct {
	mu      sync.Mutex
	maxSum  float64
	samples int
	stop    chan struct{}
	done    chan struct{}
}

func (f *regionFleet) watchShares(tenant string) *shareWatch {
	w := &shareWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tk.C:
			}
			sum := 0.0
			for _, s := range f.shares(tenant) {
				sum += s
			}
			w.mu.Lock()
			w.maxSum = max(w.maxSum, sum)
			w.samples++
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *shareWatch) end() (maxSum float64, samples int) {
	close(w.stop)
	<-w.done
	return w.maxSum, w.samples
}

// load drives one node: an admission every `every` until the context ends
// or max admissions, each settled at once with its charge. It counts the
// admitted tokens and records each admission's latency.
type loadStats struct {
	admitted, refused atomic.Int64
	tokens            atomic.Int64
	mu                sync.Mutex
	lat               []time.Duration
}

func (ls *loadStats) p99() time.Duration {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return percentile(ls.lat, 0.99)
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}

func drive(ctx context.Context, l Limiter, tenant string, lim Limits, every time.Duration, maxN int, ls *loadStats) {
	tk := time.NewTicker(every)
	defer tk.Stop()
	for range maxN {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		t0 := time.Now()
		d, err := l.Admit(ctx, Request{ID: nextID(), Tenant: tenant, Limits: lim, InputTokens: 100, OutputTokens: 1})
		el := time.Since(t0)
		if err != nil {
			return
		}
		ls.mu.Lock()
		ls.lat = append(ls.lat, el)
		ls.mu.Unlock()
		if !d.Allowed {
			ls.refused.Add(1)
			continue
		}
		ls.admitted.Add(1)
		ls.tokens.Add(d.Ticket.ChargedInput + d.Ticket.ChargedOutput)
		_ = l.Settle(context.Background(), d.Ticket, Usage{InputTokens: d.Ticket.ChargedInput, OutputTokens: d.Ticket.ChargedOutput})
	}
}

// skewResult is one skewed-demand run's figures.
type skewResult struct {
	regions         int
	admittedTokens  int64
	window          time.Duration
	bound, singleB  float64 // the stated bound; the single-region bound
	maxShareSum     float64
	raised          float64
	p99, p99single  time.Duration
	hotShare        []float64 // the hot region's share at the end of each phase
	refused, allowd int64
}

// Test tenant limits: 600k tokens/min (10k/s), a 2 s burst.
var regionLimits = Limits{TokensPerMinute: 600000, Burst: 20000}

// runSkew drives skewed demand that moves between the regions: in phase k
// region k%n is hot (2 nodes × an admission every 5 ms: 4× the global
// limit), the others light (an admission every 200 ms per node). A plain
// single-region node (Shared on its own Redis) runs the hot load's pattern
// alongside, as the latency baseline measured under the same machine load.
func runSkew(t *testing.T, n int, phase time.Duration, opt RegionOptions) skewResult {
	f := startFleet(t, n, 2, opt)
	single := NewShared(newRedis(t, startRedis(t).Addr(), RedisOptions{}), SharedOptions{AdmissionTimeout: storeTimeout})
	tenant := "acme"
	w := f.watchShares(tenant)
	var total, base loadStats
	res := skewResult{regions: n}
	start := time.Now()
	phases := max(n, 2) + 1
	for k := range phases {
		hot := k % n
		ctx, cancel := context.WithTimeout(context.Background(), phase)
		var wg sync.WaitGroup
		for _, nd := range f.nodes {
			every := 200 * time.Millisecond
			if nd.region == hot {
				every = 5 * time.Millisecond
			}
			wg.Add(1)
			go func() { defer wg.Done(); drive(ctx, nd, tenant, regionLimits, every, 10000, &total) }()
		}
		wg.Add(1)
		go func() { defer wg.Done(); drive(ctx, single, "base", regionLimits, 5*time.Millisecond, 10000, &base) }()
		wg.Wait()
		cancel()
		res.hotShare = append(res.hotShare, f.shares(tenant)[hot])
	}
	res.window = time.Since(start)
	res.maxShareSum, _ = w.end()
	res.admittedTokens = total.tokens.Load()
	res.raised = f.raised()
	G, B := float64(regionLimits.TokensPerMinute), float64(regionLimits.Burst)
	res.singleB = G*res.window.Seconds()/60 + B
	res.bound = G*res.window.Seconds()/60 + B*(1+res.raised)
	res.p99, res.p99single = total.p99(), base.p99()
	res.refused, res.allowd = total.refused.Load(), total.admitted.Load()
	return res
}

func fastRegionOptions() RegionOptions {
	return RegionOptions{Interval: 100 * time.Millisecond, Hold: 300 * time.Millisecond,
		Decay: 2 * time.Second}
}

// TestRegionsSkewedDemand runs 1, 2 and 3 regions under demand that moves
// from region to region and asserts: the sum of the shares the regions
// enforce never exceeds 1 (no double grant, sampled every 10 ms); the hot
// region's share follows the demand; the global tokens admitted stay
// within the stated bound (G·W/60 + B·(1 + Σ share increases)); and the
// admissions stay local: P99 admit latency within 1 ms of the single-region
// node run alongside (the global store is 80–240 ms away round trip) is
// logged here and asserted by TestRegionsAdmitLatency, which measures it
// without the skewed load's CPU contention.
func TestRegionsSkewedDemand(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("regions=%d", n), func(t *testing.T) {
			r := runSkew(t, n, 1500*time.Millisecond, fastRegionOptions())
			t.Logf("regions=%d window=%v admitted=%d tokens (%d admitted, %d refused) single-region bound=%.0f (ratio %.3f) stated bound=%.0f raised=%.2f max share sum=%.4f hot shares=%.2f p99 admit=%v single-region p99=%v",
				n, r.window.Round(time.Millisecond), r.admittedTokens, r.allowd, r.refused, r.singleB,
				float64(r.admittedTokens)/r.singleB, r.bound, r.raised, r.maxShareSum, r.hotShare, r.p99, r.p99single)
			if r.maxShareSum > 1+1e-6 {
				t.Errorf("the regions' shares summed to %.6f > 1: a share was granted twice", r.maxShareSum)
			}
			if float64(r.admittedTokens) > r.bound {
				t.Errorf("admitted %d tokens in %v; bound %.0f", r.admittedTokens, r.window, r.bound)
			}
			// The limit binds: at least half of what it allows was admitted
			// (the hot region is 4× over it).
			if float64(r.admittedTokens) < 0.5*float64(regionLimits.TokensPerMinute)*r.window.Seconds()/60 {
				t.Errorf("admitted only %d tokens in %v: shares did not follow demand", r.admittedTokens, r.window)
			}
			if n > 1 {
				// More than an even split (the target is 0.87–0.9; a loaded
				// machine slows the rounds, hence the margin).
				for k, s := range r.hotShare {
					if want := 1/float64(n) + 0.05; s < want {
						t.Errorf("phase %d: the hot region's share is %.3f, want > %.3f", k, s, want)
					}
				}
			}
		})
	}
}

func discardSlog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return d
	}
	return def
}

// TestRegionsAdmitLatency measures P99 admit latency on a node of the
// region farthest from the global store (120 ms one way) against a
// single-region node (Shared on its own Redis), in alternating rounds so
// that both see the same machine load, with the rebalancer running every
// 100 ms. The region's P99 in its quietest round is within 1 ms plus the
// machine's noise of the single-region one's (noise only adds; waiting for
// the global store would add 80-240 ms in every round); the log has the
// medians over rounds.
func TestRegionsAdmitLatency(t *testing.T) {
	lim := Limits{TokensPerMinute: 1e12, RequestsPerMinute: 1e12, MaxConcurrency: 1 << 20}
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("regions=%d", n), func(t *testing.T) {
			f := startFleet(t, n, 1, fastRegionOptions())
			node := f.nodes[n-1]
			single := NewShared(newRedis(t, startRedis(t).Addr(), RedisOptions{}), SharedOptions{AdmissionTimeout: storeTimeout})
			// Measure while the rebalancer is talking to the global store:
			// the first round through the relay (handshake included) takes
			// several round trips.
			admit(t, node, Request{Tenant: "acme", Limits: lim})
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if ok, _ := node.Syncs(); ok > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the rebalancer never reached the global store")
				}
			}
			rounds, per := 7, 200
			var rp, sp []time.Duration
			for range rounds {
				a, b := alternate(t, node, single, lim, per)
				rp, sp = append(rp, a), append(sp, b)
			}
			if ok, _ := node.Syncs(); ok < 2 {
				t.Errorf("the rebalancer made %d rounds while admissions were measured", ok)
			}
			mr, ms := percentile(rp, 0.5), percentile(sp, 0.5)
			br, bs := slices.Min(rp), slices.Min(sp)
			noise := slices.Max(sp) - bs
			t.Logf("regions=%d P99 admit per round: region %v, single %v; medians %v and %v; quietest rounds %v and %v; single-region spread %v",
				n, rp, sp, mr, ms, br, bs, noise)
			// Machine noise only adds to a round's P99; an admission that
			// waited for the global store (80–240 ms round trip) even once
			// in 100 would add to every round's. So the quietest rounds are
			// the robust test, the medians the figure to quote. On a quiet
			// machine the rounds' P99s differ by tenths of a ms; on a loaded
			// one (CI at load 15) every round is several ms of scheduling
			// noise, more on the side that spends more CPU per admission
			// (a preemption lands in an admission in proportion to its CPU
			// time), and even the quietest rounds differ by more than 1 ms
			// though neither waited (8.80 vs 7.37 ms; 7.38 vs 1.64 ms in 28
			// rounds). So the bound is 1 ms plus the machine's noise as the
			// single-region side measured it (its rounds' spread), as
			// docs/SCALING.md states the result ("differ by less than the
			// machine's noise"); and, whatever the noise, the quietest round
			// stays under half the shortest round trip to the global store.
			if br > bs+time.Millisecond+noise {
				t.Errorf("P99 admit latency in the quietest round %v, single-region %v: more than 1 ms + the single-region rounds' spread %v apart (%v vs %v)", br, bs, noise, rp, sp)
			}
			if rtt := 2 * regionDelays[0]; br >= rtt/2 {
				t.Errorf("P99 admit latency in the quietest round %v: an admission waited on the global store (round trip ≥ %v)", br, rtt)
			}
		})
	}
}

// alternate admits per requests on a and b in turn (so that both see the
// same moments of machine load), settling each at once, and returns each
// one's P99 admit latency.
func alternate(t *testing.T, a, b Limiter, lim Limits, per int) (p99a, p99b time.Duration) {
	t.Helper()
	lat := [2][]time.Duration{}
	for range per {
		for i, l := range []Limiter{a, b} {
			t0 := time.Now()
			d := admit(t, l, Request{Tenant: "acme", Limits: lim, InputTokens: 100, OutputTokens: 1})
			lat[i] = append(lat[i], time.Since(t0))
			if !d.Allowed {
				t.Fatalf("refused under limits it cannot reach: %+v", d)
			}
			settle(t, l, d.Ticket, Usage{InputTokens: 100, OutputTokens: 1})
		}
	}
	return percentile(lat[0], 0.99), percentile(lat[1], 0.99)
}

// TestRegionsPartition cuts the farthest region off the global store while
// it is the hot region and asserts: it keeps serving, within its last
// share (its admitted tokens ≤ what its share before the cut allows); its
// share decays to the floor within Hold+Decay and the others take what it
// released without the shares ever summing above 1; after the link heals
// it reconciles (syncs again and gets a share above the floor back from
// the global store's record, still never summing above 1). CI runs a 3 s
// partition with the timing scaled down (interval 100 ms, hold 300 ms,
// decay 2 s); SLUICE_REGION_PARTITION=30s runs the full figure with the
// default timing (interval 1 s, hold 3 s, decay 20 s).
func TestRegionsPartition(t *testing.T) {
	cut := envDuration(t, "SLUICE_REGION_PARTITION", 3*time.Second)
	opt := fastRegionOptions()
	if cut >= 25*time.Second {
		opt = RegionOptions{} // the defaults
	}
	opt = opt.withDefaults()
	warm := 20 * opt.Interval
	f := startFleet(t, 3, 1, opt)
	far := f.nodes[2]
	tenant := "acme"
	w := f.watchShares(tenant)
	G, B := float64(regionLimits.TokensPerMinute), float64(regionLimits.Burst)

	phase := func(d time.Duration, hot ...int) []*loadStats {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		stats := make([]*loadStats, len(f.nodes))
		var wg sync.WaitGroup
		for i, nd := range f.nodes {
			stats[i] = &loadStats{}
			every := 200 * time.Millisecond
			if slices.Contains(hot, nd.region) {
				every = 5 * time.Millisecond
			}
			wg.Add(1)
			go func() { defer wg.Done(); drive(ctx, nd, tenant, regionLimits, every, 100000, stats[i]) }()
		}
		wg.Wait()
		return stats
	}

	start := time.Now()
	// The far region's share grows with its demand at each rebalancing; on
	// a loaded machine the drivers send less per interval, so the warm-up
	// runs again (at most four times) until the share is the hot one's.
	var before []float64
	for try := 0; ; try++ {
		phase(warm, 2)
		before = f.shares(tenant)
		if before[2] >= 0.5 {
			break
		}
		if try == 3 {
			t.Fatalf("the hot far region's share before the cut is %.3f after %v of warm-up, want > 0.5",
				before[2], time.Since(start).Round(time.Millisecond))
		}
		t.Logf("warm-up %d: the hot far region's share is %.3f; warming up again", try+1, before[2])
	}
	_, failedBefore := far.Syncs()
	f.relays[2].Partition(true)
	cutAt := time.Now()
	during := phase(cut, 0, 2)
	cutFor := time.Since(cutAt)
	atEnd := f.shares(tenant)
	okBefore, failed := far.Syncs()
	f.relays[2].Partition(false)
	after := phase(warm, 0, 2)
	final := f.shares(tenant)
	okAfter, _ := far.Syncs()
	maxSum, samples := w.end()
	window := time.Since(start)
	var total int64
	for _, st := range [][]*loadStats{during, after} {
		for _, s := range st {
			total += s.tokens.Load()
		}
	}

	farServed := during[2].tokens.Load()
	allowed := before[2]*G*cutFor.Seconds()/60 + before[2]*B
	t.Logf("cut %v: far region share %.3f before, %.3f at the end of the cut, %.3f after healing; near region %.3f -> %.3f; far served %d tokens during the cut (its last share allows %.0f); far syncs failed %d; max share sum %.4f over %d samples; window %v",
		cutFor.Round(time.Millisecond), before[2], atEnd[2], final[2], before[0], atEnd[0], farServed, allowed,
		failed-failedBefore, maxSum, samples, window.Round(time.Millisecond))
	if failed == failedBefore {
		t.Errorf("the cut region's rebalancing never failed: the partition did not take")
	}
	if farServed == 0 || float64(farServed) < f.opt.MinShare/3*G*cutFor.Seconds()/60/2 {
		t.Errorf("the cut region served %d tokens in %v: it must keep serving at least half its floor", farServed, cutFor)
	}
	if float64(farServed) > allowed {
		t.Errorf("the cut region served %d tokens; its last share %.3f allows %.0f", farServed, before[2], allowed)
	}
	floor := opt.floor()
	if cutFor > opt.Hold+opt.Decay+2*opt.Interval && atEnd[2] > floor+1e-9 {
		t.Errorf("after %v cut off the far region's share is %.4f, want its floor %.4f", cutFor, atEnd[2], floor)
	}
	if atEnd[0] <= before[0] {
		t.Errorf("the near region's share did not grow while the far one decayed: %.3f -> %.3f", before[0], atEnd[0])
	}
	if maxSum > 1+1e-6 {
		t.Errorf("the regions' shares summed to %.6f > 1: a share was granted twice", maxSum)
	}
	if okAfter <= okBefore {
		t.Errorf("the far region did not sync again after the link healed")
	}
	if final[2] <= floor+1e-9 {
		t.Errorf("after healing the hot far region's share is %.4f, still its floor: not reconciled", final[2])
	}
	span := cutFor + warm
	if bound := G*span.Seconds()/60 + B*(1+f.raised()); float64(total) > bound {
		t.Errorf("admitted %d tokens during and after the cut (%v); bound %.0f", total, span, bound)
	}
}
