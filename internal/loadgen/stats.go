package loadgen

import (
	"cmp"
	"encoding/json"
	"math"
	"slices"
	"time"
)

// Percentiles summarises a set of latency samples. Values are exact
// nearest-rank percentiles: with n samples sorted ascending, Pp is sample
// number ceil(p/100 × n) (1-based), so every figure was observed. The zero
// value (N == 0) means no samples.
type Percentiles struct {
	N   int
	P50 time.Duration
	P95 time.Duration
	P99 time.Duration
	Max time.Duration
}

// NearestRank returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method; the zero value for an empty slice.
func NearestRank[T cmp.Ordered](sorted []T, p float64) T {
	var zero T
	n := len(sorted)
	if n == 0 {
		return zero
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	return sorted[min(max(rank, 1), n)-1]
}

// Summarize sorts samples in place and returns their percentiles.
func Summarize(samples []time.Duration) Percentiles {
	if len(samples) == 0 {
		return Percentiles{}
	}
	slices.Sort(samples)
	return Percentiles{
		N:   len(samples),
		P50: NearestRank(samples, 50),
		P95: NearestRank(samples, 95),
		P99: NearestRank(samples, 99),
		Max: samples[len(samples)-1],
	}
}

// Get returns the named figure: "p50", "p95", "p99" or "max".
func (p Percentiles) Get(stat string) time.Duration {
	switch stat {
	case "p50":
		return p.P50
	case "p95":
		return p.P95
	case "p99":
		return p.P99
	}
	return p.Max
}

// stats are the figures Percentiles reports, in order.
var stats = []string{"p50", "p95", "p99", "max"}

// MarshalJSON writes milliseconds: {"n":…,"p50_ms":…,…}.
func (p Percentiles) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		N     int     `json:"n"`
		P50ms float64 `json:"p50_ms"`
		P95ms float64 `json:"p95_ms"`
		P99ms float64 `json:"p99_ms"`
		MaxMs float64 `json:"max_ms"`
	}{p.N, ms(p.P50), ms(p.P95), ms(p.P99), ms(p.Max)})
}

// ms converts a duration to fractional milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Stage is the distribution of one Server-Timing metric (or a stage derived
// from one) across requests.
type Stage struct {
	// Name is the metric name, or "network" for client TTFT − server ttft.
	Name string `json:"name"`
	// Unit is "ms" for durations, "" for counts and rates (tokens, tps).
	Unit string `json:"unit"`
	// N is the number of requests that reported it.
	N int `json:"n"`
	// P50, P95, P99 and Max are nearest-rank percentiles in Unit.
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func summarizeStage(name, unit string, v []float64) Stage {
	slices.Sort(v)
	s := Stage{Name: name, Unit: unit, N: len(v)}
	if len(v) > 0 {
		s.P50, s.P95, s.P99 = NearestRank(v, 50), NearestRank(v, 95), NearestRank(v, 99)
		s.Max = v[len(v)-1]
	}
	return s
}
