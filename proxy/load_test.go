package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/gpusim"
	"github.com/sluice-proxy/sluice/routing"
)

// fleet returns three simulated GPUs with the given batch sizes and
// decode step bases (step = base + base/8 per sequence), 16 output tokens
// and a small prefill.
func fleet(batch [3]int, stepBase [3]time.Duration) []gpusim.Config {
	out := make([]gpusim.Config, 3)
	for i := range out {
		out[i] = gpusim.Config{MaxBatch: batch[i], StepBase: stepBase[i], StepPerSeq: stepBase[i] / 8,
			PrefillBase: 2 * time.Millisecond, PrefillPerToken: -1, DefaultMaxTokens: 16, Seed: int64(i + 1)}
	}
	return out
}

// testFleet is a fast, a medium and a small slow GPU: about 31, 16 and 1.8
// requests/s at 16 output tokens. Round robin's third of any load above
// ~6 requests/s overloads the slow one.
func testFleet() []gpusim.Config {
	return fleet([3]int{8, 8, 2}, [3]time.Duration{8 * time.Millisecond, 16 * time.Millisecond, 60 * time.Millisecond})
}

// benchFleet is three GPUs of unequal speed, same batch size: about 31,
// 16 and 10 requests/s at 16 output tokens (57 in all).
func benchFleet() []gpusim.Config {
	return fleet([3]int{8, 8, 8}, [3]time.Duration{8 * time.Millisecond, 16 * time.Millisecond, 24 * time.Millisecond})
}

// capacity estimates a simulator's throughput in requests per second with
// a full batch and tokens output tokens each.
func capacity(c gpusim.Config, tokens int) float64 {
	step := c.StepBase + time.Duration(c.MaxBatch)*c.StepPerSeq
	return float64(c.MaxBatch) / (float64(tokens) * step.Seconds())
}

// policyRun is one policy's result under an open-loop load.
type policyRun struct {
	policy        string
	sent, failed  int
	share         []float64 // fraction of requests each backend received
	p50, p95, p99 time.Duration
}

func (r policyRun) String() string {
	return fmt.Sprintf("%-13s sent %d, failed %d, shares %.2f, TTFT p50 %v p95 %v p99 %v", r.policy, r.sent, r.failed,
		r.share, r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.p99.Round(time.Millisecond))
}

// runPolicy starts fresh simulators and an edge whose pool uses policy,
// offers Poisson arrivals at rate per second for dur (same seed, same
// schedule for every policy) and measures TTFT at the client. A request
// without a first token when dur+grace ends counts with the time it had
// waited by then: a lower bound.
func runPolicy(t testing.TB, policy string, sims []gpusim.Config, rate float64, dur, grace time.Duration) policyRun {
	t.Helper()
	pool := routing.PoolConfig{Name: "p", Policy: policy}
	var running []*gpusim.Sim
	for _, c := range sims {
		sim, url := startSim(t, c)
		running = append(running, sim)
		pool.Backends = append(pool.Backends, routing.BackendConfig{URL: url, MaxBatch: c.MaxBatch})
	}
	e := startEdge(t, edgeOpts{pool: pool, start: true})
	ttfts, failed := openLoop(e.http+"/v1/chat/completions", rate, dur, grace)
	r := policyRun{policy: policy, sent: len(ttfts), failed: failed}
	total := 0
	for _, s := range running {
		total += s.Stats().Total
	}
	for _, s := range running {
		r.share = append(r.share, float64(s.Stats().Total)/float64(max(total, 1)))
	}
	slices.Sort(ttfts)
	r.p50, r.p95, r.p99 = quantile(ttfts, 0.50), quantile(ttfts, 0.95), quantile(ttfts, 0.99)
	return r
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(math.Ceil(q*float64(len(sorted))))-1, len(sorted)-1)]
}

// openLoop sends streamed chat requests to url at Poisson arrivals (a fixed
// seed) and returns each request's TTFT, and how many failed (non-200).
func openLoop(url string, rate float64, dur, grace time.Duration) (ttfts []time.Duration, failed int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	defer client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(42, 7))
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(dur+grace))
	defer cancel()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	body := `{"model":"sim-small","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hello"}]}`
	for at := time.Duration(0); at < dur; at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second)) {
		time.Sleep(time.Until(start.Add(at))) // paces the arrival schedule (load generation, not a wait)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ttft, ok := oneRequest(ctx, client, url, body)
			mu.Lock()
			ttfts = append(ttfts, ttft)
			if !ok {
				failed++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return ttfts, failed
}

// oneRequest sends one streamed request and reads it to the end; it
// returns the time to the first data event (or to ctx's end without one).
func oneRequest(ctx context.Context, client *http.Client, url, body string) (time.Duration, bool) {
	sent := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return time.Since(sent), false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return time.Since(sent), false
	}
	br := bufio.NewReader(resp.Body)
	var ttft time.Duration
	for {
		line, err := br.ReadString('\n')
		if ttft == 0 && strings.HasPrefix(line, "data:") {
			ttft = time.Since(sent)
		}
		if err != nil {
			if ttft == 0 {
				return time.Since(sent), false
			}
			return ttft, true
		}
	}
}
