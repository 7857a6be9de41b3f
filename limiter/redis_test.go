package limiter

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestRedisRetriedAdmissionChargedOnce(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	a, b := newRedis(t, srv.Addr(), RedisOptions{}), newRedis(t, srv.Addr(), RedisOptions{})
	lim := Limits{TokensPerMinute: 6000, MaxConcurrency: 3, RequestsPerMinute: 100}
	req := Request{ID: "retry-1", Tenant: "idem", Limits: lim, InputTokens: 100, OutputTokens: 100}
	t0 := time.Now() // the buckets refill from here on
	first := admit(t, a, req)
	req.InputTokens = 999 // a retry must keep the first charge
	second := admit(t, b, req)
	if !first.Allowed || !second.Allowed {
		t.Fatalf("allowed %v %v; want both", first.Allowed, second.Allowed)
	}
	if second.Ticket.ChargedInput != 100 || second.Ticket.ChargedOutput != 100 {
		t.Errorf("retry charged %d+%d; want the first charge 100+100", second.Ticket.ChargedInput, second.Ticket.ChargedOutput)
	}
	st := snapshot(t, a, "idem", lim)
	if st.InFlight != 1 {
		t.Errorf("in-flight = %d; want 1 lease for one id", st.InFlight)
	}
	within(t, "tokens remaining", st.Tokens.Remaining, 5800, 5800+refill(6000, t0))
	within(t, "requests remaining", st.Requests.Remaining, 99, 99+refill(100, t0))

	// Both tickets settle; the usage applies once.
	settle(t, a, first.Ticket, Usage{InputTokens: 100, OutputTokens: 500})
	settle(t, b, second.Ticket, Usage{InputTokens: 100, OutputTokens: 500})
	st = snapshot(t, a, "idem", lim)
	if st.InFlight != 0 {
		t.Errorf("in-flight after settle = %d; want 0", st.InFlight)
	}
	within(t, "tokens remaining after settle", st.Tokens.Remaining, 5400, 5400+refill(6000, t0))

	// An id reused after its settle is a new admission.
	third := admit(t, a, Request{ID: "retry-1", Tenant: "idem", Limits: lim, InputTokens: 10, OutputTokens: 10})
	if !third.Allowed || third.Ticket.ChargedInput != 10 {
		t.Errorf("reuse after settle: %+v; want a new admission charged 10", third.Ticket)
	}
}

func TestRedisConcurrentSettles(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	nodes := []*Redis{newRedis(t, srv.Addr(), RedisOptions{}), newRedis(t, srv.Addr(), RedisOptions{})}
	lim := Limits{TokensPerMinute: 6000, MaxConcurrency: 10}
	t0 := time.Now()
	d := admit(t, nodes[0], Request{ID: "dup", Tenant: "settles", Limits: lim, InputTokens: 100, OutputTokens: 100})
	d2 := admit(t, nodes[1], Request{ID: "dup", Tenant: "settles", Limits: lim, InputTokens: 100, OutputTokens: 100})
	admit(t, nodes[0], Request{Tenant: "settles", Limits: lim, InputTokens: 100, OutputTokens: 100})
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		tk, l := d.Ticket, nodes[0]
		if i%2 == 1 {
			tk, l = d2.Ticket, nodes[1]
		}
		wg.Go(func() {
			if err := l.Settle(context.Background(), tk, Usage{InputTokens: 100, OutputTokens: 1100}); err != nil {
				t.Errorf("Settle: %v", err)
			}
		})
	}
	wg.Wait()
	st := snapshot(t, nodes[0], "settles", lim)
	if st.InFlight != 1 {
		t.Errorf("in-flight = %d; want 1 (the other request)", st.InFlight)
	}
	// 6000 - 200 (other) - 1200 (actual, once) = 4600.
	within(t, "tokens remaining", st.Tokens.Remaining, 4600, 4600+refill(6000, t0))
}

func TestRedisCrashFreesSlotsWithinTTL(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	ttl := 600 * time.Millisecond
	crashed := newRedis(t, srv.Addr(), RedisOptions{LeaseTTL: ttl})
	other := newRedis(t, srv.Addr(), RedisOptions{LeaseTTL: ttl})
	lim := Limits{MaxConcurrency: 3}
	// Every lease is taken after start, so none can expire before start+ttl
	// however slowly the CPU lets this test run.
	start := time.Now()
	for i := 0; i < 3; i++ {
		admit(t, crashed, Request{Tenant: "crash", Limits: lim}) // never settled, never renewed
	}
	if d := admit(t, other, Request{Tenant: "crash", Limits: lim}); d.Allowed {
		t.Fatal("admitted while the crashed node holds every slot")
	}
	// A generous bound: on a starved CPU the polling itself may lag.
	const patience = 10 * time.Second
	for {
		d := admit(t, other, Request{Tenant: "crash", Limits: lim})
		if d.Allowed {
			break
		}
		if time.Since(start) > ttl+patience {
			t.Fatalf("slots still held %v after the crash (TTL %v)", time.Since(start), ttl)
		}
		time.Sleep(20 * time.Millisecond) // poll: expiry happens on Redis's clock, no event to wait on
	}
	// Redis expires leases on its own clock: allow it 10ms of skew. A lower
	// bound only: a slow machine can make el longer, never shorter.
	if el := time.Since(start); el < ttl-10*time.Millisecond {
		t.Errorf("slot freed after %v; leases live the TTL %v", el, ttl)
	}
}

func TestRedisLongStreamKeepsSlot(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	// Four beats per TTL, each bounded by the period: a starved CPU would
	// have to delay all four for the lease to lapse.
	ttl := 2 * time.Second
	holder := newRedis(t, srv.Addr(), RedisOptions{LeaseTTL: ttl, Heartbeat: ttl / 4})
	other := newRedis(t, srv.Addr(), RedisOptions{LeaseTTL: ttl})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = holder.Run(ctx) }()
	defer func() { cancel(); <-done }()

	lim := Limits{MaxConcurrency: 1}
	d := admit(t, holder, Request{Tenant: "long", Limits: lim})
	start := time.Now()
	for time.Since(start) < 3*ttl/2 { // past the TTL: only renewal keeps the slot
		if o := admit(t, other, Request{Tenant: "long", Limits: lim}); o.Allowed {
			t.Fatalf("slot taken by another node %v into a stream (TTL %v): heartbeat did not renew", time.Since(start), ttl)
		}
		time.Sleep(25 * time.Millisecond) // probe pace while real time passes the TTL on Redis's clock
	}
	settle(t, holder, d.Ticket, Usage{})
	if o := admit(t, other, Request{Tenant: "long", Limits: lim}); !o.Allowed {
		t.Fatalf("slot not free after settle: %q", o.Reason)
	}
}

func TestRedisRestartLeasesComeBack(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	r := newRedis(t, srv.Addr(), RedisOptions{})
	lim := Limits{MaxConcurrency: 2, TokensPerMinute: 6000}
	d := admit(t, r, Request{Tenant: "restart", Limits: lim, InputTokens: 100, OutputTokens: 100})
	srv.Restart() // empty data set, empty script cache
	if st := snapshot(t, r, "restart", lim); st.InFlight != 0 {
		t.Fatalf("in-flight after restart = %d; want 0 (data lost)", st.InFlight)
	}
	beat(t, r)
	if st := snapshot(t, r, "restart", lim); st.InFlight != 1 {
		t.Fatalf("in-flight after heartbeat = %d; want the lease back", st.InFlight)
	}
	if r.Nodes() != 1 {
		t.Errorf("Nodes() = %d; want 1", r.Nodes())
	}
	// Admission and settle work on the empty script cache (NOSCRIPT path).
	admit(t, r, Request{Tenant: "restart", Limits: lim})
	settle(t, r, d.Ticket, Usage{InputTokens: 100, OutputTokens: 100})
	if st := snapshot(t, r, "restart", lim); st.InFlight != 1 {
		t.Errorf("in-flight = %d; want 1", st.InFlight)
	}
	// A settled lease is not resurrected by a later heartbeat.
	if err := r.Beat(context.Background()); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	if st := snapshot(t, r, "restart", lim); st.InFlight != 1 {
		t.Errorf("in-flight after beat = %d; want 1", st.InFlight)
	}
}

func TestRedisSettleRetriedByHeartbeat(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	r := newRedis(t, srv.Addr(), RedisOptions{})
	lim := Limits{MaxConcurrency: 2}
	d := admit(t, r, Request{Tenant: "retry-settle", Limits: lim})
	srv.Kill()
	if err := r.Settle(context.Background(), d.Ticket, Usage{}); err == nil {
		t.Fatal("Settle with Redis down returned nil")
	}
	srv.Restart()
	if _, err := srv.Do("ZADD", "{t:retry-settle}:c", "99999999999999999", d.Ticket.ID); err != nil {
		t.Fatal(err)
	}
	if err := r.Beat(context.Background()); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	if st := snapshot(t, r, "retry-settle", lim); st.InFlight != 0 {
		t.Errorf("in-flight = %d; want the queued settle to release the lease", st.InFlight)
	}
}

func TestRedisAbandonedAdmission(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	r := newRedis(t, srv.Addr(), RedisOptions{})
	lim := Limits{MaxConcurrency: 2, TokensPerMinute: 6000, RequestsPerMinute: 10}

	// The admission ran but its answer was lost: abandoning takes it back.
	req := Request{ID: "lost", Tenant: "abandon", Limits: lim, InputTokens: 100, OutputTokens: 100}
	admit(t, r, req)
	r.abandonLater(req)
	if err := r.Beat(context.Background()); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	st := snapshot(t, r, "abandon", lim)
	if st.InFlight != 0 || st.Tokens.Remaining != 6000 || st.Requests.Remaining != 10 {
		t.Errorf("after abandon: %+v; want no lease, full tokens and requests", st)
	}

	// The admission had not run yet: it never will.
	late := Request{ID: "late", Tenant: "abandon", Limits: lim}
	r.abandonLater(late)
	if err := r.Beat(context.Background()); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	if _, err := r.Admit(context.Background(), late); err != ErrAbandoned {
		t.Errorf("late admission: %v; want ErrAbandoned", err)
	}
	if st := snapshot(t, r, "abandon", lim); st.InFlight != 0 {
		t.Errorf("in-flight %d after a late abandoned admission; want 0", st.InFlight)
	}
}
