package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
)

// The hand-off writes a stream's head and first token before it hijacks
// the client's connection when the connection came through a listener of
// package listen (listen.EarlySocket), else after the Hijack. These tests
// cover the cases the other loop tests do not reach.

// openBodyBackend answers every request with events in one write and
// keeps its body open (until the request ends, at most 10 s): only an
// event can end the stream.
func openBodyBackend(t *testing.T, events string) *httptest.Server {
	b, _ := heldBackend(t, events, "")
	return b
}

// heldBackend is a backend that answers every request with the events
// first in one write, then holds its body open until release is closed
// (at most 10 s) and sends rest.
func heldBackend(t *testing.T, first, rest string) (*httptest.Server, chan struct{}) {
	release := make(chan struct{})
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second):
			return
		}
		io.WriteString(w, rest)
	}))
	t.Cleanup(b.Close)
	return b, release
}

// TestLoopFirstEventEnds: a stream whose first event ends it ([DONE],
// the backend's body still open) on a keep-alive connection gets its
// whole answer, says Connection: close (the hand-off closes the
// connection) and the client's next request dials anew.
func TestLoopFirstEventEnds(t *testing.T) {
	b := openBodyBackend(t, "data: [DONE]\n\n")
	e := loopEdge(t, b.URL, edgeOpts{})
	dials := twoStreams(t, e, "", func(i int, closed bool) {
		if !closed {
			t.Fatalf("stream %d: the response does not say Connection: close", i)
		}
	})
	if dials != 2 {
		t.Fatalf("%d dials for two streams on closed connections, want 2", dials)
	}
}

// twoStreams posts two streams to e from one keep-alive client, checks
// that each answer is whole (begins with prefix, ends with [DONE]), calls
// check with whether it said Connection: close, and returns how many
// connections the client dialled.
func twoStreams(t *testing.T, e *testEdge, prefix string, check func(i int, closed bool)) int64 {
	var dials atomic.Int64
	c := countingClient(&dials, "", nil)
	for i := range 2 {
		resp := post(t, c, e.http+"/v1/chat/completions", chatBody(""))
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(string(body), prefix) ||
			!strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Fatalf("stream %d: status %d, body %q, %v", i, resp.StatusCode, body, err)
		}
		check(i, resp.Close)
	}
	return dials.Load()
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

// roleEvent is the role-only chunk an OpenAI-compatible engine sends before
// its first token (vLLM v0.11's serving_chat.py, first iteration), marked
// with id for the tests that watch the hand-off.
func roleEvent(id string) string {
	return fmt.Sprintf(`data: {"id":"%s","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n", id)
}

// watchFirstBytes records the first bytes and the backend input left to
// the loop of the hand-offs whose first bytes contain marker.
func watchFirstBytes(t *testing.T, marker string) func() (first, rest string, n int) {
	var mu sync.Mutex
	var first, rest string
	var n int
	proxy.SetFirstBytesSeen(func(f, r []byte) {
		if !strings.Contains(string(f), marker) {
			return // another test's stream
		}
		mu.Lock()
		first, rest, n = string(f), string(r), n+1
		mu.Unlock()
	})
	t.Cleanup(func() { proxy.SetFirstBytesSeen(nil) })
	return func() (string, string, int) {
		mu.Lock()
		defer mu.Unlock()
		return first, rest, n
	}
}

// TestLoopFirstWriteCarriesBufferedEvents: a backend that sends its
// role-only chunk and the first token together (one write, as vLLM's first
// iteration) gets both into the hand-off's first write — the first token
// does not wait for the loop's start — and the rest of the stream still
// comes through the loop.
func TestLoopFirstWriteCarriesBufferedEvents(t *testing.T) {
	b, release := heldBackend(t, roleEvent("bufd-1")+tokenEvent(0), tokenEvent(1)+"data: [DONE]\n\n")
	seen := watchFirstBytes(t, "bufd-1")
	e := loopEdge(t, b.URL, edgeOpts{})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	ev := newEventReader(resp.Body)
	for i, want := range []string{roleEvent("bufd-1"), tokenEvent(0)} {
		if got, err := ev.next(); err != nil || got != want {
			t.Fatalf("event %d: %q %v, want %q", i, got, err, want)
		}
	}
	first, rest, n := seen()
	if n != 1 || !strings.Contains(first, roleEvent("bufd-1")) || !strings.Contains(first, tokenEvent(0)) {
		t.Fatalf("%d hand-offs; first write %q: want the role chunk and the first token in it", n, first)
	}
	if strings.Contains(rest, "data:") {
		t.Fatalf("a complete event was left to the loop: %q", rest)
	}
	onLoop(t, e, 1)
	close(release)
	for i, want := range []string{tokenEvent(1), "data: [DONE]\n\n"} {
		if got, err := ev.next(); err != nil || got != want {
			t.Fatalf("event %d after the hand-off: %q %v, want %q", i+2, got, err, want)
		}
	}
	onLoop(t, e, 0)
}

// TestLoopBufferedEndLeftToLoop: when the whole stream came with its head
// (role chunk, a token and [DONE] in one write, the backend's body still
// open), the events before [DONE] go in the first write and [DONE] is the
// loop's: the stream ends on the loop, which keeps the client's
// connection (one dial for two streams), not the hand-off's early end,
// which closes it (TestLoopFirstEventEnds).
func TestLoopBufferedEndLeftToLoop(t *testing.T) {
	b := openBodyBackend(t, roleEvent("bufd-2")+tokenEvent(0)+"data: [DONE]\n\n")
	seen := watchFirstBytes(t, "bufd-2")
	e := loopEdge(t, b.URL, edgeOpts{})
	dials := twoStreams(t, e, roleEvent("bufd-2")+tokenEvent(0), func(i int, closed bool) {
		if closed {
			t.Fatalf("stream %d: the response says Connection: close", i)
		}
		first, rest, _ := seen()
		if !strings.Contains(first, tokenEvent(0)) || strings.Contains(first, "[DONE]") || !strings.Contains(rest, "data: [DONE]") {
			t.Fatalf("stream %d: first write %q, left to the loop %q", i, first, rest)
		}
	})
	if dials != 1 {
		t.Fatalf("%d dials for two streams on a kept connection, want 1", dials)
	}
	if _, _, n := seen(); n != 2 {
		t.Fatalf("%d hand-offs seen, want 2", n)
	}
}

// TestFramedHandOffRelaysBufferedEvents: over HTTP/2 and HTTP/3 the first
// event is written on the handler's goroutine and the stream then goes to
// a loop (handOffFramed); the events that arrived with the first — vLLM's
// role-only chunk and first token, in one write — are relayed before the
// hand-off, so the loop is left none of them (the first token does not
// wait for the loop's start), and the rest still comes through the loop.
func TestFramedHandOffRelaysBufferedEvents(t *testing.T) {
	for _, proto := range []string{"h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			id := "framed-bufd-" + proto
			b, release := heldBackend(t, roleEvent(id)+tokenEvent(0), tokenEvent(1)+"data: [DONE]\n\n")
			var mu sync.Mutex
			var pending []string
			proxy.SetFramedPendingSeen(func(rid string, p []byte) {
				if rid == id {
					mu.Lock()
					pending = append(pending, string(p))
					mu.Unlock()
				}
			})
			t.Cleanup(func() { proxy.SetFramedPendingSeen(nil) })
			var e *testEdge
			var c *http.Client
			var base string
			if proto == "h2" {
				e, c = loopEdge(t, b.URL, edgeOpts{}), h2Client()
				base = e.https
			} else {
				e, c = h3LoopEdge(t, b.URL, edgeOpts{}), h3Client(t)
				base = e.h3
			}
			resp := post(t, c, base+"/v1/chat/completions", chatBody(""), "X-Request-Id", id)
			defer resp.Body.Close()
			ev := newEventReader(resp.Body)
			for i, want := range []string{roleEvent(id), tokenEvent(0)} {
				if got, err := ev.next(); err != nil || got != want {
					t.Fatalf("event %d: %q %v, want %q", i, got, err, want)
				}
			}
			onLoop(t, e, 1)
			mu.Lock()
			seen := slices.Clone(pending)
			mu.Unlock()
			if len(seen) != 1 || strings.Contains(seen[0], "data:") {
				t.Fatalf("hand-offs left the loop %q: want one hand-off and no complete event", seen)
			}
			close(release)
			for i, want := range []string{tokenEvent(1), "data: [DONE]\n\n"} {
				if got, err := ev.next(); err != nil || got != want {
					t.Fatalf("event %d after the hand-off: %q %v, want %q", i+2, got, err, want)
				}
			}
			onLoop(t, e, 0)
		})
	}
}
