package limiter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Re-settling after a master change (resettle.go), on real redis-server
// processes (internal/redistest).

// runSettle runs ps's settle script on r's client, in resend mode or not,
// and returns the script's answer (1 applied, 0 nothing to do).
func runSettle(t *testing.T, r *Redis, ps pendingSettle, resend bool) int64 {
	t.Helper()
	sc := r.settleCall(ps)
	if resend {
		sc.args = append(sc.args, "resend")
	}
	n, err := sc.script.Run(context.Background(), r.client, sc.keys, sc.args...).Int64()
	if err != nil {
		t.Fatalf("settle script: %v", err)
	}
	return n
}

// tokenTAT is the raw tokens-bucket TAT of tenant's unscoped bucket.
func tokenTAT(t *testing.T, c *redis.Client, tenant string) string {
	t.Helper()
	v, err := c.Get(context.Background(), scopePrefix(tenant, "", false)+":k").Result()
	if err != nil && err != redis.Nil {
		t.Fatalf("GET TAT: %v", err)
	}
	return v
}

// A settle run twice (a heartbeat retry, or a resend after a master
// change that the new master already had) must change nothing the second
// time: neither the lease nor the token buckets (no second refund).
func TestRedisDoubleSettleIsNoOp(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	r := NewRedis(c, RedisOptions{})
	lim := Limits{MaxConcurrency: 3, TokensPerMinute: 6000}
	a := admit(t, r, Request{Tenant: "dbl", Limits: lim, InputTokens: 200})
	b := admit(t, r, Request{Tenant: "dbl", Limits: lim, InputTokens: 100})
	if !a.Allowed || !b.Allowed {
		t.Fatalf("admissions %+v, %+v; want both", a, b)
	}
	settle(t, r, a.Ticket, Usage{InputTokens: 10}) // a refund of 190 tokens
	tat := tokenTAT(t, c, "dbl")
	ps := pendingSettle{t: a.Ticket, u: Usage{InputTokens: 10}}
	for _, resend := range []bool{false, true} {
		if n := runSettle(t, r, ps, resend); n != 0 {
			t.Errorf("second settle (resend %v) = %d; want 0 (no-op)", resend, n)
		}
	}
	ps.abandon = true
	if n := runSettle(t, r, ps, true); n != 0 {
		t.Errorf("abandon after the settle = %d; want 0", n)
	}
	if got := tokenTAT(t, c, "dbl"); got != tat {
		t.Errorf("tokens TAT after the repeated settles %s; want %s unchanged (no second refund)", got, tat)
	}
	if got := inFlight(t, srv.Addr(), "dbl", lim); got != 1 {
		t.Errorf("leases = %d; want b's 1 left", got)
	}
	settle(t, r, b.Ticket, Usage{InputTokens: 100})
}

// A resent settle meeting no admission record (the admission was lost
// with the old master as well) gives nothing back: the tokens it would
// refund were never charged on this Redis. Old settle.lua applied it.
func TestRedisResendWithoutRecordRefundsNothing(t *testing.T) {
	t.Parallel()
	oldMaster, newMaster := startRedis(t), startRedis(t)
	lim := Limits{MaxConcurrency: 3, TokensPerMinute: 6000}
	ro := newRedis(t, oldMaster.Addr(), RedisOptions{})
	lost := admit(t, ro, Request{Tenant: "rs", Limits: lim, InputTokens: 200})
	settle(t, ro, lost.Ticket, Usage{InputTokens: 10})

	c := newClient(t, newMaster.Addr())
	rn := NewRedis(c, RedisOptions{})
	other := admit(t, rn, Request{Tenant: "rs", Limits: lim, InputTokens: 300})
	tat := tokenTAT(t, c, "rs")
	if n := runSettle(t, rn, pendingSettle{t: lost.Ticket, u: Usage{InputTokens: 10}}, true); n != 0 {
		t.Errorf("resend without a record = %d; want 0", n)
	}
	if got := tokenTAT(t, c, "rs"); got != tat {
		t.Errorf("tokens TAT %s after the resend; want %s (no refund of a charge this Redis never took)", got, tat)
	}
	if got, _ := newMaster.Do("EXISTS", recordKey("rs", lost.Ticket.ID)); got != "0" {
		t.Errorf("record of the lost admission written by the resend (EXISTS %s); want none", got)
	}
	settle(t, rn, other.Ticket, Usage{InputTokens: 300})
}

// The run_id watch: the OnConnect hook reads the server's run_id on each
// new connection; a different one (here a restart of the same address)
// signals a change, and Run then re-sends the recent settles: a settle
// the new server lacks (its lease and unsettled record back, as a replica
// promoted before the settle reached it has them) frees its slot at once.
func TestRedisResettleAfterServerChange(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	cfg := RedisConfig{Addrs: []string{srv.Addr()}, LeaseTTL: 30 * time.Second,
		AdmissionTimeout: storeTimeout, DialTimeout: storeTimeout, ReadTimeout: storeTimeout, WriteTimeout: storeTimeout}
	s := runNode(t, cfg)
	if s.Store().watch == nil {
		t.Fatal("NewFromConfig set no server watch")
	}
	lim := Limits{MaxConcurrency: 2}
	d := admit(t, s, Request{Tenant: "chg", Limits: lim})
	if !d.Allowed || d.Degraded {
		t.Fatalf("decision %+v; want shared", d)
	}
	inner := d.Ticket.impl.(*sharedTicket).inner
	settle(t, s, d.Ticket, Usage{})
	w := s.Store().watch
	w.mu.Lock()
	first := w.runID
	w.mu.Unlock()
	if info, _ := srv.Do("INFO", "server"); first == "" || !strings.Contains(info, "run_id:"+first) {
		t.Fatalf("watched run_id %q; want the server's (%q)", first, info)
	}

	// The server restarts (another run_id) holding the lease and the
	// unsettled record: the settle was lost.
	srv.Restart()
	pre := scopePrefix("chg", "", false)
	if _, err := srv.Do("ZADD", pre+":c", "99999999999999999", inner.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("SET", recordKey("chg", inner.ID), "0 0", "PX", "60000"); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, srv.Addr(), "chg", lim); got != 1 {
		t.Fatalf("leases after the restart = %d; want the lost settle's 1", got)
	}
	// The next command dials the restarted server (go-redis retries on a
	// closed connection): the hook sees the new run_id.
	start := time.Now()
	deadline := start.Add(5 * time.Second)
	for inFlight(t, srv.Addr(), "chg", lim) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("lease still held %v after the restart; want it freed by the resend", time.Since(start))
		}
		_, _ = s.Snapshot(context.Background(), "chg", lim) // a command on the node's client
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("lost settle re-sent and applied %v after the server change", time.Since(start).Round(time.Millisecond))
	if got, _ := srv.Do("GET", recordKey("chg", inner.ID)); got != "s" {
		t.Errorf("record after the resend %q; want s", got)
	}
}

func TestRecentRingBounded(t *testing.T) {
	var g recentRing
	base := time.Now()
	for i := range maxRecent + 10 {
		g.add(pendingSettle{t: &Ticket{ID: string(rune('a' + i%26))}, since: base.Add(time.Duration(i) * time.Millisecond)})
	}
	all := g.since(time.Time{})
	if len(all) != maxRecent {
		t.Fatalf("%d entries; want the bound %d", len(all), maxRecent)
	}
	if !all[0].since.Equal(base.Add(10*time.Millisecond)) || !all[len(all)-1].since.Equal(base.Add(time.Duration(maxRecent+9)*time.Millisecond)) {
		t.Errorf("kept %v..%v; want the newest %d, oldest first", all[0].since, all[len(all)-1].since, maxRecent)
	}
	if got := g.since(base.Add(time.Duration(maxRecent+5) * time.Millisecond)); len(got) != 5 {
		t.Errorf("since the 5 newest: %d entries; want 5", len(got))
	}
}

// A settle queued while Redis was away (the breaker open: settleLater)
// is sent by the next epoch poll (100ms), not by the next heartbeat
// (lease_ttl/3 = 10s with the default lease_ttl): its slot comes back as
// soon as Redis answers, e.g. on the new master after a failover.
func TestRedisQueuedSettleSentWithinEpochPoll(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	r := newRedis(t, srv.Addr(), RedisOptions{LeaseTTL: 30 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = r.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	lim := Limits{MaxConcurrency: 1}
	d := admit(t, r, Request{Tenant: "q", Limits: lim})
	time.Sleep(50 * time.Millisecond) // past Run's first beat
	start := time.Now()
	r.settleLater(d.Ticket, Usage{})
	for inFlight(t, srv.Addr(), "q", lim) != 0 {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("queued settle not sent %v later; want within a few epoch polls", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("queued settle applied %v after it was queued", time.Since(start).Round(time.Millisecond))
}
