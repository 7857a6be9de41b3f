package limiter

import (
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// BenchmarkFirstAdmission times a new node's first admission (what the
// warm-up at start is for): each iteration makes a client with
// NewFromConfig (its warm-up included, outside the timing), and, for
// "cold", undoes the warm-up (SCRIPT FLUSH and the client's connections
// killed) as a node without one would start; then one admission is timed.
// The scope has an epoch already (an admission before the loop), so a
// young Redis' epoch grace does not count. first-admit-µs is the median.
func BenchmarkFirstAdmission(b *testing.B) {
	srv := redistest.Start(b)
	cfg := RedisConfig{Addrs: []string{srv.Addr()}, AdmissionTimeout: storeTimeout,
		DialTimeout: storeTimeout, ReadTimeout: storeTimeout, WriteTimeout: storeTimeout}
	lim := Limits{MaxConcurrency: 1000}
	s0, err := NewFromConfig(cfg, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	settle(b, s0, admit(b, s0, Request{Tenant: "first", Limits: lim}).Ticket, Usage{})
	s0.Close()
	for _, cold := range []bool{false, true} {
		b.Run(map[bool]string{false: "warm", true: "cold"}[cold], func(b *testing.B) {
			var ds []time.Duration
			for range b.N {
				b.StopTimer()
				s, err := NewFromConfig(cfg, nil, slog.New(slog.DiscardHandler))
				if err != nil {
					b.Fatal(err)
				}
				if cold {
					srv.Do("SCRIPT", "FLUSH")
					srv.Do("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
				}
				b.StartTimer()
				t0 := time.Now()
				d := admit(b, s, Request{Tenant: "first", Limits: lim})
				ds = append(ds, time.Since(t0))
				b.StopTimer()
				settle(b, s, d.Ticket, Usage{})
				s.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(median(ds).Microseconds()), "first-admit-µs")
		})
	}
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
