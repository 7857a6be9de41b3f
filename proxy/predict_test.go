package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

// promptBody is a streamed chat request whose prompt is about chars
// characters (the simulator counts four a token), distinct from every
// other call's from its first block on (no expected prefix-cache hit:
// fastSim has no prefix cache).
func promptBody(model string, chars, maxTokens int) string {
	n := promptSeq.Add(1)
	return fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"%d %s"}]}`,
		model, maxTokens, n, strings.Repeat("abcd ", chars/5))
}

var promptSeq atomic.Int64 // makes promptBody's prompts distinct

// streamOK sends body and reads the stream to its end; it returns the
// time to the first event.
func streamOK(t *testing.T, c *http.Client, url, body string) time.Duration {
	t.Helper()
	start := time.Now()
	resp := post(t, c, url, body)
	defer resp.Body.Close()
	evs, done := readEvents(t, resp.Body)
	if resp.StatusCode != http.StatusOK || !done || len(evs) == 0 {
		t.Fatalf("status %d, done %v, %d events", resp.StatusCode, done, len(evs))
	}
	return evs[0].at.Sub(start)
}

// Two backends whose prefill rates differ twenty-fold (gpusim
// prefill_per_token 25µs and 500µs): predicted_ttft measures both on its
// first requests and then sends the ~600-token prompts to the fast one,
// while least_queued, seeing two idle backends, splits them.
func TestPredictedTTFTPrefersFasterPrefill(t *testing.T) {
	run := func(policy string) (slowServed int) {
		fast, slow := fastSim(), fastSim()
		fast.PrefillPerToken, slow.PrefillPerToken = 25*time.Microsecond, 500*time.Microsecond
		_, fu := startSim(t, fast)
		ss, su := startSim(t, slow)
		e := startEdge(t, edgeOpts{pool: routing.PoolConfig{Name: "p", Policy: policy, Dialect: routing.DialectNone,
			Backends: []routing.BackendConfig{{URL: fu}, {URL: su}}}})
		for i := range 16 {
			c, base := h1Client(), e.http
			if i%2 == 1 {
				c, base = h2Client(), e.https
			}
			streamOK(t, c, base+"/v1/chat/completions", promptBody("sim-small", 2400, 2))
		}
		return ss.Stats().Total
	}
	pt, lq := run(routing.PolicyPredictedTTFT), run(routing.PolicyLeastQueued)
	t.Logf("of 16 requests, the slow backend got %d under predicted_ttft, %d under least_queued", pt, lq)
	if n := pt; n > 3 {
		t.Errorf("predicted_ttft sent %d of 16 requests to the backend with 20× slower prefill; want at most 3 (its measurements)", n)
	}
	if n := lq; n < 2 {
		t.Errorf("control: least_queued sent %d of 16 to the slow backend; the backends should look alike to it", n)
	}
}

// One backend with one batch slot, each request holding it ~0.5 s: with
// five requests in flight, a request on a route with ttft_objective 1s is
// predicted to wait ~2 s and is refused with 503 ttft_objective_unmet, in
// the API's error shape, and a Retry-After of ceil(predicted − objective)
// seconds. Polling afterwards finds the first request let through within
// one second (Retry-After's granularity) plus one request's service time
// of the Retry-After, and that request meets its objective.
func TestTTFTObjectiveRefusesWithHonestRetryAfter(t *testing.T) {
	cfg := fastSim()
	cfg.MaxBatch, cfg.StepBase, cfg.StepPerSeq, cfg.PrefillPerToken = 1, 20*time.Millisecond, 0, 10*time.Microsecond
	_, u := startSim(t, cfg)
	pool := routing.PoolConfig{Name: "p", Policy: routing.PolicyPredictedTTFT, Dialect: routing.DialectNone,
		Backends: []routing.BackendConfig{{URL: u, MaxBatch: 1}}}
	routes := []testRoute{
		{RouteConfig: routing.RouteConfig{Name: "bg", Pool: "p", Models: []string{"sim-small"}}},
		{RouteConfig: routing.RouteConfig{Name: "slo", Pool: "p", Models: []string{"slo"},
			ServedModels: map[string]string{"slo": "sim-small"}, TTFTObjective: time.Second}},
	}
	e := startEdge(t, edgeOpts{pool: pool, routes: routes})
	url := e.http + "/v1/chat/completions"
	bg := func(n int, gap time.Duration) *sync.WaitGroup {
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp := post(t, h1Client(), url, promptBody("sim-small", 400, 25))
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}()
			time.Sleep(gap)
		}
		return &wg
	}
	// Learning: a request on the idle engine (prefill rate), then two
	// behind it (queue wait per waiting request).
	bg(3, 60*time.Millisecond).Wait()
	st := e.pools["p"].Backends()[0].PredictStats()
	if st.QueueWait < 200*time.Millisecond || st.QueueWait > time.Second {
		t.Fatalf("queue wait per waiting request measured %v; each request holds the slot ~0.5 s", st.QueueWait)
	}

	wg := bg(5, 10*time.Millisecond)
	defer wg.Wait()
	resp := post(t, h2cClient(), url, promptBody("slo", 400, 2))
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	refused := time.Now()
	var body struct {
		Error struct{ Type, Code, Message string }
	}
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(raw, &body) != nil ||
		body.Error.Code != "ttft_objective_unmet" || body.Error.Type != "server_error" || body.Error.Message == "" {
		t.Fatalf("with 5 requests ahead: status %d body %s; want 503 ttft_objective_unmet", resp.StatusCode, raw)
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 4 {
		t.Fatalf("Retry-After %q; want 1 to 4 s (about 4 waiting × 0.5 s − 1 s)", resp.Header.Get("Retry-After"))
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		resp := post(t, h1Client(), url, promptBody("slo", 400, 2))
		if resp.StatusCode == http.StatusServiceUnavailable {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			continue
		}
		evs, done := readEvents(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !done || len(evs) == 0 {
			t.Fatalf("status %d done %v", resp.StatusCode, done)
		}
		after := start.Sub(refused)
		ttft := evs[0].at.Sub(start)
		t.Logf("Retry-After %d s; first admitted %.2f s after the refusal, TTFT %v", ra, after.Seconds(), ttft)
		if d := after - time.Duration(ra)*time.Second; d < -1500*time.Millisecond || d > 1500*time.Millisecond {
			t.Errorf("admitted %.2f s after the refusal; Retry-After said %d s (tolerance ±1.5 s: 1 s rounding + one request)", after.Seconds(), ra)
		}
		if ttft > 1300*time.Millisecond {
			t.Errorf("the admitted request's TTFT %v misses its 1 s objective by more than 300 ms", ttft)
		}
		if n := e.pools["p"].ObjectiveRefusals(); n < 1 {
			t.Errorf("refusals counted %d", n)
		}
		return
	}
	t.Fatal("no request admitted within 10 s")
}
