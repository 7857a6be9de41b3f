package limiter

import (
	"testing"
	"time"
)

// semanticsCases run against Local and Redis alike: the two must decide,
// charge and settle the same way.
var semanticsCases = []struct {
	name string
	run  func(t *testing.T, l snapshotter, tenant string)
}{
	{"concurrency", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{MaxConcurrency: 2}
		a := admit(t, l, Request{Tenant: tenant, Limits: lim})
		b := admit(t, l, Request{Tenant: tenant, Limits: lim})
		c := admit(t, l, Request{Tenant: tenant, Limits: lim})
		if !a.Allowed || !b.Allowed || c.Allowed {
			t.Fatalf("allowed = %v %v %v; want true true false", a.Allowed, b.Allowed, c.Allowed)
		}
		if c.Reason != ReasonConcurrency || c.Ticket != nil {
			t.Errorf("refusal = %q ticket %v; want %q, no ticket", c.Reason, c.Ticket, ReasonConcurrency)
		}
		if b.Concurrency != (Quota{Limit: 2, Remaining: 0}) {
			t.Errorf("Concurrency = %+v; want limit 2 remaining 0", b.Concurrency)
		}
		settle(t, l, a.Ticket, Usage{})
		if d := admit(t, l, Request{Tenant: tenant, Limits: lim}); !d.Allowed {
			t.Fatalf("after settle: refused %q", d.Reason)
		}
	}},
	{"requests", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{RequestsPerMinute: 3}
		t0 := time.Now()
		for i := 0; i < 3; i++ {
			if d := admit(t, l, Request{Tenant: tenant, Limits: lim}); !d.Allowed {
				t.Fatalf("request %d refused: %q", i, d.Reason)
			}
		}
		d := admit(t, l, Request{Tenant: tenant, Limits: lim})
		if d.Allowed || d.Reason != ReasonRequests {
			t.Fatalf("4th = allowed %v reason %q; want refused for requests", d.Allowed, d.Reason)
		}
		// The bucket has been refilling since the first request.
		el := time.Since(t0)
		within(t, "RetryAfter", d.RetryAfter, 20*time.Second-el, 20*time.Second)
		if d.Requests.Limit != 3 || d.Requests.Remaining != 0 {
			t.Errorf("Requests = %+v; want limit 3 remaining 0", d.Requests)
		}
		within(t, "Requests.Reset", d.Requests.Reset, 60*time.Second-el, 60*time.Second)
	}},
	{"tokens and estimate", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{TokensPerMinute: 1000}
		t0 := time.Now()
		for i := 0; i < 5; i++ {
			d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 100, OutputTokens: 100})
			if !d.Allowed || d.Ticket.ChargedInput != 100 || d.Ticket.ChargedOutput != 100 {
				t.Fatalf("request %d: allowed %v ticket %+v; want charged 100+100", i, d.Allowed, d.Ticket)
			}
		}
		d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 100, OutputTokens: 100})
		if d.Allowed || d.Reason != ReasonTokens {
			t.Fatalf("6th = allowed %v reason %q; want refused for tokens", d.Allowed, d.Reason)
		}
		within(t, "RetryAfter", d.RetryAfter, 12*time.Second-time.Since(t0), 12*time.Second) // 200 tokens at 1000/min
		within(t, "Tokens.Remaining", d.Tokens.Remaining, 0, refill(1000, t0))
	}},
	{"reservation is input plus max_tokens times n", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{TokensPerMinute: 1000, DefaultMaxTokens: 100}
		d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 50, OutputTokens: 150, N: 3})
		if !d.Allowed || d.Ticket.ChargedInput != 50 || d.Ticket.ChargedOutput != 450 {
			t.Fatalf("n=3: %+v; want charged 50+450", d.Ticket)
		}
		d = admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 10, N: 2})
		if !d.Allowed || d.Ticket.ChargedInput != 10 || d.Ticket.ChargedOutput != 200 {
			t.Fatalf("default output, n=2: %+v; want charged 10+200", d.Ticket)
		}
		// 710 reserved: a third reservation of 300 no longer fits.
		if d = admit(t, l, Request{Tenant: tenant, Limits: lim, OutputTokens: 300}); d.Allowed {
			t.Fatalf("third admitted past the burst: %+v", d.Ticket)
		}
	}},
	{"token refusal takes no lease and no request", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{TokensPerMinute: 1000, MaxConcurrency: 10, RequestsPerMinute: 60}
		for i := 0; i < 2; i++ {
			admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 400, OutputTokens: 100})
		}
		t0 := time.Now()
		before := snapshot(t, l, tenant, lim)
		d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 400, OutputTokens: 100})
		if d.Allowed || d.Reason != ReasonTokens {
			t.Fatalf("3rd: allowed %v reason %q; want tokens refusal", d.Allowed, d.Reason)
		}
		after := snapshot(t, l, tenant, lim)
		if after.InFlight != 2 {
			t.Errorf("after refusal in-flight %d; want 2", after.InFlight)
		}
		within(t, "requests remaining after refusal", after.Requests.Remaining,
			before.Requests.Remaining, before.Requests.Remaining+refill(60, t0))
	}},
	{"concurrency refusal charges nothing", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{TokensPerMinute: 6000, MaxConcurrency: 1, RequestsPerMinute: 60}
		admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 100, OutputTokens: 100})
		t0 := time.Now()
		before := snapshot(t, l, tenant, lim)
		d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 100, OutputTokens: 100})
		if d.Allowed || d.Reason != ReasonConcurrency {
			t.Fatalf("2nd: allowed %v reason %q; want concurrency refusal", d.Allowed, d.Reason)
		}
		after := snapshot(t, l, tenant, lim)
		within(t, "tokens remaining", after.Tokens.Remaining, before.Tokens.Remaining, before.Tokens.Remaining+refill(6000, t0))
		within(t, "requests remaining", after.Requests.Remaining, before.Requests.Remaining, before.Requests.Remaining+refill(60, t0))
	}},
	{"debt", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{TokensPerMinute: 600} // 10 tokens/s, burst 600
		t0 := time.Now()
		d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 50, OutputTokens: 50})
		settle(t, l, d.Ticket, Usage{InputTokens: 50, OutputTokens: 650}) // 600 over the estimate
		d = admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 50, OutputTokens: 50})
		if d.Allowed || d.Reason != ReasonTokens {
			t.Fatalf("after debt: allowed %v %q; want tokens refusal", d.Allowed, d.Reason)
		}
		// 700 used + 100 asked - 600 burst = 200 tokens = 20 s.
		within(t, "RetryAfter", d.RetryAfter, 20*time.Second-time.Since(t0), 20*time.Second)
		if d.Tokens.Remaining != 0 {
			t.Errorf("Tokens.Remaining = %d in debt; want 0", d.Tokens.Remaining)
		}
	}},
	{"refund", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{TokensPerMinute: 600}
		a := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 100, OutputTokens: 200})
		settle(t, l, a.Ticket, Usage{InputTokens: 10}) // refund 290 of 300
		st := snapshot(t, l, tenant, lim)
		within(t, "remaining after partial refund", st.Tokens.Remaining, 589, 600)
	}},
	{"refund never beyond the burst", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{TokensPerMinute: 6000} // 100 tokens/s
		a := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 20, OutputTokens: 20})
		// Real time for the bucket to refill the 40 tokens: Redis refills
		// on its own clock (TIME), which no fake clock can move.
		time.Sleep(500 * time.Millisecond)
		settle(t, l, a.Ticket, Usage{}) // a refund of 40 into a full bucket
		st := snapshot(t, l, tenant, lim)
		if st.Tokens.Remaining != 6000 {
			t.Errorf("remaining after refund into a full bucket = %d; want exactly the burst 6000", st.Tokens.Remaining)
		}
		// A full burst holds half a burst twice, and no more.
		for i := 0; i < 2; i++ {
			if d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 2999, OutputTokens: 1}); !d.Allowed {
				t.Fatalf("half-burst %d refused: %q", i, d.Reason)
			}
		}
		if d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 2999, OutputTokens: 1}); d.Allowed {
			t.Fatal("third half-burst admitted: the refund created credit beyond the burst")
		}
	}},
	{"debt is bounded at one burst", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{TokensPerMinute: 600} // 10 tokens/s, burst 600
		t0 := time.Now()
		d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 50, OutputTokens: 50})
		settle(t, l, d.Ticket, Usage{InputTokens: 50, OutputTokens: 1 << 62}) // absurd usage
		d = admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 50, OutputTokens: 50})
		if d.Allowed || d.Reason != ReasonTokens {
			t.Fatalf("after absurd usage: allowed %v %q; want tokens refusal", d.Allowed, d.Reason)
		}
		// One burst of debt (TAT now + 1200 tokens) + 100 asked - 600 burst = 700 tokens = 70 s.
		within(t, "RetryAfter", d.RetryAfter, 70*time.Second-time.Since(t0), 70*time.Second)
		st := snapshot(t, l, tenant, lim)
		if st.Tokens.Remaining != 0 {
			t.Errorf("Tokens.Remaining = %d in debt; want 0", st.Tokens.Remaining)
		}
		within(t, "Tokens.Reset", st.Tokens.Reset, 120*time.Second-time.Since(t0), 120*time.Second)
	}},
	{"settle is idempotent", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{MaxConcurrency: 5, TokensPerMinute: 600}
		t0 := time.Now()
		a := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 100, OutputTokens: 100})
		admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 100, OutputTokens: 100})
		for i := 0; i < 3; i++ {
			settle(t, l, a.Ticket, Usage{InputTokens: 100, OutputTokens: 300})
		}
		st := snapshot(t, l, tenant, lim)
		if st.InFlight != 1 {
			t.Errorf("in-flight = %d after triple settle; want 1", st.InFlight)
		}
		within(t, "tokens remaining", st.Tokens.Remaining, 600-200-400, 600-200-400+refill(600, t0))
	}},
	{"shadow mode", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{MaxConcurrency: 1, Enforce: ptr(false)}
		a := admit(t, l, Request{Tenant: tenant, Limits: lim})
		b := admit(t, l, Request{Tenant: tenant, Limits: lim})
		if !a.Allowed || a.WouldRefuse || !b.Allowed || !b.WouldRefuse || b.Reason != ReasonConcurrency {
			t.Fatalf("shadow: a %+v b %+v; want both allowed, b would refuse for concurrency", a, b)
		}
		if st := snapshot(t, l, tenant, lim); st.InFlight != 2 || st.Enforced {
			t.Errorf("shadow in-flight %d enforced %v; want 2 leases, not enforced", st.InFlight, st.Enforced)
		}
		settle(t, l, b.Ticket, Usage{})
		settle(t, l, a.Ticket, Usage{})
	}},
	{"model override has its own scope", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{MaxConcurrency: 3, Models: map[string]Limits{"big": {MaxConcurrency: 1}}}
		if d := admit(t, l, Request{Tenant: tenant, Model: "big", Limits: lim}); !d.Allowed {
			t.Fatalf("big #1 refused: %q", d.Reason)
		}
		if d := admit(t, l, Request{Tenant: tenant, Model: "big", Limits: lim}); d.Allowed {
			t.Fatal("big #2 admitted past its override of 1")
		}
		if d := admit(t, l, Request{Tenant: tenant, Model: "small", Limits: lim}); !d.Allowed {
			t.Fatalf("small refused: %q", d.Reason)
		}
		st := snapshot(t, l, tenant, lim)
		if st.InFlight != 1 || len(st.Models) != 1 || st.Models[0].InFlight != 1 || st.Models[0].Concurrency.Limit != 1 {
			t.Errorf("status = %+v; want 1 in the tenant scope, 1 of 1 in model big", st)
		}
	}},
	{"input and output limits", func(t *testing.T, l snapshotter, tenant string) {
		lim := Limits{InputTokensPerMinute: 1000, OutputTokensPerMinute: 100}
		d := admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 400, OutputTokens: 50})
		if !d.Allowed || d.Ticket.ChargedInput != 400 || d.Ticket.ChargedOutput != 50 {
			t.Fatalf("first: %+v; want charged 400 in, 50 out", d.Ticket)
		}
		settle(t, l, d.Ticket, Usage{InputTokens: 400, OutputTokens: 150}) // 100 output over
		d = admit(t, l, Request{Tenant: tenant, Limits: lim, InputTokens: 10, OutputTokens: 10})
		if d.Allowed || d.Reason != ReasonOutputTokens {
			t.Fatalf("second: allowed %v %q; want output_tokens refusal", d.Allowed, d.Reason)
		}
		if d.InputTokens.Limit != 1000 || d.OutputTokens.Limit != 100 {
			t.Errorf("quotas in %+v out %+v; want limits 1000 and 100", d.InputTokens, d.OutputTokens)
		}
	}},
}

func TestSemantics(t *testing.T) {
	srv := startRedis(t)
	impls := map[string]func() snapshotter{
		"local": func() snapshotter { return NewLocal(1) },
		"redis": func() snapshotter { return newRedis(t, srv.Addr(), RedisOptions{}) },
	}
	for name, mk := range impls {
		for _, c := range semanticsCases {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				c.run(t, mk(), t.Name())
			})
		}
	}
}

func TestOversize(t *testing.T) {
	lim := Limits{TokensPerMinute: 2000, OutputTokensPerMinute: 5000, Burst: 1000,
		Models: map[string]Limits{"big": {Burst: 8000}}}
	for _, c := range []struct {
		req    Request
		reason string
		need   int64
	}{
		{Request{InputTokens: 100, OutputTokens: 900}, "", 0},
		{Request{InputTokens: 100, OutputTokens: 901}, ReasonTokens, 1001},
		{Request{InputTokens: 10, OutputTokens: 300, N: 4}, ReasonTokens, 1210},
		{Request{InputTokens: 10, OutputTokens: 300, N: 4, Model: "big"}, "", 0},
		{Request{OutputTokens: 1 << 40, N: 1 << 40, Model: "big"}, ReasonTokens, maxUsage},
		{Request{InputTokens: 1000}, ReasonTokens, 1256}, // default output estimate counts
	} {
		c.req.Limits = lim
		got := Oversize(c.req)
		switch {
		case c.reason == "" && got != nil:
			t.Errorf("%+v: oversize %+v; want it to fit", c.req, got)
		case c.reason != "" && (got == nil || got.Reason != c.reason || got.Need != c.need):
			t.Errorf("%+v: oversize %+v; want %s need %d", c.req, got, c.reason, c.need)
		}
	}
}
