package proxy_test

import (
	"context"
	"fmt"
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

// chatFleet is four equal simulated GPUs with prefix caches: batch 8,
// decode step 8ms + 1ms per sequence, prefill 2ms + 0.1ms per uncached
// token (vLLM's 16-token blocks, 4096 of them: 64 Ki tokens each).
func chatFleet() []gpusim.Config {
	out := make([]gpusim.Config, 4)
	for i := range out {
		out[i] = gpusim.Config{MaxBatch: 8, StepBase: 8 * time.Millisecond, StepPerSeq: time.Millisecond,
			PrefillBase: 2 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond, DefaultMaxTokens: 16,
			Seed: int64(i + 1), KVCacheTokens: 1 << 16, PrefixCacheBlocks: 4096}
	}
	return out
}

// Multi-turn workload: every conversation has up to chatTurns turns; each
// turn adds a user message of ~chatTurnBytes and the assistant's previous
// answer, so turn k's prompt is about k × 250 tokens and starts with turn
// k-1's prompt byte for byte.
const (
	chatTurns     = 8
	chatTurnBytes = 800
	chatOutTokens = 16
)

// chatCapacity estimates the fleet's throughput in requests/s on this
// workload without any prefix reuse: per request, the prefill of its
// average prompt (it stalls the batch's step) plus its share of the
// decode steps of a full batch.
func chatCapacity(sims []gpusim.Config) float64 {
	total := 0.0
	avgTokens := float64(chatTurns+1) / 2 * (chatTurnBytes + 200) / 4
	for _, c := range sims {
		step := c.StepBase + time.Duration(c.MaxBatch)*c.StepPerSeq
		per := c.PrefillBase.Seconds() + avgTokens*c.PrefillPerToken.Seconds() +
			chatOutTokens*step.Seconds()/float64(c.MaxBatch)
		total += 1 / per
	}
	return total
}

type conversation struct {
	id, turns int
	history   strings.Builder // the messages so far, without the closing ]
}

func (c *conversation) next(rng *rand.Rand) string {
	if c.turns == 0 {
		fmt.Fprintf(&c.history, `[{"role":"system","content":"You are assistant %d. Answer briefly."}`, c.id)
	} else {
		fmt.Fprintf(&c.history, `,{"role":"assistant","content":"answer %d of conversation %d: %s"}`, c.turns, c.id, strings.Repeat("ok ", 60))
	}
	words := make([]byte, 0, chatTurnBytes)
	for len(words) < chatTurnBytes {
		words = append(words, "abcdefghijklmnopqrstuvwxyz"[rng.IntN(26)])
		if rng.IntN(6) == 0 {
			words = append(words, ' ')
		}
	}
	fmt.Fprintf(&c.history, `,{"role":"user","content":"%s"}`, words)
	c.turns++
	return fmt.Sprintf(`{"model":"sim-small","stream":true,"max_tokens":%d,"messages":%s]}`, chatOutTokens, c.history.String())
}

// conversations hands out the workload's conversations: an idle one at
// random, or a new one when none is idle or the one drawn has had all its
// turns; a conversation is put back when its turn is answered.
type conversations struct {
	mu     sync.Mutex
	idle   []*conversation
	nextID int
}

// take returns a conversation and its next request body.
func (cs *conversations) take(rng *rand.Rand) (*conversation, string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var c *conversation
	if n := len(cs.idle); n > 0 {
		i := rng.IntN(n)
		c = cs.idle[i]
		cs.idle[i] = cs.idle[n-1]
		cs.idle = cs.idle[:n-1]
	}
	if c == nil || c.turns >= chatTurns {
		cs.nextID++
		c = &conversation{id: cs.nextID}
	}
	return c, c.next(rng)
}

func (cs *conversations) put(c *conversation) {
	cs.mu.Lock()
	cs.idle = append(cs.idle, c)
	cs.mu.Unlock()
}

// chatRun is one policy's result on the multi-turn workload.
type chatRun struct {
	policy        string
	sent, failed  int
	p50, p95, p99 time.Duration
	throughput    float64 // completed requests per second, first send to last end
	cachedShare   float64 // prompt tokens the engines found cached
}

func (r chatRun) String() string {
	return fmt.Sprintf("%-12s sent %d, failed %d, TTFT p50 %v p95 %v p99 %v, %.1f req/s, %.0f%% of prompt tokens cached",
		r.policy, r.sent, r.failed, r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond),
		r.p99.Round(time.Millisecond), r.throughput, 100*r.cachedShare)
}

// runChat starts fresh simulators and an edge whose pool uses policy and
// offers the multi-turn workload at rate turns/s for dur: Poisson arrivals
// (a fixed seed: the same schedule for every policy), each the next turn
// of a conversation that has none in flight (a user waits for the answer
// before typing the next turn); a conversation at chatTurns turns is
// replaced by a new one. TTFT is measured at the client; a request still
// without a first token when dur+grace ends counts with its wait so far.
func runChat(t testing.TB, policy string, sims []gpusim.Config, rate float64, dur, grace time.Duration) chatRun {
	t.Helper()
	pool := routing.PoolConfig{Name: "p", Policy: policy}
	var running []*gpusim.Sim
	var urls []string
	for _, c := range sims {
		sim, url := startSim(t, c)
		running, urls = append(running, sim), append(urls, url)
		pool.Backends = append(pool.Backends, routing.BackendConfig{URL: url, MaxBatch: c.MaxBatch})
	}
	e := startEdge(t, edgeOpts{pool: pool, start: true})
	url := e.http + "/v1/chat/completions"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	defer client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(42, 7))
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(dur+grace))
	defer cancel()
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		convs   conversations
		ttfts   []time.Duration
		failed  int
		lastEnd time.Time
	)
	for at := time.Duration(0); at < dur; at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second)) {
		time.Sleep(time.Until(start.Add(at))) // paces the arrival schedule (load generation, not a wait)
		c, body := convs.take(rng)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ttft, ok := oneRequest(ctx, client, url, body)
			mu.Lock()
			defer mu.Unlock()
			ttfts = append(ttfts, ttft)
			if !ok {
				failed++
			} else {
				lastEnd = time.Now()
			}
			convs.put(c)
		}()
	}
	wg.Wait()
	r := chatRun{policy: policy, sent: len(ttfts), failed: failed}
	r.throughput = float64(len(ttfts)-failed) / lastEnd.Sub(start).Seconds()
	slices.Sort(ttfts)
	r.p50, r.p95, r.p99 = quantile(ttfts, 0.50), quantile(ttfts, 0.95), quantile(ttfts, 0.99)
	var queries, hits float64
	for _, u := range urls {
		queries += scrapeCounter(t, u, "vllm:prefix_cache_queries_total")
		hits += scrapeCounter(t, u, "vllm:prefix_cache_hits_total")
	}
	r.cachedShare = hits / max(queries, 1)
	return r
}

// scrapeCounter reads one unlabelled-by-us counter from a simulator's
// /metrics (its value summed over label sets).
func scrapeCounter(t testing.TB, base, name string) float64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	total := 0.0
	for _, line := range strings.Split(sb.String(), "\n") {
		if strings.HasPrefix(line, name) {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				total += v
			}
		}
	}
	return total
}

// BenchmarkPrefixAffinity compares round_robin, least_queued and
// prefix_aware on a multi-turn chat workload (conversations that grow turn
// by turn, see chatFleet and runChat) on four simulated GPUs with prefix
// caches, at 70% of the fleet's capacity without prefix reuse, for 20 s
// per policy through a real edge. It reports TTFT P50/P99 at the client,
// throughput, the share of prompt tokens the engines found cached, and
// least_queued's P99 over prefix_aware's (the goal: at least 2).
// One run:
//
//	go test ./proxy -run '^$' -bench BenchmarkPrefixAffinity -benchtime 1x
func BenchmarkPrefixAffinity(b *testing.B) {
	sims := chatFleet()
	total := chatCapacity(sims)
	rate := 0.7 * total
	policies := []string{routing.PolicyRoundRobin, routing.PolicyLeastQueued, routing.PolicyPrefixAware, routing.PolicyPredictedTTFT}
	runs := map[string]chatRun{}
	for i := 0; i < b.N; i++ {
		for _, p := range policies {
			runs[p] = runChat(b, p, sims, rate, 20*time.Second, 10*time.Second)
		}
	}
	b.Logf("offered %.1f turns/s, 70%% of ~%.1f without prefix reuse", rate, total)
	for _, p := range policies {
		r := runs[p]
		b.Logf("%v", r)
		short := map[string]string{routing.PolicyLeastQueued: "lq", routing.PolicyRoundRobin: "rr", routing.PolicyPrefixAware: "pa",
			routing.PolicyPredictedTTFT: "pt"}[p]
		b.ReportMetric(ms(r.p50), short+"-p50-ms")
		b.ReportMetric(ms(r.p99), short+"-p99-ms")
		b.ReportMetric(r.throughput, short+"-req/s")
		b.ReportMetric(r.cachedShare, short+"-cached")
	}
	b.ReportMetric(float64(runs[routing.PolicyLeastQueued].p99)/float64(max(runs[routing.PolicyPrefixAware].p99, 1)), "lq/pa-p99")
	b.ReportMetric(float64(runs[routing.PolicyLeastQueued].p99)/float64(max(runs[routing.PolicyPredictedTTFT].p99, 1)), "lq/pt-p99")
}
