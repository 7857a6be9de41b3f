package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Shutdown lets a short stream finish, and ends a long one with an error
// event once the drain timeout passes; nothing hangs.
func TestShutdownDrainsStreams(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	sim, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})

	type result struct {
		events []sseEvent
		done   bool
	}
	stream := func(maxTokens string) <-chan result {
		resp := post(t, h1Client(), e.http+"/v1/chat/completions",
			`{"model":"sim-small","stream":true,"max_tokens":`+maxTokens+`,"messages":[{"role":"user","content":"x"}]}`)
		out := make(chan result, 1)
		go func() {
			defer resp.Body.Close()
			ev, done := readEvents(t, resp.Body)
			out <- result{ev, done}
		}()
		return out
	}
	short := stream("10")  // ~0.2 s: finishes within the drain timeout
	long := stream("5000") // ~100 s: cannot finish
	waitFor(t, 2*time.Second, "both streams running", func() bool { return sim.Stats().Running == 2 })

	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if err := shutdownWithin(t, e.server, ctx, 5*time.Second); err != nil {
		t.Logf("shutdown: %v", err)
	}
	s := <-short
	if !s.done {
		t.Fatal("the short stream did not finish with [DONE] during the drain")
	}
	l := <-long
	if l.done || len(l.events) == 0 {
		t.Fatalf("long stream: done=%v, %d events; want events then an error", l.done, len(l.events))
	}
	last := l.events[len(l.events)-1]
	if last.name != "error" || !strings.Contains(last.data, "shutting_down") {
		t.Fatalf("long stream ended with %q %q; want an error event saying the node is shutting down", last.name, last.data)
	}
	waitFor(t, 2*time.Second, "upstream cancelled", func() bool { return sim.Stats().Running == 0 })
}
