package gpusim

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkStream measures the simulator's own cost through a real
// loopback listener and HTTP client (client costs included, so the figures
// are upper bounds on the simulator's share):
//
//   - unpaced: 64 streams with zero step times, one op = one token; shows
//     the per-token ceiling (tokens/s) and allocations per token.
//   - paced-64x10ms: 64 streams at 10 ms per token, 100 tokens each, one op
//     = one whole round; the ideal inter-token latency is 10 ms.
//   - sparse-2000x1s: 2000 streams at 1 token/s, 3 tokens each, one op =
//     one whole round; the ideal inter-token latency is 1 s.
//   - unpaced-stamped: unpaced with StampTokens, the cost of the stamps.
//   - pace-64x10ms, pace-sparse-2000x1s: the paced runs with Config.Pace
//     (a timer per stream) instead of the batch scheduler.
//
// tokens/s of the paced runs include connection set-up and queueing for
// the first step; itl-ms (mean over streams of each stream's mean
// inter-token latency at the client) and worst-itl-ms show whether the
// simulator keeps pace. cpu-% is the process CPU time over wall time
// (100 = one core busy).
func BenchmarkStream(b *testing.B) {
	b.Run("unpaced", func(b *testing.B) {
		const streams = 64
		per := max(1, b.N/streams)
		url := benchSim(b, Config{MaxBatch: streams, StepBase: -1, StepPerSeq: -1, PrefillBase: -1,
			PrefillPerToken: -1, KVCacheTokens: 1 << 30})
		b.ReportAllocs()
		cpu0, t0 := cpuTime(), time.Now()
		b.ResetTimer()
		_, _ = runStreams(b, url, streams, per)
		b.StopTimer()
		reportRates(b, streams*per, cpu0, t0)
	})
	b.Run("unpaced-stamped", func(b *testing.B) {
		const streams = 64
		per := max(1, b.N/streams)
		url := benchSim(b, Config{MaxBatch: streams, StepBase: -1, StepPerSeq: -1, PrefillBase: -1,
			PrefillPerToken: -1, KVCacheTokens: 1 << 30, StampTokens: true})
		b.ReportAllocs()
		cpu0, t0 := cpuTime(), time.Now()
		b.ResetTimer()
		_, _ = runStreams(b, url, streams, per)
		b.StopTimer()
		reportRates(b, streams*per, cpu0, t0)
	})
	for _, pc := range []struct {
		name           string
		streams, token int
		every          time.Duration
	}{{"pace-64x10ms", 64, 100, 10 * time.Millisecond}, {"pace-sparse-2000x1s", 2000, 3, time.Second}} {
		b.Run(pc.name, func(b *testing.B) {
			url := benchSim(b, Config{Pace: pc.every, PrefillBase: -1, PrefillPerToken: -1, KVCacheTokens: 1 << 20})
			cpu0, t0 := cpuTime(), time.Now()
			var mean, worst time.Duration
			for b.Loop() {
				mean, worst = runStreams(b, url, pc.streams, pc.token)
			}
			reportRates(b, b.N*pc.streams*pc.token, cpu0, t0)
			reportITL(b, mean, worst)
		})
	}
	b.Run("paced-64x10ms", func(b *testing.B) {
		const streams, tokens = 64, 100
		url := benchSim(b, Config{MaxBatch: streams, StepBase: 10 * time.Millisecond, StepPerSeq: -1,
			PrefillBase: -1, PrefillPerToken: -1})
		cpu0, t0 := cpuTime(), time.Now()
		var mean, worst time.Duration
		for b.Loop() {
			mean, worst = runStreams(b, url, streams, tokens)
		}
		reportRates(b, b.N*streams*tokens, cpu0, t0)
		reportITL(b, mean, worst)
	})
	b.Run("sparse-2000x1s", func(b *testing.B) {
		const streams, tokens = 2000, 3
		url := benchSim(b, Config{MaxBatch: streams, StepBase: time.Second, StepPerSeq: -1,
			PrefillBase: -1, PrefillPerToken: -1, KVCacheTokens: 1 << 20})
		cpu0, t0 := cpuTime(), time.Now()
		var mean, worst time.Duration
		for b.Loop() {
			mean, worst = runStreams(b, url, streams, tokens)
		}
		reportRates(b, b.N*streams*tokens, cpu0, t0)
		reportITL(b, mean, worst)
	})
}

func benchSim(b *testing.B, cfg Config) string {
	b.Helper()
	_, url := startSim(b, cfg)
	return url
}

// runStreams runs n concurrent completion streams of tokens tokens each,
// checks every stream ends with [DONE] after the right number of events,
// and returns the mean and the worst of the streams' mean inter-token
// latencies, as the client saw them.
func runStreams(b *testing.B, url string, n, tokens int) (mean, worst time.Duration) {
	tr := &http.Transport{MaxIdleConnsPerHost: n}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	body := fmt.Sprintf(`{"prompt":"benchmark","max_tokens":%d,"stream":true}`, tokens)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		sum time.Duration
	)
	for range n {
		wg.Go(func() {
			itl, err := readStream(client, url, body, tokens)
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			sum, worst = sum+itl, max(worst, itl)
			mu.Unlock()
		})
	}
	wg.Wait()
	return sum / time.Duration(n), worst
}

// readStream reads one stream of tokens tokens without parsing it (each
// event ends in a blank line and holds no other newline) and returns its
// mean inter-token latency.
func readStream(client *http.Client, url, body string, tokens int) (time.Duration, error) {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/v1/completions",
		bytes.NewReader([]byte(body)))
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	buf := make([]byte, 32<<10)
	newlines := 0
	var tail []byte
	var first, last time.Time
	for {
		n, err := resp.Body.Read(buf)
		newlines += bytes.Count(buf[:n], []byte{'\n'})
		if n > 0 {
			tail = append(tail[:0], buf[max(0, n-16):n]...)
		}
		if first.IsZero() && newlines >= 2 {
			first = time.Now()
		}
		if last.IsZero() && newlines >= 2*tokens {
			last = time.Now()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if newlines != 2*(tokens+2) || !bytes.HasSuffix(tail, []byte(doneEvent)) {
		return 0, fmt.Errorf("stream: %d events, ends %q; want %d ending [DONE]", newlines/2, tail, tokens+2)
	}
	return last.Sub(first) / time.Duration(max(1, tokens-1)), nil
}

func reportRates(b *testing.B, tokens int, cpu0 time.Duration, t0 time.Time) {
	wall := time.Since(t0)
	b.ReportMetric(float64(tokens)/wall.Seconds(), "tokens/s")
	b.ReportMetric(100*float64(cpuTime()-cpu0)/float64(wall), "cpu-%")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(tokens), "cpu-µs/token")
}

func reportITL(b *testing.B, mean, worst time.Duration) {
	b.ReportMetric(float64(mean.Microseconds())/1000, "itl-ms")
	b.ReportMetric(float64(worst.Microseconds())/1000, "worst-itl-ms")
}

// cpuTime is the process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
