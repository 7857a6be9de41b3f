package limiter

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// newShared returns a Shared on a new client of addr. Store timeouts left
// zero are storeTimeout, not the production defaults (20ms, 250ms): a test
// that wants degraded decisions sets a short AdmissionTimeout itself.
func newShared(t testing.TB, addr string, ropt RedisOptions, sopt SharedOptions) *Shared {
	t.Helper()
	if sopt.AdmissionTimeout == 0 {
		sopt.AdmissionTimeout = storeTimeout
	}
	if sopt.SettleTimeout == 0 {
		sopt.SettleTimeout = storeTimeout
	}
	if sopt.Logger == nil {
		sopt.Logger = slog.New(slog.DiscardHandler)
	}
	return NewShared(newRedis(t, addr, ropt), sopt)
}

// evalCalls counts scripts run by the server (EVALSHA + EVAL).
func evalCalls(t testing.TB, srv *redistest.Server) int64 {
	t.Helper()
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				n += v
			}
		}
	}
	return n
}

func TestSharedFirstLineSavesRedisCalls(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	// Generous timeouts (newShared's): this test is about the first line.
	s := newShared(t, srv.Addr(), RedisOptions{}, SharedOptions{})
	other := newRedis(t, srv.Addr(), RedisOptions{}) // another node using the tenant

	t.Run("deny cache", func(t *testing.T) {
		lim := Limits{RequestsPerMinute: 10}
		for i := 0; i < 5; i++ {
			admit(t, other, Request{Tenant: "hot", Limits: lim})
		}
		before := evalCalls(t, srv)
		admitted := 0
		for i := 0; i < 1000; i++ {
			d := admit(t, s, Request{Tenant: "hot", Limits: lim})
			if d.Degraded {
				t.Fatalf("degraded decision %+v on a healthy store", d)
			}
			if d.Allowed {
				admitted++
			} else if d.Reason != ReasonRequests || d.RetryAfter <= 0 {
				t.Fatalf("refusal %q retry %v; want requests with a Retry-After", d.Reason, d.RetryAfter)
			}
		}
		calls := evalCalls(t, srv) - before
		if admitted != 5 {
			t.Errorf("admitted %d; want the 5 left of the shared limit", admitted)
		}
		if calls > 10 {
			t.Errorf("%d Redis script calls for 1000 admissions of a tenant over its limit; want about 6", calls)
		}
	})
	t.Run("local ceiling", func(t *testing.T) {
		lim := Limits{MaxConcurrency: 2}
		admit(t, s, Request{Tenant: "ceil", Limits: lim})
		admit(t, s, Request{Tenant: "ceil", Limits: lim})
		before := evalCalls(t, srv)
		for i := 0; i < 100; i++ {
			if d := admit(t, s, Request{Tenant: "ceil", Limits: lim}); d.Allowed || d.Reason != ReasonConcurrency {
				t.Fatalf("3rd stream on this node: allowed %v %q; want concurrency refusal", d.Allowed, d.Reason)
			}
		}
		if calls := evalCalls(t, srv) - before; calls != 0 {
			t.Errorf("%d Redis calls for refusals this node can decide alone; want 0", calls)
		}
	})
	t.Run("store refusal rolls the ceiling back", func(t *testing.T) {
		lim := Limits{MaxConcurrency: 1, RequestsPerMinute: 2}
		o := admit(t, other, Request{Tenant: "roll", Limits: lim})
		for i := 0; i < 5; i++ {
			if d := admit(t, s, Request{Tenant: "roll", Limits: lim}); d.Allowed {
				t.Fatal("admitted past the other node's lease")
			}
		}
		settle(t, other, o.Ticket, Usage{})
		if d := admit(t, s, Request{Tenant: "roll", Limits: lim}); !d.Allowed {
			t.Fatalf("refused %q after the slot freed: the local ceiling kept refused requests", d.Reason)
		}
	})
}

func TestSharedPolicies(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	reg := prometheus.NewRegistry()
	s := newShared(t, srv.Addr(), RedisOptions{}, SharedOptions{Nodes: 2, Registerer: reg,
		AdmissionTimeout: 50 * time.Millisecond, Cooldown: time.Hour})
	srv.Kill()
	open := admit(t, s, Request{Tenant: "p", Limits: Limits{MaxConcurrency: 1, OnStoreFailure: PolicyOpen}})
	closed := admit(t, s, Request{Tenant: "p2", Limits: Limits{OnStoreFailure: PolicyClosed}})
	local := admit(t, s, Request{Tenant: "p3", Limits: Limits{MaxConcurrency: 4}})
	if !open.Allowed || !open.Degraded {
		t.Errorf("open: %+v; want allowed, degraded", open)
	}
	if closed.Allowed || closed.Reason != ReasonStore || !closed.Degraded {
		t.Errorf("closed: %+v; want refused for store, degraded", closed)
	}
	if !local.Allowed || !local.Degraded {
		t.Errorf("local: %+v; want allowed, degraded", local)
	}
	// Local share 1/2 of 4 = 2 streams on this node.
	admit(t, s, Request{Tenant: "p3", Limits: Limits{MaxConcurrency: 4}})
	if d := admit(t, s, Request{Tenant: "p3", Limits: Limits{MaxConcurrency: 4}}); d.Allowed || d.Reason != ReasonConcurrency {
		t.Errorf("3rd local stream: allowed %v %q; want the node's share of 2 enforced", d.Allowed, d.Reason)
	}
	for _, p := range []struct {
		policy string
		want   float64
	}{{PolicyOpen, 1}, {PolicyClosed, 1}, {PolicyLocal, 3}} {
		if got := counterSum(t, reg, "sluice_limiter_degraded_total", "policy", p.policy); got != p.want {
			t.Errorf("degraded_total{policy=%q} = %v; want %v", p.policy, got, p.want)
		}
	}
	settle(t, s, open.Ticket, Usage{})
	settle(t, s, local.Ticket, Usage{InputTokens: 5})
}

// TestSharedPausedRedis stalls Redis (SIGSTOP) under a Shared limiter with
// a short admission timeout. The breaker runs on a fake clock, so its
// cooldown passes only when the test advances it, whatever the CPU does.
func TestSharedPausedRedis(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	const timeout, cooldown = 100 * time.Millisecond, time.Minute
	reg := prometheus.NewRegistry()
	s := newShared(t, srv.Addr(), RedisOptions{}, SharedOptions{Nodes: 2, AdmissionTimeout: timeout,
		FailureThreshold: 3, Cooldown: cooldown, Registerer: reg})
	clk := newFakeClock()
	s.now = clk.Now
	lim := Limits{MaxConcurrency: 4}
	// Healthy: a shared decision. On a starved CPU the first admission
	// (dial, script load) may outlast the short timeout; a success resets
	// the breaker's failure count, so retrying keeps the test exact.
	waitShared(t, s, clk, Request{Tenant: "pause", Limits: lim})

	srv.Pause()
	for i := 0; i < 3; i++ { // the breaker's threshold
		start := time.Now()
		d := admit(t, s, Request{Tenant: "pause-" + strconv.Itoa(i), Limits: lim})
		el := time.Since(start)
		if !d.Allowed || !d.Degraded {
			t.Fatalf("paused #%d: %+v; want a degraded local admission", i, d)
		}
		// The client's own read timeout is storeTimeout: returning well
		// before it shows AdmissionTimeout bounded the wait.
		if el < timeout || el > storeTimeout/4 {
			t.Errorf("paused admission %d took %v; want the admission timeout %v (not the client's %v)",
				i, el, timeout, storeTimeout)
		}
	}
	if !s.Degraded() {
		t.Fatal("breaker still closed after 3 timeouts")
	}
	// Breaker open: answers come without calling Redis, and the node
	// enforces its share (2 of 4).
	calls := storeCalls(t, reg)
	a := admit(t, s, Request{Tenant: "share", Limits: lim})
	b := admit(t, s, Request{Tenant: "share", Limits: lim})
	c := admit(t, s, Request{Tenant: "share", Limits: lim})
	if got := storeCalls(t, reg); got != calls {
		t.Errorf("%v store calls with the breaker open; want none", got-calls)
	}
	if !a.Allowed || !b.Allowed || c.Allowed || c.Reason != ReasonConcurrency || !c.Degraded {
		t.Errorf("share: %v %v %v (%q); want 2 of 4 admitted locally", a.Allowed, b.Allowed, c.Allowed, c.Reason)
	}
	settle(t, s, a.Ticket, Usage{}) // settled locally, no Redis wait
	srv.Resume()
	// After the cooldown one probe goes to Redis; its success closes the
	// breaker.
	waitShared(t, s, clk, Request{Tenant: "back", Limits: lim})
	if s.Degraded() {
		t.Error("breaker open after a shared decision")
	}
	settle(t, s, b.Ticket, Usage{})
}

// waitShared admits req until the decision is a shared one, moving clk past
// the breaker's cooldown before each try; it fails the test after 10s.
func waitShared(t *testing.T, s *Shared, clk *fakeClock, req Request) Decision {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		clk.Advance(s.opt.Cooldown)
		d := admit(t, s, req)
		if !d.Degraded {
			if !d.Allowed {
				t.Fatalf("shared decision %+v; want an admission", d)
			}
			return d
		}
		settle(t, s, d.Ticket, Usage{})
		if time.Now().After(deadline) {
			t.Fatalf("still degraded after 10s with Redis up: %+v", d)
		}
		time.Sleep(50 * time.Millisecond) // poll: Redis coming back has no event to wait on
	}
}

// storeCalls is how many admissions Shared sent to the store (answered or
// failed).
func storeCalls(t testing.TB, reg *prometheus.Registry) float64 {
	t.Helper()
	return counterSum(t, reg, "sluice_limiter_decisions_total", "source", "store") +
		counterSum(t, reg, "sluice_limiter_store_errors_total", "", "")
}

// counterSum adds up the counters called name that have label=value (every
// one when label is empty).
func counterSum(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				match = match || lp.GetName() == label && lp.GetValue() == value
			}
			if match {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestSharedRedisRestartUnderLoad restarts Redis (empty data set) under four
// loaded nodes: every request is answered (shared, or degraded while Redis
// is down), shared decisions resume on every node, and a heartbeat brings
// back the leases held across the restart. Degraded mode comes from Redis
// being down, not from timeouts: the admission timeout is generous so a
// starved CPU cannot fake an outage.
func TestSharedRedisRestartUnderLoad(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	var nodes []*Shared
	for i := 0; i < 4; i++ {
		nodes = append(nodes, newShared(t, srv.Addr(), RedisOptions{LeaseTTL: 3 * time.Second},
			SharedOptions{Nodes: 4, Cooldown: 200 * time.Millisecond})) // generous timeouts
	}
	lim := Limits{MaxConcurrency: 40, TokensPerMinute: 600000}
	// One long stream per node, held across the restart.
	held := make([]*Ticket, len(nodes))
	for i, n := range nodes {
		d := admit(t, n, Request{Tenant: "load", Limits: lim})
		if !d.Allowed || d.Degraded {
			t.Fatalf("node %d: %+v; want a shared admission on a healthy store", i, d)
		}
		held[i] = d.Ticket
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound, not the plan
	defer cancel()
	var restarted atomic.Bool
	var errs, degraded, sharedBefore atomic.Int64
	sharedAfter := make([]atomic.Int64, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		for g := 0; g < 6; g++ {
			wg.Go(func() {
				for ctx.Err() == nil {
					after := restarted.Load()
					d, err := n.Admit(ctx, Request{ID: nextID(), Tenant: "load", Limits: lim, InputTokens: 10, OutputTokens: 10})
					switch {
					case err != nil:
						if ctx.Err() == nil {
							errs.Add(1)
						}
						continue
					case d.Degraded:
						degraded.Add(1)
					case after:
						sharedAfter[i].Add(1)
					default:
						sharedBefore.Add(1)
					}
					if !d.Allowed {
						time.Sleep(time.Millisecond) // load: back off after a refusal
						continue
					}
					time.Sleep(5 * time.Millisecond) // load: hold the lease a while before settling
					_ = n.Settle(context.Background(), d.Ticket, Usage{InputTokens: 10, OutputTokens: 10})
				}
			})
		}
	}
	waitFor(t, "shared decisions before the restart", func() bool { return sharedBefore.Load() >= 100 })
	srv.Restart()
	restarted.Store(true)
	waitFor(t, "shared decisions on every node after the restart", func() bool {
		for i := range sharedAfter {
			if sharedAfter[i].Load() == 0 {
				return false
			}
		}
		return true
	})
	cancel()
	wg.Wait()
	t.Logf("shared decisions %d before, %d after the restart; degraded %d",
		sharedBefore.Load(), sumOf(sharedAfter), degraded.Load())
	if errs.Load() != 0 {
		t.Errorf("%d admission errors; the local policy must answer every request", errs.Load())
	}
	for _, n := range nodes {
		beat(t, n.Store())
	}
	sctx, scancel := context.WithTimeout(context.Background(), storeTimeout)
	defer scancel()
	st, err := nodes[0].Store().Snapshot(sctx, "load", lim)
	if err != nil || st.InFlight != int64(len(held)) {
		t.Errorf("after restart and a heartbeat: in-flight %d (%v); want the %d held leases back", st.InFlight, err, len(held))
	}
	for i, n := range nodes {
		settle(t, n, held[i], Usage{})
	}
}

// waitFor polls cond every 10ms until it holds; it fails the test after 15s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 15s", what)
		}
		time.Sleep(10 * time.Millisecond) // poll: the conditions are counters, no event to wait on
	}
}

// beat runs one heartbeat of r, retrying for up to 10s: right after a
// restart, or on a starved CPU, a beat may time out (it is bounded by the
// heartbeat period) and the next one make up for it, as in Run.
func beat(t *testing.T, r *Redis) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := r.Beat(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Beat: still failing after 10s: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // retry pace, as Run's next beat would
	}
}

func sumOf(v []atomic.Int64) int64 {
	var n int64
	for i := range v {
		n += v[i].Load()
	}
	return n
}
