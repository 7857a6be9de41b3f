package node

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// SIGTERM with live streams: /readyz fails first while requests are still
// served for the drain delay; then the listeners close, a short stream
// finishes, a long one ends with an error event at the drain timeout;
// nothing hangs, and the limiter's in-flight count is back to zero.
func TestDrainOnSIGTERM(t *testing.T) {
	cfg := nodeConfig{Node: "drain_delay: 400ms, drain_timeout: 1500ms",
		// 6 tokens a minute refill almost nothing during the test: what the
		// bucket lacks at the end is what the streams were charged.
		Tenants: tenant("t1", "max_concurrency: 10, tokens_per_minute: 6, burst: 100000", key1)}.String()
	tn := startFileNode(t, cfg)
	short := startStream(t, tn.base, key1, 100) // ~0.5 s at 5 ms a token
	long := startStream(t, tn.base, key1, 4000) // ~20 s: cannot finish
	waitFor(t, 5*time.Second, "two streams", func() bool { return tn.n.handler.Snapshot().InFlight == 2 })

	// sluice serve calls Shutdown on SIGTERM (see cmd/sluice's TestSignals).
	start := time.Now()
	shut := make(chan error, 1)
	go func() { shut <- tn.n.Shutdown() }()

	waitFor(t, time.Second, "/readyz to fail", func() bool {
		resp, err := http.Get(tn.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	if time.Since(start) < 300*time.Millisecond {
		if r := stream(context.Background(), tn.base, key1, "sim-small", 2); r.status != 200 || !r.done {
			t.Fatalf("a request during the drain delay: %d", r.status)
		}
	}
	if code, res := tn.postReload(); code == 200 {
		t.Fatalf("a reload while draining: %+v", res)
	}

	select {
	case <-shut:
	case <-time.After(15 * time.Second):
		t.Fatal("shutdown hangs")
	}
	if d := time.Since(start); d < 1500*time.Millisecond {
		t.Fatalf("shutdown took %v; want the drain delay plus the drain timeout", d)
	}
	if r := <-short; !r.done {
		t.Fatalf("short stream: %d %q; want [DONE] within the drain timeout", r.status, r.last)
	}
	r := <-long
	if r.done || !strings.Contains(r.last, "shutting_down") {
		t.Fatalf("long stream: done=%v last %q; want an error event saying the node shuts down", r.done, r.last)
	}
	lim := tn.n.Config().AllTenants()[0].Limits
	st, err := tn.n.limiter.Snapshot(context.Background(), "t1", lim)
	if err != nil || st.InFlight != 0 {
		t.Fatalf("limiter in flight after the drain: %d %v", st.InFlight, err)
	}
	// Charged at admission: both estimates (~4100 tokens). Settled: what
	// was produced (100 for the short one, a few hundred for the cut one).
	if used := lim.Burst - st.Tokens.Remaining; used < 100 || used >= 4000 {
		t.Fatalf("tokens used %d; want the streams' actual use, settled after the cut", used)
	}
}
