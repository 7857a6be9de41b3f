package diagnose

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/observe"
)

// snapshot builds stats for one route with the given stage P95s (ms); P50
// and P99 are derived, ITL given as its P99.
func snapshot(p95 map[string]float64, itlP99 float64, running *float64, capacity int, slo observe.SLOMillis) observe.StatsSnapshot {
	st := map[string]observe.Percentiles{}
	for k, v := range p95 {
		st[k] = observe.Percentiles{N: 100, P50: v / 2, P95: v, P99: v * 1.2}
	}
	st[observe.StageITL] = observe.Percentiles{N: 5000, P50: itlP99 / 2, P95: itlP99 * 0.9, P99: itlP99}
	st[observe.StageE2E] = observe.Percentiles{N: 100, P50: 1000, P95: 2000, P99: 3000}
	w := observe.RouteWindow{Requests: 100, Stages: st}
	return observe.StatsSnapshot{
		SLO:      slo,
		Routes:   []observe.RouteStats{{Route: "chat", Windows: map[string]observe.RouteWindow{"1m": w, "5m": w}}},
		Backends: []observe.BackendStat{{Pool: "p", URL: "http://b", Healthy: true, Running: running, Capacity: capacity}},
	}
}

func f(v float64) *float64 { return &v }

func TestVerdicts(t *testing.T) {
	cases := []struct {
		name     string
		snap     observe.StatsSnapshot
		kind     string
		dominant string
		breach   bool
	}{
		{"saturated GPUs", snapshot(map[string]float64{"queue": 50, "upstream": 5, "prefill": 1500, "ttft": 1600}, 40, f(7.8), 8, observe.SLOMillis{}),
			"capacity", "prefill", false},
		{"queue on idle GPUs", snapshot(map[string]float64{"queue": 900, "limit": 5, "upstream": 5, "prefill": 200, "ttft": 1150}, 30, f(2), 8, observe.SLOMillis{}),
			"scheduling", "queue", false},
		{"prefill bound", snapshot(map[string]float64{"queue": 1, "upstream": 3, "prefill": 1800, "ttft": 1810}, 30, f(4), 8, observe.SLOMillis{}),
			"prefill", "prefill", false},
		{"decode bound", snapshot(map[string]float64{"queue": 1, "upstream": 3, "prefill": 150, "ttft": 160}, 350, f(5), 8, observe.SLOMillis{}),
			"decode", "prefill", false},
		{"network bound", snapshot(map[string]float64{"net-rtt": 180, "tls": 170, "recv": 60, "upstream": 3, "prefill": 120, "ttft": 540}, 30, nil, 0, observe.SLOMillis{}),
			"network", "network", false},
		{"healthy", snapshot(map[string]float64{"queue": 1, "upstream": 2, "prefill": 150, "ttft": 160}, 30, f(3), 8, observe.SLOMillis{}),
			"ok", "prefill", false},
		{"SLO breach", snapshot(map[string]float64{"queue": 1, "upstream": 2, "prefill": 450, "ttft": 460}, 30, f(3), 8, observe.SLOMillis{TTFTP95: 300}),
			"prefill", "prefill", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reps := Analyze(tc.snap, Thresholds{})
			if len(reps) != 1 {
				t.Fatalf("%d reports", len(reps))
			}
			r := reps[0]
			kinds := []string{}
			for _, f := range r.Findings {
				kinds = append(kinds, f.Kind)
			}
			if !contains(kinds, tc.kind) {
				t.Errorf("findings %v; want %s", kinds, tc.kind)
			}
			if r.Dominant != tc.dominant {
				t.Errorf("dominant %s; want %s", r.Dominant, tc.dominant)
			}
			if (len(r.Breaches) > 0) != tc.breach {
				t.Errorf("breaches %v; want breach=%v", r.Breaches, tc.breach)
			}
			var out bytes.Buffer
			Write(&out, reps)
			if !strings.Contains(out.String(), "verdict ["+tc.kind+"]") || !strings.Contains(out.String(), "ttft") {
				t.Errorf("output lacks the verdict or the table:\n%s", out.String())
			}
		})
	}
}

func TestInsufficientData(t *testing.T) {
	s := snapshot(map[string]float64{"ttft": 100}, 10, nil, 0, observe.SLOMillis{})
	w := s.Routes[0].Windows["5m"]
	w.Requests = 3
	s.Routes[0].Windows["5m"], s.Routes[0].Windows["1m"] = w, w
	r := Analyze(s, Thresholds{})[0]
	if r.Findings[0].Kind != "insufficient-data" {
		t.Fatalf("findings %+v", r.Findings)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// The prediction table lists backends that have predictions, with their
// error percentiles, and nothing when none has.
func TestWritePredictions(t *testing.T) {
	var buf strings.Builder
	WritePredictions(&buf, []observe.BackendStat{{Pool: "p", URL: "http://a", PrefillRate: 9000, QueueWaitMS: 40}})
	if buf.Len() != 0 {
		t.Fatalf("printed without predictions: %q", buf.String())
	}
	p50, p95 := -20.0, 200.0
	WritePredictions(&buf, []observe.BackendStat{{Pool: "p", URL: "http://a", PrefillRate: 9000, QueueWaitMS: 40,
		PredErrors: 42, PredErrP50MS: &p50, PredErrP95MS: &p95}})
	out := buf.String()
	for _, want := range []string{"TTFT prediction error", "http://a", "-20", "200", "42", "9000", "40.0"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
