package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
)

// The tests in this file run committed HTTP/1.1 streams through the event
// loops (proxy/evloop via handoff.go): the edge reaches its backends with
// proxy/h1up, whose bodies detach. Each checks that the stream was on a
// loop (Handler.LoopStreams) while it ran.

// tokenEvent is an OpenAI chunk carrying text.
func tokenEvent(i int) string {
	return fmt.Sprintf(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t%d"}}]}`+"\n\n", i)
}

// stepBackend streams tokens one at a time: each after the test lets it
// (next), then [DONE] after n; cancelled reports when the client side of
// the backend's request went away before the end.
type stepBackend struct {
	url       string
	next      chan struct{}
	cancelled chan struct{}
	n         int
	// cut, when > 0, closes the connection after that many tokens. Set
	// after the server started, and read by its handlers, whose requests
	// reach them over TCP (no happens-before for the race detector): an
	// atomic.
	cut atomic.Int32
}

// waitCancelled fails the test with msg unless the backend sees a request
// cancelled within 5 s.
func (b *stepBackend) waitCancelled(t *testing.T, msg string) {
	t.Helper()
	select {
	case <-b.cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal(msg)
	}
}

// waitCancelledN fails the test unless the backend sees n requests
// cancelled, each within 5 s of the one before; when says after what.
func (b *stepBackend) waitCancelledN(t *testing.T, n int, when string) {
	t.Helper()
	for i := range n {
		select {
		case <-b.cancelled:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d backend requests cancelled %s", i, n, when)
		}
	}
}

func newStepBackend(t *testing.T, n int) *stepBackend {
	b := &stepBackend{next: make(chan struct{}), cancelled: make(chan struct{}, 1), n: n}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range b.n {
			if i > 0 {
				select {
				case <-b.next:
				case <-r.Context().Done():
					b.cancelled <- struct{}{}
					return
				case <-time.After(20 * time.Second):
					return
				}
			}
			if cut := int(b.cut.Load()); cut > 0 && i == cut {
				conn, _, _ := rc.Hijack()
				conn.Close()
				return
			}
			io.WriteString(w, tokenEvent(i))
			rc.Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

// loopEdge is an edge whose h1 streams take the event loops.
func loopEdge(t *testing.T, backend string, o edgeOpts) *testEdge {
	o.pool = poolOf(backend)
	o.h1up = true
	return startEdge(t, o)
}

// onLoop waits until the edge's loops hold n streams.
func onLoop(t *testing.T, e *testEdge, n int64) {
	t.Helper()
	waitFor(t, 5*time.Second, fmt.Sprintf("%d streams on the event loops", n), func() bool { return e.handler.LoopStreams() == n })
}

// TestLoopEachTokenAtOnce: a sparse stream's client gets every token
// before the backend sends the next (nothing is held back on the loop),
// and the stream ends with [DONE] and a clean end of the body.
func TestLoopEachTokenAtOnce(t *testing.T) {
	b := newStepBackend(t, 8)
	e := loopEdge(t, b.url, edgeOpts{})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("status %d, header %v", resp.StatusCode, resp.Header)
	}
	if resp.TransferEncoding == nil || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("transfer encoding %v, want chunked", resp.TransferEncoding)
	}
	onLoop(t, e, 1)
	ev := newEventReader(resp.Body)
	for i := range 8 {
		got, err := ev.next()
		if err != nil || got != tokenEvent(i) {
			t.Fatalf("token %d: %q %v", i, got, err)
		}
		if i < 7 {
			b.next <- struct{}{} // the backend sends the next only now
		}
	}
	if got, err := ev.next(); err != nil || got != "data: [DONE]\n\n" {
		t.Fatalf("end: %q %v", got, err)
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("after [DONE]: %q %v", rest, err)
	}
	onLoop(t, e, 0)
	waitFor(t, 5*time.Second, "the access log line", func() bool {
		return len(e.log.lines(`"status":200`, resp.Header.Get("X-Request-Id"))) == 1
	})
}

// eventReader splits a body into raw SSE events.
type eventReader struct {
	r   io.Reader
	buf []byte
}

func newEventReader(r io.Reader) *eventReader { return &eventReader{r: r} }

func (er *eventReader) next() (string, error) {
	tmp := make([]byte, 4096)
	for {
		if i := strings.Index(string(er.buf), "\n\n"); i >= 0 {
			ev := string(er.buf[:i+2])
			er.buf = er.buf[i+2:]
			return ev, nil
		}
		n, err := er.r.Read(tmp)
		er.buf = append(er.buf, tmp[:n]...)
		if err != nil && n == 0 {
			return string(er.buf), err
		}
	}
}

// TestLoopClientGoneCancelsBackend: the client closing mid-stream closes
// the backend's connection at once (the backend sees its request
// cancelled) and the access log says 499.
func TestLoopClientGoneCancelsBackend(t *testing.T) {
	b := newStepBackend(t, 100)
	e := loopEdge(t, b.url, edgeOpts{})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	onLoop(t, e, 1)
	ev := newEventReader(resp.Body)
	if _, err := ev.next(); err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("X-Request-Id")
	resp.Body.Close()
	select {
	case <-b.cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the backend's request was not cancelled 5s after the client left")
	}
	onLoop(t, e, 0)
	waitFor(t, 5*time.Second, "the access log line", func() bool { return len(e.log.lines(`"status":200`, id)) == 1 })
}

// TestLoopBackendDiesMidStream: the backend's connection closing before
// [DONE] ends the client's stream with the OpenAI error event and a clean
// end of the body.
func TestLoopBackendDiesMidStream(t *testing.T) {
	b := newStepBackend(t, 10)
	b.cut.Store(3)
	e := loopEdge(t, b.url, edgeOpts{})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	onLoop(t, e, 1)
	go func() {
		for range 3 {
			b.next <- struct{}{}
		}
	}()
	events, err := readEventsErr(resp.Body)
	if err != io.EOF {
		t.Fatalf("body ended with %v, want a clean end", err)
	}
	if len(events) != 4 {
		t.Fatalf("%d events, want 3 tokens and the error: %v", len(events), events)
	}
	last := events[3]
	if last.name != "error" || !strings.Contains(last.data, `"type":"server_error"`) {
		t.Fatalf("last event %+v", last)
	}
	onLoop(t, e, 0)
}

// TestLoopIdleWatchdog: a backend silent for stream_idle_timeout ends the
// stream with the error event; its request is cancelled.
func TestLoopIdleWatchdog(t *testing.T) {
	b := newStepBackend(t, 10)
	e := loopEdge(t, b.url, edgeOpts{proxy: proxy.Config{StreamIdleTimeout: 300 * time.Millisecond}})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	onLoop(t, e, 1)
	events, err := readEventsErr(resp.Body)
	if err != io.EOF || len(events) != 2 || events[1].name != "error" || !strings.Contains(events[1].data, "upstream_timeout") {
		t.Fatalf("events %+v, %v", events, err)
	}
	select {
	case <-b.cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the stalled backend's request was not cancelled")
	}
}

// TestLoopTrailerAndTimingComment: on the loop, a client that sends "TE:
// trailers" gets the Server-Timing trailer after the last event, and one
// that asks for it the timing comment before [DONE].
func TestLoopTrailerAndTimingComment(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := loopEdge(t, simURL, edgeOpts{})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""), "TE", "trailers", "X-Sluice-Timing", "comment")
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	st := resp.Trailer.Get("Server-Timing")
	if !strings.Contains(st, "decode;dur=") || !strings.Contains(st, `tokens;desc="12"`) {
		t.Fatalf("trailer Server-Timing %q", st)
	}
	s := string(body)
	c, d := strings.Index(s, ": server-timing "), strings.Index(s, "data: [DONE]")
	if c < 0 || d < 0 || c > d {
		t.Fatalf("timing comment at %d, [DONE] at %d:\n%s", c, d, s)
	}
	// The loop removes the stream after its last write, which the client
	// can read first: wait for it as the other loop tests do.
	onLoop(t, e, 0)
	// The access log line is written by the stream's completion, after
	// the loop has let it go.
	waitFor(t, 5*time.Second, "one access log line", func() bool {
		return len(e.log.lines(`"status":200`, resp.Header.Get("X-Request-Id"))) == 1
	})
}

// TestLoopSettlesAndReleasesSlot: a stream on the loop settles the
// backend's usage, and the tenant's only concurrency slot is free when the
// client has read the end of the stream: the next request is admitted
// at once.
func TestLoopSettlesAndReleasesSlot(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	for name, mk := range limiterCases(t) {
		t.Run(name, func(t *testing.T) {
			lim := mk()
			limits := limiter.Limits{MaxConcurrency: 1}
			e := loopEdge(t, simURL, edgeOpts{limiter: lim, limits: limits})
			var onLoopSeen atomic.Bool
			for i := range 3 {
				resp := post(t, h1Client(), e.http+"/v1/chat/completions",
					chatBody(`"stream_options":{"include_usage":true}`))
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
				if e.handler.LoopStreams() > 0 {
					onLoopSeen.Store(true)
				}
				events, done := readEvents(t, resp.Body)
				resp.Body.Close()
				if !done || len(events) == 0 {
					t.Fatalf("request %d: done=%v, %d events", i, done, len(events))
				}
			}
			st, err := lim.Snapshot(context.Background(), "t1", limits)
			if err != nil || st.InFlight != 0 {
				t.Fatalf("in flight after the streams: %+v %v", st, err)
			}
			if !onLoopSeen.Load() {
				t.Log("no stream was seen on the loop (each may have ended before the check)")
			}
		})
	}
}

// TestLoopDrain: Shutdown waits for a stream on the loop as for a running
// handler; one that ends within the drain timeout ends normally, one
// still running at its end gets the shutting_down error event and a clean
// end of the body.
func TestLoopDrain(t *testing.T) {
	drainsStream(t, func(t *testing.T, b *stepBackend) (*testEdge, *http.Client, string) {
		e := loopEdge(t, b.url, edgeOpts{})
		return e, h1Client(), e.http
	})
}

// drainsStream shuts the server down while a stream (three events of a
// step backend, the first sent at once) runs on a loop: Shutdown waits for
// it; a stream that finishes within the drain ends with [DONE], one that
// does not ends with the shutting_down event at the deadline; Shutdown
// returns soon after. edge starts the edge for the backend and gives its
// client and base URL.
func drainsStream(t *testing.T, edge func(*testing.T, *stepBackend) (*testEdge, *http.Client, string)) {
	for _, finishes := range []bool{true, false} {
		t.Run(fmt.Sprintf("finishes=%v", finishes), func(t *testing.T) {
			b := newStepBackend(t, 3)
			e, c, base := edge(t, b)
			resp := post(t, c, base+"/v1/chat/completions", chatBody(""))
			defer resp.Body.Close()
			onLoop(t, e, 1)
			timeout := 300 * time.Millisecond
			if finishes {
				timeout = 10 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			shut := make(chan error, 1)
			go func() { shut <- e.server.Shutdown(ctx) }() // returns within the test's bound below
			select {
			case err := <-shut:
				t.Fatalf("Shutdown returned (%v) while a loop stream ran", err)
			case <-time.After(100 * time.Millisecond):
			}
			if finishes {
				b.next <- struct{}{}
				b.next <- struct{}{}
			}
			events, err := readEventsErr(resp.Body)
			if err != io.EOF {
				t.Fatalf("body ended with %v", err)
			}
			last := events[len(events)-1]
			switch {
			case finishes && last.data != "[DONE]":
				t.Fatalf("last event %+v, want [DONE]", last)
			case !finishes && (last.name != "error" || !strings.Contains(last.data, "shutting_down")):
				t.Fatalf("last event %+v, want shutting_down", last)
			}
			select {
			case <-shut:
			case <-time.After(10 * time.Second):
				t.Fatal("Shutdown still running 10s after the stream ended")
			}
		})
	}
}

// TestLoopReloadKeepsStream: a reload (Swap) does not cut a stream on the
// loop, and the previous state is reported done only after it ended.
func TestLoopReloadKeepsStream(t *testing.T) {
	b := newStepBackend(t, 3)
	e := loopEdge(t, b.url, edgeOpts{})
	reloadKeepsStream(t, b, e, h1Client(), e.http)
}

// reloadKeepsStream swaps e's state while a stream of b (three events, the
// first sent at once) runs on a loop: the previous state must not be done
// before the stream ended, and must be done soon after.
func reloadKeepsStream(t *testing.T, b *stepBackend, e *testEdge, c *http.Client, base string) {
	t.Helper()
	resp := post(t, c, base+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	onLoop(t, e, 1)
	st := *e.handler.State()
	prev := e.handler.Swap(&st)
	select {
	case <-prev:
		t.Fatal("previous state done while its stream runs on the loop")
	case <-time.After(100 * time.Millisecond):
	}
	b.next <- struct{}{}
	b.next <- struct{}{}
	events, done := readEvents(t, resp.Body)
	if !done || len(events) != 3 {
		t.Fatalf("done=%v, %d events", done, len(events))
	}
	select {
	case <-prev:
	case <-time.After(5 * time.Second):
		t.Fatal("previous state not done 5s after its stream ended")
	}
}

// TestLoopOffKeepsGoroutinePath: with NoEventLoop the same stream is
// relayed by its goroutine (the comparison's baseline).
func TestLoopOffKeepsGoroutinePath(t *testing.T) {
	b := newStepBackend(t, 2)
	e := loopEdge(t, b.url, edgeOpts{noLoop: true})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	ev := newEventReader(resp.Body)
	if _, err := ev.next(); err != nil {
		t.Fatal(err)
	}
	if n := e.handler.LoopStreams(); n != 0 {
		t.Fatalf("%d streams on the loop with NoEventLoop", n)
	}
	b.next <- struct{}{}
	if _, done := readEvents(t, resp.Body); !done {
		t.Fatal("no [DONE]")
	}
}

// TestLoopRefusedEndsWithErrorEvent: a stream whose hand-off meets closed
// loops (the handler was closed while a request was running) has had its
// head and first token written already; it must end with the
// shutting_down error event and a clean end of the body, not a cut.
func TestLoopRefusedEndsWithErrorEvent(t *testing.T) {
	b := newStepBackend(t, 4)
	e := loopEdge(t, b.url, edgeOpts{})
	// A first stream starts the loops.
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	onLoop(t, e, 1)
	go func() {
		for range 3 { // t1..t3: the second stream's backend then waits after t0
			b.next <- struct{}{}
		}
	}()
	if _, err := readEventsErr(resp.Body); err != io.EOF {
		t.Fatalf("first stream ended with %v", err)
	}
	resp.Body.Close()
	onLoop(t, e, 0)
	e.handler.Close()

	resp = post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	events, err := readEventsErr(resp.Body)
	if err != io.EOF {
		t.Fatalf("body ended with %v (%d events), want a clean end", err, len(events))
	}
	if len(events) != 2 || !strings.Contains(events[0].data, `"content":"t0"`) {
		t.Fatalf("events %+v; want the first token and the error event", events)
	}
	if last := events[1]; last.name != "error" || !strings.Contains(last.data, `"shutting_down"`) {
		t.Fatalf("last event %+v; want the shutting_down error event", last)
	}
	if e.handler.LoopStreams() != 0 {
		t.Fatal("a refused stream is counted on the loops")
	}
}
