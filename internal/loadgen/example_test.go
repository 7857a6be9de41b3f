package loadgen_test

import (
	"fmt"
	"time"

	"github.com/sluice-proxy/sluice/internal/loadgen"
)

func ExampleParseServerTiming() {
	ms := loadgen.ParseServerTiming(nil,
		`queue;dur=1.5, prefill;dur=42;desc="512 tokens, batch 8"`,
		`ttft;dur=44.1, garbage;;, edge`)
	for _, m := range ms {
		fmt.Printf("%s %v %g %q\n", m.Name, m.HasDur, m.Dur, m.Desc)
	}
	ttft, _ := loadgen.Lookup(ms, "ttft")
	fmt.Println("server ttft", ttft)
	// Output:
	// queue true 1.5 ""
	// prefill true 42 "512 tokens, batch 8"
	// ttft true 44.1 ""
	// edge false 0 ""
	// server ttft 44.1
}

func ExampleSummarize() {
	var samples []time.Duration
	for i := 1; i <= 200; i++ {
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	p := loadgen.Summarize(samples)
	fmt.Println(p.N, p.P50, p.P95, p.P99, p.Max)
	// Output: 200 100ms 190ms 198ms 200ms
}

func ExampleFindKnee() {
	point := func(c, tokensPerSec float64, p95TTFT time.Duration) loadgen.Point {
		return loadgen.Point{Kind: loadgen.SweepConcurrency, Value: c, OutputTokensPerSec: tokensPerSec,
			TTFT: loadgen.Percentiles{N: 100, P95: p95TTFT}}
	}
	points := []loadgen.Point{
		point(1, 100, 120*time.Millisecond),
		point(2, 195, 125*time.Millisecond),
		point(4, 380, 140*time.Millisecond),
		point(8, 700, 190*time.Millisecond),
		point(16, 740, 420*time.Millisecond), // +6% throughput, TTFT 3.5× low load
	}
	k := loadgen.FindKnee(points)
	fmt.Println("knee at", points[k].Label())
	// Output: knee at c=16
}
