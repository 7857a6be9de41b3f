package limiter

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
		// Shared decisions alone never overshoot. On a loaded machine some
		// admissions can wait past admission_timeout and be decided by the
		// local policy; docs/SCALING.md ("Degraded to shared") bounds the
		// region then by the limit plus every node's share.
		bound := lim.MaxConcurrency
		if d > 0 {
			n := len(nodes)
			bound += n * ((lim.MaxConcurrency + n - 1) / n)
			t.Logf("burst %d: %d degraded decisions (machine load); bound %d", b, d, bound)
		}
		if len(got) > bound {
			t.Errorf("burst %d (cold %v): %d admitted on a limit of %d (%d degraded, bound %d)",
				b, b%2 == 0, len(got), lim.MaxConcurrency, d, bound)
		}
		if l := leases(t, srv, tenant); l > lim.MaxConcurrency {
			t.Errorf("burst %d: %d leases in Redis on a limit of %d", b, l, lim.MaxConcurrency)
		}
		for i, tk := range got {
			// A settle Redis answers late under machine load is queued for
			// the heartbeat (ErrSettleDeferred): the burst's bound holds.
			if err := by[i].Settle(context.Background(), tk, Usage{}); err != nil && !errors.Is(err, ErrSettleDeferred) {
				t.Fatalf("Settle: %v", err)
			}
		}
	}
	t.Logf("%d bursts of %d on 3 nodes, limit %d: peak %d admitted, %d degraded decisions",
		bursts, size, lim.MaxConcurrency, peak, deg)
}

// readyScope gives tenant's scope an epoch that is already ready, as
// after its first admission: a test with a short AdmissionTimeout does not
// want the new-scope wait (3×EpochPoll) in its first admission.
func readyScope(t testing.TB, srv *redistest.Server, tenant string) {
	t.Helper()
	if _, err := srv.Do("SET", scopePrefix(tenant, "", false)+":e", "1"); err != nil {
		t.Fatalf("SET: %v", err)
	}
}

// settleDone waits until Redis has processed what a resumed server had
// queued: a command on a new connection is answered after the backlog.
func settleDone(t testing.TB, srv *redistest.Server) {
	t.Helper()
	for i := 0; i < 3; i++ {
		if _, err := srv.Do("PING"); err != nil {
			t.Fatalf("PING: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFaultsStallNoPhantomLease stalls Redis (SIGSTOP) while admissions are
// on their way: their callers give up after AdmissionTimeout and decide
// locally; when Redis resumes and runs the queued scripts, none takes a
// lease or a request (the deadline check on Redis TIME), so the tenant's
// full limit is available at once, before any heartbeat.
func TestFaultsStallNoPhantomLease(t *testing.T) {
	srv := startRedis(t)
	lim := Limits{MaxConcurrency: 2, RequestsPerMinute: 10}
	stalled := prodNode(t, srv.Addr(), RedisOptions{}, SharedOptions{Nodes: 2, AdmissionTimeout: 100 * time.Millisecond})
	other := prodNode(t, srv.Addr(), RedisOptions{}, SharedOptions{Nodes: 2})
	readyScope(t, srv, "warmup")
	readyScope(t, srv, "stall")
	// Warm: a clock sample and connections.
	d := admit(t, stalled, Request{Tenant: "warmup", Limits: lim})
	settle(t, stalled, d.Ticket, Usage{})

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	var wg sync.WaitGroup
	var timedOut atomic.Int64
	var local []*Ticket
	var mu sync.Mutex
	for i := 0; i < 8; i++ {
		wg.Go(func() {
			d, err := stalled.Admit(context.Background(), Request{ID: nextID(), Tenant: "stall", Limits: lim})
			if err != nil {
				t.Errorf("Admit: %v", err)
				return
			}
			if d.Degraded {
				timedOut.Add(1)
			}
			if d.Allowed {
				mu.Lock()
				local = append(local, d.Ticket)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if timedOut.Load() == 0 {
		t.Fatal("no admission went to the stalled store")
	}
	time.Sleep(200 * time.Millisecond) // the stall outlasts every deadline
	srv.Resume()
	resumed = true
	settleDone(t, srv)
	if n := leases(t, srv, "stall"); n != 0 {
		t.Errorf("%d phantom leases after the stall (no heartbeat ran); want 0", n)
	}
	// The other node gets the full limit at once: no phantom lease or
	// request stands in the way.
	var got []*Ticket
	for i := 0; i < 2; i++ {
		d := admit(t, other, Request{Tenant: "stall", Limits: lim})
		if !d.Allowed || d.Degraded {
			t.Fatalf("admission %d after the stall: %+v; want a shared admission", i, d)
		}
		got = append(got, d.Ticket)
	}
	if d := admit(t, other, Request{Tenant: "stall", Limits: lim}); d.Allowed {
		t.Error("a third stream admitted on a limit of 2")
	}
	for _, tk := range got {
		settle(t, other, tk, Usage{})
	}
	for _, tk := range local {
		settle(t, stalled, tk, Usage{})
	}
}

// TestFaultsShutdownSettlesEverything: settles that failed during a stall,
// undos of timed-out admissions and tickets still live are all sent when
// the node's Run ends, so nothing of the node stays in Redis: no lease,
// and every token charge is settled (the bucket is full again).
func TestFaultsShutdownSettlesEverything(t *testing.T) {
	srv := startRedis(t)
	lim := Limits{MaxConcurrency: 10, TokensPerMinute: 6000}
	// A long heartbeat: only the shutdown can send what is queued.
	node := prodNode(t, srv.Addr(), RedisOptions{LeaseTTL: time.Hour},
		SharedOptions{AdmissionTimeout: 100 * time.Millisecond, SettleTimeout: 100 * time.Millisecond})
	readyScope(t, srv, "bye")
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = node.Run(ctx); close(ran) }()
	req := Request{Tenant: "bye", Limits: lim, InputTokens: 100, OutputTokens: 100}
	var tickets []*Ticket
	for i := 0; i < 4; i++ {
		d := admit(t, node, req)
		if !d.Allowed || d.Degraded {
			t.Fatalf("admission %d: %+v", i, d)
		}
		tickets = append(tickets, d.Ticket)
	}
	srv.Pause()
	// Two settles fail during the stall (queued); one admission times out
	// (its undo queued); two tickets stay live until the shutdown.
	for _, tk := range tickets[:2] {
		if err := node.Settle(context.Background(), tk, Usage{}); err == nil {
			t.Error("settle succeeded on a paused Redis")
		}
	}
	admit(t, node, req)
	srv.Resume()
	settleDone(t, srv)
	cancel()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if n := leases(t, srv, "bye"); n != 0 {
		t.Errorf("%d leases left after the shutdown; want 0", n)
	}
	// Settled with no use, the first two tickets were refunded; the live two
	// were settled at their charge (2 × 200 tokens stay spent).
	st := snapshot(t, NewRedis(newClient(t, srv.Addr()), RedisOptions{}), "bye", lim)
	if st.Tokens.Remaining < 6000-400 || st.Tokens.Remaining > 6000-400+refill(6000, time.Now().Add(-time.Minute)) {
		t.Errorf("tokens remaining %d after the shutdown; want %d (two refunds settled, two charges kept)",
			st.Tokens.Remaining, 6000-400)
	}
}

// TestFaultsRestartReassertsLeases restarts Redis empty while node A holds
// a limit-2 tenant's two streams. No heartbeat runs in the test's time (it
// is 20 minutes): A's epoch poll sees the scope's epoch change and
// re-asserts its leases within the new epoch's grace, during which no node
// admits in the scope; so node B's shared decisions after the restart are
// all refusals, and Redis holds A's two leases again.
func TestFaultsRestartReassertsLeases(t *testing.T) {
	srv := startRedis(t)
	lim := Limits{MaxConcurrency: 2}
	ropt := RedisOptions{LeaseTTL: time.Hour}
	a := prodNode(t, srv.Addr(), ropt, SharedOptions{Nodes: 2})
	b := prodNode(t, srv.Addr(), ropt, SharedOptions{Nodes: 2})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = a.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	var held []*Ticket
	for i := 0; i < 2; i++ {
		d := admit(t, a, Request{Tenant: "restart", Limits: lim})
		if !d.Allowed || d.Degraded {
			t.Fatalf("admission %d: %+v", i, d)
		}
		held = append(held, d.Ticket)
	}
	if d := admit(t, b, Request{Tenant: "restart", Limits: lim}); d.Allowed {
		t.Fatal("a third stream admitted before the restart")
	}
	srv.Restart()
	restarted := time.Now()
	var shared, admitted int
	for time.Since(restarted) < 1500*time.Millisecond {
		d := admit(t, b, Request{Tenant: "restart", Limits: lim})
		if d.Degraded {
			settle(t, b, d.Ticket, Usage{}) // degraded mode is not under test
			continue
		}
		shared++
		if d.Allowed {
			admitted++
			t.Errorf("shared admission %v after the restart while 2 of 2 streams run", time.Since(restarted))
			settle(t, b, d.Ticket, Usage{})
		}
		time.Sleep(10 * time.Millisecond)
	}
	if shared == 0 {
		t.Fatal("no shared decision after the restart")
	}
	if n := leases(t, srv, "restart"); n != 2 {
		t.Errorf("%d leases in Redis after the restart; want A's 2 re-asserted", n)
	}
	t.Logf("after the restart: %d shared decisions, %d admitted", shared, admitted)
	for _, tk := range held {
		settle(t, a, tk, Usage{})
	}
}

// TestRedisLogThroughSlog: go-redis' own log lines (here a failed dial
// with MaxRetries, against a closed port) become slog records.
func TestRedisLogThroughSlog(t *testing.T) {
	var buf syncBuffer
	SetRedisLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
	defer redis.SetLogger(discardLogger{})
	srv := startRedis(t)
	addr := srv.Addr()
	srv.Stop()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	_ = c.Ping(context.Background()).Err()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), `"msg":"redis client"`) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	out := buf.String()
	if !strings.Contains(out, `"msg":"redis client"`) || !strings.Contains(out, `"detail":`) {
		t.Fatalf("go-redis log lines not routed through slog: %q", out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(line, "{") {
			t.Errorf("unstructured log line %q", line)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// redisUptime is Redis' INFO server uptime_in_seconds.
func redisUptime(t testing.TB, srv *redistest.Server) int64 {
	t.Helper()
	v, err := srv.Do("INFO", "server")
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	_, rest, ok := strings.Cut(v, "uptime_in_seconds:")
	n, err := strconv.ParseInt(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]), 10, 64)
	if !ok || err != nil {
		t.Fatalf("no uptime in INFO server: %v", err)
	}
	return n
}

// TestFaultsNewTenantNoGrace (issue 20): a new tenant's first shared
// admission on a warm Redis (older than the restart window) takes no epoch
// grace: the scope's epoch starts now. On a Redis that just started (it
// may have restarted empty under nodes that hold leases) a new scope still
// waits the grace, so TestFaultsRestartReassertsLeases keeps its guarantee.
func TestFaultsNewTenantNoGrace(t *testing.T) {
	srv := startRedis(t)
	r := newRedis(t, srv.Addr(), RedisOptions{}) // grace 300ms, window 2s
	grace := r.Options().epochGrace()
	lim := Limits{MaxConcurrency: 5}

	start := time.Now()
	d := admit(t, r, Request{Tenant: "cold-redis", Limits: lim})
	if cold := time.Since(start); !d.Allowed || cold < grace {
		t.Fatalf("new scope on a Redis up %ds: allowed %v after %v; want the %v grace",
			redisUptime(t, srv), d.Allowed, cold, grace)
	}
	settle(t, r, d.Ticket, Usage{})

	deadline := time.Now().Add(10 * time.Second)
	for redisUptime(t, srv) <= r.Options().restartWindow() {
		if time.Now().After(deadline) {
			t.Fatal("Redis uptime does not pass the restart window")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var worst time.Duration
	for i := range 5 {
		tenant := "new-" + strconv.Itoa(i)
		start := time.Now()
		d := admit(t, r, Request{Tenant: tenant, Limits: lim})
		took := time.Since(start)
		worst = max(worst, took)
		if !d.Allowed {
			t.Fatalf("new tenant %s refused: %+v", tenant, d)
		}
		// The epoch written is not in the future: nothing waited for it.
		v, err := srv.Do("GET", scopePrefix(tenant, "", false)+":e")
		epoch, _ := strconv.ParseInt(v, 10, 64)
		if err != nil || epoch == 0 || epoch > time.Now().Add(time.Second).UnixMicro() {
			t.Fatalf("tenant %s epoch %q %v; want the admission's time", tenant, v, err)
		}
		settle(t, r, d.Ticket, Usage{})
	}
	if worst >= grace/2 {
		t.Fatalf("slowest first admission of a new tenant on a warm Redis: %v; want well under the %v grace", worst, grace)
	}
	t.Logf("first admission of 5 new tenants on a warm Redis: slowest %v (grace %v)", worst, grace)
}
