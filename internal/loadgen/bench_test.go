package loadgen

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// BenchmarkReadStream measures the client-side cost of one streamed
// response of 200 tokens read from memory: SSE framing, chunk parsing and
// recording (allocations are per stream, not per event).
func BenchmarkReadStream(b *testing.B) {
	body := roleChunk + strings.Repeat(
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"sim-small\","+
			"\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"finish_reason\":null}]}\n\n", 200) +
		usageChunk + doneEvent
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var res Result
	for b.Loop() {
		res = Result{ITL: res.ITL[:0]}
		err := readStream(bytes.NewReader([]byte(body)), time.Now(), &res, func() {})
		if res.Done != true || err == nil {
			b.Fatalf("stream not read: %+v, %v", res, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*202), "ns/event")
}

// BenchmarkParseServerTiming parses a full header and trailer.
func BenchmarkParseServerTiming(b *testing.B) {
	h := `net-rtt;dur=0.21, tls;dur=1.9, recv;dur=0.05, auth;dur=0.01, queue;dur=0.4, route;dur=0.01, upstream;dur=0.8, prefill;dur=120.5;desc="512 tokens", ttft;dur=122.3, edge;dur=0.3`
	ms := make([]Metric, 0, 16)
	b.ReportAllocs()
	for b.Loop() {
		ms = ParseServerTiming(ms[:0], h)
	}
}

// BenchmarkLoopbackH1 runs 64 concurrent streams of 100 tokens (no token
// interval) through a real loopback HTTP/1.1 server in the same process:
// an upper bound on the token rate one generator process takes in, with
// the server's cost included.
func BenchmarkLoopbackH1(b *testing.B) {
	srv := &sseServer{}
	url := startH1(b, srv)
	cfg := Config{Target: url, Workload: WorkloadCustom, PromptTokens: Dist{Kind: Fixed, A: 8},
		OutputTokens: Dist{Kind: Fixed, A: 100}, Concurrency: 64, Requests: 256}
	b.ReportAllocs()
	var tokens int64
	var wall time.Duration
	for b.Loop() {
		rep, err := Run(context.Background(), cfg, nil)
		if err != nil || rep.Targets[0].Counts.OK != 256 {
			b.Fatalf("run: %v %+v", err, rep.Targets[0].Counts)
		}
		tokens += rep.Targets[0].OutputTokens
		wall += rep.Targets[0].Wall
	}
	b.ReportMetric(float64(tokens)/wall.Seconds(), "tokens/s")
}

// BenchmarkSparseStreams holds 2,000 concurrent streams that each get a
// token every second (the server is in the same process) and reports how
// far the measured inter-token latency strays above the server's 1 s:
// the generator's own added delay at that scale.
func BenchmarkSparseStreams(b *testing.B) {
	srv := &sseServer{Interval: time.Second}
	url := startH1(b, srv)
	cfg := Config{Target: url, Workload: WorkloadCustom, PromptTokens: Dist{Kind: Fixed, A: 4},
		OutputTokens: Dist{Kind: Fixed, A: 4}, Concurrency: 2000, Requests: 2000, Timeout: time.Minute}
	for b.Loop() {
		rep, err := Run(context.Background(), cfg, nil)
		tr := rep.Targets[0]
		if err != nil || tr.Counts.OK != 2000 {
			b.Fatalf("run: %v %+v %+v", err, tr.Counts, tr.Errors)
		}
		b.ReportMetric(ms(tr.ITL.P50-time.Second), "itl-p50-over-1s-ms")
		b.ReportMetric(ms(tr.ITL.P99-time.Second), "itl-p99-over-1s-ms")
		b.ReportMetric(tr.GeneratorCPU.MsPer1kTokens, "cpu-ms/1k-tokens")
	}
}

// BenchmarkStreams64 runs the streaming shape (64 concurrent
// streams, 200 tokens 10 ms apart, HTTP/1.1; server in the same process)
// and reports how far measured ITL strays above 10 ms.
func BenchmarkStreams64(b *testing.B) {
	srv := &sseServer{Interval: 10 * time.Millisecond}
	url := startH1(b, srv)
	cfg := Config{Target: url, Workload: WorkloadCustom, PromptTokens: Dist{Kind: Fixed, A: 16},
		OutputTokens: Dist{Kind: Fixed, A: 200}, Concurrency: 64, Requests: 128}
	for b.Loop() {
		rep, err := Run(context.Background(), cfg, nil)
		tr := rep.Targets[0]
		if err != nil || tr.Counts.OK != 128 {
			b.Fatalf("run: %v %+v %+v", err, tr.Counts, tr.Errors)
		}
		b.ReportMetric(ms(tr.ITL.P50-10*time.Millisecond), "itl-p50-over-10ms-ms")
		b.ReportMetric(ms(tr.ITL.P99-10*time.Millisecond), "itl-p99-over-10ms-ms")
		b.ReportMetric(tr.GeneratorCPU.MsPer1kTokens, "cpu-ms/1k-tokens")
	}
}
