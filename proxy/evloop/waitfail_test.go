package evloop

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http/httputil"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// TestWaitFailureEndsTheLoop: when a loop's epoll_wait fails with an errno
// other than EINTR (here EINVAL: its epoll descriptor is replaced by one
// of /dev/null), the loop does not panic: it ends its streams with the
// error, closes their sockets, takes no new streams (the other loop
// does), reports the error in Err, and Close still returns.
func TestWaitFailureEndsTheLoop(t *testing.T) {
	g, err := New(Options{Loops: 2, Sweep: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	up, cl, r, h := handleOn(t, g, Stream{Idle: time.Minute}, nil)
	// An event through proves the loop holds the stream: from now
	// on it waits with a timeout (the sweep's) and so meets the
	// replaced descriptor (a wait parked without a timeout on the
	// old one would sleep on: its close drops the readiness).
	up.Write(chunked.AppendChunk(nil, []byte(ev(0))))
	cr := httputil.NewChunkedReader(bufio.NewReader(cl))
	buf := make([]byte, 256)
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := cr.Read(buf); err != nil || string(buf[:n]) != ev(0) {
		t.Fatalf("first event: %q, %v", buf[:n], err)
	}
	// The loop may be inside a wait on the old descriptor; that
	// one returns at its timeout and the next one fails.
	null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(null)
	if err := unix.Dup3(null, h.l.epfd, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	res := r.wait(t)
	if !errors.Is(res.err, unix.EINVAL) {
		t.Fatalf("stream closed with %v; want the wait's EINVAL", res.err)
	}
	if err := g.Err(); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("Group.Err() = %v; want the wait's EINVAL", err)
	}
	up.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := up.Read(buf); err == nil {
		t.Fatal("the backend's socket is still open after the loop failed")
	}
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, err := cl.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the client's socket is still open after the loop failed")
			}
			break
		}
	}
	c1, c2 := net.Pipe() // no descriptors: Add fails before the loop
	if _, err := g.Add(&Stream{Client: c1, Upstream: c2, Relay: newRelay()}); err == nil {
		t.Fatal("Add took a stream without sockets")
	}
	if g.Streams() != 0 {
		t.Fatalf("%d streams counted after the loop failed", g.Streams())
	}
	// New streams go to the loop that still runs, whichever's turn
	// it is, and are relayed.
	for i := range 2 {
		up, cl, r, h2 := handleOn(t, g, Stream{Idle: time.Minute}, nil)
		if h2.l == h.l {
			t.Fatalf("stream %d went to the failed loop", i)
		}
		up.Write(chunked.AppendChunk(nil, []byte(ev(i)+"data: [DONE]\n\n")))
		if evs, err := readEvents(cl); err != nil || len(evs) != 2 || evs[0] != ev(i) {
			t.Fatalf("stream %d on the live loop: %q, %v", i, evs, err)
		}
		if res := r.wait(t); res.err != nil {
			t.Fatalf("stream %d on the live loop closed with %v", i, res.err)
		}
	}
	closed := make(chan struct{})
	go func() { g.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the loop failed")
	}
}

// TestAddRefusedAfterFailure: once every loop failed (BreakWaits), Add
// refuses with ErrFailed and the wait's error (not ErrClosed: the group
// was not closed), and leaves the client's connection (the one given)
// open for the caller, with the bytes of Out the socket did not take.
// After Close the refusal is ErrClosed.
func TestAddRefusedAfterFailure(t *testing.T) {
	g, err := New(Options{Loops: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.BreakWaits()
	if err := g.Err(); !errors.Is(err, ErrFailed) || !errors.Is(err, unix.EINVAL) {
		t.Fatalf("Group.Err() = %v; want ErrFailed and EINVAL", err)
	}
	ln := listen(t)
	for i, wantErr := range []error{ErrFailed, ErrClosed} {
		if i == 1 {
			g.Close()
		}
		cs, cl := pair(t, ln)
		us, up := pair(t, ln)
		s := &Stream{Client: cs, Upstream: us, Relay: newRelay(), Out: []byte("head")}
		_, err := g.Add(s)
		if !errors.Is(err, wantErr) || (wantErr == ErrClosed) != errors.Is(err, ErrClosed) {
			t.Fatalf("Add: %v; want %v", err, wantErr)
		}
		if s.Client == nil {
			t.Fatal("Add closed the client's connection")
		}
		if s.Client != cs {
			t.Fatal("the client's connection was replaced")
		}
		if _, err := s.Client.Write([]byte("|end")); err != nil {
			t.Fatalf("the client's connection left by Add: %v", err)
		}
		s.Client.Close()
		b, err := io.ReadAll(cl)
		if err != nil || string(b) != "head|end" {
			t.Fatalf("client read %q, %v; want Out, then the caller's bytes", b, err)
		}
		up.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := up.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("backend's socket after the refusal: %v; want EOF", err)
		}
		cl.Close()
		up.Close()
	}
}
