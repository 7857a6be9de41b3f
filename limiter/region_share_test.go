package limiter

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// twoRegions returns nodes of regions a and b sharing a global store
// directly (no relay), each over its own regional Redis, without Run: the
// test steps them with Rebalance.
func twoRegions(t *testing.T) (a, b *Region) {
	t.Helper()
	gc := newClient(t, startRedis(t).Addr())
	mk := func(name string) *Region {
		inner := NewShared(newRedis(t, startRedis(t).Addr(), RedisOptions{}), SharedOptions{AdmissionTimeout: storeTimeout})
		r, err := NewRegion(inner, gc, RegionOptions{Name: name, Regions: []string{"a", "b"}, NodeID: name + "-1",
			Interval: time.Second, Hold: time.Minute, Decay: time.Minute, Logger: discardSlog()})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	return mk("a"), mk("b")
}

// demand admits n requests of 101 tokens for tenant on r (half the global
// limit per minute, counted over a 1 s interval, for n = 50).
func demand(t *testing.T, r *Region, tenant string, n int) {
	t.Helper()
	for range n {
		d := admit(t, r, Request{Tenant: tenant, Limits: regionLimits, InputTokens: 100, OutputTokens: 1})
		if d.Allowed {
			settle(t, r, d.Ticket, Usage{InputTokens: 100, OutputTokens: 1})
		}
	}
}

func shareOf(r *Region, tenant string) float64 { return r.RegionStatus(tenant, regionLimits).Share }

// TestRegionLendThenBorrow steps two regions through a demand move from a
// to b and asserts the two-phase rule: b gets nothing of a's share until a
// has reported enforcing its smaller share (one round to be told, one to
// confirm), and the shares never sum above 1.
func TestRegionLendThenBorrow(t *testing.T) {
	a, b := twoRegions(t)
	ctx := context.Background()
	const tn = "acme"
	floor := a.Options().MinShare / 2
	check := func(step string) {
		t.Helper()
		if s := shareOf(a, tn) + shareOf(b, tn); s > 1+1e-9 {
			t.Fatalf("%s: shares %.4f + %.4f > 1", step, shareOf(a, tn), shareOf(b, tn))
		}
	}
	demand(t, a, tn, 50)
	a.Rebalance(ctx)
	b.tenant(tn) // b knows the tenant (at its floor) and reports no demand
	b.Rebalance(ctx)
	check("a hot")
	if got := shareOf(a, tn); math.Abs(got-(1-floor)) > 1e-6 {
		t.Fatalf("a alone has demand: share %.4f, want %.4f", got, 1-floor)
	}
	if got := shareOf(b, tn); math.Abs(got-floor) > 1e-6 {
		t.Fatalf("b idle: share %.4f, want its floor %.4f", got, floor)
	}
	aHigh := shareOf(a, tn)

	// Demand moves to b: b asks first, but a still enforces its share.
	demand(t, b, tn, 50)
	b.Rebalance(ctx)
	check("b asks")
	if got := shareOf(b, tn); got > 1-aHigh+1e-9 {
		t.Fatalf("b got %.4f while a still enforces %.4f", got, aHigh)
	}
	// a is told to lower its share; until it reports enforcing it, b
	// cannot have it.
	a.Rebalance(ctx)
	aLow := shareOf(a, tn)
	if aLow >= aHigh {
		t.Fatalf("a's share did not fall: %.4f -> %.4f", aHigh, aLow)
	}
	demand(t, b, tn, 50)
	b.Rebalance(ctx)
	check("a lowered, unconfirmed")
	if got := shareOf(b, tn); got > 1-aHigh+1e-9 {
		t.Fatalf("b got %.4f before a confirmed its lower share (a was at %.4f)", got, aHigh)
	}
	// a confirms; b borrows what a lent.
	a.Rebalance(ctx)
	aNow := shareOf(a, tn)
	demand(t, b, tn, 50)
	b.Rebalance(ctx)
	check("a confirmed")
	got := shareOf(b, tn)
	if got <= floor+1e-9 {
		t.Fatalf("b's share stayed at its floor %.4f after a lent", got)
	}
	if got > 1-aLow+1e-9 || got+aNow > 1+1e-9 {
		t.Fatalf("b's share %.4f with a at %.4f (confirmed %.4f): more than a lent", got, aNow, aLow)
	}
}

// TestRegionUsageReportsShare checks the usage endpoint's figures: the
// Status quotas are the region's (the global limit times the share) and
// Status.Region carries the share, the floor and the global limits; a
// tenant without limits passes through without any regional state.
func TestRegionUsageReportsShare(t *testing.T) {
	a, _ := twoRegions(t)
	demand(t, a, "acme", 20)
	a.Rebalance(context.Background())
	st := snapshot(t, a, "acme", regionLimits)
	if st.Region == nil {
		t.Fatal("no region in the status")
	}
	share := st.Region.Share
	if share <= a.floor || share > 1 {
		t.Fatalf("share %.4f after a round with demand", share)
	}
	if want := int64(math.Floor(float64(regionLimits.TokensPerMinute) * share)); st.Tokens.Limit != want {
		t.Errorf("tokens limit %d; want the region's share %d", st.Tokens.Limit, want)
	}
	if st.Region.GlobalTokensPerMinute != regionLimits.TokensPerMinute || st.Region.Name != "a" ||
		st.Region.LastSync.IsZero() || st.Region.Stale || st.Region.GlobalUse <= 0 || st.Region.Reserved > 1+1e-9 {
		t.Errorf("region status %+v", *st.Region)
	}
	b, err := json.Marshal(st)
	if err != nil || !strings.Contains(string(b), `"region":{"name":"a","share":`) {
		t.Errorf("usage JSON %s (%v)", b, err)
	}

	admit(t, a, Request{Tenant: "free", InputTokens: 10})
	if _, ok := a.tenants.Load("free"); ok {
		t.Errorf("a tenant without limits got regional state")
	}
	if st := snapshot(t, a, "free", Limits{}); st.Region != nil {
		t.Errorf("a tenant without limits has a region status: %+v", st.Region)
	}
	if rep := a.Report(); rep.Tenants["acme"].Share != share || !rep.Reachable || rep.Syncs != 1 {
		t.Errorf("report %+v", rep)
	}
}

// TestRegionDecay checks the cut-off schedule both sides assume: held for
// Hold, then linear to the floor over Decay, never below the floor.
func TestRegionDecay(t *testing.T) {
	h, d := 3*time.Second, 20*time.Second
	for _, c := range []struct {
		age  time.Duration
		want float64
	}{{0, 0.8}, {h, 0.8}, {h + d/2, 0.45}, {h + d, 0.1}, {h + 10*d, 0.1}} {
		if got := decayed(0.8, 0.1, c.age, h, d); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("decayed(0.8) after %v = %.4f; want %.4f", c.age, got, c.want)
		}
	}
	if got := decayed(0.05, 0.1, time.Hour, h, d); got != 0.05 {
		t.Errorf("a share below the floor moved: %.4f", got)
	}
}

// BenchmarkRegionAdmit measures what the regional layer adds to an
// admission: Region over a Local against the Local alone (no Redis, so the
// difference is the share lookup, the scaling of the limits and the demand
// counters).
func BenchmarkRegionAdmit(b *testing.B) {
	lim := Limits{TokensPerMinute: 1e12, RequestsPerMinute: 1e12, MaxConcurrency: 1 << 20}
	run := func(b *testing.B, l Limiter) {
		ctx := context.Background()
		req := Request{ID: "x", Tenant: "acme", Limits: lim, InputTokens: 100, OutputTokens: 1}
		b.ReportAllocs()
		for b.Loop() {
			d, err := l.Admit(ctx, req)
			if err != nil || !d.Allowed {
				b.Fatal(err, d)
			}
			_ = l.Settle(ctx, d.Ticket, Usage{InputTokens: 100, OutputTokens: 1})
		}
	}
	b.Run("local", func(b *testing.B) { run(b, NewLocal(1)) })
	b.Run("region", func(b *testing.B) {
		r, err := NewRegion(NewLocal(1), nil, RegionOptions{Name: "a", Regions: []string{"a", "b", "c"}})
		if err != nil {
			b.Fatal(err)
		}
		run(b, r)
	})
}

// TestRegionConcurrencyStaysReserved checks that concurrency leases stay
// regional and keep their share: a region holding streams keeps that much
// of the global concurrency reserved after its share fell, so another
// region cannot be granted slots that are still in use; once the streams
// end, the share moves.
func TestRegionConcurrencyStaysReserved(t *testing.T) {
	a, b := twoRegions(t)
	ctx := context.Background()
	lim := Limits{MaxConcurrency: 10}
	var held []*Ticket
	for range 8 { // a's share grows as its streams do
		a.Rebalance(ctx)
		d := admit(t, a, Request{Tenant: "acme", Limits: lim})
		if d.Allowed {
			held = append(held, d.Ticket)
		}
	}
	a.Rebalance(ctx)
	if len(held) < 6 {
		t.Fatalf("a admitted only %d streams of 10 (share %.3f)", len(held), shareOf(a, "acme"))
	}
	// b's streams now want the slots; a's demand is gone but its streams
	// are not.
	for range 6 {
		b.tenant("acme").peak.Store(10) // b's demand: the whole limit
		b.tenant("acme").gConc.Store(10)
		b.Rebalance(ctx)
		a.Rebalance(ctx)
	}
	inUse := float64(len(held)) / 10
	if got := b.RegionStatus("acme", lim).Share; got > 1-inUse+1e-9 {
		t.Fatalf("b's share %.3f while a still holds %d of 10 slots", got, len(held))
	}
	for _, tk := range held {
		settle(t, a, tk, Usage{})
	}
	for range 6 {
		b.tenant("acme").peak.Store(10)
		b.Rebalance(ctx)
		a.Rebalance(ctx)
	}
	if got := b.RegionStatus("acme", lim).Share; got <= 1-inUse+1e-9 {
		t.Errorf("b's share %.3f after a's streams ended; want more than %.3f", got, 1-inUse)
	}
}
