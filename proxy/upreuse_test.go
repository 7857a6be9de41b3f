package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests in this file check that a stream relayed on an event loop
// gives its backend connection back to h1up's idle pool when the
// backend's body ended cleanly, and closes it on every other end. The
// backends count the connections they accept.

// rawBackend is a hand-written HTTP/1.1 backend on a real listener: for
// each request on a connection it sends the head and a first token, waits
// for next, then the rest of the stream, [DONE], the last chunk and
// extra (bytes past the body, when set).
type rawBackend struct {
	url      string
	next     chan struct{}
	extra    string
	accepted atomic.Int32
	requests atomic.Int32

	mu    sync.Mutex
	conns []net.Conn
	perC  []int // requests per connection, by accept order
}

func newRawBackend(t *testing.T) *rawBackend {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &rawBackend{url: "http://" + ln.Addr().String(), next: make(chan struct{}, 4)}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			i := len(b.conns)
			b.conns = append(b.conns, c)
			b.perC = append(b.perC, 0)
			b.mu.Unlock()
			b.accepted.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				b.serve(c, i)
			}()
		}
	}()
	return b
}

func rawChunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

func (b *rawBackend) serve(c net.Conn, i int) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		b.requests.Add(1)
		b.mu.Lock()
		b.perC[i]++
		b.mu.Unlock()
		head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
		if _, err := io.WriteString(c, head+rawChunk(tokenEvent(0))); err != nil {
			return
		}
		select {
		case <-b.next:
		case <-time.After(10 * time.Second):
			return
		}
		rest := rawChunk(tokenEvent(1)) + rawChunk("data: [DONE]\n\n") + "0\r\n\r\n" + b.extra
		if _, err := io.WriteString(c, rest); err != nil {
			return
		}
	}
}

// closeConn closes the backend's side of its i-th connection.
func (b *rawBackend) closeConn(i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conns[i].Close()
}

func (b *rawBackend) perConn() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.perC...)
}

// loopRoundTrip runs one stream through the edge's loop against b and
// checks that it ended with [DONE].
func loopRoundTrip(t *testing.T, e *testEdge, next chan struct{}) {
	t.Helper()
	loopStream(t, h1Client(), e, next)
}

// loopStream posts a streamed request with c, checks that it went to the
// event loop (one token, then the loop holds it until next lets the
// backend send the second) and that it ends with [DONE]; it returns the
// response (body read).
func loopStream(t *testing.T, c *http.Client, e *testEdge, next chan struct{}) *http.Response {
	t.Helper()
	return loopStreamHeld(t, c, e, next, func() {})
}

// loopStreamHeld is loopStream that runs held while the loop holds the
// stream between its two tokens.
func loopStreamHeld(t *testing.T, c *http.Client, e *testEdge, next chan struct{}, held func()) *http.Response {
	t.Helper()
	resp := post(t, c, e.http+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	ev := newEventReader(resp.Body)
	if got, err := ev.next(); err != nil || got != tokenEvent(0) {
		t.Fatalf("first token: %q %v", got, err)
	}
	onLoop(t, e, 1)
	held()
	next <- struct{}{}
	if got, err := ev.next(); err != nil || got != tokenEvent(1) {
		t.Fatalf("second token: %q %v", got, err)
	}
	if got, err := ev.next(); err != nil || got != "data: [DONE]\n\n" {
		t.Fatalf("end: %q %v", got, err)
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("after [DONE]: %q %v", rest, err)
	}
	onLoop(t, e, 0)
	return resp
}

// TestLoopReusesBackendConn: a stream relayed on the loop gives its
// backend connection back; the next requests to that backend take it
// instead of dialing.
func TestLoopReusesBackendConn(t *testing.T) {
	b := newRawBackend(t)
	e := loopEdge(t, b.url, edgeOpts{})
	for range 3 {
		loopRoundTrip(t, e, b.next)
	}
	if n, r := b.accepted.Load(), b.requests.Load(); n != 1 || r != 3 {
		t.Fatalf("backend accepted %d connections for %d requests, want 1 for 3", n, r)
	}
}

// TestLoopReusesBackendConnNetHTTP: the same with a net/http backend,
// which writes the last chunk apart from [DONE] (after the handler
// returns): the loop reads on to it after the stream is done, even after
// the client's side has finished (on a loaded machine the last chunk may
// come after it). Each next request waits until the backend has sent the
// last chunk (its connection idle): a connection can only be reused once
// its body ended.
func TestLoopReusesBackendConnNetHTTP(t *testing.T) {
	var accepted atomic.Int32
	idle := make(chan struct{}, 3)
	next := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		io.WriteString(w, tokenEvent(0))
		rc.Flush()
		select {
		case <-next:
		case <-time.After(10 * time.Second):
			return
		}
		io.WriteString(w, tokenEvent(1))
		rc.Flush()
		io.WriteString(w, "data: [DONE]\n\n")
		rc.Flush() // [DONE] leaves before the last chunk
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			accepted.Add(1)
		case http.StateIdle: // the response, its last chunk too, was written
			select {
			case idle <- struct{}{}:
			default:
			}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	e := loopEdge(t, srv.URL, edgeOpts{})
	for i := range 3 {
		loopRoundTrip(t, e, next)
		select {
		case <-idle:
		case <-time.After(5 * time.Second):
			t.Fatalf("stream %d: the backend did not finish its response", i)
		}
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("backend accepted %d connections for 3 streams, want 1", n)
	}
}

// TestLoopClientGoneClosesBackendConn: a stream the client ends mid-body
// does not give its connection back: the next request dials.
func TestLoopClientGoneClosesBackendConn(t *testing.T) {
	b := newRawBackend(t)
	e := loopEdge(t, b.url, edgeOpts{})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	ev := newEventReader(resp.Body)
	if _, err := ev.next(); err != nil {
		t.Fatal(err)
	}
	onLoop(t, e, 1)
	resp.Body.Close()
	onLoop(t, e, 0)
	b.next <- struct{}{} // the backend finishes its response on a closed socket
	waitFor(t, 5*time.Second, "the first response's end", func() bool { return len(b.next) == 0 })
	loopRoundTrip(t, e, b.next)
	if n := b.accepted.Load(); n != 2 {
		t.Fatalf("backend accepted %d connections, want 2 (the cut stream's is not reused)", n)
	}
	if got := b.perConn(); got[0] != 1 {
		t.Fatalf("requests per connection %v: the cut stream's connection served another", got)
	}
}

// TestLoopBytesPastBodyCloseBackendConn: a backend that sends bytes after
// the last chunk does not get its connection back.
func TestLoopBytesPastBodyCloseBackendConn(t *testing.T) {
	b := newRawBackend(t)
	b.extra = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" // an answer nobody asked for
	e := loopEdge(t, b.url, edgeOpts{})
	loopRoundTrip(t, e, b.next)
	loopRoundTrip(t, e, b.next)
	if n := b.accepted.Load(); n != 2 {
		t.Fatalf("backend accepted %d connections, want 2 (bytes past the body: not reused)", n)
	}
	if got := b.perConn(); got[0] != 1 || got[1] != 1 {
		t.Fatalf("requests per connection %v, want [1 1]", got)
	}
}

// TestLoopReturnedConnClosedByBackend: a connection given back that the
// backend then closes is caught by h1up's liveness check when the next
// POST takes it: the POST goes on a new connection, written once.
func TestLoopReturnedConnClosedByBackend(t *testing.T) {
	b := newRawBackend(t)
	e := loopEdge(t, b.url, edgeOpts{})
	loopRoundTrip(t, e, b.next)
	loopRoundTrip(t, e, b.next) // proves the connection went back to the pool
	if n := b.accepted.Load(); n != 1 {
		t.Fatalf("backend accepted %d connections, want 1", n)
	}
	b.closeConn(0)
	time.Sleep(50 * time.Millisecond) // the FIN reaches the edge's side
	loopRoundTrip(t, e, b.next)
	if n, r := b.accepted.Load(), b.requests.Load(); n != 2 || r != 3 {
		t.Fatalf("backend accepted %d connections and %d requests, want 2 and 3", n, r)
	}
	if got := b.perConn(); got[0] != 2 || got[1] != 1 {
		t.Fatalf("requests per connection %v, want [2 1] (the POST written once)", got)
	}
}
