package evloop

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http/httputil"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

var heldStreams = flag.Int("evloop.streams", 0, "held streams in TestManyHeldStreams (0: 2,000; 4,000 without -short -race)")

// pair is a loopback TCP connection: a is the loop's side, b the peer's.
func pair(t testing.TB, ln net.Listener) (a, b net.Conn) {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.c, b
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// chunkRelay is the test's Relay: each event as one chunk; [DONE] ends;
// an error ends with an "error" event; then the last chunk.
type chunkRelay struct {
	closed chan result
	events int
	hold   chan error // when set, End holds the stream and reports here
}

type result struct {
	err  error
	sent int64
}

func newRelay() *chunkRelay { return &chunkRelay{closed: make(chan result, 1)} }

func (r *chunkRelay) Event(out, ev []byte, _ time.Time) ([]byte, bool) {
	r.events++
	out = chunked.AppendChunk(out, ev)
	return out, bytes.Contains(ev, []byte("[DONE]"))
}

func (r *chunkRelay) End(out []byte, err error) ([]byte, bool) {
	if err != nil {
		out = chunked.AppendChunk(out, []byte("event: error\ndata: "+err.Error()+"\n\n"))
	}
	if r.hold != nil {
		r.hold <- err
		return out, true
	}
	return chunked.AppendLast(out, nil), false
}

func (r *chunkRelay) Closed(err error, sent int64) { r.closed <- result{err, sent} }

func (r *chunkRelay) wait(t testing.TB) result {
	t.Helper()
	select {
	case res := <-r.closed:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("stream not closed after 10s")
	}
	return result{}
}

// streamOn starts a stream of g between two fresh connections and returns
// the peers: up is the backend's side, cl the client's.
func streamOn(t testing.TB, g *Group, s Stream) (up, cl net.Conn, r *chunkRelay) {
	up, cl, r, _ = handleOn(t, g, s, nil)
	return up, cl, r
}

// handleOn is streamOn with the stream's Handle; hold, when set, makes
// End hold the stream.
func handleOn(t testing.TB, g *Group, s Stream, hold chan error) (up, cl net.Conn, r *chunkRelay, h *Handle) {
	t.Helper()
	ln := listen(t)
	cs, cl := pair(t, ln)
	us, up := pair(t, ln)
	r = newRelay()
	r.hold = hold
	s.Client, s.Upstream, s.Relay = cs, us, r
	if s.Decoder == nil && s.Remaining == 0 {
		s.Decoder = new(chunked.Decoder)
	}
	h, err := g.Add(&s)
	if err != nil {
		t.Fatal(err)
	}
	// cs and us too: a kept or reused connection is the test's to close.
	t.Cleanup(func() { up.Close(); cl.Close(); cs.Close(); us.Close() })
	return up, cl, r, h
}

func newGroup(t testing.TB, o Options) *Group {
	t.Helper()
	g, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// readEvents reads the client's chunked body to its end: the events, and
// the error from the body's end (nil: the last chunk came).
func readEvents(c net.Conn) ([]string, error) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	body, err := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(c)))
	var evs []string
	for _, e := range strings.SplitAfter(string(body), "\n\n") {
		if e != "" {
			evs = append(evs, e)
		}
	}
	return evs, err
}

func ev(i int) string { return fmt.Sprintf("data: {\"i\":%d}\n\n", i) }

// TestRelayAnySplit: events chunk-encoded by the backend in chunks that
// do not match events, written in pieces as small as one byte, with
// payload and wire bytes handed over already read, arrive whole, in
// order, as one chunk each; [DONE] ends the body with its last chunk.
func TestRelayAnySplit(t *testing.T) {
	g := newGroup(t, Options{Loops: 2})
	var body strings.Builder
	for i := 2; i < 40; i++ {
		body.WriteString(ev(i))
		if i%7 == 0 {
			body.WriteString("\n") // a stray blank line
		}
	}
	body.WriteString("data: [DONE]\n\n")
	src := body.String()
	var wire []byte
	for i := 0; i < len(src); i += 37 { // chunks across events
		wire = chunked.AppendChunk(wire, []byte(src[i:min(i+37, len(src))]))
	}
	wire = chunked.AppendLast(wire, nil)
	dec := new(chunked.Decoder)
	raw := wire[:5] // mid chunk-size line... of the first wire chunk
	head := "HTTP/1.1 200 OK\r\n\r\n"
	up, cl, r := streamOn(t, g, Stream{Out: []byte(head), Pending: []byte(ev(0) + ev(1)[:4]), Raw: raw, Decoder: dec, Idle: 5 * time.Second})
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got := make([]byte, len(head)); func() bool { _, err := io.ReadFull(cl, got); return err != nil }() || string(got) != head {
		t.Fatalf("Out not first: %q", got)
	}
	// The pending partial event "data" continues in the body: prefix the
	// rest of ev(1) in the wire chunks' payload.
	_ = up
	go func() {
		rest := wire[5:]
		for i := 0; i < len(rest); i++ { // byte by byte at first, then in blocks
			step := 1
			if i > 100 {
				step = 61
			}
			up.Write(rest[i:min(i+step, len(rest))])
			i += step - 1
		}
	}()
	_ = cl
	got, err := readEvents(cl)
	if err != nil {
		t.Fatalf("body: %v", err)
	}
	// ev(1) was cut after "data" and the wire continues with ev(2): the
	// two join into one event, as they would have on the wire.
	want := []string{ev(0), ev(1)[:4] + ev(2)}
	for i := 3; i < 40; i++ {
		want = append(want, ev(i))
	}
	want = append(want, "data: [DONE]\n\n")
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("events:\n%q\nwant\n%q", got, want)
	}
	if res := r.wait(t); res.err != nil || res.sent == 0 {
		t.Fatalf("closed with %v, sent %d", res.err, res.sent)
	}
}

// TestEachEventAtOnce: a sparse stream's client gets every event before
// the backend sends the next (no batching, no timer).
func TestEachEventAtOnce(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	up, cl, r := streamOn(t, g, Stream{Idle: 5 * time.Second})
	br := bufio.NewReader(cl)
	cr := httputil.NewChunkedReader(br)
	buf := make([]byte, 256)
	for i := range 20 {
		up.Write(chunked.AppendChunk(nil, []byte(ev(i))))
		cl.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := cr.Read(buf)
		if err != nil || string(buf[:n]) != ev(i) {
			t.Fatalf("event %d: %q, %v", i, buf[:n], err)
		}
	}
	up.Write(chunked.AppendChunk(nil, []byte("data: [DONE]\n\n")))
	if res := r.wait(t); res.err != nil {
		t.Fatal(res.err)
	}
}

// TestClientGoneClosesUpstream: when the client closes, the backend's
// connection is closed at once (its request is cancelled).
func TestClientGoneClosesUpstream(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	up, cl, r := streamOn(t, g, Stream{Idle: time.Minute})
	up.Write(chunked.AppendChunk(nil, []byte(ev(0))))
	cr := httputil.NewChunkedReader(bufio.NewReader(cl))
	buf := make([]byte, 256)
	if n, err := cr.Read(buf); err != nil || string(buf[:n]) != ev(0) {
		t.Fatalf("first event %q %v", buf[:n], err)
	}
	cl.Close()
	up.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := up.Read(buf); err != io.EOF {
		t.Fatalf("backend's read after the client left: %v, want EOF", err)
	}
	if res := r.wait(t); !errors.Is(res.err, ErrClientGone) {
		t.Fatalf("closed with %v", res.err)
	}
	if g.Streams() != 0 {
		t.Fatalf("%d streams left", g.Streams())
	}
}

// TestUpstreamCut: the backend closes mid-stream (and mid-event): the
// client gets the events so far, the error event and a clean end.
func TestUpstreamCut(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	up, cl, r := streamOn(t, g, Stream{Idle: time.Minute})
	up.Write(chunked.AppendChunk(nil, []byte(ev(0)+ev(1)+"data: {\"half")))
	up.Close()
	got, err := readEvents(cl)
	if err != nil {
		t.Fatalf("body: %v", err)
	}
	if len(got) != 3 || got[0] != ev(0) || got[1] != ev(1) || !strings.HasPrefix(got[2], "event: error\n") {
		t.Fatalf("events %q", got)
	}
	if res := r.wait(t); !errors.Is(res.err, ErrUpstreamCut) {
		t.Fatalf("closed with %v", res.err)
	}
}

// TestLengthAndCloseDelimited: a Content-Length body that ends before
// [DONE] is cut at its length; a close-delimited one at EOF.
func TestLengthAndCloseDelimited(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	body := ev(0) + ev(1)
	up, cl, r := streamOn(t, g, Stream{Remaining: int64(len(body)), Idle: time.Minute})
	up.Write([]byte(body + "garbage after the body\n\n"))
	got, err := readEvents(cl)
	if err != nil || len(got) != 3 || got[1] != ev(1) {
		t.Fatalf("length: %q %v", got, err)
	}
	if res := r.wait(t); !errors.Is(res.err, ErrUpstreamCut) {
		t.Fatalf("closed with %v", res.err)
	}
	up, cl, r = streamOn(t, g, Stream{Remaining: -1, Idle: time.Minute})
	up.Write([]byte(body + "data: [DONE]\n\n"))
	got, err = readEvents(cl)
	if err != nil || len(got) != 3 || got[2] != "data: [DONE]\n\n" {
		t.Fatalf("close-delimited: %q %v", got, err)
	}
	if res := r.wait(t); res.err != nil {
		t.Fatalf("closed with %v", res.err)
	}
}

// TestIdleTimeout: a backend silent for the idle timeout ends the stream
// with the error event; its socket is closed.
func TestIdleTimeout(t *testing.T) {
	g := newGroup(t, Options{Loops: 1, Sweep: 20 * time.Millisecond})
	up, cl, r := streamOn(t, g, Stream{Idle: 150 * time.Millisecond})
	start := time.Now() // before the event the idle time counts from
	up.Write(chunked.AppendChunk(nil, []byte(ev(0))))
	got, err := readEvents(cl)
	if err != nil || len(got) != 2 || !strings.Contains(got[1], ErrIdle.Error()) {
		t.Fatalf("events %q %v", got, err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("ended after %v, before the idle timeout", d)
	}
	if res := r.wait(t); !errors.Is(res.err, ErrIdle) {
		t.Fatalf("closed with %v", res.err)
	}
	up.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := up.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("backend's socket after idle: %v", err)
	}
}

// TestSlowClientBounded: a client that reads nothing while the backend
// floods: the loop stops reading the backend once the client's socket is
// full (backpressure: the loop holds at most one read's worth for it, the
// backend's writes block), and cuts the stream when the client has taken
// nothing for the idle timeout, closing the backend.
func TestSlowClientBounded(t *testing.T) {
	g := newGroup(t, Options{Loops: 1, Sweep: 20 * time.Millisecond})
	up, cl, r := streamOn(t, g, Stream{Idle: 300 * time.Millisecond})
	if tc, ok := cl.(*net.TCPConn); ok {
		tc.SetReadBuffer(16 << 10)
	}
	event := chunked.AppendChunk(nil, []byte("data: "+strings.Repeat("x", 4000)+"\n\n"))
	var written int64
	done := make(chan error, 1)
	go func() {
		for range 100_000 { // 400 MB: bounded; the loop cuts the stream well before
			up.SetWriteDeadline(time.Now().Add(10 * time.Second))
			n, err := up.Write(event)
			written += int64(n)
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	res := r.wait(t)
	if !errors.Is(res.err, ErrSlowClient) {
		t.Fatalf("closed with %v", res.err)
	}
	if err := <-done; err == nil {
		t.Fatal("the backend wrote 400 MB into a stream whose client reads nothing")
	}
	// Socket buffers (loopback autotuning: a few MiB each way) bound what
	// moved; the loop itself held at most one read.
	if written > 64<<20 || res.sent > 64<<20 {
		t.Fatalf("backend wrote %d, client was sent %d bytes, for a client that reads nothing", written, res.sent)
	}
	t.Logf("backend wrote %d KiB, client was sent %d KiB before the cut", written>>10, res.sent>>10)
}

// TestEndAllAndClose: EndAll (the drain) ends every stream with its cause
// as the error event and a clean end; Close ends the rest.
func TestEndAllAndClose(t *testing.T) {
	g, err := New(Options{Loops: 2})
	if err != nil {
		t.Fatal(err)
	}
	drain := errors.New("shutting_down")
	var cls []net.Conn
	var rs []*chunkRelay
	for range 6 {
		_, cl, r := streamOn(t, g, Stream{Idle: time.Minute})
		cls, rs = append(cls, cl), append(rs, r)
	}
	g.EndAll(drain)
	for i, cl := range cls {
		got, err := readEvents(cl)
		if err != nil || len(got) != 1 || !strings.Contains(got[0], "shutting_down") {
			t.Fatalf("stream %d: %q %v", i, got, err)
		}
		if res := rs[i].wait(t); res.err != drain {
			t.Fatalf("stream %d closed with %v", i, res.err)
		}
	}
	_, cl, r := streamOn(t, g, Stream{Idle: time.Minute})
	g.Close()
	if res := r.wait(t); !errors.Is(res.err, ErrClosed) {
		t.Fatalf("closed with %v", res.err)
	}
	if got, err := readEvents(cl); err != nil || len(got) != 1 {
		t.Fatalf("after Close: %q %v", got, err)
	}
	if _, err := g.Add(&Stream{Client: cl, Upstream: cl}); err == nil {
		t.Fatal("Add after Close succeeded")
	}
}

// TestManyHeldStreams holds many idle streams on two loops with no
// goroutine per stream, then relays one event on each and ends them.
func TestManyHeldStreams(t *testing.T) {
	n := *heldStreams
	if n == 0 {
		n = 2000
		if !testing.Short() && !raceEnabled {
			n = 4000 // 4 descriptors per stream in this process: 20,000 allowed
		}
	}
	g := newGroup(t, Options{Loops: 2})
	ln := listen(t)
	before := runtime.NumGoroutine()
	ups := make([]net.Conn, n)
	cls := make([]net.Conn, n)
	rs := make([]*chunkRelay, n)
	for i := range n {
		cs, cl := pair(t, ln)
		us, up := pair(t, ln)
		rs[i] = newRelay()
		if _, err := g.Add(&Stream{Client: cs, Upstream: us, Decoder: new(chunked.Decoder), Idle: time.Minute, Relay: rs[i]}); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		ups[i], cls[i] = up, cl
	}
	defer func() {
		for i := range n {
			ups[i].Close()
			cls[i].Close()
		}
	}()
	if got := g.Streams(); got != int64(n) {
		t.Fatalf("%d streams held, want %d", got, n)
	}
	if extra := runtime.NumGoroutine() - before; extra > 50 {
		t.Fatalf("%d more goroutines for %d streams", extra, n)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 8 { // bounded readers
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				ups[i].Write(chunked.AppendChunk(nil, []byte(ev(i)+"data: [DONE]\n\n")))
				got, err := readEvents(cls[i])
				if err != nil || len(got) != 2 || got[0] != ev(i) {
					errs <- fmt.Errorf("stream %d: %q %v", i, got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range n {
		if res := rs[i].wait(t); res.err != nil {
			t.Fatalf("stream %d: %v", i, res.err)
		}
	}
	if got := g.Streams(); got != 0 {
		t.Fatalf("%d streams left", got)
	}
}

// TestHoldAndFinish: a Relay that holds its ended stream (the proxy
// settles before the client sees the end) gets its events and End's bytes
// out at once, the backend closed, and the client's end only at Finish;
// Handle.End ends a running stream from another goroutine.
func TestHoldAndFinish(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	hold := make(chan error, 1)
	up, cl, r, h := handleOn(t, g, Stream{Idle: time.Minute}, hold)
	up.Write(chunked.AppendChunk(nil, []byte(ev(0)+"data: [DONE]\n\n")))
	if err := <-hold; err != nil {
		t.Fatalf("End with %v", err)
	}
	up.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := up.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("backend's socket after the end: %v", err)
	}
	cr := httputil.NewChunkedReader(bufio.NewReader(cl))
	buf := make([]byte, 256)
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	for _, want := range []string{ev(0), "data: [DONE]\n\n"} {
		if n, err := io.ReadFull(cr, buf[:len(want)]); err != nil || string(buf[:n]) != want {
			t.Fatalf("read %q %v, want %q", buf[:n], err, want)
		}
	}
	select {
	case res := <-r.closed:
		t.Fatalf("closed (%v) before Finish", res.err)
	case <-time.After(50 * time.Millisecond):
	}
	h.Finish(chunked.AppendLast(chunked.AppendChunk(nil, []byte(": tail\n\n")), nil))
	rest, err := io.ReadAll(cr)
	if err != nil || string(rest) != ": tail\n\n" {
		t.Fatalf("tail %q %v", rest, err)
	}
	if res := r.wait(t); res.err != nil {
		t.Fatal(res.err)
	}

	up, cl, r, h = handleOn(t, g, Stream{Idle: time.Minute}, hold)
	cause := errors.New("node draining")
	h.End(cause)
	if err := <-hold; err != cause {
		t.Fatalf("End with %v", err)
	}
	h.End(cause) // ending already: no effect
	h.Finish(chunked.AppendLast(nil, nil))
	got, err := readEvents(cl)
	if err != nil || len(got) != 1 || !strings.Contains(got[0], "node draining") {
		t.Fatalf("events %q %v", got, err)
	}
	if res := r.wait(t); res.err != cause {
		t.Fatalf("closed with %v", res.err)
	}
	_ = up
}

// TestDataAndEOFTogether: a backend that writes its last bytes and closes
// at once (data and FIN in one edge) ends the stream at once, not at the
// idle timeout.
func TestDataAndEOFTogether(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	for i := range 20 {
		up, cl, r := streamOn(t, g, Stream{Idle: time.Minute})
		up.Write(chunked.AppendChunk(nil, []byte(ev(i))))
		up.Close()
		start := time.Now()
		got, err := readEvents(cl)
		if err != nil || len(got) != 2 || got[0] != ev(i) {
			t.Fatalf("round %d: %q %v", i, got, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("round %d: ended after %v", i, d)
		}
		if res := r.wait(t); !errors.Is(res.err, ErrUpstreamCut) {
			t.Fatalf("round %d: closed with %v", i, res.err)
		}
	}
}

// TestOutWrittenByAdd: the stream's first bytes (the head and the first
// token) reach the client from Add itself, while the loop is busy with
// something else: the first token does not wait for the loop's turn. The
// stream still runs once the loop is free, and the bytes count as sent.
func TestOutWrittenByAdd(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	busy, release := make(chan struct{}), make(chan struct{})
	g.loops[0].command(func() { close(busy); <-release })
	<-busy
	head := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + string(chunked.AppendChunk(nil, []byte(ev(0))))
	up, cl, r := streamOn(t, g, Stream{Out: []byte(head), Idle: 5 * time.Second})
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(head))
	_, err := io.ReadFull(cl, got)
	close(release) // (before any Fatal: the group's Close needs the loop)
	if err != nil || string(got) != head {
		t.Fatalf("client read %q, %v while the loop was busy; want the head and first event", got, err)
	}
	up.Write(chunked.AppendLast(chunked.AppendChunk(nil, []byte(ev(1)+"data: [DONE]\n\n")), nil))
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	body, err := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(cl)))
	if err != nil || string(body) != ev(1)+"data: [DONE]\n\n" {
		t.Fatalf("rest of the stream %q, %v", body, err)
	}
	res := r.wait(t)
	if want := int64(len(head)) + int64(len(chunked.AppendChunk(nil, []byte(ev(1))))); res.err != nil || res.sent < want {
		t.Errorf("closed with %v after %d bytes, want nil after ≥ %d", res.err, res.sent, want)
	}
}

// TestNoLostWakeUp: with the idle sweep's timer out of the way (Sweep of
// an hour) only the kernel's readiness wakes a loop. Streams on one loop
// each send an event only after their client got the previous one (ping
// pong), so events keep arriving while the loop handles a batch and
// parks; an event whose readiness were lost between the loop's last
// epoll_wait and its park would stall its stream for good once the
// others are done (readEvent's deadline).
func TestNoLostWakeUp(t *testing.T) {
	g := newGroup(t, Options{Loops: 1, Sweep: time.Hour})
	const streams, events = 4, 1500
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for k := range streams {
		up, cl, r := streamOn(t, g, Stream{Idle: time.Hour})
		wg.Add(1)
		go func() {
			defer wg.Done()
			cr := httputil.NewChunkedReader(bufio.NewReader(cl))
			buf := make([]byte, 256)
			for i := range events {
				if _, err := up.Write(chunked.AppendChunk(nil, []byte(ev(i)))); err != nil {
					errs <- err
					return
				}
				cl.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, err := cr.Read(buf)
				if err != nil || string(buf[:n]) != ev(i) {
					errs <- fmt.Errorf("stream %d, event %d: %q, %v", k, i, buf[:n], err)
					return
				}
			}
			up.Write(chunked.AppendChunk(nil, []byte("data: [DONE]\n\n")))
			if res := r.wait(t); res.err != nil {
				errs <- res.err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
