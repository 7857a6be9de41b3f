package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
)

// tokensUsed reads the tenant's tokens bucket at /v1/usage: burst minus
// what remains.
func tokensUsed(t *testing.T, e *testEdge, burst int64) int64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.http+"/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	r, err := h1Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var usage struct {
		Tokens struct{ Limit, Remaining int64 } `json:"tokens"`
	}
	if err := json.NewDecoder(r.Body).Decode(&usage); err != nil || r.StatusCode != 200 {
		t.Fatalf("/v1/usage: %d %v", r.StatusCode, err)
	}
	return burst - usage.Tokens.Remaining
}

// settledUsed waits until the tenant holds no lease (every request
// settled) and returns the tokens used.
func settledUsed(t *testing.T, e *testEdge, lim limiter.Service, limits limiter.Limits) int64 {
	t.Helper()
	waitFor(t, 5*time.Second, "the settle", func() bool {
		st, err := lim.Snapshot(context.Background(), "t1", limits)
		return err == nil && st.InFlight == 0
	})
	return tokensUsed(t, e, limits.Burst)
}

func readAPIError(t *testing.T, resp *http.Response) openAIError {
	t.Helper()
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var eb openAIError
	if err := json.Unmarshal(raw, &eb); err != nil {
		t.Fatalf("status %d, error body %.120q: %v", resp.StatusCode, raw, err)
	}
	return eb
}

func code(e openAIError) string {
	if e.Error.Code == nil {
		return ""
	}
	return *e.Error.Code
}

// promptOf is a chat body whose prompt the edge estimates at
// (len(content)+2+16+3)/4 tokens: the content's JSON string plus 16 for
// the message's framing, over 4.
func promptOf(chars int, extra string) (body string, estimate int64) {
	content := strings.Repeat("x", chars)
	body = `{"model":"sim-small","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"` + content + `"}]`
	if extra != "" {
		body += "," + extra
	}
	return body + "}", int64(chars+2+16+3) / 4
}

// Issue 16 item 5: four parallel requests with max_tokens 10,000 on a
// 2,000 tokens/min tenant. The old edge capped each charge at half the
// burst, admitted two and let them run into 20,000 tokens of debt; now a
// reservation that can never fit the burst is a 413 that says so, with no
// Retry-After, and the bucket is untouched.
func TestAttackParallelMaxTokens(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	for name, mk := range limiterCases(t) {
		t.Run(name, func(t *testing.T) {
			limits := limiter.Limits{TokensPerMinute: 2000}
			e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: mk(), limits: limits})
			body := `{"model":"sim-small","stream":true,"max_tokens":10000,"messages":[{"role":"user","content":"go"}]}`
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			results := make(chan string, 4)
			for i := 0; i < 4; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.http+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+testKey)
					resp, err := h1Client().Do(req)
					if err != nil {
						results <- "error " + err.Error()
						return
					}
					raw, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					var eb openAIError
					json.Unmarshal(raw, &eb)
					results <- strconv.Itoa(resp.StatusCode) + " " + code(eb) + " retry-after=" + resp.Header.Get("Retry-After")
				}()
			}
			wg.Wait()
			close(results)
			for r := range results {
				if r != "413 request_too_large_for_limit retry-after=" {
					t.Errorf("parallel max_tokens 10000: %s; want 413 request_too_large_for_limit without Retry-After", r)
				}
			}
			if used := tokensUsed(t, e, 2000); used != 0 {
				t.Errorf("refused requests used %d tokens; want 0", used)
			}
		})
	}
}

// n choices multiply the output: n × max_tokens is reserved, so n=4 with
// max_tokens 600 (2,400) never fits a 2,000 burst, and n=3 with 300
// reserves 900 + input. The old edge reserved max_tokens once whatever n.
func TestAttackNChoices(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	for name, mk := range limiterCases(t) {
		t.Run(name, func(t *testing.T) {
			limits := limiter.Limits{TokensPerMinute: 2000}
			e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: mk(), limits: limits})
			resp := post(t, h1Client(), e.http+"/v1/chat/completions",
				`{"model":"sim-small","n":4,"max_tokens":600,"messages":[{"role":"user","content":"go"}]}`)
			if eb := readAPIError(t, resp); resp.StatusCode != 413 || code(eb) != "request_too_large_for_limit" {
				t.Fatalf("n=4 × 600: %d %q; want 413 request_too_large_for_limit", resp.StatusCode, code(eb))
			}
			// The simulator (like OpenAI's o-series) answers n>1 with a 400
			// of its own; the edge's admission headers show the reservation.
			resp = post(t, h1Client(), e.http+"/v1/chat/completions",
				`{"model":"sim-small","n":3,"max_tokens":300,"messages":[{"role":"user","content":"go"}]}`)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			rem, err := strconv.ParseInt(resp.Header.Get("x-ratelimit-remaining-tokens"), 10, 64)
			if err != nil || rem > 2000-900 {
				t.Fatalf("n=3 × 300: remaining %q after admission; want at most 1100 (900 output reserved)",
					resp.Header.Get("x-ratelimit-remaining-tokens"))
			}
			// A key spelled with an escape is the same key to the backend.
			resp = post(t, h1Client(), e.http+"/v1/chat/completions",
				`{"model":"sim-small","\u006e":4,"max_tokens":600,"messages":[{"role":"user","content":"go"}]}`)
			if eb := readAPIError(t, resp); resp.StatusCode != 413 {
				t.Fatalf(`"\u006e":4 × 600: %d %q; want 413`, resp.StatusCode, code(eb))
			}
			resp = post(t, h1Client(), e.http+"/v1/completions",
				`{"model":"sim-small","best_of":4,"max_tokens":600,"prompt":"go"}`)
			if eb := readAPIError(t, resp); resp.StatusCode != 413 {
				t.Fatalf("best_of 4 × 600: %d %q; want 413", resp.StatusCode, code(eb))
			}
			for _, n := range []string{"0", "-1", "129", "1.5", `"2"`} {
				resp = post(t, h1Client(), e.http+"/v1/chat/completions",
					`{"model":"sim-small","n":`+n+`,"max_tokens":3,"messages":[{"role":"user","content":"go"}]}`)
				// The intake scanner refuses a value out of range or of the
				// wrong type before choicesOf runs.
				if eb := readAPIError(t, resp); resp.StatusCode != 400 || (code(eb) != "invalid_value" && code(eb) != "invalid_type") {
					t.Errorf("n=%s: %d %q; want 400 invalid_value or invalid_type", n, resp.StatusCode, code(eb))
				}
			}
		})
	}
}

// streamUsage posts a streamed chat body asking for usage and returns the
// completion tokens the backend reported.
func streamUsage(t *testing.T, e *testEdge, body string) (status int, completion int64) {
	t.Helper()
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return resp.StatusCode, 0
	}
	events, _ := readEvents(t, resp.Body)
	for _, ev := range events {
		var c struct {
			Usage *struct {
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(ev.data), &c) == nil && c.Usage != nil {
			return 200, c.Usage.CompletionTokens
		}
	}
	t.Fatal("no usage chunk")
	return 0, 0
}

// The max_tokens ceiling: over it a request is refused (400) or clamped,
// per tenant, with the node's proxy max_tokens as default; a request that
// names no cap gets the ceiling written into its body, so the backend
// cannot run past the reservation.
func TestAttackMaxTokensCeiling(t *testing.T) {
	_, simURL := startSim(t, fastSim()) // DefaultMaxTokens 16
	lim := limiter.NewLocal(1)
	opts := `"stream_options":{"include_usage":true}`
	chat := func(maxTokens string) string {
		b := `{"model":"sim-small","stream":true,` + opts + `,"messages":[{"role":"user","content":"go"}]`
		if maxTokens != "" {
			b += `,"max_tokens":` + maxTokens
		}
		return b + "}"
	}
	t.Run("refuse", func(t *testing.T) {
		e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: lim,
			limits: limiter.Limits{TokensPerMinute: 100000, MaxTokens: 20}})
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chat("21"))
		if eb := readAPIError(t, resp); resp.StatusCode != 400 || code(eb) != "max_tokens_too_large" {
			t.Fatalf("max_tokens 21 over 20: %d %q; want 400 max_tokens_too_large", resp.StatusCode, code(eb))
		}
		if st, n := streamUsage(t, e, chat("20")); st != 200 || n != 20 {
			t.Fatalf("max_tokens 20: %d, %d tokens; want 200 and 20", st, n)
		}
		// No cap named: the ceiling is written in (20, not the backend's 16).
		if st, n := streamUsage(t, e, chat("")); st != 200 || n != 20 {
			t.Fatalf("no max_tokens: %d, %d tokens; want 200 and 20 (the ceiling)", st, n)
		}
		// A cap of 0 is no cap to vLLM (max_completion_tokens or max_tokens):
		// the ceiling replaces it.
		b := strings.Replace(chat(""), `"stream":true`, `"stream":true,"max_completion_tokens":0`, 1)
		if st, n := streamUsage(t, e, b); st != 200 || n != 20 {
			t.Fatalf("max_completion_tokens 0: %d, %d tokens; want 200 and 20 (the ceiling)", st, n)
		}
	})
	t.Run("clamp", func(t *testing.T) {
		e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: lim,
			limits: limiter.Limits{TokensPerMinute: 100000, MaxTokens: 20, MaxTokensPolicy: limiter.MaxTokensClamp}})
		if st, n := streamUsage(t, e, chat("5000")); st != 200 || n != 20 {
			t.Fatalf("max_tokens 5000 clamped to 20: %d, %d tokens; want 200 and 20", st, n)
		}
	})
	t.Run("node default", func(t *testing.T) {
		e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: lim, proxy: proxy.Config{MaxTokens: 10},
			limits: limiter.Limits{TokensPerMinute: 100000}})
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chat("11"))
		if eb := readAPIError(t, resp); resp.StatusCode != 400 || code(eb) != "max_tokens_too_large" {
			t.Fatalf("max_tokens 11 over the node's 10: %d %q; want 400", resp.StatusCode, code(eb))
		}
	})
}

// Issue 16 item 6: a long prompt cancelled during its prefill cost
// nothing. Now its input is charged once the backend accepted it
// (charge_prefill "accepted", the default); "first_token" keeps the old
// refund.
func TestAttackCancelDuringPrefill(t *testing.T) {
	cfg := fastSim()
	cfg.PrefillPerToken = 5 * time.Millisecond // ~1,000 prompt tokens: 5 s of prefill
	_, simURL := startSim(t, cfg)
	body, estimate := promptOf(4000, "")
	for name, mk := range limiterCases(t) {
		for _, policy := range []string{"", limiter.PrefillFirstToken} {
			t.Run(name+"/"+policy, func(t *testing.T) {
				// 6 tokens/min: the bucket barely refills during the test.
				limits := limiter.Limits{TokensPerMinute: 6, Burst: 100000, ChargePrefill: policy}
				lim := mk()
				e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: lim, limits: limits})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { // ends when the request is cancelled
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.http+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+testKey)
					resp, err := h1Client().Do(req)
					if err == nil {
						resp.Body.Close()
					}
					done <- err
				}()
				// The prefill runs for seconds; 1 s is well into it (a new
				// tenant scope's first shared admission waits out the
				// limiter's 300 ms epoch grace first: see limiter/redis.go).
				time.Sleep(time.Second)
				cancel()
				if err := <-done; err == nil {
					t.Fatal("the request finished before the cancel: no prefill to cancel")
				}
				used := settledUsed(t, e, lim, limits)
				want := estimate
				if policy == limiter.PrefillFirstToken {
					want = 0
				}
				if used != want {
					t.Fatalf("cancelled during prefill: %d tokens charged; want %d", used, want)
				}
			})
		}
	}
}

// Retried attempts repeated their prefill for free. Two backends that
// both accept the request and miss the first-token deadline: each
// attempt's prompt is charged once (2 × the estimate), and the client
// gets the 504.
func TestAttackRetryPrefill(t *testing.T) {
	cfg := fastSim()
	cfg.PrefillPerToken = 5 * time.Millisecond
	_, slowA := startSim(t, cfg)
	_, slowB := startSim(t, cfg)
	body, estimate := promptOf(4000, "")
	for name, mk := range limiterCases(t) {
		t.Run(name, func(t *testing.T) {
			limits := limiter.Limits{TokensPerMinute: 6, Burst: 100000}
			lim := mk()
			one := 1
			e := startEdge(t, edgeOpts{pool: poolOf(slowA, slowB), limiter: lim, limits: limits,
				proxy: proxy.Config{FirstTokenTimeout: 200 * time.Millisecond, Retries: &one}})
			resp := post(t, h1Client(), e.http+"/v1/chat/completions", body)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusGatewayTimeout {
				t.Fatalf("status %d; want 504 after both attempts timed out", resp.StatusCode)
			}
			if used := settledUsed(t, e, lim, limits); used != 2*estimate {
				t.Fatalf("two timed-out attempts charged %d tokens; want %d (each prefill once)", used, 2*estimate)
			}
		})
	}
}
