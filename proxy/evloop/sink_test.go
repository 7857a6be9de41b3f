package evloop

import (
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// fakeSink is a ClientSink with a credit the test grants: Write takes at
// most the credit left.
type fakeSink struct {
	mu      sync.Mutex
	w       Waker
	credit  int
	got     []byte
	flushes int
	closed  chan bool // Close's reset
}

func newFakeSink(credit int) *fakeSink { return &fakeSink{credit: credit, closed: make(chan bool, 1)} }

func (f *fakeSink) Attach(w Waker) { f.mu.Lock(); f.w = w; f.mu.Unlock() }

func (f *fakeSink) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := min(len(p), f.credit)
	f.credit -= n
	f.got = append(f.got, p[:n]...)
	return n, nil
}

func (f *fakeSink) Flush()           { f.mu.Lock(); f.flushes++; f.mu.Unlock() }
func (f *fakeSink) Close(reset bool) { f.closed <- reset }

// grant adds credit and resumes the stream. The loop attaches its Waker
// on its own goroutine after Group.Add returns, so an early grant may find
// none yet: the credit is then taken by the loop's first writes.
func (f *fakeSink) grant(n int) {
	f.mu.Lock()
	f.credit += n
	w := f.w
	f.mu.Unlock()
	if w != nil {
		w.Resume()
	}
}

func (f *fakeSink) text() string { f.mu.Lock(); defer f.mu.Unlock(); return string(f.got) }

// sinkOn starts a stream whose client side is f; up is the backend's peer.
func sinkOn(t *testing.T, g *Group, f *fakeSink, r *chunkRelay) net.Conn {
	t.Helper()
	ln := listen(t)
	us, upc := pair(t, ln)
	s := Stream{Sink: f, Upstream: us, Relay: r, Decoder: new(chunked.Decoder), Idle: 5 * time.Second}
	if _, err := g.Add(&s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { upc.Close() })
	return upc
}

// TestSinkPausedAndResumed: a sink that takes part of the bytes pauses the
// backend's reads; each grant resumes it; nothing is lost or reordered;
// the end closes the sink cleanly, after a Flush per batch.
func TestSinkPausedAndResumed(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	f := newFakeSink(10)
	r := newRelay()
	up := sinkOn(t, g, f, r)
	var want strings.Builder
	for i := range 20 {
		up.Write(chunked.AppendChunk(nil, []byte(ev(i))))
		want.Write(chunked.AppendChunk(nil, []byte(ev(i))))
	}
	up.Write(chunked.AppendChunk(nil, []byte("data: [DONE]\n\n")))
	want.Write(chunked.AppendChunk(nil, []byte("data: [DONE]\n\n")))
	want.Write(chunked.AppendLast(nil, nil))
	deadline := time.Now().Add(10 * time.Second)
	for f.text() != want.String() {
		if time.Now().After(deadline) {
			t.Fatalf("got %q\nwant %q", f.text(), want.String())
		}
		time.Sleep(2 * time.Millisecond)
		f.grant(7)
	}
	if res := r.wait(t); res.err != nil || res.sent != int64(want.Len()) {
		t.Fatalf("closed with %v after %d bytes; want nil after %d", res.err, res.sent, want.Len())
	}
	if reset := <-f.closed; reset {
		t.Fatal("a complete stream's sink was reset")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.flushes == 0 {
		t.Fatal("the sink was never flushed")
	}
}

// TestSinkGone: Waker.Gone ends the stream at once: the backend's socket
// is closed, the sink reset, the Relay told ErrClientGone.
func TestSinkGone(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	f := newFakeSink(1 << 20)
	r := newRelay()
	up := sinkOn(t, g, f, r)
	up.Write(chunked.AppendChunk(nil, []byte(ev(0))))
	waitUntil(t, func() bool { return strings.Contains(f.text(), ev(0)) })
	f.mu.Lock()
	w := f.w
	f.mu.Unlock()
	w.Gone()
	if res := r.wait(t); !errors.Is(res.err, ErrClientGone) {
		t.Fatalf("closed with %v; want ErrClientGone", res.err)
	}
	if reset := <-f.closed; !reset {
		t.Fatal("a gone client's stream was not reset")
	}
	buf := make([]byte, 16)
	up.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := up.Read(buf); err == nil {
		t.Fatal("the backend's socket is still open")
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
	}
}
