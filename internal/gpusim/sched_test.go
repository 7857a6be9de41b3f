package gpusim

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestEventsArriveIncrementally(t *testing.T) {
	cfg := fast()
	cfg.StepBase = 20 * time.Millisecond
	_, url := startSim(t, cfg)
	start := time.Now()
	resp := post(t, context.Background(), url, "/v1/chat/completions", chatBody(10, true, false))
	defer resp.Body.Close()
	evs, done, err := readEvents(t, resp.Body)
	if err != nil || !done || len(evs) != 12 {
		t.Fatalf("got %d events done=%v err=%v", len(evs), done, err)
	}
	// Tokens 1..10 are events 1..10. Each decode step lasts at least
	// StepBase (timers never fire early), so the tokens span at least 9
	// steps; the bound leaves 3 steps for a reader delayed by a noisy
	// machine. Most gaps must be clearly apart, not one burst.
	if spread := evs[10].at.Sub(evs[1].at); spread < 6*cfg.StepBase {
		t.Errorf("tokens arrived within %v; want them spread over ≥ %v", spread, 6*cfg.StepBase)
	}
	if ttft := evs[1].at.Sub(start); ttft < cfg.StepBase+cfg.PrefillBase {
		t.Errorf("first token after %v; want ≥ %v", ttft, cfg.StepBase+cfg.PrefillBase)
	}
	apart := 0
	for i := 2; i <= 10; i++ {
		if evs[i].at.Sub(evs[i-1].at) >= cfg.StepBase/2 {
			apart++
		}
	}
	if apart < 5 {
		t.Errorf("only %d of 9 tokens arrived ≥ %v after the previous one; want most", apart, cfg.StepBase/2)
	}
}

func TestDefaultLatencies(t *testing.T) {
	// The documented defaults: a lone request's TTFT is PrefillBase +
	// prompt×PrefillPerToken + one step, ITL one step (StepBase +
	// StepPerSeq). Only lower bounds are asserted (timers never fire
	// early); the upper bounds are generous.
	_, url := startSim(t, Config{})
	start := time.Now()
	resp := post(t, context.Background(), url, "/v1/chat/completions", chatBody(6, true, false))
	defer resp.Body.Close()
	evs, done, err := readEvents(t, resp.Body)
	if err != nil || !done || len(evs) != 8 {
		t.Fatalf("got %d events done=%v err=%v", len(evs), done, err)
	}
	ttft := evs[1].at.Sub(start)
	itl := evs[6].at.Sub(evs[1].at) / 5
	t.Logf("default TTFT %v, mean ITL %v", ttft, itl)
	if ttft < 100*time.Millisecond || ttft > 2*time.Second {
		t.Errorf("TTFT %v; want about 100–300ms", ttft)
	}
	if itl < 15*time.Millisecond || itl > time.Second {
		t.Errorf("ITL %v; want about 20–40ms", itl)
	}
}

func TestQueueingPastMaxBatch(t *testing.T) {
	cfg := fast()
	cfg.MaxBatch = 2
	cfg.StepBase = 20 * time.Millisecond
	s, url := startSim(t, cfg)
	const n, tokens = 6, 10
	firsts := make([]time.Duration, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			resp := post(t, context.Background(), url, "/v1/chat/completions", chatBody(tokens, true, false))
			defer resp.Body.Close()
			evs, done, err := readEvents(t, resp.Body)
			if err != nil || !done || len(evs) != tokens+2 {
				t.Errorf("request %d: %d events done=%v err=%v", i, len(evs), done, err)
				return
			}
			firsts[i] = evs[1].at.Sub(start)
		})
	}
	maxWaiting, maxRunning := 0, 0
	for stop := time.After(5 * time.Second); ; {
		st := s.Stats()
		maxWaiting, maxRunning = max(maxWaiting, st.Waiting), max(maxRunning, st.Running)
		if st.Completed == n {
			break
		}
		select {
		case <-stop:
			t.Fatalf("requests did not complete: %+v", st)
		case <-time.After(2 * time.Millisecond):
		}
	}
	wg.Wait()
	slices.Sort(firsts)
	t.Logf("first tokens at %v; max running %d, max waiting %d", firsts, maxRunning, maxWaiting)
	if maxRunning != 2 || maxWaiting < 3 {
		t.Errorf("max running %d, max waiting %d; want 2 and ≥ 3", maxRunning, maxWaiting)
	}
	// Only two sequences decode at once, so the third first token waits
	// for a whole generation of the first pair (≥ 9 more steps), and so on.
	// The bound leaves 4 steps of margin for noisy client reads.
	for _, k := range []int{2, 4} {
		if gap := firsts[k] - firsts[k-1]; gap < 5*cfg.StepBase {
			t.Errorf("first token %d only %v after %d; want ≥ %v (queueing)", k, gap, k-1, 5*cfg.StepBase)
		}
	}
}

func TestClientCancelDropsSequence(t *testing.T) {
	cfg := fast()
	cfg.MaxBatch = 1
	cfg.StepBase = 5 * time.Millisecond
	s, url := startSim(t, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, url, "/v1/chat/completions", chatBody(2000, true, false))
	defer resp.Body.Close()
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	// A second request waits for the only batch slot.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, url+"/v1/completions",
			stringsReader(`{"prompt":"x","stream":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		errc <- err
	}()
	eventually(t, "1 running, 1 waiting", func() bool {
		st := s.Stats()
		return st.Running == 1 && st.Waiting == 1
	})
	cancel2()
	eventually(t, "the waiting request to leave the queue", func() bool { return s.Stats().Waiting == 0 })
	if err := <-errc; err == nil {
		t.Error("cancelled request: no error")
	}
	cancel()
	eventually(t, "the running request to leave the batch", func() bool { return s.Stats().Running == 0 })
	if st := s.Stats(); st.Cancelled != 2 || st.Completed != 0 {
		t.Errorf("stats %+v; want 2 cancelled, 0 completed", st)
	}
}

func TestSlowReaderDoesNotStallBatch(t *testing.T) {
	// A client that does not read blocks its handler's writes (the server
	// socket's send buffer is made tiny so that happens soon), but not the
	// engine: its sequence is generated on schedule and buffered, and
	// batch-mates are not held back.
	const tokens = 5000
	s := New(Config{StepBase: -1, StepPerSeq: -1, PrefillBase: -1, PrefillPerToken: -1,
		MaxBatch: 2, KVCacheTokens: 1 << 20})
	srv := httptest.NewUnstartedServer(s)
	srv.Listener = smallSendBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		s.Close()
	})
	slow := post(t, context.Background(), srv.URL, "/v1/completions",
		fmt.Sprintf(`{"prompt":"slow","max_tokens":%d,"stream":true}`, tokens))
	defer slow.Body.Close()
	fast := post(t, context.Background(), srv.URL, "/v1/completions", `{"prompt":"fast","max_tokens":50,"stream":true}`)
	evs, done, err := readEvents(t, fast.Body)
	fast.Body.Close()
	if err != nil || !done || len(evs) != 51 {
		t.Fatalf("fast stream: %d events done=%v err=%v", len(evs), done, err)
	}
	eventually(t, "the unread sequence to finish in the engine", func() bool {
		return s.Stats().Running == 0 && counterValue(t, s.metrics.genTokens) == tokens+50
	})
	if st := s.Stats(); st.Completed != 1 {
		t.Errorf("stats %+v; want only the fast stream completed while the slow one is unread", st)
	}
	evs, done, err = readEvents(t, slow.Body)
	if err != nil || !done || len(evs) != tokens+1 {
		t.Fatalf("slow stream: %d events done=%v err=%v", len(evs), done, err)
	}
}

// smallSendBuffers gives accepted connections a tiny socket send buffer.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

func TestCloseStopsScheduler(t *testing.T) {
	cfg := fast()
	cfg.StepBase = 5 * time.Millisecond
	s, url := startSim(t, cfg)
	resp := post(t, context.Background(), url, "/v1/completions", `{"prompt":"x","max_tokens":10000,"stream":true}`)
	defer resp.Body.Close()
	eventually(t, "a running sequence", func() bool { return s.Stats().Running == 1 })
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	// The stream in flight is aborted, not ended cleanly.
	if _, done, err := readEvents(t, resp.Body); done || !isTruncated(err) {
		t.Errorf("stream after Close: done=%v err=%v; want truncated", done, err)
	}
	wantError(t, post(t, context.Background(), url, "/v1/completions", `{"prompt":"x"}`), 503, "unavailable")
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
