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

func newShared(t testing.TB, addr string, ropt RedisOptions, sopt SharedOptions) *Shared {
	t.Helper()
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

// counterValue reads one counter from reg.
func counterValue(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestSharedFirstLineSavesRedisCalls(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	// A generous timeout: this test is about the first line, not timeouts.
	s := newShared(t, srv.Addr(), RedisOptions{}, SharedOptions{AdmissionTimeout: 2 * time.Second})
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
		if got := counterValue(t, reg, "sluice_limiter_degraded_total", "policy", p.policy); got != p.want {
			t.Errorf("degraded_total{policy=%q} = %v; want %v", p.policy, got, p.want)
		}
	}
	settle(t, s, open.Ticket, Usage{})
	settle(t, s, local.Ticket, Usage{InputTokens: 5})
}

func TestSharedPausedRedis(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	const timeout = 100 * time.Millisecond
	s := newShared(t, srv.Addr(), RedisOptions{}, SharedOptions{Nodes: 2, AdmissionTimeout: timeout,
		FailureThreshold: 3, Cooldown: 300 * time.Millisecond})
	lim := Limits{MaxConcurrency: 4}
	if d := admit(t, s, Request{Tenant: "pause", Limits: lim}); !d.Allowed || d.Degraded {
		t.Fatalf("healthy: %+v; want a shared decision", d)
	}
	srv.Pause()
	var slow []time.Duration
	for i := 0; i < 3; i++ { // the breaker's threshold
		start := time.Now()
		d := admit(t, s, Request{Tenant: "pause-" + strconv.Itoa(i), Limits: lim})
		slow = append(slow, time.Since(start))
		if !d.Allowed || !d.Degraded {
			t.Fatalf("paused #%d: %+v; want a degraded local admission", i, d)
		}
	}
	for i, el := range slow {
		if el < timeout || el > 10*timeout {
			t.Errorf("paused admission %d took %v; want about the timeout %v", i, el, timeout)
		}
	}
	if !s.Degraded() {
		t.Fatal("breaker still closed after 3 timeouts")
	}
	// Breaker open: answers come without waiting on Redis, and the node
	// enforces its share (2 of 4).
	start := time.Now()
	a := admit(t, s, Request{Tenant: "share", Limits: lim})
	b := admit(t, s, Request{Tenant: "share", Limits: lim})
	c := admit(t, s, Request{Tenant: "share", Limits: lim})
	if el := time.Since(start); el >= timeout {
		t.Errorf("3 admissions with the breaker open took %v; want well under one timeout %v", el, timeout)
	}
	if !a.Allowed || !b.Allowed || c.Allowed || c.Reason != ReasonConcurrency || !c.Degraded {
		t.Errorf("share: %v %v %v (%q); want 2 of 4 admitted locally", a.Allowed, b.Allowed, c.Allowed, c.Reason)
	}
	settle(t, s, a.Ticket, Usage{}) // settled locally, no Redis wait
	srv.Resume()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := admit(t, s, Request{Tenant: "back", Limits: lim})
		if !d.Degraded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still degraded 10s after Redis came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s.Degraded() {
		t.Error("breaker open after a shared decision")
	}
	settle(t, s, b.Ticket, Usage{})
}

func TestSharedRedisRestartUnderLoad(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	var nodes []*Shared
	for i := 0; i < 4; i++ {
		nodes = append(nodes, newShared(t, srv.Addr(), RedisOptions{LeaseTTL: 3 * time.Second},
			SharedOptions{Nodes: 4, AdmissionTimeout: 50 * time.Millisecond, Cooldown: 200 * time.Millisecond}))
	}
	lim := Limits{MaxConcurrency: 40, TokensPerMinute: 600000}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var errs, degraded, shared atomic.Int64
	var held sync.Map // *Ticket -> node, tickets held across the restart
	var wg sync.WaitGroup
	for _, n := range nodes {
		for g := 0; g < 6; g++ {
			wg.Go(func() {
				for ctx.Err() == nil {
					d, err := n.Admit(context.Background(), Request{ID: nextID(), Tenant: "load", Limits: lim, InputTokens: 10, OutputTokens: 10})
					if err != nil {
						errs.Add(1)
						continue
					}
					if d.Degraded {
						degraded.Add(1)
					} else if d.Allowed {
						shared.Add(1)
					}
					if !d.Allowed {
						time.Sleep(time.Millisecond)
						continue
					}
					time.Sleep(5 * time.Millisecond)
					_ = n.Settle(context.Background(), d.Ticket, Usage{InputTokens: 10, OutputTokens: 10})
				}
			})
		}
	}
	// One long stream per node, held across the restart.
	for _, n := range nodes {
		d := admit(t, n, Request{Tenant: "load", Limits: lim})
		if d.Allowed && !d.Degraded {
			held.Store(d.Ticket, n)
		}
	}
	time.Sleep(time.Second)
	srv.Restart()
	wg.Wait()
	if errs.Load() != 0 {
		t.Errorf("%d admission errors; the local policy must answer every request", errs.Load())
	}
	t.Logf("shared decisions %d, degraded %d", shared.Load(), degraded.Load())
	if shared.Load() == 0 {
		t.Error("no shared decision at all")
	}
	for _, n := range nodes {
		if err := n.Store().Beat(context.Background()); err != nil {
			t.Fatalf("Beat: %v", err)
		}
	}
	heldN := 0
	held.Range(func(_, _ any) bool { heldN++; return true })
	st := snapshot(t, nodes[0], "load", lim)
	if st.Degraded || st.InFlight != int64(heldN) {
		t.Errorf("after restart and a heartbeat: in-flight %d (degraded %v); want the %d held leases back", st.InFlight, st.Degraded, heldN)
	}
	held.Range(func(k, v any) bool {
		settle(t, v.(*Shared), k.(*Ticket), Usage{})
		return true
	})
}
