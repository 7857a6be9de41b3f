package limiter

import (
	"testing"
	"time"
)

// FuzzLocal feeds arbitrary limits and sizes to Local: it must never panic,
// never report negative quotas, and admit only with a ticket.
func FuzzLocal(f *testing.F) {
	f.Add(int64(2), int64(1000), int64(0), int64(60), int64(0), int64(100), int64(50), int64(10), int64(0))
	f.Add(int64(-1), int64(-5), int64(-7), int64(0), int64(1), int64(-100), int64(1<<62), int64(-3), int64(1<<40))
	f.Fuzz(func(t *testing.T, conc, tpm, burst, rpm, itpm, in, out, actualIn, actualOut int64) {
		l := NewLocal(1)
		now := time.Now()
		lim := Limits{MaxConcurrency: int(conc % 1000), TokensPerMinute: tpm, Burst: burst,
			RequestsPerMinute: rpm, InputTokensPerMinute: itpm, OutputTokensPerMinute: itpm / 2}
		for i := 0; i < 3; i++ {
			d := l.AdmitAt(now, Request{Tenant: "f", Limits: lim, InputTokens: in, OutputTokens: out})
			if d.Allowed != (d.Ticket != nil) {
				t.Fatalf("allowed %v with ticket %v", d.Allowed, d.Ticket)
			}
			for _, q := range []Quota{d.Requests, d.Tokens, d.InputTokens, d.OutputTokens, d.Concurrency} {
				if q.Remaining < 0 || q.Reset < 0 {
					t.Fatalf("negative quota %+v", q)
				}
			}
			if !d.Allowed && d.RetryAfter < 0 {
				t.Fatalf("negative RetryAfter %v", d.RetryAfter)
			}
			if d.Ticket != nil {
				if err := l.SettleAt(now, d.Ticket, Usage{InputTokens: actualIn, OutputTokens: actualOut}); err != nil {
					t.Fatal(err)
				}
			}
			now = now.Add(time.Second)
		}
	})
}
