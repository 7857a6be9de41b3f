package loadgen

import (
	"context"
	"time"
)

// Comparison relates the target to the baseline, percentile by percentile.
type Comparison struct {
	// Target and Baseline are the two URLs.
	Target   string `json:"target"`
	Baseline string `json:"baseline"`
	// Rows hold TTFT, ITL and E2E at P50, P95, P99 and max, then token
	// delay (metric "token_delay") when either target reported one: its
	// DeltaMs is the per-token delay the target adds over the baseline.
	Rows []CompareRow `json:"rows"`
}

// CompareRow is one percentile of one metric on both targets.
type CompareRow struct {
	// Metric is "ttft", "itl", "e2e" or "token_delay"; Stat is "p50", "p95", "p99" or "max".
	Metric string `json:"metric"`
	Stat   string `json:"stat"`
	// TargetMs and BaselineMs are the two values in milliseconds.
	TargetMs   float64 `json:"target_ms"`
	BaselineMs float64 `json:"baseline_ms"`
	// Ratio is TargetMs / BaselineMs (0 when the baseline is 0).
	Ratio float64 `json:"ratio"`
	// DeltaMs is TargetMs − BaselineMs: the delay the target adds.
	DeltaMs float64 `json:"delta_ms"`
}

// runCompare alternates rounds A B B A A B … between the target (0) and the
// baseline (1); each gets cfg.Rounds rounds sharing its budget. The k-th
// round of both uses the same arrival seed and the same request bodies.
func runCompare(ctx context.Context, cfg Config, ts []*target, lv *live) []measurement {
	ms := make([]measurement, 2)
	var k [2]int
	for r := range 2 * cfg.Rounds {
		if ctx.Err() != nil {
			break
		}
		ti := 0 // A B B A: rounds 1 and 2 of every 4 go to the baseline
		if r%4 == 1 || r%4 == 2 {
			ti = 1
		}
		t := ts[ti]
		d, n := roundBudget(cfg, k[ti])
		warm := time.Duration(0)
		if k[ti] == 0 {
			warm = cfg.Warmup
		}
		if d == 0 && n == 0 {
			k[ti]++
			continue // more rounds than requests
		}
		t.seq.Store(int64(k[ti]) << 32) // round k: same bodies on both targets
		ph := newPhase(cfg, t, warm, d, n, k[ti])
		ph.label = t.role
		k[ti]++
		before := readCPU(cfg.PIDs)
		out := runPhase(ctx, ph, lv)
		ms[ti].add(out, readCPU(cfg.PIDs).since(before))
	}
	return ms
}

// roundBudget splits the per-target budget over cfg.Rounds rounds.
func roundBudget(cfg Config, k int) (time.Duration, int) {
	d := cfg.Duration / time.Duration(cfg.Rounds)
	n := cfg.Requests / cfg.Rounds
	if k < cfg.Requests%cfg.Rounds {
		n++
	}
	if cfg.Requests > 0 && n == 0 {
		return 0, 0 // this round would be unbounded in count: skip it
	}
	return d, n
}

func compareTargets(t, b *TargetReport) *Comparison {
	c := &Comparison{Target: t.URL, Baseline: b.URL}
	metrics := []struct {
		name string
		t, b Percentiles
	}{{"ttft", t.TTFT, b.TTFT}, {"itl", t.ITL, b.ITL}, {"e2e", t.E2E, b.E2E}}
	if t.TokenDelay.N > 0 || b.TokenDelay.N > 0 {
		metrics = append(metrics, struct {
			name string
			t, b Percentiles
		}{"token_delay", t.TokenDelay, b.TokenDelay})
	}
	for _, m := range metrics {
		for _, s := range stats {
			tv, bv := ms(m.t.Get(s)), ms(m.b.Get(s))
			row := CompareRow{Metric: m.name, Stat: s, TargetMs: tv, BaselineMs: bv, DeltaMs: tv - bv}
			if bv > 0 {
				row.Ratio = tv / bv
			}
			c.Rows = append(c.Rows, row)
		}
	}
	return c
}
