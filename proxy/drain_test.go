package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
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

// TestShutdownEndsCutStreamsCleanly: ten concurrent streams per protocol,
// cut by the drain timeout, each end with the shutting_down error event
// and then a clean end of the body (io.EOF: h1's last chunk, h2's
// END_STREAM, h3's FIN), never a transport error such as the GOAWAY error
// a client gets when the connection closes under a stream whose last
// frames are still queued.
func TestShutdownEndsCutStreamsCleanly(t *testing.T) {
	for _, proto := range []string{"h1", "h2c", "h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			for round := range 3 { // a cut stream is lost in about 1 of 5 drains on the old code
				shutdownCutsCleanly(t, proto, round)
			}
		})
	}
}

// shutdownCutsCleanly is one drain of TestShutdownEndsCutStreamsCleanly.
func shutdownCutsCleanly(t *testing.T, proto string, round int) {
	t.Helper()
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	cfg.MaxBatch = 16
	cfg.KVCacheTokens = 1 << 20 // room for ten long streams
	sim, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	var c *http.Client
	url := e.http
	switch proto {
	case "h1":
		c = h1Client()
	case "h2c":
		c = h2cClient()
	case "h2":
		c, url = h2Client(), e.https
	case "h3":
		c, url = h3Client(t), e.h3
	}
	const n = 10
	type result struct {
		proto  string
		events []sseEvent
		err    error // the body's last read error: io.EOF when clean
	}
	out := make(chan result, n)
	for i := range n {
		resp := post(t, c, url+"/v1/chat/completions",
			`{"model":"sim-small","stream":true,"max_tokens":5000,"messages":[{"role":"user","content":"x"}]}`)
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("stream %d: status %d %s", i, resp.StatusCode, b)
		}
		go func() { // exits at the body's end: Shutdown ends it
			defer resp.Body.Close()
			ev, err := readEventsErr(resp.Body)
			out <- result{resp.Proto, ev, err}
		}()
	}
	waitFor(t, 3*time.Second, "all streams running", func() bool { return sim.Stats().Running == n })

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := shutdownWithin(t, e.server, ctx, 8*time.Second); err != nil {
		t.Logf("shutdown: %v", err)
	}
	var bad []string
	for range n {
		r := <-out
		if len(r.events) == 0 {
			bad = append(bad, fmt.Sprintf("%s: no events, %v", r.proto, r.err))
			continue
		}
		last := r.events[len(r.events)-1]
		if last.name != "error" || !strings.Contains(last.data, "shutting_down") {
			bad = append(bad, fmt.Sprintf("%s: last event %q %q, end %v", r.proto, last.name, last.data, r.err))
		} else if r.err != io.EOF {
			bad = append(bad, fmt.Sprintf("%s: shutting_down event, then %v; want a clean end of stream", r.proto, r.err))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("round %d: %d of %d streams did not end cleanly:\n%s", round, len(bad), n, strings.Join(bad, "\n"))
	}
}

// readEventsErr reads a whole SSE body like readEvents and returns the
// error that ended it (io.EOF for a clean end).
func readEventsErr(body io.Reader) ([]sseEvent, error) {
	br := bufio.NewReader(body)
	var events []sseEvent
	var cur sseEvent
	for {
		line, err := br.ReadString('\n')
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "data:"):
			cur.data = strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
		case strings.HasPrefix(line, "event:"):
			cur.name = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case line == "" && (cur.data != "" || cur.name != ""):
			events = append(events, cur)
			cur = sseEvent{}
		}
		if err != nil {
			return events, err
		}
	}
}
