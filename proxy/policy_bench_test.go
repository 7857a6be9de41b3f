package proxy_test

import (
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

// BenchmarkPolicies compares the selection policies under the same load:
// three simulated GPUs of unequal speed (benchFleet: ~31, 16 and 10
// requests/s), open-loop Poisson arrivals (one fixed seed, so every policy
// sees the same arrival schedule) at 80% of their total capacity for 15 s,
// streamed chat requests of 16 tokens through a real edge. It reports TTFT
// at the client, P50/P95/P99 per policy in milliseconds, the share of
// requests the fastest GPU got, and round_robin's P95 over least_queued's.
// A request still without a first token 10 s after the last arrival
// counts with the time it had waited: a lower bound. One run is enough:
//
//	go test ./proxy -run '^$' -bench BenchmarkPolicies -benchtime 1x
func BenchmarkPolicies(b *testing.B) {
	sims := benchFleet()
	total := 0.0
	for _, c := range sims {
		total += capacity(c, 16)
	}
	rate := 0.8 * total
	policies := []string{routing.PolicyLeastQueued, routing.PolicyRoundRobin, routing.PolicyLeastRequest}
	runs := map[string]policyRun{}
	for i := 0; i < b.N; i++ {
		for _, p := range policies {
			runs[p] = runPolicy(b, p, sims, rate, 15*time.Second, 10*time.Second)
		}
	}
	b.Logf("offered %.1f req/s, 80%% of ~%.1f", rate, total)
	for _, p := range policies {
		r := runs[p]
		b.Logf("%v", r)
		short := map[string]string{routing.PolicyLeastQueued: "lq", routing.PolicyRoundRobin: "rr", routing.PolicyLeastRequest: "lr"}[p]
		b.ReportMetric(ms(r.p50), short+"-p50-ms")
		b.ReportMetric(ms(r.p95), short+"-p95-ms")
		b.ReportMetric(ms(r.p99), short+"-p99-ms")
		b.ReportMetric(r.share[0], short+"-fast-share")
	}
	b.ReportMetric(float64(runs[routing.PolicyRoundRobin].p95)/float64(runs[routing.PolicyLeastQueued].p95), "rr/lq-p95")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
