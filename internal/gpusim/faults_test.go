package gpusim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestFailBeforeFirst(t *testing.T) {
	t.Run("always", func(t *testing.T) {
		cfg := fast()
		cfg.FailBeforeFirst = 1
		s, url := startSim(t, cfg)
		wantError(t, post(t, context.Background(), url, "/v1/chat/completions", chatBody(3, true, false)), 500, "internal_error")
		if st := s.Stats(); st.Failed != 1 || st.Total != 1 {
			t.Errorf("stats %+v; want 1 failed of 1", st)
		}
		// The header turns it off for one request.
		resp := post(t, context.Background(), url, "/v1/completions", `{"prompt":"x","max_tokens":2}`, HeaderFail, "none")
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("with %s: none: status %d; want 200", HeaderFail, resp.StatusCode)
		}
	})
	t.Run("header", func(t *testing.T) {
		_, url := startSim(t, fast())
		wantError(t, post(t, context.Background(), url, "/v1/completions", `{"prompt":"x","stream":true}`,
			HeaderFail, "before-first"), 500, "internal_error")
	})
	t.Run("deterministic", func(t *testing.T) {
		outcomes := func(seed int64) string {
			cfg := fast()
			cfg.FailBeforeFirst = 0.5
			cfg.Seed = seed
			_, url := startSim(t, cfg)
			var b []byte
			for range 24 {
				resp := post(t, context.Background(), url, "/v1/completions", `{"prompt":"x","max_tokens":1}`)
				io.Copy(io.Discard, resp.Body) //nolint:errcheck // a loopback read
				resp.Body.Close()
				if resp.StatusCode == http.StatusInternalServerError {
					b = append(b, 'F')
				} else {
					b = append(b, '.')
				}
			}
			return string(b)
		}
		a, b, c := outcomes(7), outcomes(7), outcomes(8)
		if a != b {
			t.Errorf("seed 7 gave %s then %s; want the same sequence", a, b)
		}
		if a == c {
			t.Errorf("seeds 7 and 8 both gave %s; want different sequences", a)
		}
		fails := 0
		for _, r := range a {
			if r == 'F' {
				fails++
			}
		}
		if fails < 4 || fails > 20 {
			t.Errorf("%d of 24 failed with probability 0.5: %s", fails, a)
		}
	})
}

func TestDieAfterTokens(t *testing.T) {
	tests := []struct {
		name string
		cfg  int
		hdr  []string
	}{
		{"config", 3, nil},
		{"header", 0, []string{HeaderDieAfter, "3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fast()
			cfg.DieAfterTokens = tt.cfg
			s, url := startSim(t, cfg)
			resp := post(t, context.Background(), url, "/v1/chat/completions", chatBody(10, true, true), tt.hdr...)
			defer resp.Body.Close()
			evs, done, err := readEvents(t, resp.Body)
			if done || !isTruncated(err) {
				t.Fatalf("done=%v err=%v; want a truncated body", done, err)
			}
			if len(evs) != 4 { // role + 3 tokens
				t.Errorf("got %d events before the abort; want 4", len(evs))
			}
			eventually(t, "the aborted sequence to leave the batch", func() bool { return s.Stats().Running == 0 })
			if st := s.Stats(); st.Failed != 1 {
				t.Errorf("stats %+v; want 1 failed", st)
			}
			// Non-streamed: the connection closes without a response.
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", stringsReader(chatBody(10, false, false)))
			for i := 0; i+1 < len(tt.hdr); i += 2 {
				req.Header.Set(tt.hdr[i], tt.hdr[i+1])
			}
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				t.Errorf("non-streamed: status %d; want a closed connection", resp.StatusCode)
			}
			// A stream shorter than the limit is not affected.
			resp2 := post(t, context.Background(), url, "/v1/chat/completions", chatBody(2, true, false), tt.hdr...)
			defer resp2.Body.Close()
			if _, done, err := readEvents(t, resp2.Body); !done || err != nil {
				t.Errorf("short stream: done=%v err=%v; want complete", done, err)
			}
		})
	}
}

func TestStallAfterTokens(t *testing.T) {
	const stall = 300 * time.Millisecond
	t.Run("config", func(t *testing.T) {
		cfg := fast()
		cfg.StallAfterTokens, cfg.StallFor = 2, stall
		_, url := startSim(t, cfg)
		checkStall(t, url, nil, stall)
	})
	t.Run("header", func(t *testing.T) {
		_, url := startSim(t, fast())
		checkStall(t, url, []string{HeaderStallAfter, "2", HeaderStallFor, stall.String()}, stall)
	})
	t.Run("forever", func(t *testing.T) {
		// In a bubble, without a network: the fake clock shows that nothing
		// more arrives however long the stall lasts.
		synctest.Test(t, func(t *testing.T) {
			s := New(fast())
			defer s.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions",
				strings.NewReader(`{"prompt":"x","max_tokens":5,"stream":true}`))
			req.Header.Set(HeaderStallAfter, "2")
			rec := httptest.NewRecorder()
			served := make(chan struct{})
			go func() { defer close(served); s.ServeHTTP(rec, req) }()
			time.Sleep(time.Hour) // fake time: the engine finishes, the stream stays stalled
			synctest.Wait()
			if st := s.Stats(); st.Completed != 0 {
				t.Errorf("stats %+v; want the stalled stream incomplete", st)
			}
			cancel()
			<-served
			if evs, _, _ := readEvents(t, rec.Body); len(evs) != 2 {
				t.Errorf("got %d events; want 2 before the stall", len(evs))
			}
			if st := s.Stats(); st.Cancelled != 1 {
				t.Errorf("stats %+v; want the stalled request counted as cancelled", st)
			}
		})
	})
}

// checkStall reads a 5-token completion stream that stalls after 2 tokens
// and checks the gap and that the stream then completes.
func checkStall(t *testing.T, url string, hdr []string, stall time.Duration) {
	t.Helper()
	resp := post(t, context.Background(), url, "/v1/completions", `{"prompt":"x","max_tokens":5,"stream":true}`, hdr...)
	defer resp.Body.Close()
	evs, done, err := readEvents(t, resp.Body)
	if !done || err != nil || len(evs) != 6 {
		t.Fatalf("%d events done=%v err=%v; want 6 and [DONE]", len(evs), done, err)
	}
	// Without the stall the gap is one 2ms step; half the stall leaves room
	// for a late read of token 2.
	if gap := evs[2].at.Sub(evs[1].at); gap < stall/2 {
		t.Errorf("gap after token 2 was %v; want ≥ %v", gap, stall/2)
	}
}

func TestSlowStart(t *testing.T) {
	const delay = 200 * time.Millisecond
	for _, tt := range []struct {
		name string
		cfg  time.Duration
		hdr  []string
	}{
		{"config", delay, nil},
		{"header", 0, []string{HeaderSlowStart, delay.String()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fast()
			cfg.SlowStart = tt.cfg
			_, url := startSim(t, cfg)
			start := time.Now()
			resp := post(t, context.Background(), url, "/v1/chat/completions", chatBody(2, true, false), tt.hdr...)
			headers := time.Since(start)
			defer resp.Body.Close()
			if headers < delay {
				t.Errorf("headers after %v; want ≥ %v", headers, delay)
			}
			if _, done, err := readEvents(t, resp.Body); !done || err != nil {
				t.Errorf("done=%v err=%v", done, err)
			}
		})
	}
}

func TestFaultHeadersValidated(t *testing.T) {
	_, url := startSim(t, fast())
	for _, h := range [][]string{
		{HeaderDieAfter, "-1"}, {HeaderStallAfter, "x"}, {HeaderStallFor, "soon"}, {HeaderSlowStart, "-1s"},
	} {
		t.Run(fmt.Sprint(h), func(t *testing.T) {
			wantError(t, post(t, context.Background(), url, "/v1/completions", `{"prompt":"x"}`, h...), 400, "invalid_header")
		})
	}
}
