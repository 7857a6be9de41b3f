package limiter_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
)

func ExampleLocal() {
	l := limiter.NewLocal(1)
	lim := limiter.Limits{MaxConcurrency: 1, RequestsPerMinute: 60, TokensPerMinute: 1000}
	ctx := context.Background()

	// Two decisions at one instant (Admit decides at the current time), so
	// the quota printed below does not depend on how fast this runs: the
	// token bucket refills by 1000 a minute.
	now := time.Now()
	first := l.AdmitAt(now, limiter.Request{ID: "r1", Tenant: "acme", Limits: lim, InputTokens: 120, OutputTokens: 80})
	second := l.AdmitAt(now, limiter.Request{ID: "r2", Tenant: "acme", Limits: lim, InputTokens: 10})
	fmt.Println(first.Allowed, first.Ticket.ChargedInput+first.Ticket.ChargedOutput)
	fmt.Println(second.Allowed, second.Reason, limiter.StatusCode(second))

	h := http.Header{}
	limiter.SetHeaders(h, second)
	fmt.Println(h.Get("RateLimit-Policy"))
	fmt.Println(h.Get("Retry-After"), h.Get("x-ratelimit-remaining-tokens"))

	// The stream ends: settle with the usage the backend reported.
	_ = l.Settle(ctx, first.Ticket, limiter.Usage{InputTokens: 120, OutputTokens: 30})
	third, _ := l.Admit(ctx, limiter.Request{ID: "r3", Tenant: "acme", Limits: lim, InputTokens: 10})
	fmt.Println(third.Allowed)
	// Output:
	// true 200
	// false concurrency 429
	// "requests";q=60;w=60, "tokens";q=1000;w=60;qu="tokens", "concurrency";q=1;qu="concurrency"
	// 1 800
	// true
}
