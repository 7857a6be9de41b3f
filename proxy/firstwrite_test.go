package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The hand-off writes a stream's head and first token before it hijacks
// the client's connection when the connection came through a listener of
// package listen (listen.EarlySocket), else after the Hijack. These tests
// cover the cases the other loop tests do not reach.

// TestLoopFirstEventEnds: a stream whose first event ends it ([DONE],
// the backend's body still open) on a keep-alive connection gets its
// whole answer, says Connection: close (the hand-off closes the
// connection) and the client's next request dials anew.
func TestLoopFirstEventEnds(t *testing.T) {
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: [DONE]\n\n"))
		w.(http.Flusher).Flush()
		select { // the body stays open: only the event ends the stream
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer b.Close()
	e := loopEdge(t, b.URL, edgeOpts{})
	var dials atomic.Int64
	c := countingClient(&dials, "", nil)
	for i := range 2 {
		resp := post(t, c, e.http+"/v1/chat/completions", chatBody(""))
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Fatalf("stream %d: status %d, body %q, %v", i, resp.StatusCode, body, err)
		}
		if !resp.Close {
			t.Fatalf("stream %d: the response does not say Connection: close", i)
		}
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials for two streams on closed connections, want 2", n)
	}
}

// TestLoopHandOffHijacked: the handler served by a server of net/http's
// own (not package listen's: no socket before the Hijack) still hands its
// streams to the loops, head and first token written after the Hijack.
func TestLoopHandOffHijacked(t *testing.T) {
	b := newStepBackend(t, 2)
	e := loopEdge(t, b.url, edgeOpts{})
	plain := httptest.NewServer(e.handler)
	defer plain.Close()
	resp := post(t, h1Client(), plain.URL+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, header %v", resp.StatusCode, resp.Header)
	}
	ev := newEventReader(resp.Body)
	if got, err := ev.next(); err != nil || got != tokenEvent(0) {
		t.Fatalf("first token: %q %v", got, err)
	}
	onLoop(t, e, 1)
	b.next <- struct{}{}
	if got, err := ev.next(); err != nil || got != tokenEvent(1) {
		t.Fatalf("second token: %q %v", got, err)
	}
	if got, err := ev.next(); err != nil || got != "data: [DONE]\n\n" {
		t.Fatalf("end: %q %v", got, err)
	}
	onLoop(t, e, 0)
}
