package loadgen

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestNearestRank(t *testing.T) {
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	tests := []struct {
		name   string
		sorted []int
		p      float64
		want   int
	}{
		{"1..100 p50", hundred, 50, 50},
		{"1..100 p95", hundred, 95, 95},
		{"1..100 p99", hundred, 99, 99},
		{"1..100 p100", hundred, 100, 100},
		{"1..100 p0.1 is the first", hundred, 0.1, 1},
		{"one sample", []int{7}, 99, 7},
		{"two samples p50", []int{3, 9}, 50, 3},
		{"two samples p51", []int{3, 9}, 51, 9},
		{"ten samples p95 rounds up", []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 95, 10},
		{"ten samples p90", []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90, 9},
		{"empty", nil, 50, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NearestRank(tt.sorted, tt.p); got != tt.want {
				t.Errorf("NearestRank(p%g) = %d; want %d", tt.p, got, tt.want)
			}
		})
	}
}

func TestSummarizeKnownInputs(t *testing.T) {
	// 1000 samples 1ms..1000ms, shuffled: exact figures are known.
	s := make([]time.Duration, 1000)
	for i := range s {
		s[i] = time.Duration(i+1) * time.Millisecond
	}
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	got := Summarize(s)
	want := Percentiles{N: 1000, P50: 500 * time.Millisecond, P95: 950 * time.Millisecond,
		P99: 990 * time.Millisecond, Max: 1000 * time.Millisecond}
	if got != want {
		t.Errorf("Summarize = %+v; want %+v", got, want)
	}
	if got := Summarize(nil); got != (Percentiles{}) {
		t.Errorf("Summarize(nil) = %+v; want zero", got)
	}
}

func TestSummarizeSkewed(t *testing.T) {
	// 98 fast samples and 2 slow ones: p95 is fast, p99 and max are slow.
	var s []time.Duration
	for range 98 {
		s = append(s, time.Millisecond)
	}
	s = append(s, 500*time.Millisecond, 900*time.Millisecond)
	got := Summarize(s)
	if got.P95 != time.Millisecond || got.P99 != 500*time.Millisecond || got.Max != 900*time.Millisecond {
		t.Errorf("Summarize = %+v; want p95 1ms, p99 500ms, max 900ms", got)
	}
}

func TestPercentilesJSONInMilliseconds(t *testing.T) {
	b, err := Percentiles{N: 2, P50: 1500 * time.Microsecond, Max: 2 * time.Millisecond}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"n":2,"p50_ms":1.5,"p95_ms":0,"p99_ms":0,"max_ms":2}`
	if string(b) != want {
		t.Errorf("got %s; want %s", b, want)
	}
}

// TestTokenDelayFirstAndRest: the first stamped token of each request goes
// to TokenDelayFirst, the others to TokenDelayRest, and TokenDelay has all;
// TokenDelayLate has those of requests sent from lateAfter on.
func TestTokenDelayFirstAndRest(t *testing.T) {
	ms := time.Millisecond
	results := []Result{
		{Class: ClassOK, TokenDelay: []time.Duration{9 * ms, 1 * ms, 2 * ms}},
		{Class: ClassOK, Start: lateAfter, TokenDelay: []time.Duration{7 * ms, 3 * ms}},
		{Class: ClassOK}, // no stamped tokens
	}
	tr := summarizeTarget(results, time.Second)
	if tr.TokenDelay.N != 5 || tr.TokenDelayFirst.N != 2 || tr.TokenDelayRest.N != 3 {
		t.Fatalf("N: all %d first %d rest %d, want 5 2 3", tr.TokenDelay.N, tr.TokenDelayFirst.N, tr.TokenDelayRest.N)
	}
	if tr.TokenDelayFirst.Max != 9*ms || tr.TokenDelayFirst.P50 != 7*ms {
		t.Errorf("first: %+v, want P50 7ms max 9ms", tr.TokenDelayFirst)
	}
	if tr.TokenDelayRest.Max != 3*ms || tr.TokenDelayRest.P50 != 2*ms {
		t.Errorf("rest: %+v, want P50 2ms max 3ms", tr.TokenDelayRest)
	}
	if tr.TokenDelayLate.N != 2 || tr.TokenDelayLate.Max != 7*ms {
		t.Errorf("late: %+v, want the 2 tokens of the request sent at lateAfter", tr.TokenDelayLate)
	}
	// The results' own slices are not reordered by the summary.
	if results[0].TokenDelay[0] != 9*ms {
		t.Errorf("results[0].TokenDelay reordered: %v", results[0].TokenDelay)
	}
}
